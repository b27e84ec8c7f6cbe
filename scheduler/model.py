"""The job document (SPEC section 1): typed, validated, canonical.

``parse_job(doc)`` checks every field and raises one ``ValidationFailed``
naming every problem by its dotted field path (``http.url``, ``retries.max``,
``labels.team``, ``shell.command[1]``); a document that is not an object is
reported on the field ``"$"``. ``null`` means "not given" everywhere: the
default applies, or ``is required`` is reported.

``Job.to_doc()`` is the canonical document: every default filled in, keys in
a fixed order, maps sorted by key, durations as ``1h30m``, instants as RFC 3339
UTC (``...Z``), enums as their strings. Only the section of the job's executor
(``http`` or ``shell``) is present. ``parse_job(job.to_doc()) == job`` always
holds; this canonical document is what the replicated state stores and the API
returns. ``parse_job`` is deterministic (the state machine calls it in apply).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar, cast
from zoneinfo import ZoneInfo

import msgpack

from scheduler.duration import format_duration
from scheduler.errors import ValidationFailed
from scheduler.fields import Fields, Problems
from scheduler.instants import format_instant
from scheduler.jobrules import (
    check_instant,
    check_label_key,
    check_label_value,
    check_name,
    check_timezone,
)
from scheduler.schedule import MANUAL, Schedule, parse_schedule
from scheduler.sections import (
    DEFAULT_ALERT_EVENTS,
    HTTP_METHODS,
    AlertEvent,
    Alerts,
    Catchup,
    CatchupPolicy,
    Concurrency,
    Delivery,
    DependsOn,
    DependsOnCondition,
    ExecutorKind,
    History,
    HttpSpec,
    Retries,
    ShellSpec,
    Target,
    parse_alerts,
    parse_catchup,
    parse_depends_on,
    parse_history,
    parse_http,
    parse_retries,
    parse_shell,
    parse_target,
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
    "Job",
    "Policy",
    "Retries",
    "ShellSpec",
    "Target",
    "parse_job",
    "parse_policy",
    "stored_depends_on",
    "stored_policy",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A validated job. Treat the dict fields as read-only."""

    name: str
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    schedule: Schedule
    timezone: str = "UTC"
    paused: bool = False
    starts_at: datetime | None = None  # aware UTC; no slot before it
    ends_at: datetime | None = None  # aware UTC; no slot after it
    executor: ExecutorKind
    http: HttpSpec | None = None
    shell: ShellSpec | None = None
    timeout: float = 3600.0
    retries: Retries = field(default_factory=Retries)
    concurrency: Concurrency = Concurrency.ALLOW
    delivery: Delivery = Delivery.AT_LEAST_ONCE
    catchup: Catchup = field(default_factory=Catchup)
    target: Target = field(default_factory=Target)
    depends_on: DependsOn | None = None
    alerts: Alerts = field(default_factory=Alerts)
    history: History = field(default_factory=History)
    policy: Policy = field(init=False, repr=False, compare=False)  # derived from the four above

    def __post_init__(self) -> None:
        # Made once here: the ledger reads it at every claim, start and result (``Store.policy``).
        object.__setattr__(self, "policy", _kept(Policy(self.history.keep, self.retries, self.delivery, self.alerts)))

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def spec_doc(self) -> dict[str, Any]:
        """The executor's section (``http`` or ``shell``) as a canonical document."""
        spec = self.http if self.executor is ExecutorKind.HTTP else self.shell
        assert spec is not None
        return spec.to_doc()

    def to_doc(self) -> dict[str, Any]:
        """The canonical document (see the module docstring)."""
        doc: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "labels": _interned(dict(sorted(self.labels.items()))),
            "schedule": self.schedule.expr,
            "timezone": self.timezone,
            "paused": self.paused,
            "starts_at": None if self.starts_at is None else format_instant(self.starts_at),
            "ends_at": None if self.ends_at is None else format_instant(self.ends_at),
            "executor": self.executor.value,
        }
        doc[self.executor.value] = _interned(self.spec_doc())
        doc.update(
            timeout=format_duration(self.timeout),
            retries=_section_doc(self.retries),
            concurrency=self.concurrency.value,
            delivery=self.delivery.value,
            catchup=_section_doc(self.catchup),
            target=_section_doc(self.target),
            depends_on=None if self.depends_on is None else self.depends_on.to_doc(),
            alerts=_section_doc(self.alerts),
            history=_section_doc(self.history),
        )
        return doc


