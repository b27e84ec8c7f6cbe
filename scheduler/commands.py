"""One frozen dataclass per state transition, each under a stable tag.

Everything a transition needs that is not in the log already (times, the
proposing leader and its term, the chosen nodes) travels inside the command:
``apply`` reads no clock. Times are integer microseconds since the Unix epoch
(``*_us``), so replicas never round a float differently.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from raftlog.codec import CodecError, decode, encode, pack, unpack

from .runs import StatusName, TriggerName

__all__ = [
    "Command", "RegisterNode", "PutJob", "PutJobs", "DeleteJob", "PauseJob", "Claim", "ClaimSlots",
    "StartRuns", "RenewLeases", "FinishRuns", "ExpireRuns", "CancelRun", "DeleteDeadLetter",
    "ReportLost", "Noop", "Rejected", "AlertResults", "NodeClock", "JobPlanning", "NoteNextSlots", "COMMANDS",
    "EXPIRE_SEEN", "APPLIES", "encode_command", "decode_command",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    TAG: ClassVar[str] = ""
    # Fields a later release added: written only when set, so a release that does not know
    # them still reads the entries that leave them unset (and a leader sets them only once
    # every member announced it applies them, see APPLIES).
    LATER: ClassVar[frozenset[str]] = frozenset()
    # The field whose items each count as an entry toward the next snapshot (``weight``).
    ITEMS: ClassVar[str | None] = None
    at_us: int  # proposer's clock when it decided

    @property
    def weight(self) -> int:
        """What this entry counts as toward the next snapshot (``raftlog.fsm``): one for each
        job, claim, run or result it carries. A restart replays, and the journal holds in
        memory, everything since the last snapshot, and an entry of a thousand claims costs
        both about what a thousand entries of one would."""
        return max(1, len(getattr(self, self.ITEMS))) if self.ITEMS is not None else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Noop(Command):
    """The leader barrier: once applied, every earlier claim is visible."""

    TAG: ClassVar[str] = "noop"
    node: str = ""
    term: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNode(Command):
    TAG: ClassVar[str] = "register_node"
    node_id: str
    raft_addr: str
    http_addr: str
    tags: dict[str, str] = field(default_factory=dict)
    allow_shell: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PutJob(Command):
    """Create or replace a job. ``expect_version``: None upsert, 0 create only, n compare-and-set."""

    TAG: ClassVar[str] = "put_job"
    spec: dict[str, Any]
    expect_version: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PutJobs(Command):
    """Create or replace many jobs at once, all or none (``POST /v1/jobs:batch``).

    ``create_only``: refused as a whole if any of the names exists. On the wire ``specs``
    travel as one zlib-compressed msgpack list (see ``encode_command``)."""

    TAG: ClassVar[str] = "put_jobs"
    ITEMS: ClassVar[str | None] = "specs"
    specs: tuple[dict[str, Any], ...]
    create_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteJob(Command):
    TAG: ClassVar[str] = "delete_job"
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseJob(Command):
    TAG: ClassVar[str] = "pause_job"
    name: str
    paused: bool
    note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One decision about one slot.

    ``status`` is ``claimed`` (dispatch to ``node``), or ``skipped`` /
    ``missed`` / ``failed`` (recorded, not dispatched; ``reason`` says why).
    ``retry_of`` names the run a retry or a replay follows, ``upstream`` the
    finished run a dependency claim answers, ``request_key`` the idempotency key
    of a manual run (each recorded as the run's ``cause``). Entries written
    before the two were split carry one ``cause`` field: ``decode_command`` reads
    it as ``upstream`` for a dependency claim and as ``request_key`` otherwise.
    """

    job: str
    slot_us: int
    trigger: TriggerName
    status: StatusName = "claimed"
    node: str | None = None
    attempt: int = 1
    reason: str | None = None
    retry_of: str | None = None
    upstream: str | None = None  # dependency: the upstream run id
    request_key: str | None = None  # manual: the request's idempotency key
    not_before_us: int | None = None  # a retry claimed ahead: fire at its backoff instant, not at the slot

    def to_wire(self) -> dict[str, Any]:
        # On the wire the two still travel as the one ``cause`` field of before the split, so a
        # node of the previous release reads this build's claims (and decides them the same)
        # during a rolling upgrade; ``decode_command`` splits it again by the trigger.
        wire = {name: getattr(self, name) for name in _claim_wire_names()}
        kept, dropped = ("upstream", "request_key") if self.trigger == "dependency" else ("request_key", "upstream")
        if getattr(self, dropped) is not None:
            raise ValueError(f"a {self.trigger} claim carries no {dropped}")
        wire["cause"] = getattr(self, kept)
        return wire


