"""raftlog.clock: peers' wall clocks estimated NTP-style, with injected clocks (no sleeps);
the exchange offered only to peers that announce it; RaftNode's view relative to the leader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlog.clock import DRIFT, MAX_AGE, SAMPLES, ClockEstimate, ClockSync, TimeSource
from raftlog.node import MemberStatus, NodeConfig, NodeStatus, RaftNode
from raftlog.pacing import _Pacer
from raftlog.transport import KEEPALIVE, send_keepalives


@dataclass
class World:
    """True time, which every fake clock reads through its own skew."""

    now: float = 100_000.0  # small enough that float steps stay far below the delays under test

    def node(self, skew: float, mono_base: float) -> FakeClocks:
        return FakeClocks(self, skew, mono_base)


@dataclass
class FakeClocks:
    world: World
    skew: float  # this node's wall clock minus true time
    mono_base: float  # monotonic clocks start anywhere

    def source(self) -> TimeSource:
        return TimeSource(wall=lambda: self.world.now + self.skew, mono=lambda: self.world.now + self.mono_base)


def pair(skew_b: float, skew_a: float = 0.0) -> tuple[World, FakeClocks, ClockSync, ClockSync]:
    world = World()
    a_clocks = world.node(skew_a, 50.0)
    return world, a_clocks, ClockSync(a_clocks.source()), ClockSync(world.node(skew_b, 9_000.0).source())


def round_trip(world: World, a: ClockSync, b: ClockSync, out: float, back: float) -> None:
    """a asks b; the request takes ``out`` seconds, the answer ``back``."""
    request = a.request("b")
    world.now += out
    answer = b.answer(request)
    assert answer is not None
    world.now += back
    assert a.take("b", answer)


@pytest.mark.parametrize("skew", [3.0, -3.0, 30.0])
@pytest.mark.parametrize(("out", "back"), [(0.001, 0.001), (0.002, 0.2), (0.2, 0.002), (0.05, 0.05)],
                         ids=["fast", "slow-back", "slow-out", "symmetric"])
def test_the_estimate_is_within_its_error_bound_of_the_true_offset(skew: float, out: float, back: float) -> None:
    world, _, a, b = pair(skew)
    assert a.estimate("b") is None  # nothing measured yet
    round_trip(world, a, b, out, back)
    est = a.estimate("b")
    assert est is not None
    assert est.error == pytest.approx((out + back) / 2) and est.age == 0
    assert abs(est.offset - skew) <= est.error + 1e-9
    if out == back:
        assert est.offset == pytest.approx(skew, abs=1e-6)  # a symmetric path costs nothing


def test_the_least_delayed_sample_wins_over_later_ones() -> None:
    world, _, a, b = pair(3.0)
    round_trip(world, a, b, 0.001, 0.001)  # quiet link: the good sample
    for _ in range(5):  # then a queue on the way back: each later sample is 0.1 s off, with a wide bound
        world.now += 0.5
        round_trip(world, a, b, 0.001, 0.2)
    est = a.estimate("b")
    assert est is not None
    assert est.offset == pytest.approx(3.0, abs=1e-6)
    assert est.age == pytest.approx(2.5 + 5 * 0.201)
    assert est.error == pytest.approx(0.001 + DRIFT * est.age)
    for _ in range(SAMPLES):  # the good sample falls out of the window of the last SAMPLES
        world.now += 0.5
        round_trip(world, a, b, 0.001, 0.2)
    est = a.estimate("b")
    assert est is not None and est.error == pytest.approx(0.1005 + DRIFT * est.age)
    assert abs(est.offset - 3.0) <= est.error


def test_the_error_bound_grows_with_age_and_an_old_sample_is_dropped() -> None:
    world, _, a, b = pair(-3.0)
    round_trip(world, a, b, 0.01, 0.01)
    world.now += 20
    est = a.estimate("b")
    assert est is not None and est.age == pytest.approx(20)
    assert est.error == pytest.approx(0.01 + 20 * DRIFT)
    world.now += MAX_AGE
    assert a.estimate("b") is None


def test_a_step_of_our_own_wall_clock_mid_round_corrupts_neither_delay_nor_offset() -> None:
    world, a_clocks, a, b = pair(3.0)
    request = a.request("b")
    world.now += 0.01
    answer = b.answer(request)
    assert answer is not None
    a_clocks.skew += 5.0  # our wall clock is stepped forward while the answer travels
    world.now += 0.01
    assert a.take("b", answer)
    est = a.estimate("b")
    assert est is not None
    assert est.error == pytest.approx(0.01)  # by wall time the round would have taken 5.02 s
    assert est.offset == pytest.approx(3.0 - 5.0, abs=1e-6)  # the truth now that our clock moved
    a_clocks.skew -= 5.0  # stepped back later: the kept sample follows at once
    est = a.estimate("b")
    assert est is not None and est.offset == pytest.approx(3.0, abs=1e-6)


def test_answers_to_no_outstanding_round_are_ignored() -> None:
    world, _, a, b = pair(3.0)
    first = a.request("b")
    second = a.request("b")  # the first's answer never came in time; this round replaced it
    late = b.answer(first)
    assert late is not None and not a.take("b", late)
    answer = b.answer(second)
    assert answer is not None and a.take("b", answer)
    assert not a.take("b", answer)  # a duplicate
    assert not a.take("c", answer)  # from someone never asked
    assert b.answer({"type": "rc_clock_req"}) is None  # no t1: nothing to answer
    assert a.estimate("b") is not None


# ---- only to peers that announce it ------------------------------------------------------


class Peer:
    def __init__(self, id: str) -> None:  # noqa: A002 - pysyncobj's attribute name
        self.id = id


class Wire:
    """pysyncobj's transport: what is sent, and a link to the other side's receiver."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.callback: Any = None
        self.far: Any = None  # (the far side's _Pacer, how it sees us)

    def setOnMessageReceivedCallback(self, callback: Any) -> None:  # noqa: N802 - pysyncobj's name
        self.callback = callback

    def send(self, node: Peer, message: dict[str, Any]) -> bool:
        self.sent.append((node.id, message))
        if self.far is not None:
            pacer, me = self.far
            pacer.inbound(me, message)
        return True