_JOB_FIELDS = (
    "name", "description", "labels", "schedule", "timezone", "paused", "starts_at", "ends_at",
    "executor", "http", "shell", "timeout", "retries", "concurrency", "delivery", "catchup",
    "target", "depends_on", "alerts", "history",
)  # fmt: skip


def parse_job(doc: object, *, name: str | None = None) -> Job:
    """Validate a job document; raise ``ValidationFailed`` listing every problem.

    ``name`` is the name from the URL: a document naming another job is an
    error on ``name``; a document without a name takes it.
    """
    problems = Problems()
    f = Fields.open(doc, "", _JOB_FIELDS, problems)
    if f is None:
        raise ValidationFailed(problems.items)
    job_name = _parse_name(f, name)
    if not problems:  # a valid name (63 characters at most): never one a refused request made up
        # One string object per job name, whatever decoded it (a request, an entry, a snapshot):
        # the store's key, its document's name and its parse share it, not equal copies.
        job_name = sys.intern(job_name)
    description = f.string("description", "", max_len=2048) or ""
    labels = _interned(dict(sorted(f.string_map("labels", check_key=check_label_key,
                                                 check_value=check_label_value).items())))
    schedule = _parse_schedule(f, has_dependency=f.has("depends_on"))
    timezone = f.checked("timezone", check_timezone) or "UTC"
    paused = f.boolean("paused", False)
    starts_at, ends_at = _instant(f, "starts_at"), _instant(f, "ends_at")
    if starts_at is not None and ends_at is not None and ends_at <= starts_at:
        f.error("ends_at", "must be after starts_at")
    executor, http, shell = _parse_executor(f)
    job = Job(
        name=job_name,
        description=description,
        labels=labels,
        schedule=schedule,
        timezone=timezone,
        paused=paused,
        starts_at=starts_at,
        ends_at=ends_at,
        executor=executor,
        http=http,
        shell=shell,
        timeout=f.duration("timeout", 3600.0, positive=True),
        retries=_shared(f, "retries", parse_retries),
        concurrency=f.choice("concurrency", Concurrency, Concurrency.ALLOW),
        delivery=f.choice("delivery", Delivery, Delivery.AT_LEAST_ONCE),
        catchup=_shared(f, "catchup", parse_catchup),
        target=_shared(f, "target", parse_target),
        depends_on=parse_depends_on(f, job_name),
        alerts=_shared(f, "alerts", parse_alerts),
        history=_shared(f, "history", parse_history),
    )
    if problems:
        raise ValidationFailed(problems.items)
    return job


class Policy(NamedTuple):
    """What the run ledger and the alert rules read of a job: how many records it keeps, its
    retries, its delivery and its alerts. A replica replaying its journal after a restart
    finishes and trims runs of tens of thousands of jobs; reading these four from the stored
    document takes about a third of the time of parsing it whole (the schedule, the executor,
    the labels), and parsing each job at its first run was 30 % of such a replay (measured: a round of 30,000 runs took 3.6 s after a
    restore against 2.3 s on a warm state)."""

    keep: int
    retries: Retries
    delivery: Delivery
    alerts: Alerts

    @classmethod
    def of(cls, job: Job) -> Policy:
        return job.policy


_POLICIES: dict[Policy, Policy] = {}
_POLICIES_MAX = 4096


def _kept(policy: Policy) -> Policy:
    """An equal ``Policy`` made before, else ``policy`` (kept for the next, up to ``_POLICIES_MAX``)."""
    kept = _POLICIES.get(policy)
    if kept is not None:
        return kept
    if len(_POLICIES) < _POLICIES_MAX:
        _POLICIES[policy] = policy
    return policy


def parse_policy(doc: object) -> Policy:
    """A job document's ``Policy``, equal to ``Policy.of(parse_job(doc))`` for a document that
    parses (a stored one always does); raises ``ValidationFailed`` for these fields as
    ``parse_job`` would. Jobs that write the same sections share one ``Policy``."""
    problems = Problems()
    f = Fields.open(doc, "", _JOB_FIELDS, problems)
    if f is None:
        raise ValidationFailed(problems.items)
    policy = Policy(_shared(f, "history", parse_history).keep, _shared(f, "retries", parse_retries),
                    f.choice("delivery", Delivery, Delivery.AT_LEAST_ONCE), _shared(f, "alerts", parse_alerts))
    if problems:
        raise ValidationFailed(problems.items)
    return _kept(policy)


