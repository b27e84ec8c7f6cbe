"""Value rules of the job document: each check returns a problem message or None.

Kept apart from ``model`` so the rules read as a list; every one is pure (the
time-zone check reads tzdata, which ``zoneinfo`` caches).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from scheduler.fields import type_name
from scheduler.pattern import compile_pattern

if TYPE_CHECKING:
    from scheduler.fields import Fields

__all__ = [
    "NAME_PATTERN",
    "check_body_pattern",
    "check_cwd",
    "check_env_name",
    "check_env_value",
    "check_header_name",
    "check_header_value",
    "check_instant",
    "check_label_key",
    "check_label_value",
    "check_name",
    "check_regex",
    "check_tag_key",
    "check_timezone",
    "check_url",
    "parse_command",
    "parse_size",
]

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Zone files that differ from host to host: replicas must agree on a job's zone.
_HOST_ZONES = frozenset({"localtime", "posixrules"})
# The executor sets these itself (SPEC section 2); a job must not forge them.
_RESERVED_HEADERS = ("idempotency-key", "x-raftcron-")
_RESERVED_ENV = "RAFTCRON_"
_SIZE = re.compile(r"([0-9]{1,16})([KMGT]i?)?")
_SIZE_UNITS = {
    None: 1,
    "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}
_MAX_SIZE = 1 << 50


def check_name(value: str) -> str | None:
    if NAME_PATTERN.fullmatch(value) is None:
        return (
            "must be 1 to 63 characters of a-z, 0-9, '_' and '-', starting with a letter or digit"
        )
    return None


EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9001, 1, 1, tzinfo=UTC)
"""Instants of a job document lie in [1970, end of year 9000]. Later ones leave no room to
step a schedule forward (Python's datetime ends with year 9999: an hourly job starting
at 9999-12-31T23:59:59Z overflowed in the planner); earlier ones precede the epoch that
every instant in the ledger counts from."""


def check_instant(value: datetime) -> str | None:
    if value < EARLIEST_INSTANT or value >= LATEST_INSTANT:
        return (f"{value.isoformat().replace('+00:00', 'Z')} is out of range: "
                "use an instant from 1970-01-01T00:00:00Z to the end of year 9000")
    return None


def check_timezone(value: str) -> str | None:
    if value in _HOST_ZONES:
        return f"{value!r} depends on the host: name an IANA zone like Europe/Berlin"
    try:
        ZoneInfo(value)
    except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return f"unknown time zone {value!r}: use an IANA name like Europe/Berlin or UTC"
    return None


def check_url(value: str) -> str | None:
    if len(value) > 2048:
        return "must be at most 2048 characters"
    if _CONTROL.search(value) or " " in value:
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    return None


def check_header_name(value: str) -> str | None:
    if _HEADER_NAME.fullmatch(value) is None:
        return "is not a valid HTTP header name"
    low = value.lower()
    if low == _RESERVED_HEADERS[0] or low.startswith(_RESERVED_HEADERS[1]):
        return "is set by raftcron for every attempt and cannot be overridden"
    return None


def check_header_value(value: str) -> str | None:
    if "\r" in value or "\n" in value or "\0" in value:
        return "must not contain CR, LF or NUL"
    return None


def check_env_name(value: str) -> str | None:
    if _ENV_NAME.fullmatch(value) is None:
        return "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if value.upper().startswith(_RESERVED_ENV):
        return f"names starting with {_RESERVED_ENV} are set by raftcron"
    return None


def check_env_value(value: str) -> str | None:
    return "must not contain NUL characters" if "\0" in value else None


def check_label_key(value: str) -> str | None:
    """Kubernetes label keys: an optional DNS-subdomain prefix and '/', then a name."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        return "has an invalid prefix: use a DNS subdomain like example.com/"
    if _LABEL_NAME.fullmatch(name) is None:
        return (
            "is not a valid label key: 1 to 63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit, optionally prefixed"
        )
    return None


def check_label_value(value: str) -> str | None:
    return "must be at most 63 characters" if len(value) > 63 else None


def check_tag_key(value: str) -> str | None:
    if not value or "=" in value or _CONTROL.search(value) or value != value.strip():
        return "is not a valid tag name"
    return None


def parse_size(value: object) -> int | str:
    """Bytes in ``value``: an integer, or a string like ``"512Mi"``, ``"2G"`` (Kubernetes
    units: K M G T are powers of 1000, Ki Mi Gi Ti of 1024); a problem message otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON clients may send 3.0
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value.strip())):
        size = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    else:
        return "must be a positive number of bytes, or a size like 512Mi, 2Gi or 500M"
    if size <= 0:
        return "must be a positive number of bytes"
    if size > _MAX_SIZE:
        return "must be at most 1Pi"
    return size


def check_regex(value: str) -> str | None:
    # The state machine's rule, unchanged: jobs stored before expect_body was matched by RE2
    # must still parse on replay. New documents pass check_body_pattern too (Service.put_job).
    try:
        re.compile(value)
    except re.error as exc:
        return f"is not a valid regular expression: {exc}"
    return None


def check_body_pattern(value: str) -> str | None:
    """``http.expect_body`` as the executor runs it: a pattern RE2 compiles (linear time)."""
    try:
        compile_pattern(value)
    except ValueError as exc:
        return (
            f"is not a regular expression RE2 can run ({exc}): backreferences and look-around "
            "are not supported, matching must take linear time in a pattern of bounded size"
        )
    return None


def check_cwd(value: str) -> str | None:
    if not value.startswith("/"):
        return "must be an absolute path"
    if "\0" in value:
        return "must not contain NUL characters"
    return None


def parse_command(s: Fields) -> tuple[str, ...] | str:
    """``shell.command``: a non-empty argv list, or a non-empty string for ``/bin/sh -c``."""
    value = s.raw("command")
    if isinstance(value, str):
        if not value.strip():
            s.error("command", "must not be empty")
        elif "\0" in value:
            s.error("command", "must not contain NUL characters")
        return value
    items = s.items("command")
    if items is None:
        if value is None:
            s.missing("command")
        return ()
    if not items:
        s.error("command", "must not be empty")
    argv: list[str] = []
    for i, (path, item) in enumerate(items):
        if not isinstance(item, str):
            s.problems.add(path, f"must be a string, not {type_name(item)}")
        elif "\0" in item:
            s.problems.add(path, "must not contain NUL characters")
        elif i == 0 and not item:
            s.problems.add(path, "the program must not be empty")
        else:
            argv.append(item)
    return tuple(argv)
