"""Firing by the cluster's clock, and keeping skewed clocks out (scheduler/skew.py, worker._fire).

A fake node returns chosen estimates of the leader's clock; a FakeClock stands
for this node's wall and monotonic clocks. "Leader time" in these tests is the
local fake time plus the true offset the test picked; an estimate is that
offset give or take its error bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from memraft import MemoryCommitter, MemoryNode

from raftlog import Bridge, ClockEstimate, MemberStatus, NodeStatus
from scheduler.clock import FakeClock
from scheduler.commands import Claim, ClaimSlots, NodeClock, Noop, PutJob, RegisterNode
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.runtime import RuntimeConfig, SchedulerRuntime
from scheduler.service import Service
from scheduler.skew import REUSE, ClockGuard, SkewWatch, leader_lead_us, not_before_local_us, parse_max_skew, trusted
from scheduler.state import State
from scheduler.worker import Worker

LOCAL0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
JOB = {"name": "tick", "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"}}


class SkewedNode(MemoryNode):
    """The in-memory replica, whose estimates of the leader's clock (and of the members') are
    whatever the test sets, and whose known leader's address the test may move."""

    def __init__(self, state: State, estimate: ClockEstimate | None) -> None:
        super().__init__(state)
        self.estimate = estimate
        self.clocks: dict[str, ClockEstimate] = {}
        self.addr = "mem:1"  # the leader's raft address
        self.partners: tuple[str, ...] = ()

    def leader(self) -> str | None:
        return self.addr if self.leading else None

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        return self.estimate

    def member_clocks(self) -> dict[str, ClockEstimate]:
        return dict(self.clocks)

    def status(self) -> NodeStatus:
        # The members are whatever the test names in ``partners`` (the other raft addresses).
        return replace(super().status(), partners=tuple(
            MemberStatus(raft_addr=a, connected=True, match_index=None) for a in self.partners))


class Recorder:
    """An executor noting the local fake time each attempt started at; the times in its outcome
    come from ``now``, the cluster's time as the agent wires it (see _worker)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.now: Callable[[], datetime] = clock.now
        self.fired: list[tuple[Attempt, datetime]] = []

    async def run(self, attempt: Attempt) -> Outcome:
        self.fired.append((attempt, self.clock.now()))
        now = self.now()
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=now, finished_at=now)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _setup(estimate: ClockEstimate | None) -> tuple[FakeClock, State, SkewedNode, Service, Recorder]:
    clock = FakeClock(LOCAL0)
    state = State()
    node = SkewedNode(state, estimate)
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")  # type: ignore[arg-type]
    await service.propose(RegisterNode(at_us=us(LOCAL0), node_id="n1", raft_addr="mem:1", http_addr="mem:2"))
    await service.propose(PutJob(at_us=us(LOCAL0), spec=parse_job(JOB).to_doc()))
    return clock, state, node, service, Recorder(clock)


async def _claim(service: Service, slot: datetime, key: str = "k1") -> str:
    result, _ = await service.propose(ClaimSlots(at_us=us(LOCAL0), leader="n1", term=1, claims=(
        Claim(job="tick", slot_us=us(slot), trigger="manual", node="n1", request_key=key),)))
    return str(result["runs"][0]["id"])


async def _run_until(clock: FakeClock, until: datetime) -> None:
    """Advance the fake clock deadline by deadline (exactly to each sleeper's wake-up) up to ``until``."""
    for _ in range(10_000):
        await _settle()
        nxt = clock.next_deadline()
        if nxt is None or nxt > clock.monotonic() + (until - clock.now()).total_seconds():
            clock.advance_to(until)
            await _settle()
            return
        clock.advance(max(0.0, nxt - clock.monotonic()))
    raise AssertionError("the worker kept sleeping in tiny steps")


def _worker(service: Service, clock: FakeClock, rec: Recorder, **kw: Any) -> Worker:
    worker = Worker(service, clock, {"http": rec, "shell": rec}, lease=5.0, flush_interval=0.001, **kw)
    rec.now = worker.cluster.now
    service.node.hooks.append(lambda a: worker.on_applied(a, False))  # type: ignore[attr-defined]  # the fake's
    return worker


@pytest.mark.parametrize(("node_ahead", "misestimate"), [
    (3.0, +0.01), (3.0, -0.01), (-3.0, +0.01), (-3.0, -0.01), (30.0, +0.02), (30.0, -0.02),
])
async def test_fires_by_the_leaders_clock_never_early_and_within_the_error_bound(node_ahead: float,
                                                                                  misestimate: float) -> None:
    true_offset = -node_ahead  # the leader's wall minus this node's
    error = 0.02
    clock, state, node, service, rec = await _setup(ClockEstimate(true_offset + misestimate, error, 0.1))
    worker = _worker(service, clock, rec, max_skew=60.0)  # translation only: the skew rule is tested below
    starts: list[float] = []
    worker.on_start = lambda job, late: starts.append(late)
    worker.start()
    try:
        leader_now = LOCAL0 + timedelta(seconds=true_offset)
        slot = leader_now + timedelta(seconds=10)
        rid = await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=10 + abs(node_ahead) + 5))
        assert len(rec.fired) == 1, "the attempt fired once"
        _, local_at = rec.fired[0]
        leader_at = local_at + timedelta(seconds=true_offset)
        assert leader_at >= slot, f"fired {(slot - leader_at).total_seconds():.3f}s before its slot by the leader's clock"
        # 10 us of slack: the fake clock is stepped by float seconds from deadline to deadline.
        assert leader_at - slot <= timedelta(seconds=2 * error, microseconds=10), "no later than twice the error bound"
        # Reported in the cluster's time: the start, its lateness, and the result.
        for _ in range(100):
            if state.runs[rid]["status"] == "succeeded":
                break
            await asyncio.sleep(0.001)
        run = state.runs[rid]
        assert run["status"] == "succeeded"
        assert 0 <= run["started_us"] - us(slot) <= 2 * error * 1e6 + 1
        assert starts and 0 <= starts[0] <= 2 * error + 1e-6
    finally:
        await worker.stop()