def stored_depends_on(doc: dict[str, Any], name: str) -> DependsOn | None:
    """The ``depends_on`` of job ``name``'s stored document, read by ``parse_depends_on``
    alone (the rest of the document is not parsed); a document it finds a problem in is
    parsed whole, which refuses it as it always did."""
    problems = Problems()
    f = Fields.open(doc, "", _JOB_FIELDS, problems)
    if f is not None:
        dep = parse_depends_on(f, name)
        if not problems:
            return dep
    return parse_job(doc).depends_on


_JOB_FIELD_SET = frozenset(_JOB_FIELDS)
_STORED: dict[tuple[int, int, str, int], tuple[object, object, object, Policy]] = {}
_STORED_MAX = 4096


def stored_policy(doc: dict[str, Any]) -> Policy:
    """``parse_policy`` of a document the state stores (valid, and never changed in place).

    Such documents share their sections: a live state's through ``_section_doc``, a restored
    state's through the snapshot's table of sections. So the policy is looked up by the
    identity of the three sections it reads (``history``, ``retries``, ``alerts``) and the
    value of ``delivery``, and parsed only for a combination not met before. A replica that
    replays its journal after a restore meets every job for the first time; parsing each
    one's policy was ~12 % of that replay in-process (30,000 jobs). A document with a field
    parsing does not know is parsed (and refused) as ``parse_policy`` refuses it, whatever the
    cache holds, so every replica answers it alike. The entry holds the sections, so their ids
    cannot be reused while it stands; at most ``_STORED_MAX`` are kept, then it starts again."""
    history, retries, delivery, alerts = doc.get("history"), doc.get("retries"), doc.get("delivery"), doc.get("alerts")
    if type(delivery) is not str or not doc.keys() <= _JOB_FIELD_SET:
        return parse_policy(doc)  # refuses a field it does not know, as it always would
    key = (id(history), id(retries), delivery, id(alerts))
    hit = _STORED.get(key)
    if hit is not None and hit[0] is history and hit[1] is retries and hit[2] is alerts:
        return hit[3]
    policy = parse_policy(doc)
    if len(_STORED) >= _STORED_MAX:
        _STORED.clear()
    _STORED[key] = (history, retries, alerts, policy)
    return policy


_S = TypeVar("_S")
_SECTIONS: dict[tuple[str, bytes], Any] = {}
_SECTION_DOCS: dict[int, tuple[Any, dict[str, Any]]] = {}  # id of a kept section -> (it, its document)
_SECTIONS_MAX = 4096
_KEY_MAX = 1024
"""Parsed sections by their document: most jobs write the same ``retries``, ``catchup``,
``target``, ``alerts`` and ``history`` (often the defaults), so they are parsed once and the
frozen result is shared by every job that writes them (fewer objects per job, and a fifth to
a third less time per parse). Only a section that parsed without a problem is kept; at most
``_SECTIONS_MAX`` of them, after which new ones are parsed each time."""


_RECURRING: dict[tuple[str, bytes], Any] = {}
"""Parsed executor sections (``http``, ``shell``) by their document, as ``_SECTIONS`` but
emptied when ``_DOCS_MAX`` are kept: jobs made from one template share one (one endpoint, one
command), while a run of distinct ones (one URL per job) neither grows it without bound nor
fills ``_SECTIONS`` so that the common sections stop being shared."""


def _shared(f: Fields, key: str, parse: Callable[[Fields], _S], *, recurring: bool = False) -> _S:
    raw = f.data.get(key)
    image = _key(raw)  # an absent section too: it parses to the default, shared like any other
    if image is None:
        return parse(f)
    table = _RECURRING if recurring else _SECTIONS
    hit = table.get((key, image))
    if hit is not None:
        return cast(_S, hit)
    before = len(f.problems.items)
    value = parse(f)
    if len(f.problems.items) != before:
        return value
    if recurring:
        if len(_RECURRING) >= _DOCS_MAX:
            _RECURRING.clear()
        _RECURRING[(key, image)] = value
    elif len(_SECTIONS) < _SECTIONS_MAX:
        _SECTIONS[(key, image)] = value
        _SECTION_DOCS[id(value)] = (value, value.to_doc())  # type: ignore[attr-defined]
    return value