class Poller:
    def subscribe(self, fd: int, callback: Any, events: int) -> None:
        pass


class Host:
    """The attributes of pysyncobj's SyncObj that _Pacer touches on a follower."""

    def __init__(self) -> None:
        self._poller = Poller()
        self._SyncObj__transport = Wire()
        self._rc_batch_peers: set[str] = set()
        self.delivered: list[Any] = []

    def _SyncObj__onMessageReceived(self, node: Peer, message: Any) -> None:  # noqa: N802
        self.delivered.append(message)


def test_a_peer_that_does_not_announce_the_clock_exchange_is_never_sent_it() -> None:
    world, _, a, _b = pair(3.0)
    host = Host()
    pacer = _Pacer(host, None, a)
    old, new = Peer("10.0.0.2:7001"), Peer("10.0.0.3:7001")
    wire = host._SyncObj__transport
    for _ in range(3):
        pacer.inbound(old, {"type": "rc_keepalive", "batch": 1})  # an older release's keepalive
        send_keepalives(wire, [old], a)
    assert wire.sent == [(old.id, KEEPALIVE)] * 3
    pacer.inbound(new, KEEPALIVE)
    wire.sent.clear()
    send_keepalives(wire, [old, new], a)
    assert [(n, m["type"]) for n, m in wire.sent] == [
        (old.id, "rc_keepalive"), (new.id, "rc_keepalive"), (new.id, "rc_clock_req")]
    assert all(m["type"] == "rc_keepalive" for n, m in wire.sent if n == old.id)
    assert host.delivered[-1] == KEEPALIVE  # keepalives still reach pysyncobj


def test_two_nodes_time_each_other_through_their_pacers() -> None:
    world = World()
    a_clock = ClockSync(world.node(0.0, 1.0).source())
    b_clock = ClockSync(world.node(-3.0, 2.0).source())
    a_host, b_host = Host(), Host()
    a_pacer = _Pacer(a_host, None, a_clock)
    b_pacer = _Pacer(b_host, None, b_clock)
    a_peer, b_peer = Peer("a"), Peer("b")
    a_host._SyncObj__transport.far = (b_pacer, a_peer)
    b_host._SyncObj__transport.far = (a_pacer, b_peer)
    send_keepalives(a_host._SyncObj__transport, [b_peer], a_clock)  # a announces; b does not know b yet
    assert a_clock.estimate("b") is None
    send_keepalives(b_host._SyncObj__transport, [a_peer], b_clock)  # b announces, and asks a at once
    send_keepalives(a_host._SyncObj__transport, [b_peer], a_clock)
    a_est, b_est = a_clock.estimate("b"), b_clock.estimate("a")
    assert a_est is not None and b_est is not None
    assert a_est.offset == pytest.approx(-3.0) and b_est.offset == pytest.approx(3.0)
    clock_types = {"rc_clock_req", "rc_clock_resp"}
    assert not [m for m in a_host.delivered + b_host.delivered if m["type"] in clock_types]  # ours alone


