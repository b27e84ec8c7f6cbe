"""raftlog reads raft times on pysyncobj's clock (the timebase of its deadlines and stamps).

pysyncobj stamps its election deadline and its followers' answers with ``CLOCK_MONOTONIC_RAW``;
``time.monotonic`` is slewed by NTP and parts from it by the clock's frequency error (0.31 s
after 1 h 52 min of uptime on the benchmark machine). Here ``time.monotonic`` runs 30 s ahead
of pysyncobj's clock, as after some days of uptime: a leader whose quorum has just answered read
as 30 s out of touch (its worker then cut off every attempt it held), and an excused stall
pushed the election deadline 30 s out."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pysyncobj.monotonic import monotonic as pysyncobj_clock

from raftlog import NodeConfig, RaftNode
from raftlog.pacing import _contact_at
from raftlog.prevote import PreVote


class _Fsm:
    def apply(self, command: bytes, ctx: object) -> None:
        return None

    def snapshot(self) -> object:
        return iter([b""])

    def restore(self, data: bytes) -> None:
        return None


@pytest.fixture
def slewed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "monotonic", lambda: pysyncobj_clock() + 30.0)


def _node(tmp_path: Path) -> RaftNode:
    return RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=("127.0.0.1:2", "127.0.0.1:3"), data_dir=tmp_path,
                               secret="s"), _Fsm())  # type: ignore[arg-type]


def test_a_leader_whose_quorum_just_answered_is_in_touch(tmp_path: Path, slewed: None) -> None:
    node = _node(tmp_path)
    now = pysyncobj_clock()
    host = SimpleNamespace(_isLeader=lambda: True, otherNodes=["b", "c"], _SyncObj__lastResponseTime={"b": now, "c": now})
    node._contact = _contact_at(host, pacer=None)  # type: ignore[arg-type]
    assert node.leader_contact_age() < 1.0


def test_an_excused_stall_moves_the_election_deadline_by_one_timeout(tmp_path: Path, slewed: None) -> None:
    node = _node(tmp_path)
    host = SimpleNamespace(_isLeader=lambda: False, _SyncObj__raftElectionDeadline=pysyncobj_clock() - 1.0)
    node._last_tick -= 1.0  # this node's own tick took a second
    node._excuse_own_stall(host)  # type: ignore[arg-type]
    ahead = host._SyncObj__raftElectionDeadline - pysyncobj_clock()
    assert 0 < ahead <= node.config.election_min + 0.5, ahead


def test_pre_vote_reads_the_deadline_on_pysyncobjs_clock() -> None:
    gate = PreVote(SimpleNamespace(), election_min=0.4, election_max=1.0, heard_leader=lambda: 0.0,
                   send=lambda node, message: None)
    assert gate._now is pysyncobj_clock
