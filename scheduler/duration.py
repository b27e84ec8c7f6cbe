"""Durations as users write them (instants: ``scheduler.instants``).

One grammar for every duration a user writes, in a job document, an agent option
or the command line: ``90s``, ``5m``, ``1h30m``, ``2d`` or ``1.5h``, that is numbers
(a decimal fraction allowed) each followed by a unit of ``d h m s``, each unit at most
once and in that order; or a plain integer (``90`` or ``"90"``), meaning seconds. The
total must be a whole number of seconds: ``1.5h`` is 5400 s, ``1.5s`` is refused
(sub-second durations are not supported, so there is no ``ms``).
``format_duration`` writes the canonical form (``5400 -> "1h30m"``) and
``parse_duration(format_duration(x)) == x`` for every valid ``x``.

"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

__all__ = [
    "MAX_DURATION",
    "format_duration",
    "parse_duration",
]

MAX_DURATION = 100 * 365 * 86400
"""Longest accepted duration (about 100 years): keeps datetime arithmetic in range."""

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_DURATION_RE = re.compile(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
def parse_duration(value: object) -> float:
    """Seconds in ``value`` (``"1h30m"``, ``"1.5h"``, ``"90s"``, ``90``), as a float.

    Raises ``ValueError`` for anything else: negative, not a whole number of
    seconds, empty, unknown units, units out of order, booleans, or more than
    ``MAX_DURATION``.
    """
    if type(value) is str or type(value) is int:  # not bool (True == 1 as a cache key)
        return _parse_duration_cached(value)
    return _parse_duration(value)


@functools.lru_cache(maxsize=1024, typed=True)
def _parse_duration_cached(value: str | int) -> float:
    # Every job document holds several durations, parsed on every replica for every
    # put; the same few texts come back again and again. Errors are not cached.
    return _parse_duration(value)


def _parse_duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a duration like '90s' or '1h30m', not a boolean")  # noqa: TRY004
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit() and text.isascii():
            seconds = int(text)
        else:
            m = _DURATION_RE.fullmatch(text)
            if not text or m is None:
                raise ValueError(f"invalid duration {value!r}: use e.g. '90s', '5m', '1h30m', '2d'")
            # Exact arithmetic: 1.1h is 3960 s, which floats miss by a hair.
            total = sum((Fraction(g) * mult for g, (_, mult) in zip(m.groups(), _UNITS, strict=True) if g),
                        Fraction(0))
            if total.denominator != 1:
                raise ValueError(f"invalid duration {value!r}: must be a whole number of seconds")
            seconds = int(total)
    else:
        raise ValueError("must be a duration like '90s', '5m' or '1h30m'")  # noqa: TRY004
    if seconds < 0:
        raise ValueError("must not be negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"must be at most {format_duration(MAX_DURATION)}")
    return float(seconds)


@functools.lru_cache(maxsize=1024, typed=True)
def format_duration(seconds: float) -> str:
    """Canonical text of a whole number of seconds: ``0s``, ``90 -> 1m30s``, ``2d1h``."""
    if not math.isfinite(seconds) or seconds < 0 or not float(seconds).is_integer():
        raise ValueError(f"not a whole non-negative number of seconds: {seconds!r}")
    rest = int(seconds)
    if rest == 0:
        return "0s"
    parts = []
    for unit, mult in _UNITS:
        n, rest = divmod(rest, mult)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
