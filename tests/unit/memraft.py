"""An in-memory raft node and its write path, for tests of the scheduler on a FakeClock.

``MemoryNode`` is a ``RaftPort``: one replica that commits and applies each
command the moment it is submitted (no network), telling its hooks of every
applied entry and of every change of role or term. ``MemoryCommitter`` is the
``Committer`` over it: like ``raftlog.Bridge``, a submit's result reaches the
awaiting task on a later turn of the loop, after the applied hooks have run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raftlog import ApplyContext, ClockEstimate, RoleChange
from raftlog.bridge import NotCommitted, UnknownOutcome
from raftlog.node import FAIL_REASON, NodeConfig, NodeStatus
from scheduler.commands import APPLIES
from scheduler.state import Applied, State


class MemoryNode:
    """Stands in for RaftNode: one replica that commits and applies at once."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.index = 0
        self._leading = True
        self._term = 1
        self.config = NodeConfig(raft_addr="mem:1", peers=(), data_dir=Path("/nonexistent"), secret="x")
        self.hooks: list[Callable[[Applied], None]] = []
        self.role_hooks: list[Callable[[RoleChange], None]] = []  # as RaftNode(on_role=...)
        self.silent = 0.0  # seconds since the "leader" was last heard from (a partition test sets it)
        self.peer_forms: set[str] = set(APPLIES)  # what the (absent) peers announced they apply

    # Setting either one is a role change, announced as the raft node announces it.
    @property
    def leading(self) -> bool:
        return self._leading

    @leading.setter
    def leading(self, value: bool) -> None:
        self._leading = value
        self._announce()

    @property
    def term(self) -> int:
        return self._term

    @term.setter
    def term(self, value: int) -> None:
        self._term = value
        self._announce()

    def _announce(self) -> None:
        change = RoleChange("leader" if self._leading else "follower", self.leader(), self._term)
        for hook in self.role_hooks:
            hook(change)

    def submit(self, payload: bytes, callback: Callable[[Any, int], None]) -> None:
        if not self._leading:
            callback(None, FAIL_REASON.MISSING_LEADER)
            return
        self.index += 1
        result = self.state.apply(payload, ApplyContext(index=self.index))
        if isinstance(result, Applied):
            for hook in self.hooks:
                hook(result)
        callback(result, FAIL_REASON.SUCCESS)

    def add_member(self, raft_addr: str, callback: Callable[[Any, int], None]) -> None:
        callback(None, FAIL_REASON.REQUEST_DENIED)  # one fixed replica: no membership to change

    def remove_member(self, raft_addr: str, callback: Callable[[Any, int], None]) -> None:
        callback(None, FAIL_REASON.REQUEST_DENIED)

    def is_leader(self) -> bool:
        return self._leading

    def leader_contact_age(self) -> float:
        return self.silent

    def leader(self) -> str | None:
        return "mem:1" if self._leading else None

    def status(self) -> NodeStatus:
        return NodeStatus(raft_addr="mem:1", state="leader" if self._leading else "follower",
                          leader=self.leader(), term=self._term, commit_index=self.index, applied_index=self.index,
                          has_quorum=True, raft_thread_alive=True)

    @property
    def replay_upto(self) -> int:
        return 0  # nothing in a journal: this replica starts empty

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        return ClockEstimate(0.0, 0.0, 0.0) if self._leading else None

    def member_clocks(self) -> Mapping[str, ClockEstimate]:
        return {"mem:1": ClockEstimate(0.0, 0.0, 0.0)} if self._leading else {}

    def peers_apply(self, form: str) -> bool:
        return form in self.peer_forms

    def leader_uses(self, form: str) -> bool:
        return self.leader() is not None and form in self.peer_forms


class MemoryCommitter:
    """The write path over a MemoryNode, failing as ``raftlog.Bridge`` fails."""

    def __init__(self, node: MemoryNode) -> None:
        self.node = node

    async def submit(self, payload: bytes, timeout: float = 5.0) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def settle(result: Any, err: int) -> None:
            if fut.done():
                return
            if err == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            elif err == FAIL_REASON.MISSING_LEADER:
                fut.set_exception(NotCommitted("MISSING_LEADER", "not committed: missing leader"))
            else:
                fut.set_exception(UnknownOutcome(str(err), "outcome unknown"))

        def callback(result: Any, err: int) -> None:
            # As the bridge's relay does: the result is delivered on a later turn of the loop.
            fut.get_loop().call_soon(settle, result, err)

        self.node.submit(payload, callback)
        return await fut

    async def add_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        raise NotCommitted("REQUEST_DENIED", "a MemoryNode has one member")

    async def remove_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        raise NotCommitted("REQUEST_DENIED", "a MemoryNode has one member")
