"""Partitions, one-way cuts, a flapping link, delay with loss and a stopped leader, on real agents
each in its own network namespace (tests/faults/network.py), judged by tests/faults/checker.py.

Each test runs two ``@every 1s`` jobs (at-least-once and at-most-once) through its fault and
asks the checker about every slot from just before the fault to after the cluster recovered.
A node cut off from the leader must start nothing once half a lease has passed (the worker's
rule): read from what the receiver got and which node the ledger says ran it.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.cluster.harness import Node, wait_for

from .checker import FAULT_TOLERANCE
from .rig import FIGURES, JOBS, LEASE, Rig

pytestmark = pytest.mark.faults

CUT = 10.0  # seconds a node stays cut off or stopped


def hold(seconds: float) -> None:
    """Keep a fault in place for ``seconds``: the fault's length is the thing under test."""
    time.sleep(seconds)


def started_while_cut(rig: Rig, node: Node, cut: float, healed: float) -> list[str]:
    """Deliveries the cut-off ``node`` made later than half a lease into its cut."""
    late = []
    for expect in JOBS:
        ran_by = {r["id"]: r["node"] for r in rig.c.runs(expect.name, via=rig.leader())}
        for d in rig.s.of(expect.name):
            rid = d.headers.get("X-Raftcron-Run-Id")
            if ran_by.get(rid) == node.name and cut + LEASE / 2 + FAULT_TOLERANCE < d.at < healed:
                late.append(f"{expect.name} run {rid} of slot {d.headers.get('X-Raftcron-Slot')} arrived "
                            f"{d.at - cut:.1f}s into {node.name}'s cut")
    return late


def judged(rig: Rig, t0: float, name: str) -> None:
    rig.wait_recovered()
    verdict = rig.judge(t0)
    FIGURES.append(f"faults: {name}: {verdict.line()}")
    assert verdict.counts["slots"] >= 10, verdict.report()
    assert verdict.ok, verdict.report()


def test_leader_isolated_from_both_followers(rig: Rig) -> None:
    old = rig.leader()
    others = [n for n in rig.c.nodes if n is not old]
    t0 = time.time()
    rig.net.isolate(rig.index(old))
    cut = time.time()
    hold(FAULT_TOLERANCE)
    committed = rig.status(old)["commit_index"]
    new = rig.c.leader(timeout=60, among=others)
    assert new is not old
    seen = {committed}
    while time.time() < cut + CUT:
        seen.add(rig.status(old)["commit_index"])  # the API of the cut-off node still answers us
        time.sleep(0.5)
    rig.net.heal()
    healed = time.time()
    rig.fault(cut, healed)
    assert max(seen) == committed, f"the isolated old leader committed entries {committed} -> {max(seen)} while cut off"
    assert started_while_cut(rig, old, cut, healed) == []
    judged(rig, t0, "leader isolated 10 s")


def test_one_follower_isolated(rig: Rig) -> None:
    leader = rig.leader()
    follower = next(n for n in rig.c.nodes if n is not leader)
    t0 = time.time()
    rig.net.isolate(rig.index(follower))
    cut = time.time()
    hold(CUT)
    rig.net.heal()
    healed = time.time()
    rig.fault(cut, healed)
    late = started_while_cut(rig, follower, cut, healed)
    assert late == [], late
    judged(rig, t0, "follower isolated 10 s")


@pytest.mark.parametrize("sender", ["leader", "follower"])
def test_one_way_cut(rig: Rig, sender: str) -> None:
    """A hears B, B does not hear A: every packet from A to B dropped, B to A passes."""
    leader = rig.leader()
    follower = next(n for n in rig.c.nodes if n is not leader)
    a, b = (leader, follower) if sender == "leader" else (follower, leader)
    t0 = time.time()
    rig.net.cut(rig.index(a), rig.index(b))
    cut = time.time()
    hold(CUT)
    rig.net.heal()
    rig.fault(cut, time.time())
    judged(rig, t0, f"one-way cut {sender} -> other 10 s")


def test_a_link_flapping_every_one_to_three_seconds(rig: Rig) -> None:
    leader = rig.leader()
    follower = next(n for n in rig.c.nodes if n is not leader)
    a, b = rig.index(leader), rig.index(follower)
    rng = random.Random(14)
    t0 = time.time()
    end = t0 + 30.0
    flips = 0
    for _ in range(60):  # bounded: 30 s of 1-3 s halves is at most 30 flips
        if time.time() >= end:
            break
        down = time.time()
        rig.net.cut(a, b)
        rig.net.cut(b, a)
        hold(min(rng.uniform(1.0, 3.0), max(0.0, end - time.time())))
        rig.net.heal()
        rig.fault(down, time.time())
        flips += 1
        hold(min(rng.uniform(1.0, 3.0), max(0.0, end - time.time())))
    assert flips >= 5
    judged(rig, t0, f"a leader-follower link flapping 30 s ({flips} cuts)")


def test_delay_and_loss_on_every_link(rig: Rig) -> None:
    terms = [rig.term(n) for n in rig.c.nodes]
    t0 = time.time()
    rig.net.slow(0.2, 0.1)
    rig.net.lossy(5)
    start = time.time()
    hold(12.0)
    during = [rig.term(n) for n in rig.c.nodes]
    rig.net.calm()
    rig.fault(start, time.time())
    assert rig.net.delayer is not None and rig.net.delayer.held > 100, "the delayer held the nodes' packets"
    FIGURES.append(f"faults: 200+-100 ms delay, 5 % loss for 12 s: raft term {max(terms)} -> {max(during)} "
                   f"({rig.net.delayer.held} packets delayed)")
    judged(rig, t0, "200+-100 ms delay with 5 % loss 12 s")


def test_leader_stopped_ten_seconds(rig: Rig) -> None:
    old = rig.leader()
    others = [n for n in rig.c.nodes if n is not old]
    t0 = time.time()
    old.pause()
    stopped = time.time()
    try:
        new = rig.c.leader(timeout=60, among=others)
        assert new is not old
        hold(max(0.0, stopped + CUT - time.time()))
    finally:
        old.resume()
    rig.fault(stopped, time.time())
    wait_for("the resumed old leader to follow the new one",
             lambda: (rig.status(old)["leader"] or {}).get("node_id") not in (None, old.name), timeout=60)
    judged(rig, t0, "leader SIGSTOP 10 s")
