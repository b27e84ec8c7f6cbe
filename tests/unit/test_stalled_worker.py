"""A worker declines an attempt it would start long past its instant and its claim.

While a node is stopped (SIGSTOP), starved or cut off, the leader goes on: it counts the node's
unstarted claims lost and claims the slots again elsewhere. A worker that wakes late, or applies
a claim only when its partition heals, and fires anyway runs the slot a second time, long after
its instant. A FakeClock advanced in one step past the instant stands for the stall.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from memraft import MemoryNode

from raftlog import Bridge
from scheduler.clock import FakeClock
from scheduler.commands import Claim, ClaimSlots, PutJob, RegisterNode
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.service import Service
from scheduler.state import State
from scheduler.worker import Worker

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
JOB = {"name": "tick", "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"}}


class Recorder:
    def __init__(self) -> None:
        self.fired: list[Attempt] = []

    async def run(self, attempt: Attempt) -> Outcome:
        self.fired.append(attempt)
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=T0, finished_at=T0)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _worker_with_claim(slot_in: float, lease: float, *, claimed_in: float = 0.0,
                             applied_in: float = 0.0) -> tuple[FakeClock, State, Worker, Recorder, str]:
    """A worker given one claim for the slot at T0 + ``slot_in``, decided by the leader at
    T0 + ``claimed_in`` and applied here at T0 + ``applied_in``."""
    clock = FakeClock(T0)
    state = State()
    node = MemoryNode(state)
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")
    await service.propose(RegisterNode(at_us=us(T0), node_id="n1", raft_addr="mem:1", http_addr="mem:2"))
    await service.propose(PutJob(at_us=us(T0), spec=parse_job(JOB).to_doc()))
    rec = Recorder()
    worker = Worker(service, clock, {"http": rec}, lease=lease, flush_interval=0.001, max_skew=60.0)
    node.hooks.append(lambda a: worker.on_applied(a, False))
    worker.start()
    clock.advance(applied_in)
    result, _ = await service.propose(ClaimSlots(at_us=us(T0 + timedelta(seconds=claimed_in)), leader="n1", term=1, claims=(
        Claim(job="tick", slot_us=us(T0 + timedelta(seconds=slot_in)), trigger="manual", node="n1", request_key="k"),)))
    await _settle()
    return clock, state, worker, rec, str(result["runs"][0]["id"])


async def test_a_wait_overrun_by_far_more_than_two_seconds_declines_the_attempt() -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 30.0)  # stopped through the instant and 30 s beyond
        await _settle()
        assert rec.fired == [], "fired 30 s after its instant, when the leader has retried it elsewhere"
        assert worker.declined == 1
        assert state.runs[rid]["status"] == "claimed", "left for the leader to count lost"
    finally:
        await worker.stop()


async def test_the_limit_is_half_a_short_lease() -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=2.0)
    try:
        clock.advance(10.0 + 1.5)  # overran by 1.5 s: more than half a 2 s lease
        await _settle()
        assert rec.fired == [] and worker.declined == 1
    finally:
        await worker.stop()


async def test_a_wait_overrun_within_the_limit_still_fires() -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 1.5)  # a busy machine's lag: under min(half a lease, 2 s)
        await _settle()
        assert len(rec.fired) == 1 and worker.declined == 0
    finally:
        await worker.stop()


async def test_a_claim_applied_long_after_its_instant_is_declined() -> None:
    # A follower cut off just after the claim committed applies it when the cut heals, 11 s on.
    clock, state, worker, rec, rid = await _worker_with_claim(2.0, lease=2.0, claimed_in=0.0, applied_in=13.0)
    try:
        await _settle()
        assert rec.fired == [], "fired 11 s after its instant, when the leader had retried it elsewhere"
        assert worker.declined == 1 and state.runs[rid]["status"] == "claimed"
    finally:
        await worker.stop()


async def test_a_catch_up_claim_for_an_old_slot_fires_at_once() -> None:
    # Claimed now for a slot a minute past (catch-up): on time from its claim.
    clock, state, worker, rec, rid = await _worker_with_claim(-60.0, lease=2.0, claimed_in=0.0)
    try:
        await _settle()
        assert len(rec.fired) == 1 and worker.declined == 0
    finally:
        await worker.stop()