# ---- relative to the leader --------------------------------------------------------------


def node_with(tmp_path: Path, world: World, skew: float, leader: str | None, peers: tuple[str, ...]) -> RaftNode:
    node = RaftNode(NodeConfig(raft_addr="me", peers=peers, data_dir=tmp_path, secret="s"),
                    fsm=None, time_source=world.node(skew, 7.0).source())  # type: ignore[arg-type]
    node._cached = NodeStatus(raft_addr="me", state="leader" if leader == "me" else "follower", leader=leader,
                              term=3, commit_index=1, applied_index=1, has_quorum=True, raft_thread_alive=True,
                              partners=tuple(MemberStatus(raft_addr=p, connected=True, match_index=1) for p in peers))
    return node


def measure(world: World, node: RaftNode, peer: str, skew: float, delay: float) -> None:
    far = ClockSync(world.node(skew, 123.0).source())
    request = node._clock.request(peer)
    world.now += delay / 2
    answer = far.answer(request)
    assert answer is not None
    world.now += delay / 2
    assert node._clock.take(peer, answer)


def test_a_followers_view_of_every_members_clock_against_the_leaders(tmp_path: Path) -> None:
    world = World()
    node = node_with(tmp_path, world, 1.0, "lead", ("lead", "other"))  # this node runs 1 s ahead
    assert node.clock_offset_to_leader() is None and node.member_clocks() == {}  # nothing measured
    measure(world, node, "lead", 4.0, 0.02)
    measure(world, node, "other", -1.0, 0.04)
    to_leader = node.clock_offset_to_leader()
    assert to_leader is not None and to_leader.offset == pytest.approx(3.0)
    assert to_leader.error == pytest.approx(0.01, abs=1e-5)
    clocks = node.member_clocks()
    assert set(clocks) == {"me", "lead", "other"}
    assert clocks["lead"] == ClockEstimate(0.0, 0.0, 0.0)
    assert clocks["me"].offset == pytest.approx(-3.0) and clocks["me"].error == pytest.approx(0.01, abs=1e-5)
    assert clocks["other"].offset == pytest.approx(-5.0)
    assert clocks["other"].error == pytest.approx(0.03, abs=1e-5)  # both legs' errors (and a hair of drift)
    node._cached = NodeStatus(raft_addr="me", state="candidate", leader=None, term=4, commit_index=1,
                              applied_index=1, has_quorum=False, raft_thread_alive=True)
    assert node.member_clocks() == {} and node.clock_offset_to_leader() is None


def test_the_leaders_view(tmp_path: Path) -> None:
    world = World()
    node = node_with(tmp_path, world, 2.0, "me", ("b", "c"))
    measure(world, node, "b", 2.5, 0.01)
    assert node.clock_offset_to_leader() == ClockEstimate(0.0, 0.0, 0.0)
    clocks = node.member_clocks()
    assert set(clocks) == {"me", "b"}  # c not measured yet
    assert clocks["me"] == ClockEstimate(0.0, 0.0, 0.0)
    assert clocks["b"].offset == pytest.approx(0.5) and clocks["b"].error == pytest.approx(0.005)


def test_a_step_of_the_peers_wall_clock_shows_at_the_next_round() -> None:
    world = World()
    peer = world.node(3.0, 20.0)
    a, b = ClockSync(world.node(0.0, 10.0).source()), ClockSync(peer.source())
    for _ in range(3):
        round_trip(world, a, b, 0.001, 0.001)
        world.now += 0.5
    peer.skew = 8.0  # an operator steps the peer's clock 5 s forward
    round_trip(world, a, b, 0.05, 0.05)  # a slower round than the three before it
    est = a.estimate("b")
    assert est is not None and abs(est.offset - 8.0) <= est.error
    assert est.error == pytest.approx(0.05)  # the older, quicker samples were dropped, not preferred
    round_trip(world, a, b, 0.01, 0.01)  # samples after the step are kept together
    est = a.estimate("b")
    assert est is not None and est.error == pytest.approx(0.01) and abs(est.offset - 8.0) <= est.error