_SPLIT_CAUSE = frozenset({"upstream", "request_key"})


@functools.cache
def _claim_wire_names() -> tuple[str, ...]:
    """Claim's fields that travel under their own names, in order (all but the two in ``cause``)."""
    return tuple(f.name for f in fields(Claim) if f.name not in _SPLIT_CAUSE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimSlots(Command):
    """All decisions of one leader tick, in one entry."""

    TAG: ClassVar[str] = "claim_slots"
    ITEMS: ClassVar[str | None] = "claims"
    leader: str
    term: int
    claims: tuple[Claim, ...]
    cancel: tuple[str, ...] = ()  # run ids replaced (concurrency: replace)
    # More slots than are worth a record each (a cluster stopped for a day under
    # an every-second job): ``{job, status, count, first_us, last_us, reason}``;
    # they advance the job past ``last_us`` and are counted, not listed.
    summaries: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRuns(Command):
    TAG: ClassVar[str] = "start_runs"
    ITEMS: ClassVar[str | None] = "runs"
    node: str
    runs: tuple[str, ...]
    started_us: dict[str, int]
    lease_until_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RenewLeases(Command):
    TAG: ClassVar[str] = "renew_leases"
    ITEMS: ClassVar[str | None] = "runs"
    node: str
    runs: tuple[str, ...]
    lease_until_us: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishRuns(Command):
    """Results of attempts, each ``{run_id, status, started_us, finished_us, exit_code,
    http_status, output, error}``."""

    TAG: ClassVar[str] = "finish_runs"
    ITEMS: ClassVar[str | None] = "results"
    node: str
    results: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireRuns(Command):
    """The leader found these attempts' leases lapsed: they become ``lost``.

    ``seen``: run id -> the lease the leader saw lapse (0 for a claim it saw never started).
    An attempt whose start or renewal committed between the leader's look and this entry
    (its lease now later than the one seen) is alive and kept: taking it away would run its
    slot again while it runs. Runs not in ``seen`` (entries of leaders before EXPIRE_SEEN) are
    taken whatever happened since."""

    TAG: ClassVar[str] = "expire_runs"
    ITEMS: ClassVar[str | None] = "runs"
    LATER: ClassVar[frozenset[str]] = frozenset({"seen"})
    leader: str
    term: int
    runs: tuple[str, ...]
    reason: str = "lease expired"
    seen: dict[str, int] = field(default_factory=dict)


EXPIRE_SEEN = "expire_seen"
"""The entry form of an ``expire_runs`` that carries ``seen`` (an older release refuses it)."""

APPLIES: tuple[str, ...] = (EXPIRE_SEEN,)
"""The entry forms this release applies beyond the first release's, announced to the peers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportLost(Command):
    """A restarted node reports the attempts it held before it died."""

    TAG: ClassVar[str] = "report_lost"
    ITEMS: ClassVar[str | None] = "runs"
    node: str
    runs: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRun(Command):
    TAG: ClassVar[str] = "cancel_run"
    run_id: str
    reason: str = "cancelled by an operator"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteDeadLetter(Command):
    TAG: ClassVar[str] = "delete_dead_letter"
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertResults(Command):
    """The leader's delivery attempts: ``{id, ok, error}`` each, at ``at_us``."""

    TAG: ClassVar[str] = "alert_results"
    ITEMS: ClassVar[str | None] = "results"
    leader: str
    results: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeClock(Command):
    """The leader's judgement of one node's clock changed (``scheduler.skew.ClockGuard``).

    ``offset_us``: that node's wall clock minus the leader's (for the leader itself: its
    wall minus the median of its followers'); None when the leader holds no estimate.
    """

    TAG: ClassVar[str] = "node_clock"
    node: str
    offset_us: int | None
    error_us: int | None
    skewed: bool
    leader: str
    term: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPlanning(Command):
    """The leader could not plan version ``version`` of ``job`` (``error``), or can again
    (``error`` None). Recorded on the job, so every node's view shows it; the first failure of
    a version raises an ``unplannable`` alert."""

    TAG: ClassVar[str] = "job_planning"
    job: str
    version: int
    error: str | None
    leader: str
    term: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NoteNextSlots(Command):
    """Jobs' next slots as a leader walked them: ``{job, version, created_us, from_us, slot_us,
    epoch}`` each (slot_us None: the schedule has no more; epoch: the planner's, see
    ``planner.PLAN_EPOCH``). Kept with a job (``next_slot``) while it is the same job at the
    same version and its walk still starts at ``from_us``, so that a later leader need not
    parse and plan every job at once to know when each is next due. A command of its own, not
    a field of ``ClaimSlots``: a node of an older release refuses only these entries (and
    plans every job when it leads), never the claims."""

    TAG: ClassVar[str] = "note_next_slots"
    # Counted as one entry toward the next snapshot, however many jobs it names: it only keeps
    # where a leader's walk ended (replaying it is cheap; without it a leader walks again), and
    # counted by its jobs, the 100,000 notes after a bulk load brought five snapshots of the
    # whole state at once (loaded writes/s 0.32-0.38 of empty against 0.58-0.62).
    leader: str
    term: int
    slots: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A command apply refused: the same value on every replica, never an exception."""

    code: str  # invalid | not_found | conflict | stale | internal
    message: str


COMMANDS: dict[str, type[Command]] = {
    c.TAG: c
    for c in (
        Noop, RegisterNode, PutJob, PutJobs, DeleteJob, PauseJob, ClaimSlots, StartRuns, RenewLeases,
        FinishRuns, ExpireRuns, ReportLost, CancelRun, DeleteDeadLetter, AlertResults, NodeClock,
        JobPlanning, NoteNextSlots,
    )
}


def encode_command(cmd: Command) -> bytes:
    data: dict[str, Any] = {}
    later = _later_defaults(type(cmd)) if cmd.LATER else None
    for name, *_ in _wire_fields(type(cmd)):
        value = getattr(cmd, name)
        if later is not None and name in later and value == later[name]:
            continue  # unset: the entry reads as it did before the field was added
        if name == "claims":
            value = [c.to_wire() for c in value]
        elif name == "specs":
            value = _compress_specs(value)
        elif isinstance(value, tuple):
            value = list(value)
        data[name] = value
    return encode(cmd.TAG, data)


def decode_command(raw: bytes) -> Command:
    """Bytes to a command; raises CodecError naming what is wrong."""
    env = decode(raw)
    cls = COMMANDS.get(env.tag)
    if cls is None:
        raise CodecError(f"unknown command tag {env.tag!r}")
    kwargs: dict[str, Any] = {}
    for name, annotation, required, check in _wire_fields(cls):
        if name not in env.data:
            if required:
                raise CodecError(f"command {env.tag!r} lacks field {name!r}")
            continue
        value = env.data[name]
        if name == "specs":
            value = _decompress_specs(env.tag, value)
        if name == "claims":
            try:
                wire, made = [], []
                for c in value:  # one claim at a time: the first malformed one is the one named
                    args = _claim_args(c) if "cause" in c else c
                    made.append(Claim(**args))
                    wire.append(args)
                value = tuple(made)
            except TypeError as exc:
                raise CodecError(f"command {env.tag!r} has a malformed claim: {exc}") from exc
            claim_fields = _wire_fields(Claim)
            exact = _claim_exact()
            for args, c in zip(wire, value, strict=True):
                if all(type(v) in exact.get(k, ()) for k, v in args.items()):
                    continue  # each value of a type its field's check passes; the rest are defaults
                for cname, cannotation, _, ccheck in claim_fields:
                    if not ccheck(getattr(c, cname)):
                        raise CodecError(f"command {env.tag!r} has a malformed claim: {cname!r} must be {cannotation}")
        elif not check(value):
            # Checked here, so apply never meets a wrong type half way through a command.
            raise CodecError(f"command {env.tag!r}: field {name!r} must be {annotation}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    if len(env.data) > len(kwargs):
        unknown = set(env.data) - {f[0] for f in _wire_fields(cls)}
        if unknown:
            raise CodecError(f"command {env.tag!r} has unknown fields {sorted(unknown)}")
    return cls(**kwargs)


# A batch of job documents repeats the same keys and defaults thousands of times: measured,
# 1,000 documents packed to 466 KB and compressed (level 1, 1.3 ms) to 7 KB. Compressed, a
# batch stays under pysyncobj's appendEntriesBatchSizeBytes (64 KiB), above which it sends an
# entry in chunks whose last one it misjudges (PYSYNCOBJ.md: tracebacks on every follower).
_SPECS_LEVEL = 1
SPECS_LIMIT = 64 * 2**20
"""Bytes a batch's documents may take unpacked: bounds what a hostile entry can make a replica allocate."""


def _compress_specs(specs: tuple[dict[str, Any], ...]) -> bytes:
    return zlib.compress(pack(list(specs)), _SPECS_LEVEL)


def _decompress_specs(tag: str, wire: Any) -> Any:
    """The specs list of a ``put_jobs`` entry, or CodecError; the field check that follows
    refuses anything but a list of maps with string keys."""
    if not isinstance(wire, bytes):
        raise CodecError(f"command {tag!r}: field 'specs' must be compressed bytes")
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(wire, SPECS_LIMIT)
    except zlib.error as exc:
        raise CodecError(f"command {tag!r}: field 'specs' is not zlib data: {exc}") from exc
    if inflate.unconsumed_tail or not inflate.eof:
        raise CodecError(f"command {tag!r}: field 'specs' is truncated or inflates beyond {SPECS_LIMIT} bytes")
    return unpack(raw)


def _claim_args(wire: Any) -> Any:
    """A claim's wire fields as Claim's keywords, reading the ``cause`` field of entries written
    before it was split (anything else is left for Claim to refuse)."""
    if not isinstance(wire, dict):
        return wire
    args = dict(wire)
    cause = args.pop("cause")
    if cause is not None:
        # As the ledger read it then: the upstream run of a dependency claim, else a request key.
        key = "upstream" if args.get("trigger") == "dependency" else "request_key"
        if args.get(key) is not None:
            raise TypeError(f"both 'cause' and {key!r} given")  # reported as a malformed claim
        args[key] = cause
    return args


_Check = Callable[[Any], bool]


_WIRE_FIELDS: dict[type, tuple[tuple[str, str, bool, _Check], ...]] = {}


def _wire_fields(cls: type) -> tuple[tuple[str, str, bool, _Check], ...]:
    """(name, annotation text, required, its wire check) of each field, computed once per class.
    ``claims`` is checked claim by claim against Claim's own fields instead."""
    found = _WIRE_FIELDS.get(cls)
    if found is None:
        found = _WIRE_FIELDS[cls] = tuple(
            (f.name, str(f.type), f.default is MISSING and f.default_factory is MISSING,
             _checker("Any" if f.name == "claims" else str(f.type)))
            for f in fields(cls)
        )
    return found


def _later_defaults(cls: type[Command]) -> dict[str, Any]:
    """Name -> default of each of ``cls.LATER``'s fields (each has one), computed once per class."""
    found = _LATER_DEFAULTS.get(cls)
    if found is None:
        found = _LATER_DEFAULTS[cls] = {
            f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
            for f in fields(cls) if f.name in cls.LATER
        }
    return found


_LATER_DEFAULTS: dict[type, dict[str, Any]] = {}
_UNCHECKED_NAMES = frozenset({"StatusName", "TriggerName"})
_JUST_STR = frozenset({str})  # msgpack gives map keys as exact str


@functools.cache
def _exact(annotation: str) -> frozenset[type]:
    """The types whose every value passes ``_checker(annotation)`` (what msgpack gives, exactly:
    ``type(v) in _exact(a)`` implies ``_checker(a)(v)``); empty where there is no such set."""
    if " | " in annotation:
        parts = [_exact(a) for a in annotation.split(" | ")]
        return frozenset().union(*parts) if all(parts) else frozenset()
    return _EXACT.get(annotation, frozenset())


_EXACT: dict[str, frozenset[type]] = {
    "int": frozenset({int}), "str": frozenset({str}), "None": frozenset({type(None)}), "bool": frozenset({bool}),
    **{n: frozenset({str}) for n in _UNCHECKED_NAMES},
}


@functools.cache
def _claim_exact() -> dict[str, frozenset[type]]:
    """Per wire key of a claim, the types that pass its field's check (``_exact``): a claim whose
    every key and value fits is not checked field by field. A key Claim does not have has none."""
    return {n: _exact(a) for n, a, _, _ in _wire_fields(Claim)}


@functools.cache
def _checker(annotation: str) -> _Check:
    """Whether a value (as msgpack gives it: lists for tuples) fits one annotation text; built
    once per text (decoding runs on every replica for every entry)."""
    if " | " in annotation:
        options = tuple(_checker(a) for a in annotation.split(" | "))
        if len(options) == 2:  # ``X | None``, nearly all of them: no generator per value
            first, second = options
            return lambda v: first(v) or second(v)
        return lambda v: any(c(v) for c in options)
    if annotation == "Any":
        return lambda v: True
    if annotation == "None":
        return lambda v: v is None
    if annotation == "int":
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if annotation in _UNCHECKED_NAMES:
        # A claim's trigger and status: any string decodes, and the ledger refuses a value it
        # does not know claim by claim (a refusal in the entry's result, the same on every
        # replica), as it did when they were typed str; a CodecError would refuse the whole entry.
        annotation = "str"
    if annotation == "str":
        return lambda v: isinstance(v, str)
    if annotation == "bool":
        return lambda v: isinstance(v, bool)
    # Items whose types are all exact (``_exact``) pass without a call per item; any other is
    # checked one by one, with the same answer as before.
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        item_text = annotation[len("tuple["):-len(", ...]")]
        item, exact = _checker(item_text), _exact(item_text)
        return lambda v: isinstance(v, (list, tuple)) and ({*map(type, v)} <= exact or all(item(x) for x in v))
    if annotation.startswith("dict[") and annotation.endswith("]"):
        key_text, _, item_text = annotation[len("dict["):-1].partition(", ")
        key, item = _checker(key_text), _checker(item_text)
        if key_text == "str" and item_text == "Any":  # a job document: only its keys are checked here
            return lambda v: isinstance(v, dict) and {*map(type, v)} <= _JUST_STR
        key_exact, item_exact = _exact(key_text), _exact(item_text)
        return lambda v: isinstance(v, dict) and (
            ({*map(type, v)} <= key_exact and {*map(type, v.values())} <= item_exact)
            or all(key(k) and item(x) for k, x in v.items()))
    raise TypeError(f"no wire check for annotation {annotation!r}")  # a new field type: extend _checker
