"""When a node may answer reads of the state: once it has applied what a leader of the current
term has committed (RaftNode._catch_up), never from what its snapshot and an old commit index
gave it after a restart."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raftlog.node import NodeConfig, RaftNode


def _host(entries: list[tuple[int, int]]) -> Any:
    """A stand-in for pysyncobj's SyncObj: only the journal, (data, index, term) per entry."""
    return SimpleNamespace(_SyncObj__raftLog=[(b"", idx, term) for idx, term in entries])


def _st(commit: int, applied: int, term: int) -> dict[str, Any]:
    return {"commit_idx": commit, "last_applied": applied, "raft_term": term}


def test_a_node_is_caught_up_once_it_applied_an_entry_committed_in_the_current_term(tmp_path: Path) -> None:
    node = RaftNode(NodeConfig(raft_addr="me", peers=("p",), data_dir=tmp_path, secret="s"), fsm=None)  # type: ignore[arg-type]
    # Restarted with entries 1..10 of term 2 in the journal, in term 3 now.
    journal = [(i, 2) for i in range(1, 11)]
    cases = [
        (_host(journal), _st(0, 0, 3), None),  # no leader heard of yet, nothing committed known
        (_host(journal), _st(0, 0, 3), "p"),  # a leader, but no commit index from it yet
        (_host(journal), _st(10, 4, 3), "p"),  # applying the journal
        # Everything in its journal applied, but the entry committed last is of term 2: the
        # new leader may hold committed entries this node never received.
        (_host(journal), _st(10, 10, 3), "p"),
        (_host([(20, 3), (21, 3)]), _st(19, 19, 3), "p"),  # the committed entry was compacted away
    ]
    for host, st, leader in cases:
        node._catch_up(host, st, leader)
        assert node.status().caught_up is False  # status() before the first tick: not caught up
        assert node._caught_up is False, (st, leader)
    with_noop = [*journal, (11, 3)]  # the leader's no-op of term 3, committed and applied
    node._catch_up(_host(with_noop), _st(11, 10, 3), "p")
    assert node._caught_up is False  # committed, not yet applied
    node._catch_up(_host(with_noop), _st(11, 11, 3), "p")
    assert node._caught_up is True
    node._catch_up(_host(with_noop), _st(11, 11, 4), None)  # an election later: still caught up
    assert node._caught_up is True
