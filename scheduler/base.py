"""The scheduler's seams: what it needs of a raft node and of the way to commit, and who watches.

``RaftPort`` is all the scheduler asks of a raft node (``raftlog.RaftNode`` in
production, an in-memory replica in tests); ``Committer`` is the awaitable
write path over it (``raftlog.Bridge``). Both are structural, so a test double
is checked by mypy like the real thing, with no ``type: ignore``.

``ClockEstimate`` and ``RoleChange`` are raftlog's own values, re-exported.

``Observer`` is told what the runtime sees happen (the agent's metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from raftlog import ClockEstimate, NodeStatus, RoleChange

from .state import Applied

__all__ = ["ClockEstimate", "Committer", "Observer", "RaftPort", "RoleChange", "observed_role"]

SubmitCallback = Callable[[Any, int], None]


def observed_role(status: NodeStatus) -> RoleChange:
    """The role as ``status`` shows it, in the shape of the node's own ``on_role`` events."""
    return RoleChange(status.state, status.leader, status.term)


class RaftPort(Protocol):
    """A raft node as the scheduler uses it. Every method may be called from the event loop."""

    def submit(self, payload: bytes, callback: SubmitCallback) -> None:
        """Propose ``payload``; ``callback(result, fail_reason)`` runs once, on any thread."""
        ...

    def is_leader(self) -> bool: ...

    def leader(self) -> str | None:
        """The raft address of the leader this node knows of, if any."""
        ...

    def status(self) -> NodeStatus: ...

    def leader_contact_age(self) -> float:
        """Seconds since this node was last in touch with a leader holding a quorum (``inf`` never)."""
        ...

    @property
    def replay_upto(self) -> int:
        """The last index replayed from this node's own journal at start-up (not to be acted on)."""
        ...

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        """The leader's wall clock minus this node's; zero on the leader, None while unknown."""
        ...

    def member_clocks(self) -> Mapping[str, ClockEstimate]:
        """raft address -> that member's wall clock minus the leader's; empty with no leader."""
        ...

    def peers_apply(self, form: str) -> bool:
        """Whether every other member announced it applies entries of ``form`` (``commands.APPLIES``)."""
        ...

    def leader_uses(self, form: str) -> bool:
        """Whether the current leader heard every member announce ``form``, and so proposes it."""
        ...


class Committer(Protocol):
    """Commits through the raft log and awaits the applied result (``raftlog.Bridge``)."""

    async def submit(self, payload: bytes, timeout: float = 5.0) -> Any: ...

    async def add_member(self, raft_addr: str, timeout: float = 10.0) -> None: ...

    async def remove_member(self, raft_addr: str, timeout: float = 10.0) -> None: ...


class Observer(Protocol):
    """Told what happens on this node (the agent's metrics); called on the event loop, must not raise."""

    def on_applied(self, applied: Applied, replay: bool) -> None: ...

    def run_started(self, job: str, lateness_s: float) -> None: ...

    def run_finished(self, job: str, status: str, duration_s: float) -> None: ...

    def alert_delivered(self, outcome: str) -> None: ...