async def test_a_node_three_seconds_ahead_does_not_fire_three_seconds_early() -> None:
    # The bug of issue 12, on the worker as the agent builds it: the attempt fired when this
    # node's own wall clock reached the slot, 3 s before the leader's did.
    true_offset = -3.0
    clock, state, node, service, rec = await _setup(ClockEstimate(true_offset, 0.005, 0.1))
    worker = Worker(service, clock, {"http": rec, "shell": rec}, lease=5.0, flush_interval=0.001)
    worker.max_skew = 10.0  # this test is about when it fires, not about refusing a skewed node
    node.hooks.append(lambda a: worker.on_applied(a, False))
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=true_offset + 10)
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=20))
        assert rec.fired, "the attempt fired"
        leader_at = rec.fired[0][1] + timedelta(seconds=true_offset)
        early = (slot - leader_at).total_seconds()
        assert early <= 0, f"fired {early:.3f}s before its slot by the leader's clock"
    finally:
        await worker.stop()


async def test_an_estimate_that_moves_while_sleeping_is_read_again_on_waking() -> None:
    clock, state, node, service, rec = await _setup(ClockEstimate(0.0, 0.0, 0.0))
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=10)
        await _claim(service, slot)
        await _settle()
        assert clock.sleepers >= 1
        node.estimate = ClockEstimate(-0.4, 0.01, 0.0)  # the leader turns out 0.4 s behind this node
        await _run_until(clock, LOCAL0 + timedelta(seconds=15))
        assert len(rec.fired) == 1
        assert rec.fired[0][1] - timedelta(seconds=0.4) >= slot, "not started before the slot by the newest estimate"
    finally:
        await worker.stop()


async def test_no_estimate_means_not_started_and_declined_after_half_a_lease() -> None:
    clock, state, node, service, rec = await _setup(None)
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        rid = await _claim(service, LOCAL0 + timedelta(seconds=1))
        await _run_until(clock, LOCAL0 + timedelta(seconds=30))
        assert rec.fired == []
        assert worker.declined == 1
        assert state.runs[rid]["status"] == "claimed", "left for the leader to count lost and retry"
    finally:
        await worker.stop()


async def test_an_estimate_arriving_while_waiting_is_used() -> None:
    clock, state, node, service, rec = await _setup(None)
    worker = _worker(service, clock, rec, max_skew=2.0)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=1)
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=0.5))
        node.estimate = ClockEstimate(-1.0, 0.01, 0.0)  # the leader 1 s behind: due at local +2.01 s
        await _run_until(clock, LOCAL0 + timedelta(seconds=5))
        assert len(rec.fired) == 1 and worker.declined == 0
        assert rec.fired[0][1] - timedelta(seconds=1.0) >= slot
    finally:
        await worker.stop()


async def test_no_estimate_long_before_the_instant_is_not_held_against_the_attempt() -> None:
    clock, state, node, service, rec = await _setup(None)
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=20)  # a retry's backoff instant, say: far ahead
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=19))  # 19 s without an estimate, > half a lease
        node.estimate = ClockEstimate(0.2, 0.01, 0.0)
        await _run_until(clock, LOCAL0 + timedelta(seconds=25))
        assert worker.declined == 0 and len(rec.fired) == 1
        assert rec.fired[0][1] + timedelta(seconds=0.2) >= slot
    finally:
        await worker.stop()


