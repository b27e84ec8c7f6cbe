"""The state-machine protocol raftlog hosts.

The host (``raftlog.node``) knows nothing of what the state means: it hands
each committed entry's bytes to ``apply`` in log order, asks for a snapshot
when the journal is compacted, and restores one when it starts from a dump or
a leader installs a snapshot.

A state machine may also have an ``entry_weight`` attribute: how many entries the one
it just applied counts as toward the next snapshot (``NodeConfig.compaction_entries``),
1 when absent. A restart replays what came after the last snapshot, so an entry that
carries a thousand records should count as a thousand. And it may have a ``records()``
method: how many records it holds; the host then also waits for that many times
``NodeConfig.compaction_share`` before a snapshot, since each one packs the whole state.
And it may have an ``idle()`` method, called on the raft thread at every tick, between
applies, for housekeeping that changes how the state is kept, never what it holds (the
scheduler moves cold run history out of memory there); it must return quickly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ApplyContext", "LocalStateLost", "StateMachine"]


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What the host knows about the entry being applied.

    ``index`` is the entry's Raft log index: the same on every replica, so it
    may enter the state (fencing tokens are derived from it). ``replay`` is a
    local fact (the entry was already in this node's journal when it started)
    and must never influence the state, only what this node does about it.
    """

    index: int
    replay: bool = False


class LocalStateLost(Exception):
    """Raised by ``apply`` when part of the state this node kept locally (outside the snapshot
    and the journal: a scratch file it moved cold records to) cannot be read back. Applying on
    without it would part this replica from the others, so the host stops taking part in raft
    (as after a snapshot it could not restore); a restart rebuilds the state from the snapshot
    and the journal."""


class StateMachine(Protocol):
    def apply(self, command: bytes, ctx: ApplyContext) -> Any:
        """Apply one committed command; deterministic, and never raises but ``LocalStateLost``.

        A malformed or refused command returns a rejection value, the same on
        every replica. Reads no clock, random source or environment, and no file but what
        this node wrote of its own state (read back whole, or ``LocalStateLost``).
        """
        ...

    def snapshot(self) -> Iterator[bytes]:
        """Capture the state now; the returned iterator may be consumed later, on another thread.

        The view must be taken before this returns (apply may run again right
        after), and the chunks joined are what ``restore`` accepts.
        """
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot; discards everything before."""
        ...
