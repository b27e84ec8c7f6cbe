"""Instants: integer microseconds inside, RFC 3339 at the edges.

Inside raftcron an instant is an aware UTC ``datetime`` or, in commands, records and
the state machine, integer microseconds since the Unix epoch (``us`` / ``from_us``:
exact, so replicas never round a float differently). Users write RFC 3339 with an
offset or ``Z`` (``parse_instant``); it is written back as ``2026-12-01T10:00:00Z``,
with a fraction only when present, by ``format_instant``, the one formatter of
instants (API answers, the executors' identity headers and alert payloads).
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["format_instant", "from_us", "parse_instant", "us"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INSTANT_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})"
)



def us(t: datetime) -> int:
    """Aware datetime -> integer microseconds since the epoch, exactly."""
    d = t - _EPOCH  # whole fields, not timedelta // timedelta: this runs several times per write
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def from_us(v: int) -> datetime:
    return _EPOCH + timedelta(microseconds=v)


def parse_instant(value: object) -> datetime:
    """An aware UTC datetime from RFC 3339 text with an offset (or an aware datetime).

    Fractions beyond microseconds are truncated. Raises ``ValueError``.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("must carry a UTC offset")
        return value.astimezone(UTC)
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 timestamp string")  # noqa: TRY004
    m = _INSTANT_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError(
            f"invalid RFC 3339 timestamp {value!r}: use e.g. '2026-12-01T10:00:00Z' or "
            "'2026-12-01T11:00:00+01:00'"
        )
    year, month, day, hour, minute, second, frac, off = m.groups()
    micro = int((frac or "").ljust(6, "0")[:6])
    if off in ("Z", "z"):
        tz = UTC
    else:
        sign = -1 if off[0] == "-" else 1
        oh, om = int(off[1:3]), int(off[4:6])
        if oh > 23 or om > 59:
            raise ValueError(f"invalid UTC offset in {value!r}")
        tz = timezone(sign * timedelta(hours=oh, minutes=om))
    try:
        t = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz
        )
        return t.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"invalid RFC 3339 timestamp {value!r}: {exc}") from exc


def format_instant(t: datetime) -> str:
    """``2026-12-01T10:00:00Z``; ``.ffffffZ`` only when there are microseconds."""
    if t.tzinfo is None:
        raise ValueError("naive datetime: instants must be aware")
    return _format_utc(t.astimezone(UTC))


@functools.lru_cache(maxsize=4096)
def _format_utc(t: datetime) -> str:
    # Cached: a job view shows its next five slots, and jobs sharing a schedule share them.
    # isoformat writes the fraction only when there are microseconds, as we want.
    return t.replace(tzinfo=None).isoformat() + "Z"