async def test_a_node_skewed_itself_starts_nothing_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    clock, state, node, service, rec = await _setup(ClockEstimate(-3.0, 0.01, 0.0))
    worker = _worker(service, clock, rec, max_skew=0.5)
    worker.start()
    caplog.set_level(logging.INFO, logger="raftcron.worker")
    try:
        for i in range(3):
            await _claim(service, LOCAL0 + timedelta(seconds=i - 2), key=f"k{i}")
        await _run_until(clock, LOCAL0 + timedelta(seconds=10))
        assert rec.fired == [] and worker.declined == 3 and worker.skewed
        beyond = [r for r in caplog.records if "beyond --max-clock-skew" in r.getMessage()]
        assert len(beyond) == 1, "logged once per transition, not per attempt"
        node.estimate = ClockEstimate(-0.1, 0.01, 0.0)
        # Ahead of the leader's clock (about 9.9 s now): claimed at LOCAL0, a slot already 3 s past
        # would be declined as applied too late (worker._too_late), which is not what this tests.
        await _claim(service, LOCAL0 + timedelta(seconds=12), key="k9")
        await _run_until(clock, LOCAL0 + timedelta(seconds=20))
        assert len(rec.fired) == 1 and not worker.skewed
        assert len([r for r in caplog.records if "back within --max-clock-skew" in r.getMessage()]) == 1
    finally:
        await worker.stop()


async def test_a_leader_recorded_ahead_of_its_followers_holds_attempts_back_by_its_lead() -> None:
    # The leader's clock runs 3 s ahead of its followers' (it recorded so): a follower on the
    # majority's time fires when the majority's clock reaches the slot, not the leader's.
    clock, state, node, service, rec = await _setup(ClockEstimate(3.0, 0.01, 0.0))
    await service.propose(RegisterNode(at_us=us(LOCAL0), node_id="n0", raft_addr="mem:0", http_addr="mem:9"))
    await service.propose(NodeClock(at_us=us(LOCAL0), node="n0", offset_us=3_000_000, error_us=10_000, skewed=True,
                                    leader="n0", term=1, reason="ahead"))
    node.addr = "mem:0"  # n0 leads
    assert leader_lead_us(state.clocks, state.nodes, "mem:0") == (3_000_000, 10_000)
    worker = _worker(service, clock, rec)  # max_skew 0.5: this node agrees with the majority
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=10)  # by this node's (the majority's) clock
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=20))
        assert len(rec.fired) == 1 and not worker.skewed
        assert slot <= rec.fired[0][1] <= slot + timedelta(seconds=0.05)
    finally:
        await worker.stop()


async def test_a_leader_stepping_ahead_holds_attempts_until_its_lead_is_recorded() -> None:
    # The leader's clock jumps 3 s ahead: this follower's estimate says so before the leader's
    # record of its lead is committed. Its own clock now reads as skewed, so it holds the
    # attempt instead of firing it 3 s early, and fires once the record tells it the lead.
    clock, state, node, service, rec = await _setup(ClockEstimate(0.0, 0.01, 0.0))
    await service.propose(RegisterNode(at_us=us(LOCAL0), node_id="n0", raft_addr="mem:0", http_addr="mem:9"))
    node.addr = "mem:0"  # n0 leads
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=2)  # this node keeps the true time
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=0.5))
        node.estimate = ClockEstimate(3.0, 0.01, 0.0)
        await _run_until(clock, LOCAL0 + timedelta(seconds=2.3))
        assert rec.fired == [] and worker.skewed, "held, not fired by the stepped leader's clock"
        await service.propose(NodeClock(at_us=us(LOCAL0), node="n0", offset_us=3_000_000, error_us=10_000,
                                        skewed=True, leader="n0", term=1, reason="ahead"))
        await _run_until(clock, LOCAL0 + timedelta(seconds=3))
        assert len(rec.fired) == 1 and worker.declined == 0 and not worker.skewed
        assert slot <= rec.fired[0][1] <= LOCAL0 + timedelta(seconds=2.4)
    finally:
        await worker.stop()


# ---- the guard (pure) ------------------------------------------------------------------

MEMBERS = {"a:1": "n1", "a:2": "n2", "a:3": "n3"}  # n1 leads at a:1


def _est(offset: float) -> ClockEstimate:
    return ClockEstimate(offset, 0.005, 0.1)


