"""The job document: validation with field paths, defaults, canonical round trip."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.commands import PutJob, decode_command, encode_command
from scheduler.duration import format_duration, parse_duration
from scheduler.errors import ValidationFailed
from scheduler.instants import us
from scheduler.model import (
    AlertEvent,
    CatchupPolicy,
    Concurrency,
    Delivery,
    DependsOnCondition,
    ExecutorKind,
    HttpSpec,
    Job,
    Retries,
    ShellSpec,
    parse_job,
)
from scheduler.planner import next_slot_us
from scheduler.schedule import parse_schedule

MINIMAL: dict[str, Any] = {
    "name": "ping",
    "schedule": "*/5 * * * *",
    "executor": "http",
    "http": {"url": "https://example.test/hook"},
}

# SPEC section 1, as a dict. The SPEC shows both executor sections to document
# them; a real job has only the one its executor names (see the test below).
SPEC_EXAMPLE: dict[str, Any] = {
    "name": "nightly-report",
    "description": "...",
    "labels": {"team": "billing"},
    "schedule": "0 2 * * *",
    "timezone": "Europe/Berlin",
    "paused": False,
    "starts_at": None,
    "ends_at": None,
    "executor": "http",
    "http": {
        "url": "https://example.test/hook",
        "method": "POST",
        "headers": {"Authorization": "Bearer ..."},
        "body": '{"report": "nightly"}',
        "expect_status": [200, 204],
        "expect_body": "ok",
    },
    "shell": {
        "command": ["/usr/local/bin/report", "--full"],
        "env": {"REPORT_DIR": "/var/reports"},
        "cwd": "/srv",
    },
    "timeout": "5m",
    "retries": {"max": 3, "backoff": "10s", "factor": 2, "max_backoff": "5m"},
    "concurrency": "forbid",
    "delivery": "at-least-once",
    "catchup": {"policy": "latest", "window": "1h"},
    "target": {"tags": {"zone": "a"}, "count": 1},
    "depends_on": {"job": "extract", "on": "success"},
    "alerts": {
        "webhook": "https://hooks.example.test/raftcron",
        "on": ["failure", "recovery", "missed", "dead"],
        "after_failures": 1,
    },
    "history": {"keep": 100},
}


def spec_http() -> dict[str, Any]:
    doc = copy.deepcopy(SPEC_EXAMPLE)
    del doc["shell"]
    return doc


def spec_shell() -> dict[str, Any]:
    doc = copy.deepcopy(SPEC_EXAMPLE)
    del doc["http"]
    doc["executor"] = "shell"
    return doc


def problems(doc: object, **kw: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationFailed) as info:
        parse_job(doc, **kw)
    assert info.value.status == 400 and info.value.code == "invalid"
    return info.value.details


def fields_of(doc: object, **kw: Any) -> list[str]:
    return [d["field"] for d in problems(doc, **kw)]


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with the dotted ``path`` set (``...`` deletes it)."""
    doc = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return doc


# --- valid documents and defaults --------------------------------------------


def test_minimal_http_job_gets_every_default() -> None:
    job = parse_job(MINIMAL)
    assert job.to_doc() == {
        "name": "ping",
        "description": "",
        "labels": {},
        "schedule": "*/5 * * * *",
        "timezone": "UTC",
        "paused": False,
        "starts_at": None,
        "ends_at": None,
        "executor": "http",
        "http": {
            "url": "https://example.test/hook",
            "method": "POST",
            "headers": {},
            "body": None,
            "expect_status": [],
            "expect_body": None,
        },
        "timeout": "1h",
        "retries": {"max": 0, "backoff": "10s", "factor": 2, "max_backoff": "5m"},
        "concurrency": "allow",
        "delivery": "at-least-once",
        "catchup": {"policy": "latest", "window": "1h"},
        "target": {"tags": {}, "count": 1},
        "depends_on": None,
        "alerts": {
            "webhook": None,
            "on": ["failure", "recovery", "missed", "dead"],
            "after_failures": 1,
            "late_after": "1m",
        },
        "history": {"keep": 100},
    }
    assert job.timeout == 3600.0 and job.retries == Retries()
    assert job.http == HttpSpec(url="https://example.test/hook")  # any 2xx: test_executors_http


