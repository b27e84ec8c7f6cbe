"""Schedule maths: the slots of a job, as a pure function of the previous instant.

A slot is the scheduled instant of one run: an aware UTC ``datetime``.
``Schedule.next_after(after, tz, anchor)`` is the first slot strictly after
``after``; calling it again with that slot walks the schedule. Nothing here
reads a clock or does I/O, so every replica and every leader computes the same
slots.

Forms (``parse_schedule``):

- 5-field cron ``*/5 * * * *``; 6-field cron with seconds FIRST
  ``*/10 * * * * *`` (croniter's own 6-field form puts seconds last; we pass
  ``second_at_beginning``). Hashed (``H``) and random (``R``) values are
  refused: replicas must agree on every slot.
- ``@yearly`` (= ``@annually``), ``@monthly``, ``@weekly``, ``@daily``
  (= ``@midnight``), ``@hourly``, ``@minutely``: cron shorthands.
- ``@every <duration>``: slots are ``anchor + k * interval`` for k >= 1,
  where ``anchor`` is the job's creation instant (the creation instant itself
  is not a slot). At least 1s.
- ``@at <RFC 3339 instant>``: one slot.
- ``@manually``: no slots.

Cron and daylight saving time. Cron is matched on the wall clock of the job's
time zone, then each matching wall time is mapped to one instant:

- a wall time that does not exist (spring-forward gap) runs once, at the first
  instant after the gap: ``30 2 * * *`` in Europe/Berlin on 2026-03-29 fires at
  03:00 CEST (01:00 UTC). Several gap times (``*/15`` inside the skipped hour)
  and the first wall time after the gap collapse into that one slot;
- a wall time that occurs twice (fall-back overlap) runs once, at its first
  occurrence. The repeated hour produces no slots the second time round, so an
  hourly job has a two-hour gap in UTC that night and never two runs for one
  wall time.

croniter resolves gaps the same way but runs every repeated wall time twice
(``30 2 * * *`` fires at 00:30 and 01:30 UTC on 2026-10-25 in Berlin). We
therefore use croniter only for wall-clock matching on naive datetimes and do
the time-zone mapping here.
"""

from __future__ import annotations

import copy
import enum
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

from croniter import CroniterBadDateError, CroniterError, croniter

from scheduler.duration import (
    format_duration,
    format_instant,
    parse_duration,
    parse_instant,
)

__all__ = ["MANUAL", "Schedule", "ScheduleKind", "parse_schedule"]

_US = timedelta(microseconds=1)

_ALIASES = {
    "@yearly": "@yearly",
    "@annually": "@yearly",
    "@monthly": "@monthly",
    "@weekly": "@weekly",
    "@daily": "@daily",
    "@midnight": "@daily",
    "@hourly": "@hourly",
    "@minutely": "@minutely",
}
_ALIAS_CRON = {
    "@yearly": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@minutely": "* * * * *",
}
# H (hashed) and R (random) values: no month or weekday name starts with either letter.
_NONDETERMINISTIC = re.compile(r"[HhRr](?:$|[(/])")
_PROBE_START = datetime(2000, 1, 1)
# A step through croniter normally lands on the answer at once; this bounds the
# loop if a zone had two transitions closer together than a schedule's period.
_MAX_STEPS = 1000


class ScheduleKind(enum.StrEnum):
    CRON = "cron"
    EVERY = "every"
    AT = "at"
    MANUAL = "manual"


