"""raftlog's additions to pysyncobj's timing and durability (pacing, journal, host), against
stand-ins for its internals: the follower-side trim of AppendEntries it already holds, eager
sends, and the stall excuse."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raftlog.clock import raft_clock
from raftlog.node import NodeConfig, RaftNode
from raftlog.pacing import _Pacer


class FakePoller:
    def __init__(self) -> None:
        self.subscribed: list[Any] = []
        self.callbacks: dict[int, Any] = {}

    def subscribe(self, fd: int, callback: Any, events: int) -> None:
        self.subscribed.append(fd)
        self.callbacks[fd] = callback


class FakeTransport:
    def __init__(self) -> None:
        self.callback: Any = None
        self.sent: list[tuple[Any, Any]] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append((node, message))
        return True

    def setOnMessageReceivedCallback(self, callback: Any) -> None:  # noqa: N802 - pysyncobj's name
        self.callback = callback


class FakeHost:
    """Just the attributes of pysyncobj's SyncObj that raftlog reads and writes."""

    def __init__(self, log: list[tuple[bytes, int, int]], *, leader: bool = False) -> None:
        self._poller = FakePoller()
        self._SyncObj__raftLog = log
        self._SyncObj__transport = FakeTransport()
        self._SyncObj__raftCommitIndex = 0
        self._SyncObj__raftNextIndex: dict[str, int] = {}
        self._SyncObj__raftMatchIndex: dict[str, int] = {}
        self._SyncObj__raftElectionDeadline = 0.0
        self.delivered: list[Any] = []
        self.sends = 0
        self.otherNodes = ["b", "c"]
        self.connected = {"b", "c"}
        self.leader = leader
        self._SyncObj__raftLeader: str | None = None
        self._rc_batch_peers: set[str] = set()
        self._SyncObj__lastResponseTime: dict[str, float] = {}

    def _SyncObj__onMessageReceived(self, node: str, message: Any) -> None:  # noqa: N802
        self.delivered.append(message)

    def _SyncObj__getCurrentLogIndex(self) -> int:  # noqa: N802
        return self._SyncObj__raftLog[-1][1]

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802
        self.sends += 1
        for node in self.otherNodes:
            self._SyncObj__raftNextIndex[node] = self._SyncObj__getCurrentLogIndex() + 1

    def _isLeader(self) -> bool:  # noqa: N802
        return self.leader

    def isNodeConnected(self, node: str) -> bool:  # noqa: N802
        return node in self.connected


def entries(first: int, last: int, term: int) -> list[tuple[bytes, int, int]]:
    return [(b"c%d" % i, i, term) for i in range(first, last + 1)]


def append(prev: int, prev_term: int, ents: list[tuple[bytes, int, int]], term: int = 2) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": 1, "entries": ents,
            "prevLogIdx": prev, "prevLogTerm": prev_term}


def delivered_after(log: list[tuple[bytes, int, int]], message: dict[str, Any]) -> dict[str, Any]:
    host = FakeHost(log)
    _Pacer(host)
    host._SyncObj__transport.callback("leader", message)
    assert len(host.delivered) == 1
    out: dict[str, Any] = host.delivered[0]
    return out


def test_entries_already_held_are_trimmed_to_what_is_new() -> None:
    out = delivered_after(entries(1, 5, 2), append(2, 2, entries(3, 7, 2)))
    assert (out["prevLogIdx"], out["prevLogTerm"], [e[1] for e in out["entries"]]) == (5, 2, [6, 7])
    assert out["commit_index"] == 1 and out["term"] == 2


def test_a_resent_batch_answers_for_this_leaders_later_entries_without_truncating_them() -> None:
    # pysyncobj would delete 6..8 (acknowledged already) and re-append only 3..5
    out = delivered_after(entries(1, 8, 2), append(2, 2, entries(3, 5, 2)))
    assert (out["prevLogIdx"], out["prevLogTerm"], out["entries"]) == (8, 2, [])


def test_later_entries_of_an_older_term_are_left_to_pysyncobj() -> None:
    log = entries(1, 8, 1)
    msg = append(2, 1, entries(3, 5, 1), term=2)
    assert delivered_after(log, msg) is msg


