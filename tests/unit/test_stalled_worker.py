"""A worker runs an attempt it would start long past its instant and its claim only once the
ledger recorded its start for this node; without that (a leader that does not name what it saw
in its expiries) it declines it.

While a node is stopped (SIGSTOP), starved or cut off, the leader goes on: it counts the node's
unstarted claims lost and claims the slots again elsewhere. A worker that wakes late, or applies
a claim only when its partition heals, and fires anyway runs the slot a second time, long after
its instant. A FakeClock advanced in one step past the instant stands for the stall.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from memraft import MemoryNode

from raftlog import Bridge
from scheduler.clock import FakeClock
from scheduler.commands import Claim, ClaimSlots, DeleteJob, ExpireRuns, PutJob, RegisterNode, StartRuns, decode_command
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
        self.hold: asyncio.Event | None = None  # set: each attempt runs until it is set

    async def run(self, attempt: Attempt) -> Outcome:
        self.fired.append(attempt)
        if self.hold is not None:
            await self.hold.wait()
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=T0, finished_at=T0)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _worker_with_claim(slot_in: float, lease: float, *, claimed_in: float = 0.0, applied_in: float = 0.0,
                             names_seen: bool = True) -> tuple[FakeClock, State, Worker, Recorder, str]:
    """A worker given one claim for the slot at T0 + ``slot_in``, decided by the leader at
    T0 + ``claimed_in`` and applied here at T0 + ``applied_in``. ``names_seen``: the leader
    names what it saw in its expiries (every member announced EXPIRE_SEEN)."""
    clock = FakeClock(T0)
    state = State()
    node = MemoryNode(state)
    if not names_seen:
        node.peer_forms.clear()
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


async def _past_the_limit(clock: FakeClock, state: State, worker: Worker, rec: Recorder, rid: str,
                          names_seen: bool) -> None:
    """After a stall past the late limit: declined, or reserved and run once its start commits."""
    await _settle()
    assert rec.fired == [], "fired past the limit before the ledger recorded its start"
    if not names_seen:
        assert worker.declined == 1 and worker.reserved == 0
        assert state.runs[rid]["status"] == "claimed", "left for the leader to count lost"
        clock.advance(0.01)  # the report period
        await _settle()
        assert rec.fired == [] and state.runs[rid]["status"] == "claimed"
        return
    assert worker.reserved == 1 and worker.declined == 0
    clock.advance(0.01)  # the report period: the start is committed, then it runs
    await _settle()
    assert [a.run_id for a in rec.fired] == [rid] and worker.declined == 0
    clock.advance(0.01)
    await _settle()
    assert state.runs[rid]["status"] == "succeeded"


@pytest.mark.parametrize("names_seen", [True, False])
async def test_a_wait_overrun_by_far_more_than_two_seconds_waits_for_its_start_to_commit(names_seen: bool) -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0, names_seen=names_seen)
    try:
        clock.advance(10.0 + 30.0)  # stopped through the instant and 30 s beyond
        await _past_the_limit(clock, state, worker, rec, rid, names_seen)
    finally:
        await worker.stop()


@pytest.mark.parametrize("names_seen", [True, False])
async def test_the_limit_is_half_a_short_lease(names_seen: bool) -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=2.0, names_seen=names_seen)
    try:
        clock.advance(10.0 + 1.5)  # overran by 1.5 s: more than half a 2 s lease
        await _past_the_limit(clock, state, worker, rec, rid, names_seen)
    finally:
        await worker.stop()


async def test_a_late_attempt_the_leader_took_back_before_its_start_committed_is_not_run() -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 30.0)
        await _settle()
        assert worker.reserved == 1
        # The leader's expiry (it saw the claim unstarted) commits before the start does.
        await worker.svc.propose(ExpireRuns(at_us=us(T0) + 40_000_000, leader="n1", term=1, runs=(rid,),
                                            seen={rid: 0}))
        clock.advance(0.01)
        await _settle()
        assert rec.fired == [] and worker.declined == 1
        assert state.runs[rid]["status"] == "lost"
    finally:
        await worker.stop()


async def test_a_late_attempt_whose_start_commits_before_the_leaders_expiry_runs_once() -> None:
    """The leader looked while the claim was unstarted and decided its expiry; the start
    commits first, the attempt runs, and the expiry (naming the claim it saw) keeps it: the slot
    is not retried elsewhere while it runs."""
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 30.0)
        await _settle()
        decided = ExpireRuns(at_us=us(T0) + 40_000_000, leader="n1", term=1, runs=(rid,), seen={rid: 0})
        rec.hold = asyncio.Event()
        clock.advance(0.01)
        await _settle()
        assert [a.run_id for a in rec.fired] == [rid] and state.runs[rid]["status"] == "running"
        result, _ = await worker.svc.propose(decided)
        assert result == {"lost": [], "kept": [rid]}
        rec.hold.set()
        await _settle()
        clock.advance(0.01)
        await _settle()
        assert state.runs[rid]["status"] == "succeeded" and state.active == {}
        assert len(rec.fired) == 1
    finally:
        await worker.stop()


async def test_a_late_attempt_is_not_run_when_the_leader_stops_naming_what_it_saw() -> None:
    # A new leader that has not yet heard every member announce the form: its expiries would
    # take a started attempt away, so the reserved one is left to lapse and be retried.
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 30.0)
        await _settle()
        assert worker.reserved == 1
        worker.svc.node.peer_forms.clear()  # type: ignore[attr-defined]
        clock.advance(0.01)
        await _settle()
        assert rec.fired == [] and worker.declined == 1
        assert state.runs[rid]["status"] == "running", "its lease lapses and the leader retries it"
    finally:
        await worker.stop()



async def _reserved(lease: float = 5.0) -> tuple[FakeClock, State, Worker, Recorder, str]:
    """A worker holding one reserved attempt: stalled 30 s past its instant, its start not yet committed."""
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=lease)
    clock.advance(10.0 + 30.0)
    await _settle()
    assert worker.reserved == 1 and rec.fired == []
    return clock, state, worker, rec, rid


def _starts_reported(worker: Worker) -> list[str]:
    """Run ids of every start this worker reports from now on."""
    reported: list[str] = []
    node = worker.svc.node
    submit = node.submit  # type: ignore[attr-defined]

    def spy(payload: bytes, callback: object) -> None:
        cmd = decode_command(payload)
        if isinstance(cmd, StartRuns):
            reported.extend(cmd.runs)
        submit(payload, callback)

    node.submit = spy  # type: ignore[attr-defined]
    return reported


@pytest.mark.parametrize(("commit_delay", "runs"), [(1.0, True), (4.0, False)])
async def test_a_late_start_that_commits_with_under_a_third_of_its_lease_left_is_not_run(
        commit_delay: float, runs: bool) -> None:
    """The start took a 5 s lease when it was asked for; committed 4 s later, 1 s of it is
    left, under a third: the leader may count it lapsed before a renewal commits, so it is
    not run (its lease lapses and the slot is retried). Committed 1 s later, it runs."""
    clock, state, worker, rec, rid = await _reserved(lease=5.0)
    node = worker.svc.node
    submit = node.submit  # type: ignore[attr-defined]

    def slow(payload: bytes, callback: object) -> None:
        if isinstance(decode_command(payload), StartRuns):
            clock.advance(commit_delay)  # the entry commits this long after the report was made
        submit(payload, callback)

    node.submit = slow  # type: ignore[attr-defined]
    try:
        clock.advance(0.01)
        await _settle()
        if runs:
            assert [a.run_id for a in rec.fired] == [rid] and worker.declined == 0
        else:
            assert rec.fired == [] and worker.declined == 1 and worker.busy == 0
            assert state.runs[rid]["status"] == "running", "its lease lapses and the leader retries it"
    finally:
        await worker.stop()


async def test_a_late_attempt_fenced_by_its_start_is_not_run_nor_held() -> None:
    """This node missed the expiry (it came in a snapshot): the start it reports is refused as
    stale, which drops the reservation instead of holding it forever."""
    clock, state, worker, rec, rid = await _reserved()
    node = worker.svc.node
    hooks = list(node.hooks)  # type: ignore[attr-defined]
    node.hooks.clear()  # type: ignore[attr-defined]
    await worker.svc.propose(ExpireRuns(at_us=us(T0) + 40_000_000, leader="n1", term=1, runs=(rid,), seen={rid: 0}))
    node.hooks.extend(hooks)  # type: ignore[attr-defined]
    try:
        assert state.runs[rid]["status"] == "lost" and worker._reserved
        clock.advance(0.01)
        await _settle()
        assert rec.fired == [] and worker.declined == 1 and not worker._reserved
    finally:
        await worker.stop()


async def test_deleting_the_job_drops_its_reserved_attempt_unreported() -> None:
    clock, state, worker, rec, rid = await _reserved()
    reported = _starts_reported(worker)
    try:
        await worker.svc.propose(DeleteJob(at_us=us(T0) + 40_000_000, name="tick"))
        clock.advance(0.01)
        await _settle()
        clock.advance(0.01)
        await _settle()
        assert rec.fired == [] and worker.declined == 1 and not worker._reserved
        assert reported == [], "reported the start of an attempt of a deleted job"
    finally:
        await worker.stop()


async def test_a_reserved_attempt_is_not_scheduled_again() -> None:
    clock, state, worker, rec, rid = await _reserved()
    try:
        worker._schedule(state.runs[rid])  # handed the same claim again
        assert not worker._waiting
        clock.advance(0.01)
        await _settle()
        clock.advance(1.0)
        await _settle()
        assert [a.run_id for a in rec.fired] == [rid] and worker.reserved == 1
    finally:
        await worker.stop()


async def test_a_start_that_commits_while_the_worker_stops_launches_nothing() -> None:
    clock, state, worker, rec, rid = await _reserved()
    stopping = asyncio.get_running_loop().create_task(worker.stop())
    await asyncio.sleep(0)  # stop() has begun: it is cancelling the attempts
    await worker.svc.propose(StartRuns(at_us=us(T0) + 40_000_000, node="n1", runs=(rid,),
                                       started_us={rid: us(T0) + 40_000_000}, lease_until_us=us(T0) + 45_000_000))
    await stopping
    await _settle()
    assert state.runs[rid]["status"] == "running"
    assert rec.fired == [] and worker.busy == 0, "launched an attempt after the worker stopped"


async def test_a_claim_that_commits_while_the_worker_stops_is_not_scheduled() -> None:
    clock, state, worker, rec, _ = await _worker_with_claim(10.0, lease=5.0)
    stopping = asyncio.get_running_loop().create_task(worker.stop())
    await asyncio.sleep(0)  # stop() has begun
    result, _ = await worker.svc.propose(ClaimSlots(at_us=us(T0), leader="n1", term=1, claims=(
        Claim(job="tick", slot_us=us(T0 + timedelta(seconds=20)), trigger="manual", node="n1", request_key="k2"),)))
    await stopping
    assert result["runs"] and not worker._waiting and not worker._wave_tasks, "a wave opened after stop"
    clock.advance(30.0)
    await _settle()
    assert rec.fired == []


async def test_a_wait_overrun_within_the_limit_still_fires() -> None:
    clock, state, worker, rec, rid = await _worker_with_claim(10.0, lease=5.0)
    try:
        clock.advance(10.0 + 1.5)  # a busy machine's lag: under min(half a lease, 2 s)
        await _settle()
        assert len(rec.fired) == 1 and worker.declined == 0
    finally:
        await worker.stop()


@pytest.mark.parametrize("names_seen", [True, False])
async def test_a_claim_applied_long_after_its_instant_waits_for_its_start_to_commit(names_seen: bool) -> None:
    # A follower cut off just after the claim committed applies it when the cut heals, 11 s on.
    clock, state, worker, rec, rid = await _worker_with_claim(2.0, lease=2.0, claimed_in=0.0, applied_in=13.0,
                                                              names_seen=names_seen)
    try:
        await _past_the_limit(clock, state, worker, rec, rid, names_seen)
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
