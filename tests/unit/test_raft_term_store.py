"""A raft node whose term and vote cannot be stored (a full disk) changes neither, and stops
leading in a term it has seen passed.

Found by the disk-full fault test: pysyncobj set the new term in memory before storing it; the
store raised on the full leader, which kept leading in a term it never won, and its
AppendEntries in that term made the new leader's followers drop entries the new leader had
committed. These drive a real ``_Host`` (no threads, no sockets) through pysyncobj's own
message handler.
"""

from __future__ import annotations

import errno
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObjConf

from raftlog.host import _Host
from raftlog.journal import _DurableJournal, _DurableMeta, journal_factory
from tests.cluster.harness import free_ports


class Disk:
    """The meta file's store, failing with ENOSPC while ``full``."""

    def __init__(self) -> None:
        self.full = False

    def store(self, storer: _DurableMeta, meta: dict[str, Any]) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        _DurableMeta.storeMeta(storer, meta)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def leader(tmp_path: Path, disk: Disk) -> Iterator[tuple[_Host, list[dict[str, Any]]]]:
    """A leader of term 3 with two peers that never answer; what it sends is recorded, never sent."""
    me, *peers = (f"127.0.0.1:{port}" for port in free_ports(3))
    owner = types.SimpleNamespace(_journal=None, _pacer=None, _prevote=None, _restore_failed=None)
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / "raft.journal"), bindAddress=me)
    with journal_factory(True):
        host = _Host(owner, me, peers, conf)  # type: ignore[arg-type]
    journal = host._SyncObj__raftLog
    assert isinstance(journal, _DurableJournal)
    storer = journal._FileJournal__metaStorer
    storer.storeMeta = lambda meta: disk.store(storer, meta)
    sent: list[dict[str, Any]] = []
    host._rc_transport_send = lambda node, message: sent.append(message) or True
    host._SyncObj__setCurrentTerm(3, None)
    host._SyncObj__onBecomeLeader()
    assert host._isLeader()
    sent.clear()
    yield host, sent
    disk.full = False
    host.destroy()  # without a tick thread: closes its listener and its journal at once


def _peer(host: _Host) -> Any:
    return sorted(host.otherNodes, key=lambda n: n.id)[0]


def _stored_term(tmp_path: Path) -> tuple[int, Any]:
    meta = _DurableMeta(str(tmp_path / "raft.journal.meta")).getMeta()
    return meta.get("currentTerm", 0), meta.get("votedForNodeId")


def test_a_leader_that_cannot_store_a_newer_term_stops_leading_and_keeps_its_term(
        tmp_path: Path, disk: Disk, leader: tuple[_Host, list[dict[str, Any]]]) -> None:
    host, sent = leader
    log_index = host._SyncObj__getCurrentLogIndex()
    disk.full = True
    with pytest.raises(OSError):
        host._SyncObj__onMessageReceived(_peer(host), {
            "type": "request_vote", "term": 4, "last_log_index": log_index + 5, "last_log_term": 3})
    assert host._SyncObj__raftCurrentTerm == 3, "a term adopted in memory that the disk does not hold"
    assert not host._isLeader(), "still leading after hearing of term 4"
    assert not [m for m in sent if m["type"] == "response_vote"], "voted without storing the vote"
    # Its next heartbeat would have carried term 4 and deposed the real leader of term 4.
    host._SyncObj__sendAppendEntries()
    assert all(m.get("term", 3) <= 3 for m in sent), sent
    # Nothing but the step down happened: the term on disk and the one the journal would store
    # at its next one-second flush are the old one.
    assert _stored_term(tmp_path) == (3, None)
    disk.full = False
    host._SyncObj__raftLog.onOneSecondTimer()
    assert _stored_term(tmp_path) == (3, None)


def test_a_newer_term_in_append_entries_that_cannot_be_stored_is_not_taken(
        disk: Disk, leader: tuple[_Host, list[dict[str, Any]]]) -> None:
    host, _ = leader
    log_index = host._SyncObj__getCurrentLogIndex()
    disk.full = True
    with pytest.raises(OSError):
        host._SyncObj__onMessageReceived(_peer(host), {
            "type": "append_entries", "term": 4, "commit_index": 0, "entries": [(b"x", log_index + 1, 4)],
            "prevLogIdx": log_index, "prevLogTerm": 3})
    assert host._SyncObj__raftCurrentTerm == 3
    assert not host._isLeader()
    assert host._SyncObj__getCurrentLogIndex() == log_index, "took entries of a term it could not store"


def test_the_term_is_taken_once_the_disk_takes_it(tmp_path: Path, disk: Disk,
                                                  leader: tuple[_Host, list[dict[str, Any]]]) -> None:
    host, sent = leader
    peer = _peer(host)
    message = {"type": "request_vote", "term": 4, "last_log_index": host._SyncObj__getCurrentLogIndex() + 5,
               "last_log_term": 3}
    disk.full = True
    with pytest.raises(OSError):
        host._SyncObj__onMessageReceived(peer, message)
    disk.full = False
    host._SyncObj__onMessageReceived(peer, message)  # the candidate asks again
    assert host._SyncObj__raftCurrentTerm == 4
    assert [m for m in sent if m["type"] == "response_vote"] == [{"type": "response_vote", "term": 4}]
    assert _stored_term(tmp_path) == (4, peer.id)


def test_a_commit_index_that_cannot_be_stored_skips_no_tick_and_is_stored_later(
        tmp_path: Path, disk: Disk, leader: tuple[_Host, list[dict[str, Any]]]) -> None:
    host, _ = leader
    journal = host._SyncObj__raftLog
    journal.setRaftCommitIndex(2)
    disk.full = True
    journal.onOneSecondTimer()  # pysyncobj calls it at the top of a tick: it must not raise
    meta = _DurableMeta(str(tmp_path / "raft.journal.meta")).getMeta()
    assert meta.get("raftCommitIndex", 1) != 2
    disk.full = False
    journal.onOneSecondTimer()
    assert _DurableMeta(str(tmp_path / "raft.journal.meta")).getMeta()["raftCommitIndex"] == 2