def test_spec_example_as_an_http_job() -> None:
    job = parse_job(spec_http())
    assert job.name == "nightly-report" and job.tz.key == "Europe/Berlin"
    assert job.schedule == parse_schedule("0 2 * * *")
    assert job.executor is ExecutorKind.HTTP and job.shell is None
    assert job.http is not None and job.http.expect_status == (200, 204)
    assert job.http.headers == {"Authorization": "Bearer ..."}
    assert job.timeout == 300.0
    assert job.retries == Retries(max=3, backoff=10.0, factor=2.0, max_backoff=300.0)
    assert job.concurrency is Concurrency.FORBID and job.delivery is Delivery.AT_LEAST_ONCE
    assert job.catchup.policy is CatchupPolicy.LATEST and job.catchup.window == 3600.0
    assert job.target.tags == {"zone": "a"} and job.target.count == 1
    assert job.depends_on is not None and job.depends_on.job == "extract"
    assert job.depends_on.on is DependsOnCondition.SUCCESS
    assert job.alerts.on == (
        AlertEvent.FAILURE,
        AlertEvent.RECOVERY,
        AlertEvent.MISSED,
        AlertEvent.DEAD,
    )
    assert job.alerts.late_after == 60.0 and job.history.keep == 100
    assert parse_job(job.to_doc()) == job


def test_spec_example_as_a_shell_job() -> None:
    job = parse_job(spec_shell())
    assert job.http is None
    assert job.shell == ShellSpec(
        command=("/usr/local/bin/report", "--full"), env={"REPORT_DIR": "/var/reports"}, cwd="/srv"
    )
    assert job.spec_doc() == {
        "command": ["/usr/local/bin/report", "--full"],
        "env": {"REPORT_DIR": "/var/reports"},
        "cwd": "/srv",
    }
    assert "http" not in job.to_doc() and parse_job(job.to_doc()) == job


def test_spec_example_verbatim_names_the_extra_section() -> None:
    assert problems(SPEC_EXAMPLE) == [
        {"field": "shell", "message": "must be absent when executor is http"}
    ]


def test_a_shell_command_may_be_a_string() -> None:
    doc = with_(spec_shell(), "shell.command", "report --full | gzip > /tmp/r.gz")
    shell = parse_job(doc).shell
    assert shell is not None and shell.command == "report --full | gzip > /tmp/r.gz"


def test_null_means_the_default() -> None:
    doc = dict(
        MINIMAL,
        description=None,
        labels=None,
        timezone=None,
        paused=None,
        retries=None,
        catchup={"policy": None},
        alerts={"on": None},
        history=None,
        depends_on=None,
    )
    assert parse_job(doc) == parse_job(MINIMAL)


def test_depends_on_makes_the_schedule_optional() -> None:
    doc = with_(with_(MINIMAL, "schedule", ...), "depends_on", {"job": "extract"})
    job = parse_job(doc)
    assert job.schedule.expr == "@manually"
    assert job.depends_on is not None and job.depends_on.on is DependsOnCondition.SUCCESS


def test_the_url_name_fills_in_and_must_match() -> None:
    assert parse_job(with_(MINIMAL, "name", ...), name="from-url").name == "from-url"
    assert parse_job(MINIMAL, name="ping").name == "ping"
    assert problems(MINIMAL, name="other") == [
        {"field": "name", "message": "does not match the name in the URL ('other')"}
    ]
    assert fields_of(with_(MINIMAL, "name", ...), name="Bad Name") == ["name"]


def test_lists_are_canonical_sets() -> None:
    doc = with_(MINIMAL, "http.expect_status", [204, 200, 204])
    doc = with_(doc, "alerts", {"on": ["late", "failure", "late"]})
    job = parse_job(doc)
    assert job.http is not None and job.http.expect_status == (200, 204)
    assert job.alerts.on == (AlertEvent.FAILURE, AlertEvent.LATE)


def test_values_are_written_back_canonically() -> None:
    doc = dict(
        MINIMAL,
        schedule="@every 90s",
        timeout=5400,
        starts_at="2026-12-01T11:00:00+01:00",
        ends_at="2027-01-01T00:00:00.250Z",
        http={"url": "http://h.test", "method": "get"},
        retries={"factor": 1.5, "backoff": "0s"},
    )
    out = parse_job(doc).to_doc()
    assert out["schedule"] == "@every 1m30s" and out["timeout"] == "1h30m"
    assert out["starts_at"] == "2026-12-01T10:00:00Z"
    assert out["ends_at"] == "2027-01-01T00:00:00.250000Z"
    assert out["http"]["method"] == "GET" and out["retries"]["factor"] == 1.5
    assert out["retries"]["backoff"] == "0s"