def _section_doc(section: Any) -> dict[str, Any]:
    """A section's document; for a shared section, one document shared by every job that
    writes it. Stored job documents are never changed in place (records are replaced, views
    copy before masking), so sharing is safe, and it saves each stored job about seven
    containers (measured in tests/unit/test_shared_sections.py)."""
    kept = _SECTION_DOCS.get(id(section))
    if kept is not None and kept[0] is section:
        return kept[1]
    doc: dict[str, Any] = section.to_doc()
    return doc


_DOCS: dict[bytes, dict[str, Any]] = {}
_DOCS_MAX = 8192
"""Recent ``labels`` and executor sections of canonical documents by their packed bytes: jobs
made from one template (one endpoint, one team's labels) store one document between them, as
they share the parsed sections above (measured in-process, 100,000 jobs of one URL and ten
label sets: the stored records 275 -> 200 MB). Emptied when full, so a long run of distinct
ones costs at most ``_DOCS_MAX`` entries and sharing resumes for the values that recur."""


def _interned(doc: dict[str, Any]) -> dict[str, Any]:
    """An equal document already stored by another job, else ``doc`` (kept for the next)."""
    image = _key(doc)
    if image is None:
        return doc
    kept = _DOCS.get(image)
    if kept is None:
        if len(_DOCS) >= _DOCS_MAX:
            _DOCS.clear()
        _DOCS[image] = kept = doc
    return kept


def _key(value: object) -> bytes | None:
    """The section's document as msgpack bytes: a key that tells apart what parses apart
    (``True`` from ``1``, ``1.0`` from ``1``, ``"1"`` from ``1``: msgpack writes each with
    its own type; ``strict_types`` refuses a tuple or a subclass rather than pass it as a
    list or its base), or None when it cannot be packed or is too large to keep as a key.
    Packing in C takes about a twentieth of the time walking the value in Python took; the
    same section written with its keys in another order is a second entry, never a wrong one."""
    try:
        image: bytes = msgpack.packb(value, strict_types=True, use_bin_type=True)  # a packer per call: thread-safe
    except (TypeError, ValueError, OverflowError):
        return None
    return image if len(image) <= _KEY_MAX else None


_EXECUTOR_KINDS = tuple(ExecutorKind)  # iterating an Enum class is slow, and this runs on every put


def _parse_executor(f: Fields) -> tuple[ExecutorKind, HttpSpec | None, ShellSpec | None]:
    """``executor`` and its section; the other section must be absent."""
    executor = f.required_choice("executor", ExecutorKind)
    for kind in _EXECUTOR_KINDS:
        if executor is not None and executor is not kind and f.has(kind.value):
            f.error(kind.value, f"must be absent when executor is {executor.value}")
        elif executor is kind and not f.has(kind.value):
            f.missing(kind.value, f"is required when executor is {kind.value}")
    # With no valid executor both sections are still checked, to report all we can.
    http = (_shared(f, "http", parse_http, recurring=True) if executor is ExecutorKind.HTTP
            else parse_http(f) if executor is None else None)
    shell = (_shared(f, "shell", parse_shell, recurring=True) if executor is ExecutorKind.SHELL
             else parse_shell(f) if executor is None else None)
    return executor or ExecutorKind.HTTP, http, shell


def _parse_name(f: Fields, url_name: str | None) -> str:
    doc_name = f.string("name")
    if doc_name is None and f.has("name"):
        return url_name or ""  # wrong type, already reported
    if doc_name is None and url_name is None:
        f.missing("name")
        return ""
    if doc_name is not None and url_name is not None and doc_name != url_name:
        f.error("name", f"does not match the name in the URL ({url_name!r})")
        return url_name
    chosen = doc_name if doc_name is not None else url_name
    assert chosen is not None
    if problem := check_name(chosen):
        f.error("name", problem)
    return chosen


def _parse_schedule(f: Fields, *, has_dependency: bool) -> Schedule:
    text = f.string("schedule")
    if text is None:
        if not f.has("schedule") and not has_dependency:
            f.missing("schedule", "is required (or give depends_on)")
        return MANUAL
    try:
        schedule = parse_schedule(text)
    except ValueError as exc:
        f.error("schedule", str(exc))
        return MANUAL
    if schedule.at is not None and (problem := check_instant(schedule.at)):
        f.error("schedule", f"@at {problem}")
        return MANUAL
    return schedule


def _instant(f: Fields, key: str) -> datetime | None:
    value = f.instant(key)
    if value is not None and (problem := check_instant(value)):
        f.error(key, problem)
        return None
    return value
