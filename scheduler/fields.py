"""Reading a JSON-like document field by field, collecting every problem.

``Problems`` gathers ``{"field": path, "message": ...}`` entries; ``Fields``
wraps one object of the document at a dotted path (``http``, ``retries``) and
hands out typed values. A getter that finds a problem records it and returns
the default, so validation goes on and reports everything at once.

Conventions shared by every getter:

- a missing key and an explicit ``null`` are the same: the default applies (a
  required field reports ``is required``);
- ``bool`` is never accepted where a number is expected, although Python
  treats it as an ``int``;
- list items are addressed as ``path[i]``, map entries as ``path.key``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from enum import Enum
from typing import TypeVar, cast

from scheduler.duration import parse_duration
from scheduler.errors import FieldError
from scheduler.instants import parse_instant

__all__ = ["ROOT", "Fields", "Problems", "join", "type_name"]

ROOT = "$"
"""The field path reported when the document itself is not an object."""

E = TypeVar("E", bound=Enum)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


class Problems:
    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, field: str, message: str) -> None:
        self.items.append({"field": field, "message": message})

    def __bool__(self) -> bool:
        return bool(self.items)


class Fields:
    """One object of the document; reports its unknown keys when opened."""

    def __init__(
        self, data: Mapping[object, object], path: str, known: Iterable[str], problems: Problems
    ) -> None:
        self.data = data
        self.path = path
        self.problems = problems
        allowed = _key_set(known if isinstance(known, tuple) else tuple(known))
        if allowed.issuperset(data):
            return  # the usual case, in one C call: every key a known field name
        for key in data:
            if not isinstance(key, str):
                problems.add(join(path, str(key)), "keys must be strings")
            elif key not in allowed:
                problems.add(join(path, key), "unknown field")

    @classmethod
    def open(
        cls, value: object, path: str, known: Iterable[str], problems: Problems
    ) -> Fields | None:
        """``Fields`` over ``value`` if it is an object, else report it and return None."""
        if type(value) is not dict and not isinstance(value, Mapping):
            problems.add(path or ROOT, f"must be an object, not {type_name(value)}")
            return None
        return cls(value, path, known, problems)

    def at(self, key: str | int) -> str:
        return join(self.path, key)

    def raw(self, key: str) -> object:
        """The value at ``key``; ``None`` when missing or null."""
        return self.data.get(key)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def error(self, key: str | int, message: str) -> None:
        self.problems.add(self.at(key), message)

    def missing(self, key: str, why: str = "is required") -> None:
        self.error(key, why)

    def section(self, key: str, known: Iterable[str]) -> Fields | None:
        value = self.data.get(key)
        if value is None:
            return None
        return Fields.open(value, f"{self.path}.{key}" if self.path else key, known, self.problems)

    def string(
        self, key: str, default: str | None = None, *, required: bool = False, max_len: int = 0
    ) -> str | None:
        value = self.data.get(key)
        if value is None:
            if required:
                self.missing(key)
            return default
        if not isinstance(value, str):
            self.error(key, f"must be a string, not {type_name(value)}")
            return default
        if max_len and len(value) > max_len:
            self.error(key, f"must be at most {max_len} characters")
            return default
        return value

    def checked(
        self, key: str, check: Callable[[str], str | None], *, required: bool = False
    ) -> str | None:
        """An optional (or required) string that must pass ``check`` (message or None)."""
        value = self.string(key, required=required)
        if value is not None and (problem := check(value)):
            self.error(key, problem)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.error(key, f"must be a boolean, not {type_name(value)}")
            return default
        return value

    def integer(
        self, key: str, default: int, *, lo: int | None = None, hi: int | None = None
    ) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON clients may send 3.0
        if isinstance(value, bool) or not isinstance(value, int):
            what = repr(value) if isinstance(value, float) else type_name(value)
            self.error(key, f"must be an integer, not {what}")
            return default
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.error(key, _range_message(lo, hi))
            return default
        return value

    def number(self, key: str, default: float, *, lo: float | None = None, hi: float | None = None) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.error(key, f"must be a number, not {type_name(value)}")
            return default
        if not math.isfinite(value):
            self.error(key, "must be a finite number")
            return default
        if lo is not None and value < lo:
            self.error(key, f"must be at least {lo:g}")
            return default
        if hi is not None and value > hi:
            self.error(key, f"must be at most {hi:g}")
            return default
        return float(value)

    def duration(self, key: str, default: float, *, positive: bool = False) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.error(key, str(exc))
            return default
        if positive and seconds <= 0:
            self.error(key, "must be longer than 0s")
            return default
        return seconds

    def instant(self, key: str) -> datetime | None:
        value = self.data.get(key)
        if value is None:
            return None
        try:
            return parse_instant(value)
        except ValueError as exc:
            self.error(key, str(exc))
            return None

    def choice(self, key: str, enum: type[E], default: E) -> E:
        value = self.data.get(key)
        if value is None:
            return default
        found = self._member(key, value, enum)
        return default if found is None else found

    def required_choice(self, key: str, enum: type[E]) -> E | None:
        value = self.data.get(key)
        if value is None:
            self.missing(key)
            return None
        return self._member(key, value, enum)

    def _member(self, key: str | int, value: object, enum: type[E]) -> E | None:
        if isinstance(value, str):
            member = _by_value(enum).get(value)
            if member is not None:
                return member  # type: ignore[return-value]
        options = ", ".join(str(e.value) for e in enum)
        self.error(key, f"must be one of {options}, not {value!r}")
        return None

    def string_map(
        self,
        key: str,
        *,
        check_key: Callable[[str], str | None] | None = None,
        check_value: Callable[[str], str | None] | None = None,
    ) -> dict[str, str]:
        """A map of string to string, sorted by key; ``check_*`` return an error message or None."""
        value = self.data.get(key)
        if value is None:
            return {}
        if type(value) is not dict and not isinstance(value, Mapping):
            self.error(key, f"must be an object of strings, not {type_name(value)}")
            return {}
        out: dict[str, str] = {}
        for k in sorted(value, key=str):
            v = value[k]
            if not isinstance(k, str):
                problem: str | None = "keys must be strings"
            else:
                problem = check_key(k) if check_key else None
                if problem is None and not isinstance(v, str):
                    problem = f"must be a string, not {type_name(v)}"
                if problem is None and check_value is not None:
                    problem = check_value(v)
            if problem is not None:
                self.problems.add(join(self.at(key), str(k)), problem)
                continue
            out[k] = v
        return out

    def items(self, key: str) -> list[tuple[str, object]] | None:
        """``(path, item)`` per element of the list at ``key``; None if absent or not a list."""
        value = self._list(key)
        if value is None:
            return None
        return [(self.at(key) + f"[{i}]", item) for i, item in enumerate(value)]

    def _list(self, key: str) -> list[object] | tuple[object, ...] | None:
        """The list at ``key``, reporting a value that is not one; None if absent or not a list."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, (list, tuple)):
            self.error(key, f"must be a list, not {type_name(value)}")
            return None
        return value

    def int_set(self, key: str, *, lo: int, hi: int) -> tuple[int, ...]:
        """A list of integers in ``[lo, hi]``, returned sorted and without repeats."""
        found: set[int] = set()
        for i, item in enumerate(self._list(key) or ()):
            if isinstance(item, bool) or not isinstance(item, int):
                self.error(join(key, i), f"must be an integer, not {type_name(item)}")
            elif not lo <= item <= hi:
                self.error(join(key, i), _range_message(lo, hi))
            else:
                found.add(item)
        return tuple(sorted(found))

    def enum_set(self, key: str, enum: type[E], default: tuple[E, ...]) -> tuple[E, ...]:
        """A list of enum values, returned without repeats in the enum's declaration order."""
        items = self._list(key)
        if items is None:
            return default
        by_value = cast("dict[object, E]", _by_value(enum))
        found: set[E] = set()
        for i, item in enumerate(items):
            member = by_value.get(item) if isinstance(item, str) else None
            if member is None:
                member = self._member(join(key, i), item, enum)  # reports it
            if member is not None:
                found.add(member)
        return tuple(e for e in by_value.values() if e in found)


def _range_message(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"must be between {lo} and {hi}"
    if lo is not None:
        return f"must be at least {lo}"
    return f"must be at most {hi}"


@functools.lru_cache(maxsize=256)
def _key_set(known: tuple[str, ...]) -> frozenset[str]:
    return frozenset(known)


@functools.cache
def _by_value(enum: type[Enum]) -> dict[object, Enum]:
    """An enum's members by value, in declaration order: a lookup, not a walk over the
    members (Enum.__iter__ is slow)."""
    return {member.value: member for member in enum}