def test_to_doc_is_stable_json_and_msgpack_friendly() -> None:
    job = parse_job(spec_http())
    first = job.to_doc()
    assert job.to_doc() == first
    assert json.dumps(first) == json.dumps(job.to_doc())  # same key order too
    assert list(first) == list(parse_job(first).to_doc())
    packed = msgpack.packb(first)
    assert parse_job(msgpack.unpackb(packed)) == job
    assert msgpack.packb(parse_job(msgpack.unpackb(packed)).to_doc()) == packed


def test_next_slot_honours_starts_at_and_ends_at() -> None:
    doc = dict(
        MINIMAL,
        schedule="0 * * * *",
        starts_at="2026-05-01T10:30:00Z",
        ends_at="2026-05-01T12:00:00Z",
    )
    job = parse_job(doc)
    anchor = us(datetime(2026, 1, 1, tzinfo=UTC))
    at = datetime(2026, 5, 1, 0, 0, tzinfo=UTC)
    assert next_slot_us(job, anchor, us(at)) == us(datetime(2026, 5, 1, 11, tzinfo=UTC))
    assert next_slot_us(job, anchor, us(at.replace(hour=11))) == us(datetime(2026, 5, 1, 12, tzinfo=UTC))
    assert next_slot_us(job, anchor, us(at.replace(hour=12))) is None
    on_start = parse_job(dict(doc, starts_at="2026-05-01T11:00:00Z"))
    assert next_slot_us(on_start, anchor, us(at)) == us(datetime(2026, 5, 1, 11, tzinfo=UTC))


def test_an_unset_max_backoff_is_never_below_backoff() -> None:
    assert parse_job(dict(MINIMAL, retries={"backoff": "10m"})).retries.max_backoff == 600.0
    assert parse_job(dict(MINIMAL, retries={"backoff": "1m"})).retries.max_backoff == 300.0


def test_retry_delays_grow_to_their_cap() -> None:
    r = Retries(max=5, backoff=10, factor=3, max_backoff=60)
    assert [r.delay(n) for n in range(1, 5)] == [10, 30, 60, 60]


# --- errors, each with its exact field path ---------------------------------

