"""Run statuses and triggers (SPEC section 2), and the one table of how a status may change.

A run record is one attempt of one slot. A claim creates it in one of
``CLAIM_STATUSES``; after that the ledger (``scheduler.ledger``) changes its
status only along ``TRANSITIONS``::

    claimed  -> running                      its start was reported
    claimed  -> succeeded | failed | timed_out | retrying | dead
                                             it finished before its start was reported
    running  -> succeeded | failed | timed_out | retrying | dead
    claimed | running -> lost                lease expired, or its node restarted
    claimed | running -> dead                lost for the last time under at-least-once
    claimed | running | retrying | lost -> cancelled
                                             replaced, the job changed, or an operator

A retry or a replay is not a transition: it is a new record of the same slot
(trigger ``retry`` or ``replay``) whose ``retry_of`` names the attempt it
follows, which keeps its status. ``FOLLOWS`` says which statuses each may follow.

``ACTIVE`` holds the statuses some transition leaves, ``TERMINAL`` the others:
a terminal record never changes again. ``lost`` and ``retrying`` are not terminal:
until their next attempt is claimed they can still be cancelled. Whether one
record is still live (a ``lost`` attempt under at-most-once is not retried, a
``retrying`` one whose retry was claimed is done) is ``State.active``, not its
status.

``RunRecord`` is the record itself: a ``TypedDict``, so ``mypy --strict`` checks
every key read and written (``run["stauts"]`` is an error) while a record stays
a plain dict at run time: what msgpack packs into snapshots and gives back on
restore, and ~1,130 bytes for 24 keys against ~520 for a slotted dataclass, which
neither fits the scale goal (a million records in 300 MB): history will need a
packed form of its own, and the typing does not wait for it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NotRequired, TypedDict, TypeGuard, get_args

__all__ = [
    "ACTIVE", "CLAIM_STATUSES", "FOLLOWS", "RUN_STATUSES", "SCHEDULED", "TERMINAL", "TRANSITIONS",
    "LateResult", "RunRecord", "RunStatus", "StatusName", "Trigger", "TriggerName", "is_status", "is_trigger",
]


class RunStatus(enum.StrEnum):
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    RETRYING = "retrying"
    LOST = "lost"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    MISSED = "missed"
    DEAD = "dead"


class Trigger(enum.StrEnum):
    SCHEDULE = "schedule"
    CATCHUP = "catchup"
    MANUAL = "manual"
    RETRY = "retry"
    DEPENDENCY = "dependency"
    REPLAY = "replay"


StatusName = Literal[
    "claimed", "running", "succeeded", "failed", "timed_out", "retrying", "lost", "cancelled", "skipped", "missed",
    "dead",
]
"""A status as a record holds it: a plain string that mypy checks (``"claimd"`` is an error
wherever a status is stored, passed or compared). The values of ``RunStatus``, in its order
(tests/unit/test_run_record.py keeps the two in step)."""

TriggerName = Literal["schedule", "catchup", "manual", "retry", "dependency", "replay"]
"""A trigger as a record holds it; the values of ``Trigger``, in its order."""

_STATUS_NAMES: frozenset[str] = frozenset(RunStatus)
_TRIGGER_NAMES: frozenset[str] = frozenset(Trigger)


def is_status(value: object) -> TypeGuard[StatusName]:
    """Whether ``value`` (a string from the wire or a node's report) is a run status."""
    return value in _STATUS_NAMES


def is_trigger(value: object) -> TypeGuard[TriggerName]:
    """Whether ``value`` (a string from the wire) is a run trigger."""
    return value in _TRIGGER_NAMES


_S = RunStatus
_RESULTS = frozenset({_S.SUCCEEDED, _S.FAILED, _S.TIMED_OUT, _S.RETRYING, _S.DEAD})
"""What a reported result makes of a live attempt (``dead``: retries exhausted)."""

TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = MappingProxyType({
    _S.CLAIMED: frozenset({_S.RUNNING, *_RESULTS, _S.LOST, _S.CANCELLED}),
    _S.RUNNING: frozenset({*_RESULTS, _S.LOST, _S.CANCELLED}),
    _S.RETRYING: frozenset({_S.CANCELLED}),
    _S.LOST: frozenset({_S.CANCELLED}),
})
"""Every status change the ledger makes, by the status it leaves."""

CLAIM_STATUSES = frozenset({_S.CLAIMED, _S.SKIPPED, _S.MISSED, _S.FAILED})
"""The statuses a claim may record: dispatched, or decided without running (``failed``: no node fits)."""

FOLLOWS: Mapping[Trigger, frozenset[RunStatus]] = MappingProxyType({
    Trigger.RETRY: frozenset({_S.RETRYING, _S.LOST}),
    Trigger.REPLAY: frozenset({_S.DEAD}),
})
"""The statuses of the attempt a new attempt of the same slot may follow, by its trigger."""

ACTIVE = frozenset(TRANSITIONS)
HELD = frozenset({_S.CLAIMED, _S.RUNNING})
"""Attempts a node holds: claimed for it, or running on it (its reports and leases apply)."""
AWAITING_RETRY = FOLLOWS[Trigger.RETRY]
"""Attempts whose slot a retry may still take (``retrying``, or ``lost`` with its lease)."""
BUSY = HELD | AWAITING_RETRY
"""Attempts that keep a job busy for its concurrency policy."""
TERMINAL = frozenset(RunStatus) - ACTIVE
SCHEDULED = frozenset({Trigger.SCHEDULE, Trigger.CATCHUP})
"""Triggers of slots the schedule decides (at most once each); the others name a request or a run."""

RUN_STATUSES: tuple[StatusName, ...] = get_args(StatusName)
"""Every status in SPEC order, as plain strings: the API's status filter, metric labels, the CLI."""


class LateResult(TypedDict):
    """A result reported after its attempt was decided otherwise: recorded, deciding nothing."""

    status: str | None  # as the node reported it, not a status this record took
    finished_us: int | None


class RunRecord(TypedDict):
    """One attempt of one slot, as the ledger keeps it (``State.runs``) and snapshots it.

    Records are replaced, never mutated in place: a change is a new dict,
    ``{**run, "status": "running"}``, which mypy checks key by key.

    ``status`` and ``trigger`` hold plain strings, the enums' values, not their members,
    typed as the ``StatusName`` and ``TriggerName`` literals: compare them with string
    literals (``run["status"] == "running"``), which mypy checks against the literal
    (a misspelt status is a non-overlapping comparison), or test membership in the sets
    above (``in TERMINAL``). mypy takes a member and a literal string for values that
    never compare equal, so ``== RunStatus.RUNNING`` is refused here. Measured, members
    would cost more than they check: a dict holding only strings, numbers and None
    is left alone by the cyclic garbage collector, a member (a class instance) makes
    it tracked, and with 1,000,000 records a full collection went from 45 ms to
    255 ms; restore would also have to convert every record msgpack gives back
    (+9 % on a 200,000-run snapshot). tests/unit/test_run_record.py holds records to
    plain strings.
    """

    id: str  # run_id_of(token)
    job: str
    slot_us: int
    attempt: int  # 1 for the first attempt of a slot
    trigger: TriggerName
    status: StatusName
    node: str | None  # the node it was dispatched to; None when decided without running
    claimed_us: int
    started_us: int | None
    finished_us: int | None
    lease_us: int | None  # running: the lease's end; None once it ended
    exit_code: int | None
    http_status: int | None
    output: str
    error: str | None
    token: int  # the fencing token
    term: int  # of the leader that claimed it
    leader: str
    retry_of: str | None  # the attempt this one follows (a retry or a replay)
    next: str | None  # the attempt that follows this one
    cause: str | None  # dependency: the upstream run id; manual: the request key
    retry_at_us: int | None
    outcome: str | None  # the status its node reported, before retries decided the record's status
    not_before_us: int | None
    late_result: NotRequired[LateResult]
    dead_deleted: NotRequired[bool]  # a dead letter an operator deleted: kept as history only
