"""Pre-vote (raftlog.prevote) on fake hosts: the answers a peer gives, the gate in front of
pysyncobj's election, the fallback for peers of an older release, and a real leader loss."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftlog.pacing import _Pacer
from raftlog.prevote import PREVOTE_REQUEST, PREVOTE_RESPONSE, PreVote
from raftlog.transport import KEEPALIVE

MIN, MAX = 0.4, 1.0
SILENT = 2.5  # seconds a peer must be connected without a keepalive to count as an older release


@dataclass(frozen=True)
class Node:
    id: str


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeHost:
    """The parts of pysyncobj's SyncObj that pre-vote reads and writes."""

    def __init__(self, name: str, names: list[str], *, term: int = 3, log_term: int = 3, log_index: int = 10) -> None:
        self.name = name
        self.otherNodes = [Node(n) for n in names if n != name]
        self.connected = {n.id for n in self.otherNodes}
        self.raftCurrentTerm = term
        self._SyncObj__raftLog = [(b"", i, log_term) for i in range(log_index - 2, log_index + 1)]
        self._SyncObj__raftElectionDeadline = 0.0
        self.leader = False

    def _isLeader(self) -> bool:  # noqa: N802 - pysyncobj's name
        return self.leader

    def isNodeConnected(self, node: Node) -> bool:  # noqa: N802 - pysyncobj's name
        return node.id in self.connected


class Cluster:
    """Fake hosts with a pre-vote each, their messages queued and delivered on ``pump``."""

    def __init__(self, names: list[str], **host: Any) -> None:
        self.clock = FakeClock()
        self.hosts = {n: FakeHost(n, names, **host) for n in names}
        self.heard = dict.fromkeys(names, 0.0)
        self.queue: list[tuple[str, str, dict[str, Any]]] = []
        self.down: set[str] = set()
        self.votes: dict[str, PreVote] = {}
        for name, h in self.hosts.items():
            self.votes[name] = PreVote(
                h, election_min=MIN, election_max=MAX, heard_leader=lambda n=name: self.heard[n],
                send=lambda node, msg, src=name: self.queue.append((src, node.id, msg)),
                silent_after=SILENT, monotonic=self.clock, rng=random.Random(7),
            )
            self.votes[name].peers = {n for n in names if n != name}

    def pump(self) -> int:
        delivered = 0
        while self.queue:
            src, dst, msg = self.queue.pop(0)
            if src in self.down or dst in self.down:
                continue
            self.votes[dst].take(Node(src), msg)
            delivered += 1
        return delivered

    def leader_heartbeat(self, leader: str) -> None:
        self.hosts[leader].leader = True
        for name in self.hosts:
            if name != leader and name not in self.down:
                self.heard[name] = self.clock.t
                self.hosts[name]._SyncObj__raftElectionDeadline = self.clock.t + MIN


def request(term: int, last_index: int = 10, last_term: int = 3) -> dict[str, Any]:
    return {"type": PREVOTE_REQUEST, "term": term, "last_log_index": last_index, "last_log_term": last_term}


def test_a_follower_that_heard_from_the_leader_refuses_and_one_that_did_not_grants() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["b"]
    c.heard["b"] = c.clock.t - (MIN - 0.05)
    assert not vote.would_vote(request(4))
    c.heard["b"] = c.clock.t - (MIN + 0.05)
    assert vote.would_vote(request(4))
    c.heard["b"] = 0.0  # never heard from a leader
    assert vote.would_vote(request(4))


def test_the_leader_refuses_and_a_term_not_above_its_own_is_refused() -> None:
    c = Cluster(["a", "b", "c"])
    c.hosts["b"].leader = True
    assert not c.votes["b"].would_vote(request(4))
    c.hosts["b"].leader = False
    assert not c.votes["b"].would_vote(request(3))
    assert c.votes["b"].would_vote(request(4))


def test_an_asker_whose_log_is_behind_is_refused() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["b"]
    assert not vote.would_vote(request(4, last_index=9, last_term=3))  # shorter, same last term
    assert not vote.would_vote(request(4, last_index=50, last_term=2))  # longer but older last term
    assert vote.would_vote(request(4, last_index=10, last_term=3))  # as up to date
    assert vote.would_vote(request(4, last_index=2, last_term=4))  # newer last term wins over length
    assert not vote.would_vote({"type": PREVOTE_REQUEST, "term": 4})  # malformed: no log position