RULES = [
    # (path to set, value (... deletes), field reported, words in the message)
    ("name", ..., "name", "is required"),
    ("name", "Nightly", "name", "a-z"),
    ("name", "-x", "name", "starting with"),
    ("name", "x" * 64, "name", "1 to 63"),
    ("name", 7, "name", "must be a string"),
    ("description", "d" * 2049, "description", "2048"),
    ("description", 5, "description", "must be a string"),
    ("labels", ["team"], "labels", "must be an object"),
    ("labels", {"team": 1}, "labels.team", "must be a string"),
    ("labels", {"team": "v" * 64}, "labels.team", "63"),
    ("labels", {"bad key": "v"}, "labels.bad key", "label key"),
    ("labels", {"-team": "v"}, "labels.-team", "label key"),
    ("labels", {"Example.com/team": "v"}, "labels.Example.com/team", "prefix"),
    ("schedule", ..., "schedule", "is required"),
    ("schedule", "61 * * * *", "schedule", "invalid cron"),
    ("schedule", "@every 0s", "schedule", "at least 1s"),
    ("schedule", 5, "schedule", "must be a string"),
    ("timezone", "Mars/Olympus", "timezone", "unknown time zone"),
    ("timezone", "localtime", "timezone", "depends on the host"),
    ("timezone", "Europe", "timezone", "unknown time zone"),
    ("timezone", "../etc/passwd", "timezone", "unknown time zone"),
    ("paused", "false", "paused", "must be a boolean"),
    ("paused", 0, "paused", "must be a boolean"),
    ("starts_at", "2026-12-01 10:00", "starts_at", "RFC 3339"),
    ("starts_at", "2026-12-01T10:00:00", "starts_at", "RFC 3339"),
    ("ends_at", 1767225600, "ends_at", "RFC 3339"),
    ("executor", ..., "executor", "is required"),
    ("executor", "grpc", "executor", "must be one of http, shell"),
    ("http", ..., "http", "is required when executor is http"),
    ("http", "https://x.test", "http", "must be an object"),
    ("http.url", ..., "http.url", "is required"),
    ("http.url", "ftp://example.test/x", "http.url", "http:// or https://"),
    ("http.url", "https://", "http.url", "host"),
    ("http.url", "https://exa mple.test", "http.url", "spaces"),
    ("http.url", "https://example.test:99999/", "http.url", "Port out of range"),
    ("http.method", "FETCH", "http.method", "GET, POST"),
    ("http.headers", {"Bad Header": "x"}, "http.headers.Bad Header", "header name"),
    ("http.headers", {"X-A": "a\r\nb"}, "http.headers.X-A", "CR, LF"),
    ("http.headers", {"Idempotency-Key": "k"}, "http.headers.Idempotency-Key", "set by raftcron"),
    ("http.headers", {"x-raftcron-job": "j"}, "http.headers.x-raftcron-job", "set by raftcron"),
    ("http.body", {"a": 1}, "http.body", "must be a string"),
    ("http.expect_status", 200, "http.expect_status", "must be a list"),
    ("http.expect_status", [200, 600], "http.expect_status[1]", "between 100 and 599"),
    ("http.expect_status", [200, "204"], "http.expect_status[1]", "must be an integer"),
    ("http.expect_status", [True], "http.expect_status[0]", "must be an integer"),
    ("http.expect_body", "(unclosed", "http.expect_body", "regular expression"),
    ("http.follow", True, "http.follow", "unknown field"),
    ("timeout", "0s", "timeout", "longer than 0s"),
    ("timeout", "5 minutes", "timeout", "invalid duration"),
    ("timeout", -5, "timeout", "negative"),
    ("timeout", True, "timeout", "boolean"),
    ("timeout", "1.5s", "timeout", "invalid duration"),
    ("retries", 3, "retries", "must be an object"),
    ("retries.max", "3", "retries.max", "must be an integer"),
    ("retries.max", True, "retries.max", "must be an integer, not a boolean"),
    ("retries.max", 2.5, "retries.max", "must be an integer"),
    ("retries.max", 101, "retries.max", "between 0 and 100"),
    ("retries.max", -1, "retries.max", "between 0 and 100"),
    ("retries.backoff", "soon", "retries.backoff", "invalid duration"),
    ("retries.factor", 0.5, "retries.factor", "at least 1"),
    ("retries.factor", True, "retries.factor", "must be a number"),
    ("retries.factor", float("inf"), "retries.factor", "finite"),
    ("retries.max_backoff", "5s", "retries.max_backoff", "at least backoff"),
    ("retries.maxx", 2, "retries.maxx", "unknown field"),
    ("concurrency", "queue", "concurrency", "allow, forbid, replace"),
    ("delivery", "exactly-once", "delivery", "at-least-once, at-most-once"),
    ("catchup.policy", "some", "catchup.policy", "none, latest, all"),
    ("catchup.window", "forever", "catchup.window", "invalid duration"),
    ("target.tags", {"zone": 1}, "target.tags.zone", "must be a string"),
    ("target.tags", {"a=b": "c"}, "target.tags.a=b", "tag name"),
    ("target.count", 0, "target.count", "between 1 and 100"),
    ("target.count", 101, "target.count", "between 1 and 100"),
    ("retries.factor", 101, "retries.factor", "at most 100"),
    ("target.count", True, "target.count", "not a boolean"),
    ("depends_on", "extract", "depends_on", "must be an object"),
    ("depends_on", {"on": "success"}, "depends_on.job", "is required"),
    ("depends_on", {"job": "Extract"}, "depends_on.job", "a-z"),
    ("depends_on", {"job": "ping"}, "depends_on.job", "itself"),
    ("depends_on", {"job": "x", "on": "done"}, "depends_on.on", "success, failure, any"),
    ("alerts.webhook", "mailto:ops@example.test", "alerts.webhook", "http:// or https://"),
    ("alerts.on", "failure", "alerts.on", "must be a list"),
    ("alerts.on", ["failure", "boom"], "alerts.on[1]", "must be one of failure"),
    ("alerts.after_failures", 0, "alerts.after_failures", "between 1 and 10000"),
    ("alerts.late_after", "late", "alerts.late_after", "invalid duration"),
    ("history.keep", 0, "history.keep", "between 1 and 10000"),
    ("history.keep", 10001, "history.keep", "between 1 and 10000"),
    ("history.keep", False, "history.keep", "not a boolean"),
    ("history.days", 3, "history.days", "unknown field"),
    ("owner", "me", "owner", "unknown field"),
]


