"""The sections of a job document: enums, typed sections and their parsers.

Each section is a frozen dataclass with a ``to_doc()`` giving its canonical
document, and a ``parse_<section>(f)`` reading it from the job document with
field-path errors (see ``scheduler.fields``). ``scheduler.model`` assembles
them into a ``Job``; import them from there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from scheduler.duration import format_duration
from scheduler.fields import Fields
from scheduler.jobrules import (
    check_cwd,
    check_env_name,
    check_env_value,
    check_header_name,
    check_header_value,
    check_name,
    check_regex,
    check_tag_key,
    check_url,
    parse_command,
    parse_size,
)

__all__ = [
    "DEFAULT_ALERT_EVENTS",
    "HTTP_METHODS",
    "AlertEvent",
    "Alerts",
    "Catchup",
    "CatchupPolicy",
    "Concurrency",
    "Delivery",
    "DependsOn",
    "DependsOnCondition",
    "ExecutorKind",
    "History",
    "HttpSpec",
    "Retries",
    "SHELL_USER_PROCESSES",
    "ShellLimits",
    "ShellSpec",
    "Target",
    "parse_alerts",
    "parse_catchup",
    "parse_depends_on",
    "parse_history",
    "parse_http",
    "parse_retries",
    "parse_shell",
    "parse_target",
]


class ExecutorKind(enum.StrEnum):
    HTTP = "http"
    SHELL = "shell"


class Concurrency(enum.StrEnum):
    ALLOW = "allow"
    FORBID = "forbid"
    REPLACE = "replace"


class Delivery(enum.StrEnum):
    AT_LEAST_ONCE = "at-least-once"
    AT_MOST_ONCE = "at-most-once"


class CatchupPolicy(enum.StrEnum):
    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class DependsOnCondition(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    ANY = "any"


class AlertEvent(enum.StrEnum):
    """Declaration order is the canonical order of ``alerts.on``."""

    FAILURE = "failure"
    RECOVERY = "recovery"
    MISSED = "missed"
    DEAD = "dead"
    LATE = "late"
    DURATION = "duration"
    DUPLICATE = "duplicate"


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
DEFAULT_ALERT_EVENTS = (AlertEvent.FAILURE, AlertEvent.RECOVERY, AlertEvent.MISSED, AlertEvent.DEAD)


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSpec:
    url: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    expect_status: tuple[int, ...] = ()  # sorted, unique; empty: any 2xx
    expect_body: str | None = None  # a regex searched in the response body

    def to_doc(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "method": self.method,
            "headers": dict(sorted(self.headers.items())),
            "body": self.body,
            "expect_status": list(self.expect_status),
            "expect_body": self.expect_body,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellLimits:
    """``shell.limits``: resource limits set (``setrlimit``) in the job's process before it runs.

    ``processes`` is RLIMIT_NPROC, which the kernel counts per user: all processes and
    threads of the user the job runs as (``--shell-user``), not of this job alone, and it
    does not bind root. Unset, it is ``SHELL_USER_PROCESSES`` when jobs run as a
    ``--shell-user`` and no limit otherwise (the count would then include everything the
    agent's own user runs, the agent's threads too). ``memory`` (bytes) is RLIMIT_DATA, each process's private writable
    memory (heap and anonymous maps, not shared libraries or reserved address space).
    ``cpu`` is RLIMIT_CPU in seconds of CPU time per process; unset, the attempt's
    ``timeout`` is the bound. ``open_files`` is RLIMIT_NOFILE. A limit is never raised
    above the agent's own hard limit.
    """

    processes: int | None = None
    memory: int = 1 << 30
    cpu: int | None = None
    open_files: int = 1024

    def to_doc(self) -> dict[str, Any]:
        return {"processes": self.processes, "memory": self.memory, "cpu": self.cpu, "open_files": self.open_files}


SHELL_LIMIT_FIELDS = ("processes", "memory", "cpu", "open_files")
SHELL_USER_PROCESSES = 1024
"""``shell.limits.processes`` when unset and jobs run as a ``--shell-user``."""
_MAX_PROCESSES = 1 << 22  # the kernel's pid_max ceiling
_MAX_OPEN_FILES = 1 << 20  # the kernel's default nr_open
_MIN_MEMORY = 1 << 20  # below this not even /bin/sh starts


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellSpec:
    command: tuple[str, ...] | str  # argv, or a string for /bin/sh -c
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    limits: ShellLimits = field(default_factory=ShellLimits)

    def to_doc(self) -> dict[str, Any]:
        command: list[str] | str = (
            self.command if isinstance(self.command, str) else list(self.command)
        )
        doc: dict[str, Any] = {"command": command, "env": dict(sorted(self.env.items())), "cwd": self.cwd}
        # Default limits stay out of the document, so documents stored before limits
        # existed read back byte-equal and replicas' snapshots keep agreeing.
        if self.limits != ShellLimits():
            doc["limits"] = self.limits.to_doc()
        return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class Retries:
    max: int = 0
    backoff: float = 10.0
    factor: float = 2.0
    max_backoff: float = 300.0

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        # Past max_backoff the exponent only risks float overflow; stop growing there.
        delay = self.backoff
        for _ in range(max(0, retry - 1)):
            if delay >= self.max_backoff:
                break
            delay *= self.factor
        return min(self.max_backoff, delay)

    def to_doc(self) -> dict[str, Any]:
        factor: float = int(self.factor) if self.factor.is_integer() else self.factor
        return {
            "max": self.max,
            "backoff": format_duration(self.backoff),
            "factor": factor,
            "max_backoff": format_duration(self.max_backoff),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Catchup:
    policy: CatchupPolicy = CatchupPolicy.LATEST
    window: float = 3600.0

    def to_doc(self) -> dict[str, Any]:
        return {"policy": self.policy.value, "window": format_duration(self.window)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    tags: dict[str, str] = field(default_factory=dict)
    count: int = 1

    def to_doc(self) -> dict[str, Any]:
        return {"tags": dict(sorted(self.tags.items())), "count": self.count}


@dataclass(frozen=True, slots=True, kw_only=True)
class DependsOn:
    job: str
    on: DependsOnCondition = DependsOnCondition.SUCCESS

    def to_doc(self) -> dict[str, Any]:
        return {"job": self.job, "on": self.on.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerts:
    webhook: str | None = None
    on: tuple[AlertEvent, ...] = DEFAULT_ALERT_EVENTS  # unique, in AlertEvent order
    after_failures: int = 1
    late_after: float = 60.0

    def to_doc(self) -> dict[str, Any]:
        return {
            "webhook": self.webhook,
            "on": [e.value for e in self.on],
            "after_failures": self.after_failures,
            "late_after": format_duration(self.late_after),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """How much of a job's run history is kept: at most ``keep`` records, and none whose
    attempt ended more than ``max_age`` seconds ago (None: kept by count alone). Attempts in
    flight and dead letters are kept whatever their age or count."""

    keep: int = 100
    max_age: float | None = None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"keep": self.keep}
        if self.max_age is not None:
            doc["max_age"] = format_duration(self.max_age)
        return doc


def parse_http(f: Fields) -> HttpSpec | None:
    s = f.section("http", ("url", "method", "headers", "body", "expect_status", "expect_body"))
    if s is None:
        return None
    url = s.checked("url", check_url, required=True)
    method = s.string("method", "POST") or "POST"
    if method.upper() not in HTTP_METHODS:
        s.error("method", f"must be one of {', '.join(HTTP_METHODS)}, not {method!r}")
    return HttpSpec(
        url=url or "",
        method=method.upper(),
        headers=s.string_map(
            "headers", check_key=check_header_name, check_value=check_header_value
        ),
        body=s.string("body"),
        expect_status=s.int_set("expect_status", lo=100, hi=599),
        expect_body=s.checked("expect_body", check_regex),
    )


def parse_shell(f: Fields) -> ShellSpec | None:
    s = f.section("shell", ("command", "env", "cwd", "limits"))
    if s is None:
        return None
    return ShellSpec(
        command=parse_command(s),
        env=s.string_map("env", check_key=check_env_name, check_value=check_env_value),
        cwd=s.checked("cwd", check_cwd),
        limits=parse_shell_limits(s),
    )


def parse_shell_limits(s: Fields) -> ShellLimits:
    """``shell.limits``; every field optional, the defaults of ``ShellLimits`` otherwise."""
    lim = s.section("limits", SHELL_LIMIT_FIELDS)
    if lim is None:
        return ShellLimits()
    default = ShellLimits()
    memory = default.memory
    raw_memory = lim.raw("memory")
    if raw_memory is not None:
        parsed = parse_size(raw_memory)
        if isinstance(parsed, str):
            lim.error("memory", parsed)
        elif parsed < _MIN_MEMORY:
            lim.error("memory", "must be at least 1Mi")
        else:
            memory = parsed
    cpu: int | None = None
    if lim.has("cpu"):
        seconds = lim.duration("cpu", 0.0, positive=True)
        cpu = int(seconds) if seconds > 0 else None
    processes: int | None = None
    if lim.has("processes"):
        processes = lim.integer("processes", 1, lo=1, hi=_MAX_PROCESSES)
    return ShellLimits(
        processes=processes,
        memory=memory,
        cpu=cpu,
        open_files=lim.integer("open_files", default.open_files, lo=1, hi=_MAX_OPEN_FILES),
    )


def parse_retries(f: Fields) -> Retries:
    s = f.section("retries", ("max", "backoff", "factor", "max_backoff"))
    if s is None:
        return Retries()
    max_ = s.integer("max", 0, lo=0, hi=100)
    backoff = s.duration("backoff", 10.0)
    factor = s.number("factor", 2.0, lo=1, hi=100)
    # Unset, the cap is 5m or the first backoff if that is longer.
    max_backoff = s.duration("max_backoff", max(300.0, backoff))
    if max_backoff < backoff:
        s.error("max_backoff", "must be at least backoff")
    return Retries(max=max_, backoff=backoff, factor=factor, max_backoff=max_backoff)


def parse_catchup(f: Fields) -> Catchup:
    s = f.section("catchup", ("policy", "window"))
    if s is None:
        return Catchup()
    return Catchup(
        policy=s.choice("policy", CatchupPolicy, CatchupPolicy.LATEST),
        window=s.duration("window", 3600.0),
    )


def parse_target(f: Fields) -> Target:
    s = f.section("target", ("tags", "count"))
    if s is None:
        return Target()
    return Target(
        tags=s.string_map("tags", check_key=check_tag_key), count=s.integer("count", 1, lo=1, hi=100)
    )


def parse_depends_on(f: Fields, job_name: str) -> DependsOn | None:
    s = f.section("depends_on", ("job", "on"))
    if s is None:
        return None
    dep = s.string("job", required=True)
    if dep is not None and (problem := check_name(dep)):
        s.error("job", problem)
    elif dep is not None and dep == job_name:
        s.error("job", "a job cannot depend on itself")
    on = s.choice("on", DependsOnCondition, DependsOnCondition.SUCCESS)
    return DependsOn(job=dep or "", on=on)


def parse_alerts(f: Fields) -> Alerts:
    s = f.section("alerts", ("webhook", "on", "after_failures", "late_after"))
    if s is None:
        return Alerts()
    return Alerts(
        webhook=s.checked("webhook", check_url),
        on=s.enum_set("on", AlertEvent, DEFAULT_ALERT_EVENTS),
        after_failures=s.integer("after_failures", 1, lo=1, hi=10000),
        late_after=s.duration("late_after", 60.0),
    )


HISTORY_MAX_AGE_RANGE = (60.0, 3650 * 86400.0)
"""``history.max_age`` bounds: a minute (records are swept once a minute) to ten years."""


def parse_history(f: Fields) -> History:
    s = f.section("history", ("keep", "max_age"))
    if s is None:
        return History()
    keep = s.integer("keep", 100, lo=1, hi=10000)
    max_age: float | None = None
    if s.data.get("max_age") is not None:
        seconds = s.duration("max_age", -1.0)  # -1: not a duration, already reported
        lo, hi = HISTORY_MAX_AGE_RANGE
        if lo <= seconds <= hi:
            max_age = seconds
        elif seconds != -1.0:
            s.error("max_age", f"must be between {format_duration(lo)} and {format_duration(hi)}")
    return History(keep=keep, max_age=max_age)
