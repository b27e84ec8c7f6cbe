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

import bisect
import calendar
import copy
import enum
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

from croniter import CroniterBadDateError, CroniterError, croniter

from scheduler.duration import format_duration, parse_duration
from scheduler.instants import format_instant, parse_instant

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
class _SlotRun:
    """Consecutive slots of one cron schedule in one time zone: ``slots[0]`` is the first
    slot after ``start`` and each next one the first slot after the one before."""

    start: datetime
    slots: tuple[datetime, ...]


# Long enough for the slots a planner walks ahead of a busy schedule; a run that is full
# drops its older half as it grows.
_RUN_LENGTH = 256


@dataclass(frozen=True, slots=True)
class _Parsed:
    canonical: str
    kind: ScheduleKind
    interval: float | None = None
    at: datetime | None = None
    cron: croniter | None = None
    wall: _WallCron | None = None
    # Slots already found, per time zone (see Schedule._next_cron); shared by every job that
    # has this schedule, like the parse itself.
    runs: dict[tzinfo, _SlotRun] = field(default_factory=dict, compare=False, repr=False)


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
    # The same wall-clock matching as croniter on croniter's own expansion of the fields,
    # ~20x cheaper per step; None for L, W and # (those stay with croniter).
    _wall: _WallCron | None = field(init=False, default=None, compare=False, repr=False)
    _runs: dict[tzinfo, _SlotRun] = field(init=False, default_factory=dict, compare=False, repr=False)

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
        object.__setattr__(self, "_wall", parsed.wall)
        object.__setattr__(self, "_runs", parsed.runs)

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

    def _next_cron(self, after: datetime, tz: tzinfo) -> datetime | None:
        """``_find_cron``, answered from the slots found before when it can be.

        A run is (start, s1..sn) with s1 = the first slot after start and each next s the
        first slot after the one before, so no slot lies between start and sn but those:
        for start <= after < sn the answer is the first si > after, exactly what a search
        would find. Jobs that share a schedule share its runs: the API shows the next five
        slots of every job it writes, the leader plans each new one, and most jobs are a
        few common schedules.
        """
        run = self._runs.get(tz)
        if run is not None and run.start <= after < run.slots[-1]:
            return run.slots[bisect.bisect_right(run.slots, after)]
        found = self._find_cron(after, tz)
        if found is None:
            return None
        if run is None:
            run = _SlotRun(after, (found,))
        elif after == run.slots[-1]:  # the walk goes on: extend, dropping the older half when full
            kept = run.slots if len(run.slots) < _RUN_LENGTH else run.slots[_RUN_LENGTH // 2:]
            run = _SlotRun(run.start if kept is run.slots else run.slots[_RUN_LENGTH // 2 - 1], (*kept, found))
        elif found == run.slots[0] and after < run.start:  # nothing between after and the run
            run = _SlotRun(after, run.slots)
        else:
            run = _SlotRun(after, (found,))
        self._runs[tz] = run
        return found

    def _find_cron(self, after: datetime, tz: tzinfo) -> datetime | None:
        if _is_utc(tz):
            # No transitions: no gap, no repeated hour, the wall clock is the instant.
            found = self._next_wall(after.replace(tzinfo=None))
            return None if found is None else found.replace(tzinfo=UTC)
        local = after.astimezone(tz)
        wall = local.replace(tzinfo=None, fold=0)
        if local.fold == 1 and _is_ambiguous(wall, tz):
            # `after` is in the second pass of a repeated hour: every wall time
            # left in it was already run at its first occurrence, so resume at
            # the end of the repeat.
            wall = _overlap_end_wall(after, local, tz) - timedelta(seconds=1)
        for _ in range(_MAX_STEPS):
            found = self._next_wall(wall)
            if found is None:
                return None
            wall = found
            slot = _wall_to_utc(wall, tz)
            if slot > after:
                return slot
        raise RuntimeError(f"no slot of {self.expr!r} found after {after.isoformat()}")

    def _next_wall(self, wall: datetime) -> datetime | None:
        """The first matching wall time strictly after ``wall`` (naive), or None."""
        if self._wall is not None:
            return self._wall.next_after(wall)
        assert self._cron is not None
        try:
            return copy.copy(self._cron).get_next(datetime, start_time=wall)  # type: ignore[no-any-return]
        except (CroniterBadDateError, OverflowError, ValueError):
            return None


def parse_schedule(expr: str) -> Schedule:
    """Parse a schedule; raises ``ValueError`` naming what is wrong."""
    if not isinstance(expr, str):
        raise ValueError("a schedule must be a string")  # noqa: TRY004
    parsed = _parse(expr)
    return _schedule(parsed.canonical, parsed.kind)


@functools.lru_cache(maxsize=4096)
def _schedule(canonical: str, kind: ScheduleKind) -> Schedule:
    """One ``Schedule`` per canonical text, shared by every job that has it (it is frozen, and
    what it finds is shared per text already): 100,000 jobs of a few schedules hold a few."""
    return Schedule(expr=canonical, kind=kind)


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
        cron = _compile(_ALIAS_CRON[canonical], False)
        return _Parsed(canonical, ScheduleKind.CRON, cron=cron, wall=_WallCron.of(cron))
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
    cron = _compile(text, len(fields) == 6)
    return _Parsed(text, ScheduleKind.CRON, cron=cron, wall=_WallCron.of(cron))


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


@dataclass(frozen=True, slots=True)
class _WallCron:
    """croniter's wall-clock matching (``get_next`` on naive datetimes), on its expansion.

    A field is a sorted tuple of allowed values, or None for ``*``. Day of month and
    day of week are one condition when either is ``*`` and either-or when both are
    restricted (croniter's default, as in Vixie cron). ``seconds`` is None for 5-field
    expressions (second 0). croniter searches at most 50 years ahead; so does this.
    tests/unit/test_schedule.py compares the two on random expressions and instants.
    """

    seconds: tuple[int, ...] | None
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int] | None
    months: frozenset[int] | None
    dows: frozenset[int] | None

    YEARS = 50

    @classmethod
    def of(cls, cron: croniter) -> _WallCron | None:
        """The matcher for a compiled expression, or None when it uses L, W or #."""
        ex = cron.expanded
        if cron.nth_weekday_of_month or cron.nearest_weekday or len(ex) not in (5, 6):
            return None
        fields: list[tuple[int, ...] | None] = []
        for values in ex:
            if values[0] == "*":
                fields.append(None)
            elif all(type(v) is int for v in values):
                fields.append(tuple(sorted(set(values))))
            else:
                return None  # "l" (last day) and anything else croniter knows and we do not
        minute, hour, dom, month, dow = fields[:5]
        return cls(
            seconds=(fields[5] or tuple(range(60))) if len(fields) == 6 else None,
            minutes=minute or tuple(range(60)),
            hours=hour or tuple(range(24)),
            doms=None if dom is None else frozenset(dom),
            months=None if month is None else frozenset(month),
            dows=None if dow is None else frozenset(d % 7 for d in dow),
        )

    def next_after(self, after: datetime) -> datetime | None:
        """The first matching naive wall time strictly after ``after`` (naive)."""
        if self.seconds is None:
            t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        else:
            t = after.replace(microsecond=0) + timedelta(seconds=1)
        if self.doms is not None and self.dows is not None:
            either = [x for x in (self._search(t, self.doms, None), self._search(t, None, self.dows)) if x]
            return min(either) if either else None
        return self._search(t, self.doms, self.dows)

    def _search(self, t: datetime, doms: frozenset[int] | None, dows: frozenset[int] | None) -> datetime | None:
        year, month, day = t.year, t.month, t.day
        clock: tuple[int, int, int] | None = (t.hour, t.minute, t.second)  # None: from midnight
        while year <= t.year + self.YEARS:
            if self.months is None or month in self.months:
                last = _DAYS_IN_MONTH[month] if month != 2 else 28 + calendar.isleap(year)
                # cron counts weekdays from Sunday = 0; only needed when the day of week matters
                weekday = (calendar.weekday(year, month, day) + 1) % 7 if dows is not None and day <= last else 0
                while day <= last:
                    if (doms is None or day in doms) and (dows is None or weekday in dows):
                        hms = self._time_from(*(clock or (0, 0, 0)))
                        if hms is not None:
                            return datetime(year, month, day, *hms)
                    day, weekday, clock = day + 1, (weekday + 1) % 7, None
            year, month, day, clock = year + (month == 12), month % 12 + 1, 1, None
        return None

    def _time_from(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        """The first (hour, minute, second) of the day at or after h:m:s."""
        secs = self.seconds or (0,)
        for hour in self.hours[bisect.bisect_left(self.hours, h):]:
            same_hour = hour == h
            for minute in self.minutes[bisect.bisect_left(self.minutes, m if same_hour else 0):]:
                i = bisect.bisect_left(secs, s if same_hour and minute == m else 0)
                if i < len(secs):
                    return hour, minute, secs[i]
        return None


_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_NO_TRANSITIONS = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu",
                             "GMT", "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "GMT0", "GMT+0", "GMT-0",
                             "Greenwich", "Etc/Greenwich"})


def _is_utc(tz: tzinfo) -> bool:
    """``tz`` is UTC under one of its names (the zone of most jobs)."""
    return tz is UTC or getattr(tz, "key", None) in _NO_TRANSITIONS


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