@pytest.mark.parametrize(("path", "value", "field", "words"), RULES)
def test_each_rule_reports_its_field(path: str, value: Any, field: str, words: str) -> None:
    got = problems(with_(MINIMAL, path, value))
    assert [d["field"] for d in got] == [field], got
    assert words in got[0]["message"]


SHELL = {"name": "sh", "schedule": "@hourly", "executor": "shell", "shell": {"command": ["true"]}}

SHELL_RULES = [
    ("shell", ..., "shell", "is required when executor is shell"),
    ("http", {"url": "https://x.test"}, "http", "must be absent when executor is shell"),
    ("shell.command", ..., "shell.command", "is required"),
    ("shell.command", [], "shell.command", "must not be empty"),
    ("shell.command", "   ", "shell.command", "must not be empty"),
    ("shell.command", ["/bin/x", 3], "shell.command[1]", "must be a string"),
    ("shell.command", ["", "x"], "shell.command[0]", "program must not be empty"),
    ("shell.command", ["a\0b"], "shell.command[0]", "NUL"),
    ("shell.command", {"argv": []}, "shell.command", "must be a list"),
    ("shell.env", {"1BAD": "x"}, "shell.env.1BAD", "environment variable name"),
    ("shell.env", {"RAFTCRON_JOB": "x"}, "shell.env.RAFTCRON_JOB", "set by raftcron"),
    ("shell.env", {"OK": 1}, "shell.env.OK", "must be a string"),
    ("shell.cwd", "srv", "shell.cwd", "absolute path"),
    ("shell.cwd", 1, "shell.cwd", "must be a string"),
    ("shell.user", "root", "shell.user", "unknown field"),
]


@pytest.mark.parametrize(("path", "value", "field", "words"), SHELL_RULES)
def test_each_shell_rule_reports_its_field(path: str, value: Any, field: str, words: str) -> None:
    got = problems(with_(SHELL, path, value))
    assert [d["field"] for d in got] == [field], got
    assert words in got[0]["message"]


@pytest.mark.parametrize("doc", [None, [], "job", 3, True])
def test_a_document_that_is_not_an_object(doc: object) -> None:
    assert fields_of(doc) == ["$"]


def test_ends_at_must_follow_starts_at() -> None:
    doc = dict(MINIMAL, starts_at="2026-01-02T00:00:00Z", ends_at="2026-01-02T01:00:00+01:00")
    assert problems(doc) == [{"field": "ends_at", "message": "must be after starts_at"}]


@pytest.mark.parametrize(("field", "value"), [
    ("starts_at", "9999-12-31T23:59:59Z"),  # issue 12: planning an hourly job from here overflowed
    ("ends_at", "9001-01-01T00:00:00Z"),
    ("starts_at", "1969-12-31T23:59:59Z"),
    ("schedule", "@at 9500-06-01T00:00:00Z"),
    ("schedule", "@at 1960-06-01T00:00:00+02:00"),
])
def test_instants_beyond_year_9000_or_before_1970_are_refused_naming_the_field(field: str, value: str) -> None:
    [problem] = problems(dict(MINIMAL, **{field: value}))
    assert problem["field"] == field
    assert "out of range" in problem["message"] and "end of year 9000" in problem["message"]