def test_guard_reports_each_transition_once() -> None:
    g = ClockGuard(0.5, settle=0.0)
    v = g.check({"a:1": _est(0), "a:2": _est(0.01), "a:3": _est(3.0)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0)
    assert v.skewed == {"n3"} and not v.leader_skewed
    assert [(c.node, c.skewed, c.offset_us) for c in v.changed] == [("n3", True, 3_000_000)]
    v = g.check({"a:1": _est(0), "a:2": _est(0.01), "a:3": _est(2.9)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 1.0)
    assert v.skewed == {"n3"} and v.changed == ()
    v = g.check({"a:1": _est(0), "a:2": _est(0.01), "a:3": _est(0.2)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 2.0)
    assert v.skewed == frozenset() and [(c.node, c.skewed) for c in v.changed] == [("n3", False)]
    v = g.check({"a:1": _est(0), "a:2": _est(-0.6), "a:3": _est(0.2)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 3.0)
    assert v.skewed == {"n2"} and [(c.node, c.skewed) for c in v.changed] == [("n2", True)]


def test_guard_a_reachable_member_without_estimate_is_skewed_after_the_grace_only() -> None:
    g = ClockGuard(0.5, unmeasured_grace=5.0, settle=0.0)
    clocks = {"a:1": _est(0), "a:2": _est(0)}
    v = g.check(clocks, MEMBERS, {"n1", "n2", "n3"}, "a:1", 100.0)
    assert v.skewed == frozenset() and v.changed == ()
    v = g.check(clocks, MEMBERS, {"n1", "n2", "n3"}, "a:1", 105.0)
    assert v.skewed == {"n3"} and [(c.node, c.offset_us) for c in v.changed] == [("n3", None)]
    v = g.check(clocks, MEMBERS, {"n1", "n2"}, "a:1", 200.0)  # unreachable now: keeps its judgement
    assert v.skewed == {"n3"} and v.changed == ()
    v = g.check({**clocks, "a:3": _est(0.1)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 201.0)
    assert v.skewed == frozenset() and [(c.node, c.skewed) for c in v.changed] == [("n3", False)]


def test_guard_an_unreachable_member_never_measured_is_not_news() -> None:
    g = ClockGuard(0.5, unmeasured_grace=1.0)
    v = g.check({"a:1": _est(0), "a:2": _est(0)}, MEMBERS, {"n1", "n2"}, "a:1", 0.0)
    v = g.check({"a:1": _est(0), "a:2": _est(0)}, MEMBERS, {"n1", "n2"}, "a:1", 50.0)
    assert v.skewed == frozenset() and v.changed == ()
    # Reachable at last: its grace starts now, not when it was first seen.
    v = g.check({"a:1": _est(0), "a:2": _est(0)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 50.5)
    assert v.skewed == frozenset() and v.changed == ()
    v = g.check({"a:1": _est(0), "a:2": _est(0)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 51.5)
    assert v.skewed == {"n3"}


def test_guard_a_leader_far_from_a_majority_is_the_skewed_one() -> None:
    g = ClockGuard(0.5)
    # The leader runs 3 s ahead: both followers read -3 s against it.
    v = g.check({"a:1": _est(0), "a:2": _est(-3.0), "a:3": _est(-3.1)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0)
    assert v.leader_skewed and v.skewed == {"n1"}, "the followers agree with each other: they keep their attempts"
    (lead,) = [c for c in v.changed if c.node == "n1"]
    assert lead.skewed and lead.offset_us == 3_050_000 and "median" in lead.reason
    # One follower of two far is no majority: the follower is the skewed one.
    g = ClockGuard(0.5)
    v = g.check({"a:1": _est(0), "a:2": _est(0.0), "a:3": _est(-3.0)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0)
    assert not v.leader_skewed and v.skewed == {"n3"}


def test_guard_leaves_a_node_out_at_once_but_reports_only_a_settled_change() -> None:
    g = ClockGuard(0.5, settle=1.0)
    good = {"a:1": _est(0), "a:2": _est(0), "a:3": _est(0)}
    assert g.check(good, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0).changed == ()
    blip = {**good, "a:2": _est(-3.0)}  # a leader's step, seen by one follower's sample so far
    v = g.check(blip, MEMBERS, {"n1", "n2", "n3"}, "a:1", 1.0)
    assert v.skewed == {"n2"} and v.changed == ()
    v = g.check(good, MEMBERS, {"n1", "n2", "n3"}, "a:1", 1.5)
    assert v.skewed == frozenset() and v.changed == (), "back before it settled: no report, no recovery"
    g.check(blip, MEMBERS, {"n1", "n2", "n3"}, "a:1", 2.0)
    v = g.check(blip, MEMBERS, {"n1", "n2", "n3"}, "a:1", 2.9)
    assert v.skewed == {"n2"} and v.changed == ()
    v = g.check(blip, MEMBERS, {"n1", "n2", "n3"}, "a:1", 3.0)
    assert [(c.node, c.skewed) for c in v.changed] == [("n2", True)]
    # The leader's own judgement is reported at once: workers time slots by the lead it records.
    ahead = {"a:1": _est(0), "a:2": _est(-3.0), "a:3": _est(-3.0)}
    v = g.check(ahead, MEMBERS, {"n1", "n2", "n3"}, "a:1", 3.1)
    assert v.leader_skewed and ("n1", True) in [(c.node, c.skewed) for c in v.changed]


def test_guard_majority_counts_unmeasured_followers() -> None:
    members = {f"a:{i}": f"n{i}" for i in range(1, 6)}
    g = ClockGuard(0.5)
    v = g.check({"a:1": _est(0), "a:2": _est(-3), "a:3": _est(-3), "a:4": _est(0)}, members, set(members.values()),
                "a:1", 0.0)
    assert not v.leader_skewed and v.skewed == {"n2", "n3"}


def test_guard_starts_from_what_is_recorded() -> None:
    g = ClockGuard(0.5, known={"n3": True, "n2": False}, settle=0.0)
    v = g.check({"a:1": _est(0), "a:2": _est(0), "a:3": _est(0.1)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0)
    assert [(c.node, c.skewed) for c in v.changed] == [("n3", False)], "a recovery from an earlier leader's judgement"
    g = ClockGuard(0.5, known={"n3": True})
    v = g.check({"a:1": _est(0), "a:2": _est(0), "a:3": _est(4.0)}, MEMBERS, {"n1", "n2", "n3"}, "a:1", 0.0)
    assert v.skewed == {"n3"} and v.changed == (), "reported already"


def test_not_before_local_is_never_early_for_any_true_offset_within_the_bound() -> None:
    due = us(LOCAL0)
    est = ClockEstimate(-3.0, 0.05, 0.0)
    local = not_before_local_us(due, est)
    for true_offset in (-3.05, -3.0, -2.95):
        assert local + true_offset * 1e6 >= due
    assert local + (-2.95) * 1e6 - due <= 0.1 * 1e6 + 1


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("250ms", 0.25)])
def test_max_skew_flag_values(text: str, seconds: float) -> None:
    assert parse_max_skew(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0ms", "-1s", "fast", "1.5s", ""])
def test_max_skew_flag_rejects_bad_values(text: str) -> None:
    with pytest.raises(ValueError, match="--max-clock-skew"):
        parse_max_skew(text)


def test_agent_rejects_a_bad_max_clock_skew(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from api.agent import add_agent_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_agent_arguments(p)
    args = p.parse_args(["--node-id", "n1", "--raft-addr", "127.0.0.1:1", "--secret", "s" * 32])
    assert config_from_args(args).max_clock_skew == 0.5, "default 500ms"
    args = p.parse_args(["--node-id", "n1", "--raft-addr", "127.0.0.1:1", "--secret", "s" * 32, "--max-clock-skew", "soon"])
    with pytest.raises(ValueError, match="--max-clock-skew 'soon'"):
        config_from_args(args)


# ---- the leader's side: picker, NodeClock, alerts ------------------------------------------------


async def _cluster() -> tuple[FakeClock, State, SkewedNode, Service]:
    clock = FakeClock(LOCAL0)
    state = State()
    node = SkewedNode(state, ClockEstimate(0, 0, 0))
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")  # type: ignore[arg-type]
    for i in (1, 2, 3):
        await service.propose(RegisterNode(at_us=us(LOCAL0), node_id=f"n{i}", raft_addr=f"mem:{i}", http_addr="x"))
    await service.propose(PutJob(at_us=us(LOCAL0), spec=parse_job(JOB).to_doc()))
    await service.propose(Noop(at_us=us(LOCAL0), node="n1", term=node.term))  # the leader loop's barrier
    return clock, state, node, service


def _picks(service: Service, live: set[str], n: int = 60) -> set[str]:
    job = service.state.job("tick")
    assert job is not None
    picker = service.picker(live)
    return {node for _ in range(n) for node in picker.pick(job)[0]}


async def test_the_picker_never_picks_a_skewed_node_and_each_change_is_one_alert() -> None:
    clock, state, node, service = await _cluster()
    node.clocks = {"mem:1": _est(0), "mem:2": _est(0.01), "mem:3": _est(3.0)}
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5, interval=0.25, settle=1.0)
    task = asyncio.create_task(watch.run())
    try:
        await _settle()
        assert _picks(service, watch.live()) == {"n2"}, "n3 is skewed; the leader (n1) is spared while n2 is free"
        assert "n3" not in state.clocks, "left out at once, reported once settled"
        for _ in range(4):
            clock.advance(0.25)
            await _settle()
        assert _picks(service, watch.live()) == {"n2"}
        assert state.clocks["n3"]["skewed"] and state.clocks["n3"]["offset_us"] == 3_000_000
        assert trusted({"n1", "n2", "n3"}, state.clocks) == {"n1", "n2"}, "every node's picker reads the record"
        skew_alerts = [a for a in state.alerts.values() if a["event"].startswith("clock_skew")]
        assert [(a["event"], a["node"], a["job"]) for a in skew_alerts] == [("clock_skew", "n3", None)]
        for _ in range(4):  # unchanged: nothing more is committed or alerted
            clock.advance(0.25)
            await _settle()
        assert len([a for a in state.alerts.values() if a["event"].startswith("clock_skew")]) == 1
        node.clocks["mem:3"] = _est(0.1)
        clock.advance(0.25)
        await _settle()
        assert _picks(service, watch.live()) == {"n2"}, "taken back only once the recovery is recorded"
        for _ in range(4):
            clock.advance(0.25)
            await _settle()
        assert not state.clocks["n3"]["skewed"]
        assert _picks(service, watch.live()) == {"n2", "n3"}
        events = [a["event"] for a in state.alerts.values() if a["event"].startswith("clock_skew")]
        assert events == ["clock_skew", "clock_skew_recovered"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_skewed_leader_is_reported_and_takes_no_attempts() -> None:
    clock, state, node, service = await _cluster()
    node.clocks = {"mem:1": _est(0), "mem:2": _est(-3.0), "mem:3": _est(-3.0)}
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5)
    task = asyncio.create_task(watch.run())
    try:
        await _settle()
        assert state.clocks["n1"]["skewed"] and state.clocks["n1"]["offset_us"] == 3_000_000
        assert [(a["event"], a["node"]) for a in state.alerts.values()] == [("clock_skew", "n1")]
        assert _picks(service, watch.live()) == {"n2", "n3"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _apply(state: State, index: int, cmd: Any) -> Any:
    from raftlog.fsm import ApplyContext
    from scheduler.commands import encode_command

    return state.apply(encode_command(cmd), ApplyContext(index=index))


def test_node_clock_raises_one_alert_per_transition_and_none_when_unchanged() -> None:
    state = State()
    t = us(LOCAL0)

    def nc(skewed: bool, offset: int | None, at: int) -> NodeClock:
        return NodeClock(at_us=t + at, node="n2", offset_us=offset, error_us=None if offset is None else 2_000,
                         skewed=skewed, leader="n1", term=3, reason="why")

    _apply(state, 1, nc(False, 1_000, 0))
    assert state.alerts == {}, "a first good clock is no news"
    _apply(state, 2, nc(True, 3_000_000, 1))
    _apply(state, 3, nc(True, 3_100_000, 2))  # a retried or repeated judgement
    _apply(state, 4, nc(True, None, 3))
    alerts = list(state.alerts.values())
    assert [(a["event"], a["node"], a["job"], a["run_id"]) for a in alerts] == [("clock_skew", "n2", None, None)]
    assert alerts[0]["extra"]["offset_ms"] == 3000 and alerts[0]["error"] == "why"
    assert state.clocks["n2"]["since_us"] == t + 1, "skewed since the transition, not the last repeat"
    _apply(state, 5, nc(False, 100, 4))
    _apply(state, 6, nc(False, 100, 5))
    assert [a["event"] for a in state.alerts.values()] == ["clock_skew", "clock_skew_recovered"]
    back = State()
    back.restore(state.snapshot_bytes())
    assert back.clocks == state.clocks
    assert back.snapshot_bytes() == state.snapshot_bytes()


def test_a_snapshot_without_the_clocks_section_restores_empty() -> None:
    state = State()
    _apply(state, 1, RegisterNode(at_us=0, node_id="n1", raft_addr="a", http_addr="b"))
    raw = b"".join(chunk for chunk in state.snapshot() if b"clocks" not in chunk)
    back = State()
    back.restore(raw)
    assert back.clocks == {} and "n1" in back.nodes



async def test_a_leader_recorded_skewed_under_another_leader_records_its_own_lead() -> None:
    # n1, skewed as a follower of n2 (+3 s), now leads: workers hold attempts back by the lead
    # only from a record of this leadership, so the watch commits one although the judgement
    # (skewed) did not change.
    clock, state, node, service = await _cluster()
    await service.propose(NodeClock(at_us=us(LOCAL0), node="n1", offset_us=3_000_000, error_us=1_000, skewed=True,
                                    leader="n2", term=1, reason="ahead of n2"))
    assert leader_lead_us(state.clocks, state.nodes, "mem:1") == (0, 0), "n2's judgement of a follower"
    node.clocks = {"mem:1": _est(0), "mem:2": _est(-3.0), "mem:3": _est(-3.0)}
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5)
    task = asyncio.create_task(watch.run())
    try:
        await _settle()
        assert leader_lead_us(state.clocks, state.nodes, "mem:1") == (3_000_000, 5_000)
        assert [a["event"] for a in state.alerts.values()] == ["clock_skew"], "no second alert for the same skew"
        node.clocks = {"mem:1": _est(0), "mem:2": _est(-4.0), "mem:3": _est(-4.0)}  # the leader's clock jumps on
        clock.advance(0.25)
        await _settle()
        assert leader_lead_us(state.clocks, state.nodes, "mem:1") == (4_000_000, 5_000)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("leader_ahead", [30.0, -3.0])
async def test_a_leader_with_a_far_clock_plans_by_its_followers_median_and_not_before_judging(
        leader_ahead: float) -> None:
    """A node elected with its clock 30 s ahead must not take the next 30 s of slots for late
    (skipped, or run as catch-up), nor one 3 s behind claim every slot 3 s late: it plans by
    the median of its followers' clocks, once that is judged and its own record committed."""
    clock, state, node, service = await _cluster()
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5)
    node.clocks = {"mem:1": _est(0), "mem:2": _est(-leader_ahead), "mem:3": _est(-leader_ahead + 0.01)}
    assert watch.planning_now_us() is None, "judged skewed: nothing is planned before its lead is recorded"
    assert "clock is judged skewed" in watch.not_planning() and "not recorded yet" in watch.not_planning()
    task = asyncio.create_task(watch.run())
    try:
        await _settle()
        planned = watch.planning_now_us()
        assert planned is not None
        followers_now = us(clock.now()) - round(leader_ahead * 1e6)
        assert abs(planned - followers_now) <= 10_000, "the followers' median, not the leader's own clock"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_before_its_barrier_plans_nothing_and_says_so() -> None:
    clock, state, node, service = await _cluster()
    node.term += 1  # elected again: the barrier applied is the last term's
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5)
    assert watch.planning_now_us() is None
    assert watch.not_planning() == (f"this term's barrier is not applied here yet (term {node.term}; the last "
                                    f"barrier applied is of term {node.term - 1})")
    await service.propose(Noop(at_us=us(LOCAL0), node="n1", term=node.term))
    assert watch.planning_now_us() == us(clock.now())


async def test_a_leader_in_line_with_its_followers_plans_by_its_own_clock() -> None:
    clock, state, node, service = await _cluster()
    node.clocks = {"mem:1": _est(0), "mem:2": _est(0.2), "mem:3": _est(-0.1)}
    watch = SkewWatch(service, clock, lambda: {"n1", "n2", "n3"}, 0.5)
    task = asyncio.create_task(watch.run())
    try:
        await _settle()
        assert watch.planning_now_us() == us(clock.now())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_cluster_time_is_the_leaders_clock_less_its_recorded_lead() -> None:
    from scheduler.skew import ClusterTime

    clock = FakeClock(LOCAL0)
    lead = {"us": 0}
    ct = ClusterTime(clock, lambda: ClockEstimate(-3.0, 0.001, 0.1), lambda: lead["us"])
    assert ct.now() == LOCAL0 - timedelta(seconds=3), "this node runs 3 s ahead of the leader"
    lead["us"] = 30_000_000  # the leader recorded itself 30 s ahead of its followers' median
    clock.advance(REUSE)  # a reading is carried forward that long (see the next test)
    assert ct.now() == LOCAL0 - timedelta(seconds=33) + timedelta(seconds=REUSE), \
        "leases and starts in the time the leader plans by"


def test_cluster_time_carries_a_reading_forward_briefly_and_operator_stamps_read_afresh() -> None:
    from scheduler.skew import ClusterTime

    clock = FakeClock(LOCAL0)
    reads = {"n": 0, "offset": -3.0}

    def source() -> ClockEstimate:
        reads["n"] += 1
        return ClockEstimate(reads["offset"], 0.001, 0.1)

    ct = ClusterTime(clock, source)
    first = ct.now()
    reads["offset"] = -2.0  # a new round trip moved the estimate by a second
    clock.advance(REUSE / 2)
    assert ct.now() == first + timedelta(seconds=REUSE / 2), "carried forward on the monotonic clock"
    assert reads["n"] == 1
    # An operator's write is stamped with what the leader's clock has certainly reached: never
    # from a reading carried forward, whose error it would not account for.
    assert ct.reached_us() == us(clock.now() - timedelta(seconds=2.0)) - 1000 and reads["n"] == 2
    clock.advance(REUSE)
    assert ct.now() == clock.now() - timedelta(seconds=2.0), "read afresh once REUSE has passed"


@pytest.mark.parametrize("leader_ahead", [-3.0, 3.0])
async def test_a_new_leader_far_from_the_others_is_corrected_before_its_lead_is_recorded(leader_ahead: float) -> None:
    # Just elected, n0's clock is 3 s off both followers' and nothing is recorded yet: the
    # slots the previous leader claimed fire by the followers' clock, this node's estimates of
    # the members' clocks telling the lead (a 3 s slow leader made them 3 s late before).
    clock, state, node, service, rec = await _setup(ClockEstimate(leader_ahead, 0.01, 0.0))
    await service.propose(RegisterNode(at_us=us(LOCAL0), node_id="n0", raft_addr="mem:0", http_addr="mem:9"))
    node.addr = "mem:0"  # n0 leads
    node.clocks = {"mem:0": _est(0.0), "mem:1": _est(-leader_ahead), "mem:2": _est(-leader_ahead + 0.01)}
    assert leader_lead_us(state.clocks, state.nodes, "mem:0") == (0, 0), "nothing recorded"
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=10)  # by this node's (the majority's) clock
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=20))
        assert len(rec.fired) == 1 and not worker.skewed
        assert slot <= rec.fired[0][1] <= slot + timedelta(seconds=0.05)
    finally:
        await worker.stop()


async def test_a_leader_planning_30s_behind_its_own_clock_plans_at_its_first_tick() -> None:
    # The leader's clock is 30 s fast and it plans by its followers' (SkewWatch.planning_now_us):
    # its jobs are due at the first tick, not when the planning instant catches up with its wall
    # clock (before, a leader 30 s fast planned nothing for 30 s, then skipped those slots).
    from scheduler.leader import LeaderConfig, LeaderLoop

    clock, state, node, service, _ = await _setup(ClockEstimate(0, 0, 0))
    await service.propose(PutJob(at_us=us(LOCAL0) - 60_000_000, spec=parse_job(
        {**JOB, "name": "every", "schedule": "@every 1s"}).to_doc()))
    loop = LeaderLoop(service, clock, LeaderConfig(), lambda: {"n1"}, lambda: us(clock.now()) - 30_000_000)
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(10):
            await _settle()
            clock.advance(0.05)
        assert state.job_runs["every"], "claims made within the first ticks"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_follower_far_ahead_that_measured_only_itself_does_not_take_the_leader_for_the_far_one() -> None:
    # Seen in the clock-skew cluster test (a follower at +3 s, 1 delivery 1.8 s early): just
    # after an election this node (mem:1, 3 s ahead of the leader mem:0) had measured the
    # leader but not the third member; judged by the measured followers only, itself the one
    # measured, "all followers far" made the leader look 3 s ahead, its lead was subtracted
    # and the slot fired 3 s early by the leader's clock. Of the leader's two followers one
    # far one is no majority: the attempt is not started early (this node is the skewed one).
    clock, state, node, service, rec = await _setup(ClockEstimate(-3.0, 0.01, 0.0))
    await service.propose(RegisterNode(at_us=us(LOCAL0), node_id="n0", raft_addr="mem:0", http_addr="mem:9"))
    node.addr = "mem:0"
    node.partners = ("mem:0", "mem:2")
    node.clocks = {"mem:0": _est(0.0), "mem:1": _est(3.0)}  # mem:2 not measured yet
    worker = _worker(service, clock, rec)
    worker.start()
    try:
        slot = LOCAL0 + timedelta(seconds=10)  # by the leader's clock: this node's LOCAL0 + 13 s
        await _claim(service, slot)
        await _run_until(clock, LOCAL0 + timedelta(seconds=20))
        early = [t for _, t in rec.fired if t < slot + timedelta(seconds=3)]
        assert not early, f"started by this node's clock at {early}, before the leader's clock reached the slot"
        assert worker.skewed, "this node, 3 s from the leader and not from a majority of followers, is the skewed one"
    finally:
        await worker.stop()


class ForwardingFollower(SkewedNode):
    """A follower whose writes commit (as forwarded to the leader would)."""

    def submit(self, payload: bytes, callback: Callable[[Any, int], None]) -> None:
        leading, self._leading = self._leading, True
        try:
            super().submit(payload, callback)
        finally:
            self._leading = leading


@pytest.mark.parametrize("ahead", [30.0, -7200.0])
async def test_operator_writes_through_a_skewed_node_are_stamped_by_the_cluster_time(ahead: float) -> None:
    """An edit, a pause and a manual run through a node whose clock is ``ahead`` of the
    leader's carry the leader's time, as the runtime wires the service: an edit stamped by a
    clock 2 h behind started the new schedule 2 h early (12 slots recorded missed and one run
    as catch-up), one 30 s ahead left the next 30 s of slots without a record."""
    clock = FakeClock(LOCAL0)
    state = State()
    node = ForwardingFollower(state, ClockEstimate(-ahead, 0.002, 0.1))  # the leader's wall minus this node's
    node.leading = False
    runtime = SchedulerRuntime(state, clock, RuntimeConfig(node_id="n2", raft_addr="mem:2", http_addr="mem:3"),
                               {}, asyncio.get_running_loop())
    service = runtime.start(node, MemoryCommitter(node))
    leader_now = us(clock.now()) - round(ahead * 1e6)
    try:
        doc = {"name": "e", "schedule": "*/5 * * * *", "executor": "http", "http": {"url": "http://sink.test/e"}}
        await service.put_job(parse_job(doc))
        assert abs(state.jobs["e"]["spec_since_us"] - leader_now) < 10_000
        await service.pause("e", True, None)
        assert abs(state.jobs["e"]["spec_since_us"] - leader_now) < 10_000
        await service.pause("e", False, None)
        run_id = await service.run_now("e", {"n2"})
        assert abs(state.runs[run_id]["slot_us"] - leader_now) < 10_000
    finally:
        await runtime.stop()
