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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ACTIVE", "CLAIM_STATUSES", "FOLLOWS", "RUN_STATUSES", "SCHEDULED", "TERMINAL", "TRANSITIONS",
    "RunStatus", "Trigger",
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
TERMINAL = frozenset(RunStatus) - ACTIVE
SCHEDULED = frozenset({Trigger.SCHEDULE, Trigger.CATCHUP})
"""Triggers of slots the schedule decides (at most once each); the others name a request or a run."""

RUN_STATUSES: tuple[str, ...] = tuple(s.value for s in RunStatus)
"""Every status in SPEC order, as plain strings: the API's status filter, metric labels, the CLI."""
