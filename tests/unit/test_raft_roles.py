"""RaftNode.on_role: leadership changes as events, from the raft thread's tick, against a
stand-in for pysyncobj's SyncObj."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftlog.node import NodeConfig, RaftNode, RoleChange


class Peer:
    def __init__(self, id: str) -> None:  # noqa: A002 - pysyncobj's attribute name
        self.id = id


class Transport:
    def setOnMessageReceivedCallback(self, callback: Any) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def send(self, node: Any, message: Any) -> bool:
        return True


class Poller:
    def subscribe(self, fd: int, callback: Any, events: int) -> None:
        pass


class Host:
    """What RaftNode._on_tick reads of pysyncobj's SyncObj, for a node with no peers."""

    def __init__(self) -> None:
        self._poller = Poller()
        self._SyncObj__transport = Transport()
        self._SyncObj__raftLog = [(b"", 1, 1)]
        self._SyncObj__raftCommitIndex = 1
        self._SyncObj__raftNextIndex: dict[str, int] = {}
        self._SyncObj__raftMatchIndex: dict[str, int] = {}
        self._SyncObj__lastResponseTime: dict[str, float] = {}
        self._SyncObj__raftElectionDeadline = 0.0
        self._rc_batch_peers: set[str] = set()
        self.otherNodes: list[Peer] = []
        self.status: dict[str, Any] = {}

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        pass

    def _SyncObj__getCurrentLogIndex(self) -> int:  # noqa: N802
        return 1

    def _isLeader(self) -> bool:  # noqa: N802
        return bool(self.status["state"] == 2)

    def isNodeConnected(self, node: Any) -> bool:  # noqa: N802
        return True

    def tick_thread_alive(self) -> bool:
        return True

    def getStatus(self) -> dict[str, Any]:  # noqa: N802
        return {"commit_idx": 1, "last_applied": 1, "has_quorum": True, **self.status}

    def set(self, state: int, leader: str | None, term: int) -> None:
        self.status = {"state": state, "leader": None if leader is None else Peer(leader), "raft_term": term}


def test_role_leader_and_term_changes_arrive_as_events_and_a_raising_hook_stops_nothing(tmp_path: Path) -> None:
    seen: list[RoleChange] = []

    def hook(change: RoleChange) -> None:
        seen.append(change)
        if change.role == "candidate":
            raise RuntimeError("a consumer's bug")

    node = RaftNode(NodeConfig(raft_addr="a:1", peers=(), data_dir=tmp_path, secret="s"),
                    fsm=None, on_role=hook)  # type: ignore[arg-type]
    host = Host()
    node._host = host  # type: ignore[assignment]
    steps = [
        (0, None, 1), (0, None, 1),  # the first tick tells where we start; an unchanged tick nothing
        (1, None, 2),  # an election: candidate (the hook raises)
        (2, "a:1", 2), (2, "a:1", 2),  # won it
        (0, "b:1", 5),  # deposed by a leader of a later term
        (0, "b:1", 6),  # same role and leader, a new term: still an event
        (0, "c:1", 6),  # another leader, same term and role
    ]
    for state, leader, term in steps:
        host.set(state, leader, term)
        node._on_tick()
        assert node.status().term == term  # the tick ran to the end, the raising hook notwithstanding
    assert seen == [
        RoleChange("follower", None, 1), RoleChange("candidate", None, 2), RoleChange("leader", "a:1", 2),
        RoleChange("follower", "b:1", 5), RoleChange("follower", "b:1", 6), RoleChange("follower", "c:1", 6),
    ]


def test_a_role_event_finds_the_status_of_its_own_tick(tmp_path: Path) -> None:
    """A consumer told "leader in term 2" reads status() at once (the runtime's leader loop
    checks ``status().term == term`` before its first tick). A status still of the tick before
    made it conclude its leadership was over and never plan for the whole term (seen: a single
    node that claimed nothing for 60 s on a busy machine)."""
    node: RaftNode
    read: list[tuple[str, int]] = []

    def hook(change: RoleChange) -> None:
        st = node.status()
        read.append((st.state, st.term))

    node = RaftNode(NodeConfig(raft_addr="a:1", peers=(), data_dir=tmp_path, secret="s"),
                    fsm=None, on_role=hook)  # type: ignore[arg-type]
    host = Host()
    node._host = host  # type: ignore[assignment]
    for state, leader, term in [(0, None, 1), (1, None, 2), (2, "a:1", 2)]:
        host.set(state, leader, term)
        node._on_tick()
    assert read == [("follower", 1), ("candidate", 2), ("leader", 2)]