@pytest.mark.parametrize("log", [entries(1, 5, 1), entries(1, 2, 1)], ids=["conflicting-term", "nothing-held"])
def test_conflicting_or_new_entries_pass_unchanged(log: list[tuple[bytes, int, int]]) -> None:
    msg = append(2, 1, entries(3, 5, 2))
    assert delivered_after(log, msg) is msg


def test_a_partial_conflict_keeps_the_matching_prefix_as_the_new_prev() -> None:
    log = entries(1, 4, 2) + entries(5, 6, 1)  # 5 and 6 from an older leader
    out = delivered_after(log, append(2, 2, entries(3, 7, 2)))
    assert (out["prevLogIdx"], out["prevLogTerm"], [e[1] for e in out["entries"]]) == (4, 2, [5, 6, 7])


@pytest.mark.parametrize("message", [
    {"type": "append_entries", "term": 2, "commit_index": 3, "prevLogIdx": 4, "prevLogTerm": 2, "entries": []},
    {"type": "request_vote", "term": 3},
    {"type": "rc_keepalive"},
])
def test_other_messages_pass_untouched(message: dict[str, Any]) -> None:
    assert delivered_after(entries(1, 5, 2), message) is message


def test_the_leader_sends_at_once_to_an_idle_follower_and_waits_for_a_busy_one() -> None:
    host = FakeHost(entries(1, 5, 2), leader=True)
    pacer = _Pacer(host)
    host._SyncObj__raftNextIndex.update(b=6, c=6)
    host._SyncObj__raftMatchIndex.update(b=5, c=5)
    pacer.on_tick()
    assert host.sends == 0  # nothing new
    host._SyncObj__raftLog += entries(6, 7, 2)
    pacer.on_tick()
    assert host.sends == 1  # both idle: sent at once, not at the next period
    host._SyncObj__raftLog += entries(8, 8, 2)
    pacer.on_tick()
    assert host.sends == 1  # both still have 6..7 unacknowledged: 8 waits and joins their next batch
    host._SyncObj__raftMatchIndex["b"] = 7
    pacer.on_tick()
    assert host.sends == 2
    host._SyncObj__raftMatchIndex.update(b=8, c=8)
    host._SyncObj__raftCommitIndex = 8
    pacer.on_tick()
    assert host.sends == 2  # a new commit index alone waits for the next entries or heartbeat
    host._SyncObj__transport.callback("b", {"type": "apply_command", "command": b"x", "request_id": 1})
    host._SyncObj__raftLog += entries(9, 9, 2)  # b's command, appended by pysyncobj
    pacer.on_tick()
    assert host.sends == 3  # entry 9 goes out at once
    host._SyncObj__raftMatchIndex.update(b=9, c=9)
    host._SyncObj__raftCommitIndex = 9
    pacer.on_tick()
    assert host.sends == 4  # and its commit too: b's client waits for it
    pacer.on_tick()
    assert host.sends == 4
    host.connected.clear()
    host._SyncObj__raftLog += entries(10, 10, 2)
    pacer.on_tick()
    assert host.sends == 4  # nobody reachable
    host.leader = False
    host.connected.update({"b", "c"})
    pacer.on_tick()
    assert host.sends == 4  # followers never send