def test_answering_changes_nothing_of_the_answering_node() -> None:
    c = Cluster(["a", "b", "c"])
    host = c.hosts["b"]
    host._SyncObj__raftElectionDeadline = 1234.5
    c.votes["b"].take(Node("a"), request(9))
    assert (host.raftCurrentTerm, host._SyncObj__raftElectionDeadline) == (3, 1234.5)
    assert c.queue == [("b", "a", {"type": PREVOTE_RESPONSE, "term": 9, "granted": True})]


def test_a_follower_cut_off_never_starts_an_election() -> None:
    c = Cluster(["a", "b", "c"])
    c.down.add("a")  # its messages go nowhere, though its links still look connected
    host = c.hosts["a"]
    for _ in range(20):
        c.clock.t += MAX + 0.01
        c.leader_heartbeat("c")
        c.votes["a"].before_tick()
        # pysyncobj elects only if the deadline has passed when its own check runs
        assert host._SyncObj__raftElectionDeadline > c.clock.t
        c.pump()
    assert c.votes["a"].rounds == 20 and c.votes["a"].elections == 0


def test_a_returning_follower_is_refused_while_the_leader_is_live() -> None:
    c = Cluster(["a", "b", "c"])
    c.clock.t += 5.0
    c.leader_heartbeat("c")
    c.heard["a"] = 0.0  # a was cut off: it has not heard from the leader for long
    c.hosts["a"]._SyncObj__raftElectionDeadline = 0.0
    c.votes["a"].before_tick()
    assert c.pump() == 4  # two asks, two answers
    assert c.hosts["a"]._SyncObj__raftElectionDeadline > c.clock.t
    assert c.votes["a"].won == 0 and c.votes["a"].elections == 0


def test_a_real_leader_loss_still_elects() -> None:
    c = Cluster(["a", "b", "c"])
    c.leader_heartbeat("c")
    c.down.add("c")
    c.hosts["a"].connected.discard("c")
    c.clock.t += MIN + 0.1  # past a's deadline, and past b's minimum timeout without the leader
    vote = c.votes["a"]
    vote.before_tick()
    assert vote.rounds == 1 and c.hosts["a"]._SyncObj__raftElectionDeadline > c.clock.t
    c.pump()
    assert vote.won == 1
    assert c.hosts["a"]._SyncObj__raftElectionDeadline == 0.0  # pysyncobj's next check elects
    vote.before_tick()
    assert c.hosts["a"]._SyncObj__raftElectionDeadline == 0.0 and vote.elections == 1


def test_a_leader_heard_after_the_gate_opened_closes_it() -> None:
    c = Cluster(["a", "b", "c"])
    c.down.add("c")
    c.clock.t += MIN + 0.1
    vote = c.votes["a"]
    vote.before_tick()
    c.pump()
    assert vote.won == 1
    c.hosts["a"]._SyncObj__raftElectionDeadline = c.clock.t + MIN  # an AppendEntries arrived
    vote.before_tick()
    c.clock.t += MIN + 0.1
    vote.before_tick()  # the deadline passed again: a new round, not the old grant
    assert vote.elections == 0 and vote.rounds == 2


def test_an_answer_to_an_earlier_round_or_an_older_term_is_not_counted() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.before_tick()
    asked = c.queue[0][2]["term"]
    c.queue.clear()
    vote.take(Node("b"), {"type": PREVOTE_RESPONSE, "term": asked - 1, "granted": True})
    vote.take(Node("b"), {"type": PREVOTE_RESPONSE, "term": asked, "granted": False})
    assert vote.won == 0
    c.hosts["a"].raftCurrentTerm += 1  # a vote request at a higher term moved it on meanwhile
    vote.take(Node("b"), {"type": PREVOTE_RESPONSE, "term": asked, "granted": True})
    assert vote.won == 0


def test_a_node_with_no_prevote_peers_elects_as_pysyncobj_does() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.peers = set()
    vote.heard = {"b", "c"}  # their keepalives came without "prevote": an older release
    vote.before_tick()
    assert c.queue == [] and vote.rounds == 0 and vote.elections == 1
    assert c.hosts["a"]._SyncObj__raftElectionDeadline == 0.0


def test_mid_upgrade_the_older_peers_count_as_yes() -> None:
    c = Cluster(["a", "b", "c", "d", "e"])
    vote = c.votes["a"]
    vote.peers = {"b", "c"}  # d and e run a release without pre-vote: 1 + 2 silent is a majority
    vote.heard = {"b", "c", "d", "e"}
    vote.before_tick()
    assert c.queue == [] and vote.elections == 1
    vote.peers = {"b", "c", "d"}  # 1 + 1 silent: one yes of b, c, d is needed
    c.heard["b"] = c.clock.t
    vote.before_tick()
    c.pump()
    assert vote.won == 1 and vote.rounds == 1