@dataclass(frozen=True, slots=True)
class _Parsed:
    canonical: str
    kind: ScheduleKind
    interval: float | None = None
    at: datetime | None = None
    cron: croniter | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A parsed schedule. Build it with ``parse_schedule``.

    ``expr`` is the canonical text (what a job document shows); equality is by
    ``expr``. ``interval`` (seconds, ``@every``) and ``at`` (``@at``) are
    derived from it.
    """

    expr: str
    kind: ScheduleKind
    interval: float | None = field(init=False, default=None, compare=False)
    at: datetime | None = field(init=False, default=None, compare=False)
    # croniter parses its expression in the constructor (~0.3 ms); we keep one
    # prototype and copy it per call (the copy is cheap and keeps calls from
    # different threads apart).
    _cron: croniter | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        parsed = _parse(self.expr)
        if parsed.canonical != self.expr:
            raise ValueError(f"not a canonical schedule {self.expr!r}: use parse_schedule()")
        if parsed.kind != self.kind:
            raise ValueError(f"schedule {self.expr!r} is of kind {parsed.kind.value!r}")
        object.__setattr__(self, "kind", parsed.kind)
        object.__setattr__(self, "interval", parsed.interval)
        object.__setattr__(self, "at", parsed.at)
        object.__setattr__(self, "_cron", parsed.cron)

    def __str__(self) -> str:
        return self.expr

    def next_after(self, after: datetime, tz: tzinfo, anchor: datetime) -> datetime | None:
        """The first slot strictly after ``after``, as an aware UTC datetime.

        ``tz`` is the job's time zone (used by cron only), ``anchor`` the job's
        creation instant (used by ``@every`` only). ``None`` when there is no
        further slot (``@manually``, a past ``@at``, a cron that never matches
        again).
        """
        after = _aware_utc(after, "after")
        if self.kind is ScheduleKind.CRON:
            return self._next_cron(after, tz)
        if self.kind is ScheduleKind.EVERY:
            assert self.interval is not None
            return _next_every(after, _aware_utc(anchor, "anchor"), self.interval)
        if self.kind is ScheduleKind.AT:
            assert self.at is not None
            return self.at if self.at > after else None
        return None

    def slots_between(
        self,
        after_exclusive: datetime,
        until_inclusive: datetime,
        tz: tzinfo,
        anchor: datetime,
        limit: int,
    ) -> list[datetime]:
        """Slots in ``(after_exclusive, until_inclusive]``, oldest first, at most ``limit``."""
        until = _aware_utc(until_inclusive, "until_inclusive")
        slots: list[datetime] = []
        t = after_exclusive
        while len(slots) < limit:
            nxt = self.next_after(t, tz, anchor)
            if nxt is None or nxt > until:
                break
            slots.append(nxt)
            t = nxt
        return slots

    def _next_cron(self, after: datetime, tz: tzinfo) -> datetime | None:
        assert self._cron is not None
        local = after.astimezone(tz)
        wall = local.replace(tzinfo=None, fold=0)
        if local.fold == 1 and _is_ambiguous(wall, tz):
            # `after` is in the second pass of a repeated hour: every wall time
            # left in it was already run at its first occurrence, so resume at
            # the end of the repeat.
            wall = _overlap_end_wall(after, local, tz) - timedelta(seconds=1)
        it = copy.copy(self._cron)
        for _ in range(_MAX_STEPS):
            try:
                wall = it.get_next(datetime, start_time=wall)
            except (CroniterBadDateError, OverflowError, ValueError):
                return None
            slot = _wall_to_utc(wall, tz)
            if slot > after:
                return slot
        raise RuntimeError(f"no slot of {self.expr!r} found after {after.isoformat()}")


def parse_schedule(expr: str) -> Schedule:
    """Parse a schedule; raises ``ValueError`` naming what is wrong."""
    if not isinstance(expr, str):
        raise ValueError("a schedule must be a string")  # noqa: TRY004
    parsed = _parse(expr)
    return Schedule(expr=parsed.canonical, kind=parsed.kind)


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> _Parsed:
    # Cached: parse_job runs on every replica for every job put, and Schedule's
    # own __post_init__ parses again.
    text = " ".join(expr.split())
    if not text:
        raise ValueError("a schedule must not be empty")
    if not text.startswith("@"):
        return _parse_cron(text)
    word, _, rest = text.partition(" ")
    word = word.lower()
    if word in _ALIASES:
        if rest:
            raise ValueError(f"{word} takes no argument")
        canonical = _ALIASES[word]
        return _Parsed(canonical, ScheduleKind.CRON, cron=_compile(_ALIAS_CRON[canonical], False))
    if word == "@manually":
        if rest:
            raise ValueError("@manually takes no argument")
        return _Parsed("@manually", ScheduleKind.MANUAL)
    if word == "@every":
        try:
            seconds = parse_duration(rest)
        except ValueError as exc:
            raise ValueError(f"@every needs a duration like '30s', '5m' or '1h30m': {exc}") from exc
        if seconds < 1:
            raise ValueError("@every needs an interval of at least 1s")
        return _Parsed(f"@every {format_duration(seconds)}", ScheduleKind.EVERY, interval=seconds)
    if word == "@at":
        try:
            at = parse_instant(rest)
        except ValueError as exc:
            raise ValueError(
                f"@at needs an RFC 3339 instant with an offset like 2026-12-01T10:00:00Z: {exc}"
            ) from exc
        return _Parsed(f"@at {format_instant(at)}", ScheduleKind.AT, at=at)
    raise ValueError(
        f"unknown schedule {word!r}: use cron fields, @yearly, @monthly, @weekly, @daily, "
        "@hourly, @minutely, @every <duration>, @at <instant> or @manually"
    )


def _parse_cron(text: str) -> _Parsed:
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise ValueError(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 "
            f"with seconds first, got {len(fields)} in {text!r}"
        )
    for f in fields:
        if any(_NONDETERMINISTIC.match(part) for part in f.split(",")):
            raise ValueError(f"hashed (H) and random (R) cron values are not supported: {text!r}")
    return _Parsed(text, ScheduleKind.CRON, cron=_compile(text, len(fields) == 6))


def _compile(text: str, seconds_first: bool) -> croniter:
    try:
        proto = croniter(text, _PROBE_START, second_at_beginning=seconds_first)
        # Probe once: an expression that can never match (31 February) fails here,
        # not at the first next_after.
        copy.copy(proto).get_next(datetime)
    except CroniterBadDateError as exc:
        raise ValueError(f"cron expression {text!r} never matches") from exc
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise ValueError(f"invalid cron expression {text!r}: {exc}") from exc
    return proto


def _aware_utc(t: datetime, name: str) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got naive {t.isoformat()}")
    return t.astimezone(UTC)


def _next_every(after: datetime, anchor: datetime, interval: float) -> datetime | None:
    # Integer microseconds: no float drift however far from the anchor.
    step = int(interval) * 1_000_000
    delta = (after - anchor) // _US
    k = delta // step + 1 if delta >= 0 else 1
    try:
        return anchor + timedelta(microseconds=k * step)
    except OverflowError:
        return None


def _is_ambiguous(wall: datetime, tz: tzinfo) -> bool:
    a = wall.replace(tzinfo=tz, fold=0).utcoffset()
    b = wall.replace(tzinfo=tz, fold=1).utcoffset()
    return a != b and wall.replace(tzinfo=tz, fold=0).astimezone(UTC) < wall.replace(
        tzinfo=tz, fold=1
    ).astimezone(UTC)


def _wall_to_utc(wall: datetime, tz: tzinfo) -> datetime:
    """The instant a matching wall time runs at: first occurrence, or the end of a gap."""
    u = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if u.astimezone(tz).replace(tzinfo=None) == wall:
        return u  # exists; fold=0 is the first of two occurrences
    return _gap_end(wall, tz)


@functools.lru_cache(maxsize=1024)
def _gap_end(wall: datetime, tz: tzinfo) -> datetime:
    """The transition instant that skips over the nonexistent ``wall``."""
    a = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    b = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    return _first_change(min(a, b), max(a, b), tz)


def _overlap_end_wall(after: datetime, local: datetime, tz: tzinfo) -> datetime:
    """The first wall time after the repeated period that ``after`` (second pass) is in."""
    first = local.replace(fold=0)
    shift = first.utcoffset() - local.utcoffset()  # type: ignore[operator]
    transition = _first_change(after - shift, after, tz)
    return transition.replace(tzinfo=None) + first.utcoffset()  # type: ignore[operator]


def _first_change(lo: datetime, hi: datetime, tz: tzinfo) -> datetime:
    """The earliest whole second in (lo, hi] whose UTC offset differs from lo's.

    Time-zone transitions fall on whole seconds; ``lo`` and ``hi`` straddle one.
    """
    lo_s = int(lo.timestamp() // 1)
    hi_s = -int(-hi.timestamp() // 1)
    base = datetime.fromtimestamp(lo_s, tz).utcoffset()
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == base:
            lo_s = mid
        else:
            hi_s = mid
    return datetime.fromtimestamp(hi_s, UTC)


MANUAL = parse_schedule("@manually")
"""The schedule of a job that runs only by hand or as a dependency."""