@pytest.mark.parametrize(("gap", "leader", "moved"), [(0.5, False, True), (0.05, False, False), (0.5, True, False)])
def test_a_followers_own_long_tick_pushes_its_election_deadline_past_it(
        tmp_path: Path, gap: float, leader: bool, moved: bool) -> None:
    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s", election_min=0.4),
                    fsm=None)  # type: ignore[arg-type]
    host = FakeHost(entries(1, 1, 1), leader=leader)
    before = raft_clock()  # pysyncobj stamps its deadline on its own clock
    host._SyncObj__raftElectionDeadline = before - 0.1  # would start an election on the next tick
    node._last_tick = before - gap
    node._excuse_own_stall(host)  # type: ignore[arg-type]
    if moved:
        assert host._SyncObj__raftElectionDeadline >= before + 0.4
    else:
        assert host._SyncObj__raftElectionDeadline == before - 0.1


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fdatasync raftlog.journal makes (still done), as the file descriptors it was given."""
    import os

    from raftlog import journal as node_module

    seen: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(node_module.os, "fdatasync", lambda fd: (seen.append(fd), real(fd)))
    return seen


def test_the_journal_syncs_each_append_unless_deferred_then_once(tmp_path: Path, syncs: list[int]) -> None:
    from raftlog import journal as node_module

    journal = node_module._DurableJournal(str(tmp_path / "j"))
    journal.add(b"a", 1, 1)
    assert len(syncs) == 1  # a follower's append: synced before it can be acknowledged
    journal.defer = True
    journal.add(b"b", 2, 1)
    journal.add(b"c", 3, 1)
    assert len(syncs) == 1
    journal.defer = False
    journal.sync()
    journal.sync()
    assert len(syncs) == 2  # the leader's batch: one sync, and only when something is pending
    for i in range(4, 40):
        journal.add(b"x", i, 1)
    syncs.clear()
    journal.deleteEntriesTo(30)  # compaction rewrites the kept entries: one sync for all
    assert len(syncs) == 1 and [e[1] for e in journal][:2] == [31, 32]
    reopened = node_module._DurableJournal(str(tmp_path / "j"))
    assert [e[1] for e in reopened] == list(range(31, 40))
    journal._destroy()
    reopened._destroy()


def test_the_journal_grows_past_its_mapping_and_reads_back_as_written(tmp_path: Path, syncs: list[int]) -> None:
    """The journal file keeps its size instead of asking the kernel on every write; growing
    still goes through pysyncobj, and pysyncobj's own reader finds every entry."""
    from pysyncobj.journal import FileJournal

    from raftlog import journal as node_module

    journal = node_module._DurableJournal(str(tmp_path / "j"))
    journal.defer = True
    sizes = {journal._rc_file._rc_size}
    written = [(bytes([i % 251]) * (i % 700 + 1), i, 1 + i // 1000) for i in range(1, 3001)]
    for command, idx, term in written:
        journal.add(command, idx, term)
        sizes.add(journal._rc_file._rc_size)
    journal.sync()
    assert len(sizes) > 5  # it grew several times (from 1 KiB to over 1 MiB)
    assert journal._rc_file._rc_size == journal._rc_file._ResizableFile__mm.size()
    assert syncs == [journal._rc_file.fileno()]
    journal._destroy()
    plain = FileJournal(str(tmp_path / "j"))
    assert [(bytes(e[0]), e[1], e[2]) for e in plain] == written
    plain._destroy()


def test_a_followers_batch_is_synced_once_and_before_its_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               syncs: list[int]) -> None:
    """Entries of one AppendEntries: one fdatasync, done before the answer acknowledging them."""
    from types import SimpleNamespace

    from pysyncobj import SyncObj

    from raftlog import journal as node_module
    from raftlog.host import _Host

    answers: list[tuple[int, int, bool]] = []  # (syncs so far, the index acknowledged, dirty then)
    journal = node_module._DurableJournal(str(tmp_path / "j"))
    monkeypatch.setattr(SyncObj, "_SyncObj__sendNextNodeIdx",
                        lambda self, node, reset=False, nextNodeIdx=None, success=False:
                        answers.append((len(syncs), nextNodeIdx, journal._rc_dirty)))
    follower = object.__new__(_Host)  # only the answer path of the real class
    follower._rc_owner = SimpleNamespace(_journal=journal, _restore_failed=None)

    class Follower(FakeHost):
        def _SyncObj__onMessageReceived(self, node: str, message: Any) -> None:  # noqa: N802
            for entry in message["entries"]:  # what pysyncobj does with an AppendEntries
                journal.add(*entry)
            _Host._SyncObj__sendNextNodeIdx(follower, node, nextNodeIdx=message["entries"][-1][1] + 1,
                                                      success=True)

    journal.add(b"c1", 1, 2)
    syncs.clear()
    host = Follower(journal)  # type: ignore[arg-type]
    _Pacer(host, journal)
    host._SyncObj__transport.callback("leader", append(1, 2, entries(2, 40, 2)))
    assert answers == [(1, 41, False)]  # one sync for 39 entries, and it came before the answer
    assert len(syncs) == 1 and not journal._rc_dirty
    reopened = node_module._DurableJournal(str(tmp_path / "j"))
    assert [e[1] for e in reopened] == list(range(1, 41))
    journal._destroy()
    reopened._destroy()


def test_term_and_vote_are_stored_synced_and_renamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from raftlog import journal as node_module

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(node_module.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    journal = node_module._DurableJournal(str(tmp_path / "j"))
    journal.setCurrentTerm(7, "127.0.0.1:2")
    assert len(synced) == 2  # the new file's data, then the directory holding the rename
    assert not (tmp_path / "j.meta.tmp").exists()
    again = node_module._DurableJournal(str(tmp_path / "j"))
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:2")
    journal._destroy()
    again._destroy()


def test_submits_wake_the_raft_thread_with_one_pipe_write_until_it_has_woken() -> None:
    import os

    host = FakeHost(entries(1, 1, 1), leader=True)
    pacer = _Pacer(host)  # type: ignore[arg-type]
    (fd,) = host._poller.subscribed

    def pending() -> bytes:
        try:
            return os.read(fd, 1024)
        except BlockingIOError:
            return b""

    for _ in range(100):
        pacer.wake()
    assert pending() == b"o"  # one write for the hundred submits
    pacer.wake()
    assert pending() == b""  # still flagged: the raft thread has not polled since
    host._poller.callbacks[fd](fd, 0)  # its poll: drains the pipe, then clears the flag
    pacer.wake()
    assert pending() == b"o"  # the next submit writes again


def test_a_failed_wake_up_write_is_tried_again_by_the_next_submit() -> None:
    host = FakeHost(entries(1, 1, 1), leader=True)
    pacer = _Pacer(host)  # type: ignore[arg-type]
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise OSError(9, "Bad file descriptor")

    pacer._notifier.notify = broken  # type: ignore[method-assign]
    for _ in range(2):
        with pytest.raises(OSError):
            pacer.wake()
    assert len(calls) == 2  # not taken for a pending wake-up


def test_leader_contact_age_as_a_follower_and_as_a_leader(tmp_path: Path) -> None:
    """How long a node has been out of touch with a leader that has a quorum: what a worker
    checks before it starts an attempt claimed for it. The raft thread notes the instant each
    tick (``_contact_at``); the age is read from it."""
    from raftlog.pacing import _contact_at

    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s"),
                    fsm=None)  # type: ignore[arg-type]
    assert node.leader_contact_age() == float("inf")  # no tick yet
    host = FakeHost(entries(1, 1, 1))
    pacer = _Pacer(host)  # type: ignore[arg-type]

    def age() -> float:
        node._contact = _contact_at(host, pacer)  # what _on_tick does
        return node.leader_contact_age()

    assert age() == float("inf")  # a follower that never heard a leader
    heartbeat = {"type": "append_entries", "term": 2, "prevLogIdx": 1, "prevLogTerm": 1, "commit_index": 1}
    pacer.inbound("b", heartbeat)  # pysyncobj refused it (a stale leader): its leader is not "b"
    assert age() == float("inf")
    host._SyncObj__raftLeader = "b"  # pysyncobj took "b" as its leader
    pacer.inbound("b", heartbeat)
    assert 0 <= age() < 1
    pacer.heard_leader -= 30
    assert age() >= 30
    pacer.inbound("c", heartbeat)  # from another node than the leader: no contact
    assert age() >= 30

    host.leader = True  # a leader of three counts the fresher of its two followers' answers
    now = raft_clock()  # pysyncobj stamps its followers' answers on its own clock
    host._SyncObj__lastResponseTime = {"b": now - 40, "c": now - 2}
    assert 2 <= age() < 3
    host._SyncObj__lastResponseTime = {"b": now - 40, "c": now - 50}
    assert age() >= 40
    host.otherNodes = ["b", "c", "d", "e"]  # of five, the second freshest
    host._SyncObj__lastResponseTime = {"b": now - 1, "c": now - 7, "d": now - 30, "e": now - 60}
    assert 7 <= age() < 8
    host.otherNodes = []  # alone: in touch with itself
    assert 0 <= age() < 1


class Peer:
    def __init__(self, id: str) -> None:  # noqa: A002 - pysyncobj's attribute name
        self.id = id


def test_forwarded_commands_and_their_answers_travel_in_one_message_per_peer_and_tick() -> None:
    """A follower forwards each command to the leader as its own message, and the leader
    answers each: batched per peer within one _checkCommandsToApply, to peers that said (in
    their keepalive) that they read batches; the receiver delivers them one by one, in order."""
    from raftlog.host import _Host

    leader, old = Peer("10.0.0.1:7001"), Peer("10.0.0.2:7001")
    sent: list[tuple[str, Any]] = []
    host = object.__new__(_Host)
    host._rc_batch, host._rc_batch_peers = None, {leader.id}
    host._rc_transport_send = lambda node, message: sent.append((node.id, message)) or True
    commands = [{"type": "apply_command", "command": b"c%d" % i, "request_id": i} for i in range(5)]

    host._rc_send(leader, commands[0])  # outside a batch window: straight out
    assert sent == [(leader.id, commands[0])]
    sent.clear()
    host._rc_batch = {}
    for c in commands:
        host._rc_send(leader, c)
        host._rc_send(old, c)  # a peer that never announced batches gets each at once
    assert [m for n, m in sent] == commands and {n for n, _ in sent} == {old.id}
    sent.clear()
    host._rc_flush()
    assert sent == [(leader.id, {"type": "rc_batch", "messages": commands})]
    assert host._rc_batch is None
    sent.clear()
    host._rc_batch = {}
    host._rc_send(leader, commands[1])
    host._rc_flush()
    assert sent == [(leader.id, commands[1])]  # one message needs no envelope

    receiver = FakeHost(entries(1, 1, 1), leader=True)
    pacer = _Pacer(receiver)  # type: ignore[arg-type]
    pacer.inbound(leader, {"type": "rc_batch", "messages": commands})
    assert receiver.delivered == commands and pacer._forwarded
    pacer.inbound(old, {"type": "rc_keepalive", "batch": 1})
    assert receiver._rc_batch_peers == {old.id}
    assert receiver.delivered[-1] == {"type": "rc_keepalive", "batch": 1}  # still handed on


def test_a_leader_uses_an_entry_form_only_once_every_peer_announced_it(tmp_path: Path) -> None:
    """NodeConfig.applies rides every keepalive; RaftNode.peers_apply holds only while each
    other member's newest keepalive lists the form (a peer restarted on an older release, or
    one not heard since this process started, closes it)."""
    b, c = Peer("10.0.0.2:7001"), Peer("10.0.0.3:7001")
    node = RaftNode(NodeConfig(raft_addr="10.0.0.1:7001", peers=(b.id, c.id), data_dir=tmp_path, secret="s",
                               applies=("expire_seen",)), fsm=None)  # type: ignore[arg-type]
    assert not node.peers_apply("expire_seen")  # no pacer yet: nothing heard

    host = FakeHost(entries(1, 1, 1))
    host.otherNodes = [b, c]  # type: ignore[list-item]
    node._last_keepalive = -1e9
    node._keepalive(host)  # type: ignore[arg-type]
    sent = host._SyncObj__transport.sent
    keepalives = [m for _, m in sent if m.get("type") == "rc_keepalive"]
    assert len(keepalives) == 2 and all(m["applies"] == ["expire_seen"] for m in keepalives)

    pacer = _Pacer(host)  # type: ignore[arg-type]
    node._pacer = pacer
    pacer.inbound(b, {"type": "rc_keepalive", "batch": 1, "applies": ["expire_seen", 7]})
    assert pacer.applies[b.id] == {"expire_seen"}
    assert not node.peers_apply("expire_seen")  # c not heard yet
    pacer.inbound(c, {"type": "rc_keepalive", "applies": ["expire_seen", "other"]})
    assert node.peers_apply("expire_seen") and not node.peers_apply("other")
    pacer.inbound(b, {"type": "rc_keepalive", "batch": 1})  # b came back on an older release
    assert not node.peers_apply("expire_seen") and pacer.applies[b.id] == frozenset()
    pacer.inbound(b, {"type": "rc_keepalive", "applies": "expire_seen"})  # not a list: nothing
    assert not node.peers_apply("expire_seen")
    pacer.inbound(b, {"type": "rc_keepalive", "applies": ["expire_seen"]})
    assert node.peers_apply("expire_seen")

    # The members are the raft thread's, not the start-up list: c removed (``members remove``)
    # no longer holds the form back; d added does until it announces it.
    pacer.inbound(c, {"type": "rc_keepalive"})
    assert not node.peers_apply("expire_seen")
    host.otherNodes = [b]  # type: ignore[list-item]
    node._last_keepalive = -1e9
    node._keepalive(host)  # type: ignore[arg-type]
    assert node.peers_apply("expire_seen")
    d = Peer("10.0.0.4:7001")
    host.otherNodes = [b, d]  # type: ignore[list-item]
    node._last_keepalive = -1e9
    node._keepalive(host)  # type: ignore[arg-type]
    assert not node.peers_apply("expire_seen")
    pacer.inbound(d, {"type": "rc_keepalive", "applies": ["expire_seen"]})
    assert node.peers_apply("expire_seen")

    alone = RaftNode(NodeConfig(raft_addr="10.0.0.1:7001", peers=(), data_dir=tmp_path, secret="s"),
                     fsm=None)  # type: ignore[arg-type]
    alone._pacer = _Pacer(FakeHost(entries(1, 1, 1)))  # type: ignore[arg-type]
    assert not alone.peers_apply("expire_seen")  # the raft thread has not ticked: members unknown
    single = FakeHost(entries(1, 1, 1))
    single.otherNodes = []
    alone._last_keepalive = -1e9
    alone._keepalive(single)  # type: ignore[arg-type]
    assert alone.peers_apply("expire_seen")  # a single node: no peer to wait for
    host2 = FakeHost(entries(1, 1, 1))
    host2.otherNodes = [b]  # type: ignore[list-item]
    alone._last_keepalive = -1e9
    alone._keepalive(host2)  # type: ignore[arg-type]
    assert all("applies" not in m for _, m in host2._SyncObj__transport.sent)  # announces nothing it lacks


def test_a_follower_trusts_a_form_only_while_the_leader_announces_it_heard_every_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RaftNode.leader_uses: on the leader, peers_apply; on a follower, the forms in the newest
    keepalive of the leader (``all_apply``), which the leader sends from what it heard."""
    a, b, c = Peer("10.0.0.1:7001"), Peer("10.0.0.2:7001"), Peer("10.0.0.3:7001")
    leader = RaftNode(NodeConfig(raft_addr=a.id, peers=(b.id, c.id), data_dir=tmp_path / "a", secret="s",
                                 applies=("expire_seen",)), fsm=None)  # type: ignore[arg-type]
    host = FakeHost(entries(1, 1, 1))
    host.otherNodes = [b, c]  # type: ignore[list-item]
    leader._pacer = pacer = _Pacer(host)  # type: ignore[arg-type]
    sent = host._SyncObj__transport.sent

    def tick() -> dict[str, Any]:
        sent.clear()
        leader._last_keepalive = -1e9
        leader._keepalive(host)  # type: ignore[arg-type]
        return next(m for _, m in sent if m.get("type") == "rc_keepalive")

    monkeypatch.setattr(leader, "status", lambda: SimpleNamespace(leader=a.id))
    assert tick()["all_apply"] == [] and not leader.leader_uses("expire_seen")
    pacer.inbound(b, {"type": "rc_keepalive", "applies": ["expire_seen"]})
    pacer.inbound(c, {"type": "rc_keepalive", "applies": ["expire_seen"]})
    announced = tick()
    assert announced["all_apply"] == ["expire_seen"] and leader.leader_uses("expire_seen")
    pacer.inbound(c, {"type": "rc_keepalive"})  # c back on an older release
    withdrawn = tick()
    assert withdrawn["all_apply"] == [] and not leader.leader_uses("expire_seen")

    follower = RaftNode(NodeConfig(raft_addr=b.id, peers=(a.id, c.id), data_dir=tmp_path / "b", secret="s",
                                   applies=("expire_seen",)), fsm=None)  # type: ignore[arg-type]
    fhost = FakeHost(entries(1, 1, 1))
    fhost.otherNodes = [a, c]  # type: ignore[list-item]
    follower._pacer = fpacer = _Pacer(fhost)  # type: ignore[arg-type]
    seen_leader: list[str | None] = [a.id]
    monkeypatch.setattr(follower, "status", lambda: SimpleNamespace(leader=seen_leader[0]))
    assert not follower.leader_uses("expire_seen")  # the leader not heard since this process started
    fpacer.inbound(a, announced)
    assert follower.leader_uses("expire_seen")
    fpacer.inbound(c, {"type": "rc_keepalive", "all_apply": ["expire_seen"]})  # read once c leads
    seen_leader[0] = c.id
    assert follower.leader_uses("expire_seen")
    seen_leader[0] = a.id
    fpacer.inbound(a, withdrawn)
    assert not follower.leader_uses("expire_seen")
    fpacer.inbound(a, announced)
    seen_leader[0] = None  # no leader: nobody proposes
    assert not follower.leader_uses("expire_seen")