def test_a_node_just_started_waits_to_hear_its_peers_before_counting_them_silent() -> None:
    # A follower restarted while the leader lives: its election deadline passes before the
    # leader's first AppendEntries or any peer's keepalive reaches it. Counting its peers as
    # older releases then elected it at once, and its higher term deposed the leader.
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.peers = set()
    for _ in range(3):
        vote.before_tick()
        assert c.queue == [] and vote.elections == 0, "no election before the peers could announce themselves"
        c.clock.t += (SILENT - 0.1) / 2
    assert c.hosts["a"]._SyncObj__raftElectionDeadline == 0.0, "its own deadline is kept, to be checked again"
    # Then the peers' keepalives come: it asks, and peers that hear the leader refuse.
    vote.peers = vote.heard = {"b", "c"}
    c.heard.update(b=c.clock.t, c=c.clock.t)
    vote.before_tick()
    c.pump()
    assert vote.rounds == 1 and vote.won == 0 and vote.elections == 0


def test_a_peer_connected_long_without_a_keepalive_counts_as_an_older_release() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.peers = set()
    c.hosts["a"].connected = {"b"}  # c is down
    vote.before_tick()
    c.hosts["a"].connected = {"b", "c"}  # c comes up later than b
    c.clock.t += SILENT / 2
    vote.before_tick()
    assert vote.elections == 0
    c.clock.t += SILENT / 2  # b connected for SILENT: 1 + 1 of 3, a majority; c's half does not count
    vote.before_tick()
    assert c.queue == [] and vote.elections == 1


def test_a_peer_down_and_never_heard_is_no_yes() -> None:
    # Before, a peer that never announced pre-vote counted as a yes even while down: with one
    # peer down since this node started and the other live (and reading pre-vote), the node
    # elected without asking the live one.
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.peers = vote.heard = {"b"}
    c.hosts["a"].connected = {"b"}
    for _ in range(3):
        c.heard["b"] = c.clock.t  # b hears a live leader
        vote.before_tick()
        c.pump()
        c.clock.t += SILENT
    assert vote.elections == 0 and vote.rounds >= 1 and vote.won == 0


def test_a_node_connected_to_nobody_neither_asks_nor_elects() -> None:
    c = Cluster(["a", "b", "c"])
    c.hosts["a"].connected.clear()
    c.votes["a"].before_tick()
    assert c.queue == [] and c.votes["a"].elections == 0


def test_the_pacer_routes_prevote_messages_and_notes_who_reads_them() -> None:
    class Transport:
        def setOnMessageReceivedCallback(self, callback: Any) -> None:  # noqa: N802
            self.callback = callback

    class Host(FakeHost):
        def __init__(self) -> None:
            super().__init__("a", ["a", "b"])
            self._poller = type("P", (), {"subscribe": lambda *a: None})()
            self._SyncObj__transport = Transport()
            self._rc_batch_peers: set[str] = set()
            self._SyncObj__raftLeader: Node | None = None
            self.delivered: list[Any] = []

        def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
            self.delivered.append(message)

    host = Host()
    sent: list[Any] = []
    vote = PreVote(host, election_min=MIN, election_max=MAX, heard_leader=lambda: 0.0,
                   send=lambda node, msg: sent.append(msg))
    vote.peers = set()
    pacer = _Pacer(host, prevote=vote)  # type: ignore[arg-type]
    assert vote.heard == set()
    pacer.inbound(Node("b"), dict(KEEPALIVE))
    assert vote.peers == {"b"} and vote.heard == {"b"}
    pacer.inbound(Node("b"), {k: v for k, v in KEEPALIVE.items() if k != "prevote"})
    assert vote.peers == set() and vote.heard == {"b"}  # restarted on an older release: a yes without asking
    assert vote._older("b")
    pacer.inbound(Node("b"), request(4))
    assert sent == [{"type": PREVOTE_RESPONSE, "term": 4, "granted": True}]
    pacer.inbound(Node("b"), {"type": "append_entries", "term": 2, "commit_index": 1})
    assert vote._stale_leader > 0  # a leader below this node's term 3: noted before pysyncobj ignores it
    pacer.inbound(Node("b"), {"type": "append_entries", "term": 3, "commit_index": 1})
    assert vote._stale_leader == 0.0
    assert [m["type"] for m in host.delivered] == ["rc_keepalive", "rc_keepalive", "append_entries",
                                                   "append_entries"]  # pysyncobj never sees ours