def test_instants_at_the_bounds_are_accepted() -> None:
    job = parse_job(dict(MINIMAL, starts_at="1970-01-01T00:00:00Z", ends_at="9000-12-31T23:59:59.999999Z"))
    assert job.ends_at == datetime(9000, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    assert parse_job(dict(MINIMAL, schedule="@at 9000-12-31T23:00:00Z")).schedule.at is not None


def test_every_problem_is_reported_at_once_in_document_order() -> None:
    doc = {
        "name": "Bad",
        "labels": {"team": 5},
        "schedule": "* * *",
        "timezone": "Nowhere/Land",
        "executor": "http",
        "http": {"url": "gopher://x", "expect_status": [99], "extra": 1},
        "shell": {"command": "x"},
        "retries": {"max": "3", "factor": True, "jitter": 1},
        "target": {"count": True},
        "alerts": {"on": ["nope"]},
        "history": {"keep": 0},
        "nope": 1,
    }
    assert fields_of(doc) == [
        "nope",
        "name",
        "labels.team",
        "schedule",
        "timezone",
        "shell",
        "http.extra",
        "http.url",
        "http.expect_status[0]",
        "retries.jitter",
        "retries.max",
        "retries.factor",
        "target.count",
        "alerts.on[0]",
        "history.keep",
    ]


def test_without_a_valid_executor_both_sections_are_still_checked() -> None:
    doc = {"name": "x", "schedule": "@daily", "http": {"url": 1}, "shell": {"cwd": "rel"}}
    assert fields_of(doc) == ["executor", "http.url", "shell.command", "shell.cwd"]


def test_non_string_keys_are_reported() -> None:
    assert fields_of(dict(MINIMAL, labels={1: "a"})) == ["labels.1"]
    assert fields_of({**MINIMAL, 5: "x"}) == ["5"]


def test_yaml_1_1_on_keys_are_caught() -> None:
    # PyYAML reads a bare `on:` key as True; the document must say "on".
    assert fields_of(dict(MINIMAL, depends_on={"job": "x", True: "any"})) == ["depends_on.True"]


def test_a_job_may_not_depend_on_itself_through_the_url_name() -> None:
    doc = {k: v for k, v in MINIMAL.items() if k != "name"}
    assert fields_of(dict(doc, depends_on={"job": "ping"}), name="ping") == ["depends_on.job"]


# --- durations ----------------------------------------------------------------

DURATIONS = [
    ("90s", 90), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("1d2h3m4s", 93784),
    (90, 90), ("90", 90), (0, 0), ("0s", 0), (3600.0, 3600),
]  # fmt: skip


@pytest.mark.parametrize(("text", "seconds"), DURATIONS)
def test_durations_parse(text: object, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (90, "1m30s"), (3600, "1h"), (5400, "1h30m"), (90061, "1d1h1m1s")],
)
def test_durations_format(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "bad", ["", "s", "5", "-5s", "5m1h", "5ms", "5 m", True, None, [], 1.5]
)
def test_bad_durations(bad: object) -> None:
    if bad == "5":
        assert parse_duration(bad) == 5  # plain integer seconds
        return
    with pytest.raises(ValueError):
        parse_duration(bad)


# --- the round trip, for generated jobs ---------------------------------------

names = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,62}", fullmatch=True)
short = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
no_nul = short.filter(lambda v: "\0" not in v)
label_keys = st.from_regex(
    r"([a-z0-9]{1,8}(\.[a-z0-9]{1,8})?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?",
    fullmatch=True,
)
header_names = st.from_regex(r"X-[A-Za-z0-9-]{1,10}", fullmatch=True)
env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: not k.startswith("RAFTCRON_")
)
durations = st.integers(0, 10 * 86400)
# The same duration written as seconds, as a numeric string, or as "1h30m".
duration_values = durations.flatmap(lambda s: st.sampled_from([s, str(s), format_duration(s)]))
instants = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=2))]),
)
schedules = st.sampled_from(
    [
        "*/5 * * * *", "0 2 * * *", "*/10 * * * * *", "@hourly", "@annually", "@every 90s",
        "@at 2026-12-01T11:00:00+01:00", "@manually", "0 9 * * mon-fri",
    ]
) | st.integers(1, 10**6).map(lambda s: f"@every {s}s")  # fmt: skip
urls = st.sampled_from(
    ["https://example.test/hook", "http://10.0.0.1:8080/x?y=1", "https://h.test"]
)
zones = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kathmandu"])