def test_a_node_with_prevote_off_never_asks_but_still_answers() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.asks = False
    vote.before_tick()
    assert c.queue == [] and vote.rounds == 0
    assert c.hosts["a"]._SyncObj__raftElectionDeadline == 0.0  # pysyncobj elects as it always did
    vote.take(Node("b"), request(4))
    assert c.queue == [("a", "b", {"type": PREVOTE_RESPONSE, "term": 4, "granted": True})]


def pysyncobj_check(c: Cluster, name: str, late: float) -> Callable[[], None]:
    """pysyncobj's election check, ``late`` seconds after pre-vote read the clock: it elects
    (its term goes up) when it sees a passed deadline."""
    host = c.hosts[name]

    def tick() -> None:
        c.clock.t += late
        if host._SyncObj__raftElectionDeadline < c.clock.t:
            host.raftCurrentTerm += 1

    return tick


def test_a_deadline_that_passes_while_pysyncobj_is_about_to_check_starts_no_election() -> None:
    c = Cluster(["a", "b", "c"])
    host = c.hosts["a"]
    host._SyncObj__raftElectionDeadline = c.clock.t + 0.001
    c.votes["a"].around_tick(pysyncobj_check(c, "a", late=10.0))  # a SIGSTOP between the two
    assert host.raftCurrentTerm == 3
    assert host._SyncObj__raftElectionDeadline == 1000.001  # held, and given back
    c.votes["a"].around_tick(pysyncobj_check(c, "a", late=0.0))  # now pre-vote sees it passed: asks
    assert host.raftCurrentTerm == 3 and c.votes["a"].rounds == 1


def test_what_pysyncobj_writes_during_its_tick_is_kept() -> None:
    c = Cluster(["a", "b", "c"])
    host = c.hosts["a"]
    host._SyncObj__raftElectionDeadline = c.clock.t + 0.3

    def leader_message() -> None:
        host._SyncObj__raftElectionDeadline = c.clock.t + 0.9

    c.votes["a"].around_tick(leader_message)
    assert host._SyncObj__raftElectionDeadline == c.clock.t + 0.9


def test_the_gate_opens_for_pysyncobj_once_a_majority_granted() -> None:
    c = Cluster(["a", "b", "c"])
    c.down.add("c")
    c.clock.t += MIN + 0.1
    vote = c.votes["a"]
    vote.around_tick(pysyncobj_check(c, "a", late=0.0))
    c.pump()
    vote.around_tick(pysyncobj_check(c, "a", late=0.0))
    assert c.hosts["a"].raftCurrentTerm == 4 and vote.elections == 1


def test_a_node_ahead_of_a_live_leader_elects_without_asking() -> None:
    """Its term above the leader's, it ignores that leader and would be refused pre-vote for
    as long as the leader lives: the stuck node of a bench run (term 3 against a leader at 2)."""
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    c.clock.t += 5.0
    vote.note_append_entries(2)  # the leader's heartbeat, a term below a's 3
    vote.around_tick(pysyncobj_check(c, "a", late=0.0))
    assert c.queue == [] and c.hosts["a"].raftCurrentTerm == 4 and vote.elections == 1
    vote.note_append_entries(4)  # a leader at its own term again: the gate is back
    c.clock.t += 5.0
    vote.around_tick(pysyncobj_check(c, "a", late=0.0))
    assert c.hosts["a"].raftCurrentTerm == 4 and vote.rounds == 1


def test_a_lower_term_leader_heard_long_ago_no_longer_opens_the_gate() -> None:
    c = Cluster(["a", "b", "c"])
    vote = c.votes["a"]
    vote.note_append_entries(2)
    c.clock.t += MAX + 0.1
    vote.around_tick(pysyncobj_check(c, "a", late=0.0))
    assert c.hosts["a"].raftCurrentTerm == 3 and vote.rounds == 1


def test_a_leadership_transfer_is_not_asked_about() -> None:
    """The leader's TimeoutNow (pysyncobj's transferLeadership, used by a leader whose disk is
    full) makes the follower elect at once: its peers, which hear the live leader, would refuse
    a pre-vote, and the transfer would never happen."""
    c = Cluster(["a", "b", "c"])
    c.leader_heartbeat("c")
    host = c.hosts["a"]
    host._SyncObj__raftElectionDeadline = 0.0  # what pysyncobj does on TimeoutNow
    host._SyncObj__transferInProgress = True  # type: ignore[attr-defined]
    assert c.votes["a"].before_tick() is None  # the gate is open: pysyncobj's check elects
    assert c.pump() == 0 and c.votes["a"].rounds == 0