def some_of(d: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``d`` without any subset of its keys, so defaults get exercised too."""
    return st.sets(st.sampled_from(sorted(d))).map(
        lambda drop: {k: v for k, v in d.items() if k not in drop}
    )


http_sections = st.fixed_dictionaries(
    {"url": urls},
    optional={
        "method": st.sampled_from(["GET", "post", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
        "headers": st.dictionaries(
            header_names, short.filter(lambda v: not any(c in v for c in "\r\n\0")), max_size=3
        ),
        "body": st.none() | short,
        "expect_status": st.lists(st.integers(100, 599), max_size=4),
        "expect_body": st.none() | st.sampled_from(["ok", "^done$", r"\d+", ""]),
    },
)
argv = st.lists(no_nul, min_size=1, max_size=4).filter(lambda a: a[0] != "")
shell_sections = st.fixed_dictionaries(
    {"command": argv | st.sampled_from(["echo hi", "exit 3"])},
    optional={
        "env": st.dictionaries(env_names, no_nul, max_size=3),
        "cwd": st.none() | st.sampled_from(["/", "/srv", "/var/reports"]),
    },
)


@st.composite
def job_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid job document; optional fields are left out at random."""
    name = draw(names)
    executor = draw(st.sampled_from(["http", "shell"]))
    backoff = draw(durations)
    starts = draw(st.none() | instants)
    ends = None if starts is None else starts + timedelta(days=draw(st.integers(1, 99)))
    optional: dict[str, Any] = {
        "description": draw(short),
        "labels": draw(st.dictionaries(label_keys, st.text(max_size=63), max_size=3)),
        "schedule": draw(schedules),
        "timezone": draw(zones),
        "paused": draw(st.booleans()),
        "starts_at": None if starts is None else starts.isoformat(),
        "ends_at": None if ends is None else ends.isoformat(),
        "timeout": draw(duration_values.filter(lambda v: parse_duration(v) > 0)),
        "retries": draw(
            some_of(
                {
                    "max": draw(st.integers(0, 100)),
                    "backoff": backoff,
                    "factor": draw(st.integers(1, 5) | st.floats(1, 10)),
                    # 10s is backoff's default, for when backoff is left out
                    "max_backoff": max(backoff, 10) + draw(durations),
                }
            )
        ),
        "concurrency": draw(st.sampled_from(["allow", "forbid", "replace"])),
        "delivery": draw(st.sampled_from(["at-least-once", "at-most-once"])),
        "catchup": draw(
            some_of(
                {
                    "policy": draw(st.sampled_from(["none", "latest", "all"])),
                    "window": draw(duration_values),
                }
            )
        ),
        "target": draw(
            some_of(
                {
                    "tags": draw(
                        st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True), short)
                    ),
                    "count": draw(st.integers(1, 10)),
                }
            )
        ),
        "depends_on": draw(
            st.none()
            | st.fixed_dictionaries(
                {"job": names.filter(lambda n: n != name)},
                optional={"on": st.sampled_from(["success", "failure", "any"])},
            )
        ),
        "alerts": draw(
            some_of(
                {
                    "webhook": draw(st.none() | urls),
                    "on": draw(st.lists(st.sampled_from([e.value for e in AlertEvent]))),
                    "after_failures": draw(st.integers(1, 50)),
                    "late_after": draw(duration_values),
                }
            )
        ),
        "history": {"keep": draw(st.integers(1, 10000))},
    }
    doc = draw(some_of(optional))
    if "schedule" not in doc and doc.get("depends_on") is None:
        doc["schedule"] = "@daily"
    section = draw(http_sections if executor == "http" else shell_sections)
    return {"name": name, "executor": executor, executor: section, **doc}


@settings(max_examples=200, deadline=None)
@given(doc=job_docs())
def test_to_doc_and_parse_job_round_trip(doc: dict[str, Any]) -> None:
    job = parse_job(doc)
    canonical = job.to_doc()
    assert parse_job(canonical) == job
    assert parse_job(canonical).to_doc() == canonical
    assert job.to_doc() == canonical
    wire = json.loads(json.dumps(canonical))
    assert parse_job(wire) == job and wire == canonical
    assert parse_job(msgpack.unpackb(msgpack.packb(canonical))) == job
    # What State.offer rests on: the proposer's own command equals what replicas decode.
    cmd = PutJob(at_us=1, spec=canonical, expect_version=None)
    assert decode_command(encode_command(cmd)) == cmd


@settings(max_examples=100, deadline=None)
@given(
    doc=job_docs(),
    path=st.sampled_from(["retries.max", "history.keep", "target.count", "alerts.after_failures"]),
    flag=st.booleans(),
)
def test_a_boolean_is_never_an_integer(doc: dict[str, Any], path: str, flag: bool) -> None:
    assert fields_of(with_(doc, path, flag)) == [path]


def test_job_is_a_frozen_value() -> None:
    job = parse_job(MINIMAL)
    with pytest.raises(AttributeError):
        job.name = "other"  # type: ignore[misc]
    assert (
        Job(
            name="ping",
            schedule=parse_schedule("*/5 * * * *"),
            executor=ExecutorKind.HTTP,
            http=HttpSpec(url="https://example.test/hook"),
        )
        == job
    )
