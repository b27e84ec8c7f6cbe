"""Attempts due at the same instant wait as one wave and pass the instant's checks together.

An hourly burst puts thousands of a node's attempts on one instant. Each used to wait on its
own timer and read the cluster's clock estimate (the leader's offset, every member's clock, the
leader's recorded lead) on its own, several times: measured with a 3,000-slot burst, about a
tenth of the agents' time at the instant went to those reads. A wave reads them once. What must
not change: none starts before its instant, an attempt cancelled or whose job is deleted while
it waits never starts, an attempt that joins an instant already passed still starts, none
starts past the late limit, and a new estimate between two slices holds the rest back.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from memraft import MemoryNode

from raftlog import Bridge, ClockEstimate
from raftlog.node import FAIL_REASON
from scheduler.clock import FakeClock
from scheduler.commands import (
    CancelRun,
    Claim,
    ClaimSlots,
    DeleteJob,
    PutJobs,
    RegisterNode,
    RenewLeases,
    StartRuns,
    decode_command,
)
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.service import Service
from scheduler.state import State
from scheduler.worker import BATCH, LAUNCH_SLICE, STARTS_IN_FLIGHT, Worker

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
JOBS = 400


class Recorder:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fired: list[tuple[Attempt, datetime]] = []

    async def run(self, attempt: Attempt) -> Outcome:
        self.fired.append((attempt, self.clock.now()))
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=T0, finished_at=T0)


class CountingEstimates:
    """Wraps the worker's ClusterTime.estimate to count the reads."""

    def __init__(self, worker: Worker) -> None:
        self.reads = 0
        inner = worker.cluster.estimate

        def counted() -> Any:
            self.reads += 1
            return inner()

        worker.cluster.estimate = counted  # type: ignore[method-assign]


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def _report_period(clock: FakeClock) -> None:
    for _ in range(3):  # the worker's report batching (flush_interval 1 ms)
        clock.advance(0.002)
        await _settle()


async def _setup(jobs: int = JOBS) -> tuple[FakeClock, State, Service, Worker, Recorder]:
    clock = FakeClock(T0)
    state = State()
    node = MemoryNode(state)
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")
    await service.propose(RegisterNode(at_us=us(T0), node_id="n1", raft_addr="mem:1", http_addr="mem:2"))
    specs = tuple(parse_job({"name": f"j{i:04d}", "schedule": "@hourly", "executor": "http",
                             "http": {"url": "http://sink.test/x"}}).to_doc() for i in range(jobs))
    await service.propose(PutJobs(at_us=us(T0), specs=specs))
    rec = Recorder(clock)
    worker = Worker(service, clock, {"http": rec}, lease=5.0, flush_interval=0.001, max_skew=60.0)
    node.hooks.append(lambda a: worker.on_applied(a, False))
    worker.start()
    return clock, state, service, worker, rec


async def _claim(service: Service, names: list[str], slot: datetime, key: str) -> list[str]:
    result, _ = await service.propose(ClaimSlots(at_us=us(T0), leader="n1", term=1, claims=tuple(
        Claim(job=name, slot_us=us(slot), trigger="manual", node="n1", request_key=f"{key}-{name}")
        for name in names)))
    await _settle()
    return [str(r["id"]) for r in result["runs"]]


async def test_a_burst_fires_at_its_instant_reading_the_clock_once_not_per_attempt() -> None:
    clock, state, service, worker, rec = await _setup()
    try:
        counter = CountingEstimates(worker)
        slot = T0 + timedelta(seconds=10)
        await _claim(service, [f"j{i:04d}" for i in range(JOBS)], slot, "burst")
        clock.advance(10.0 - 0.001)
        await _settle()
        assert rec.fired == [], "started before the instant"
        clock.advance(0.001)
        await _settle()
        assert len(rec.fired) == JOBS and worker.fired == JOBS and worker.declined == 0
        assert all(at >= slot for _, at in rec.fired)
        # Before the waves: each attempt read the estimate itself, two or more times (>= 800 here).
        assert counter.reads <= 10, f"{counter.reads} reads of the clock estimate for one instant"
        assert {a.job for a, _ in rec.fired} == {f"j{i:04d}" for i in range(JOBS)}
    finally:
        await worker.stop()


async def test_attempts_cancelled_or_deleted_while_waiting_never_start_and_the_rest_do() -> None:
    clock, state, service, worker, rec = await _setup(jobs=5)
    try:
        slot = T0 + timedelta(seconds=10)
        rids = await _claim(service, [f"j{i:04d}" for i in range(5)], slot, "w")
        await service.propose(CancelRun(at_us=us(T0), run_id=rids[1]))
        await service.propose(DeleteJob(at_us=us(T0), name="j0003"))
        await _settle()
        clock.advance(10.0)
        await _settle()
        assert sorted(a.job for a, _ in rec.fired) == ["j0000", "j0002", "j0004"]
        assert worker.declined == 0, "a cancelled or deleted attempt is not a declined one"
        for _ in range(3):  # the reports' batching period
            clock.advance(0.01)
            await _settle()
        assert state.runs[rids[0]]["status"] == "succeeded"
        assert state.runs[rids[1]]["status"] == "cancelled"
    finally:
        await worker.stop()


async def test_an_attempt_for_an_instant_whose_wave_already_fired_still_fires() -> None:
    clock, state, service, worker, rec = await _setup(jobs=2)
    try:
        slot = T0 + timedelta(seconds=1)
        await _claim(service, ["j0000"], slot, "first")
        clock.advance(1.5)
        await _settle()
        assert [a.job for a, _ in rec.fired] == ["j0000"]
        await _claim(service, ["j0001"], slot, "second")  # e.g. a retry of the same slot elsewhere, now here
        await _settle()
        assert [a.job for a, _ in rec.fired] == ["j0000", "j0001"]
    finally:
        await worker.stop()


@pytest.mark.parametrize("names_seen", [True, False])
async def test_a_wave_past_its_limit_reserves_or_declines_every_attempt_in_it_with_one_log_line(
        caplog: Any, names_seen: bool) -> None:
    """Past the late limit a wave's attempts run once the ledger recorded their start (the
    leader names what it saw in expiries), else are declined; one log line either way."""
    clock, state, service, worker, rec = await _setup(jobs=3)
    if not names_seen:
        service.node.peer_forms.clear()  # type: ignore[attr-defined]
    try:
        rids = await _claim(service, ["j0000", "j0001", "j0002"], T0 + timedelta(seconds=5), "late")
        clock.advance(5.0 + 30.0)  # stopped through the instant and 30 s beyond
        await _settle()
        assert rec.fired == []
        if names_seen:
            assert worker.reserved == 3 and worker.declined == 0
            lines = [r for r in caplog.records if "came up more than" in r.getMessage()]
            assert len(lines) == 1 and lines[0].getMessage().startswith("3 attempt(s)")
            await _report_period(clock)
            assert sorted(a.run_id for a, _ in rec.fired) == sorted(rids)
            return
        assert worker.declined == 3 and worker.reserved == 0
        assert all(state.runs[r]["status"] == "claimed" for r in rids), "left for the leader to count lost"
        lines = [r for r in caplog.records if "not starting" in r.getMessage()]
        assert len(lines) == 1 and "not starting 3 attempt(s)" in lines[0].getMessage()
    finally:
        await worker.stop()


async def test_stopping_the_worker_with_waves_waiting_leaves_no_task_behind() -> None:
    clock, state, service, worker, rec = await _setup(jobs=3)
    await _claim(service, ["j0000", "j0001"], T0 + timedelta(seconds=30), "a")
    await _claim(service, ["j0002"], T0 + timedelta(seconds=60), "b")
    await worker.stop()
    await _settle()
    leftover = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert not [n for n in leftover if n.startswith("wave@") or "@" in n], leftover
    assert rec.fired == []


async def test_a_large_wave_is_launched_in_slices_with_the_loop_served_between() -> None:
    jobs = LAUNCH_SLICE * 2 + 200
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    seen: list[int] = []
    inner = rec.run

    async def run(attempt: Attempt) -> Outcome:
        seen.append(turns)
        return await inner(attempt)

    rec.run = run  # type: ignore[method-assign]
    tick = asyncio.create_task(ticker())
    try:
        await _claim(service, [f"j{i:04d}" for i in range(jobs)], T0 + timedelta(seconds=5), "big")
        clock.advance(5.0)
        await _settle()
        assert len(rec.fired) == jobs
        assert len(set(seen)) >= 3, "every attempt of the wave launched in one turn of the loop"
    finally:
        tick.cancel()
        await worker.stop()


@pytest.mark.parametrize("names_seen", [True, False])
async def test_attempts_launched_after_the_limit_by_a_slow_launch_wait_for_their_start(names_seen: bool) -> None:
    # Each launch takes the loop 5 ms (a starved node): the wave's later slices are past the
    # 2 s limit by the time they come up, and are reserved (or declined) rather than started
    # at once that late.
    jobs = LAUNCH_SLICE * 3
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    if not names_seen:
        service.node.peer_forms.clear()  # type: ignore[attr-defined]
    inner = rec.run

    async def slow(attempt: Attempt) -> Outcome:
        clock.advance(0.005)
        return await inner(attempt)

    rec.run = slow  # type: ignore[method-assign]
    try:
        await _claim(service, [f"j{i:04d}" for i in range(jobs)], T0 + timedelta(seconds=5), "slow")
        clock.advance(5.0)
        for _ in range(5):
            await _settle()
        assert len(rec.fired) == LAUNCH_SLICE, "the first slice starts; the rest come up 2.5 s and more late"
        if not names_seen:
            assert worker.declined == jobs - LAUNCH_SLICE and worker.reserved == 0
            return
        assert worker.reserved == jobs - LAUNCH_SLICE and worker.declined == 0
        for _ in range(4):
            await _report_period(clock)
        assert len({a.run_id for a, _ in rec.fired}) == len(rec.fired) == jobs, "each once, once its start committed"
    finally:
        await worker.stop()


async def test_a_wave_opened_for_an_instant_whose_wave_is_still_launching_fires_too() -> None:
    # Seen with 100,000 slots due at once: while the first wave launched slice by slice, a claim
    # for the same instant opened a second wave; the first one's end dropped the second's
    # attempts (KeyError in the second wave, its attempts never started).
    jobs = LAUNCH_SLICE * 2
    clock, state, service, worker, rec = await _setup(jobs=jobs + 1)
    slot = T0 + timedelta(seconds=5)
    inner = rec.run
    joined: list[str] = []

    async def run(attempt: Attempt) -> Outcome:
        if not joined and len(rec.fired) == LAUNCH_SLICE:  # in the last slice, as the first wave ends
            joined.append("late")
            await _claim(service, [f"j{jobs:04d}"], slot, "joins")  # e.g. a retry of that slot, here
        return await inner(attempt)

    rec.run = run  # type: ignore[method-assign]
    try:
        await _claim(service, [f"j{i:04d}" for i in range(jobs)], slot, "first")
        clock.advance(5.0)
        for _ in range(5):
            await _settle()
        assert len(rec.fired) == jobs + 1 and f"j{jobs:04d}" in {a.job for a, _ in rec.fired}
        assert not worker._waiting and not worker._waves
    finally:
        await worker.stop()


class Holding:
    """An executor whose attempts run until released: long jobs."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def run(self, attempt: Attempt) -> Outcome:
        self.started.append(attempt.run_id)
        await self.release.wait()
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=T0, finished_at=T0)


async def _start_long(service: Service, clock: FakeClock, held: Holding, jobs: int) -> list[str]:
    """Claim ``jobs`` attempts for 5 s on and run them all (long ones) at their instant."""
    rids = await _claim(service, [f"j{i:04d}" for i in range(jobs)], T0 + timedelta(seconds=5), "long")
    clock.advance(5.0 + 1.0)
    await _settle()
    assert len(held.started) == jobs
    return rids


async def test_more_starts_than_one_report_holds_are_all_reported() -> None:
    # 700 long attempts: 300 starts go in one report. The rest waited for another kick (none
    # came while they ran): the leader would have counted them lost at the start deadline and
    # run them again elsewhere while they still ran.
    jobs = 700
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    held = Holding()
    worker.executors["http"] = held  # type: ignore[assignment]
    try:
        rids = await _start_long(service, clock, held, jobs)
        for _ in range(6):
            await _report_period(clock)
        assert all(state.runs[r]["status"] == "running" for r in rids), "a start left unreported"
    finally:
        held.release.set()
        await worker.stop()



async def test_starts_of_several_entries_are_proposed_together_and_a_failed_one_again() -> None:
    """1,300 long attempts: their starts go out STARTS_IN_FLIGHT entries at once, not one
    awaited after another (late attempts run only once their starts commit, see LATE_LIMIT),
    the rest after them; of those, only one whose commit failed is proposed again."""
    jobs = BATCH * STARTS_IN_FLIGHT + 100
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    held = Holding()
    worker.executors["http"] = held  # type: ignore[assignment]
    node = service.node
    submit = node.submit  # type: ignore[attr-defined]
    waiting: list[tuple[StartRuns, bytes, Any]] = []
    proposed: list[tuple[str, ...]] = []

    def deferred(payload: bytes, callback: Any) -> None:
        cmd = decode_command(payload)
        if isinstance(cmd, StartRuns):
            proposed.append(cmd.runs)
            waiting.append((cmd, payload, callback))
        else:
            submit(payload, callback)

    node.submit = deferred  # type: ignore[attr-defined]
    try:
        rids = await _start_long(service, clock, held, jobs)
        await _report_period(clock)
        assert [len(r) for r in proposed] == [BATCH] * STARTS_IN_FLIGHT, "starts awaited one entry at a time"
        first = list(waiting)
        waiting.clear()
        for i, (_, payload, callback) in enumerate(first):
            if i == 1:
                callback(None, FAIL_REASON.MISSING_LEADER)  # not committed
            else:
                submit(payload, callback)
        for _ in range(8):
            await _report_period(clock)
            for _, payload, callback in waiting:
                submit(payload, callback)
            waiting.clear()
        again = [runs for runs in proposed[STARTS_IN_FLIGHT:] if set(runs) & set(first[0][0].runs)]
        assert again == [], "a committed start proposed again"
        assert any(set(runs) == set(first[1][0].runs) for runs in proposed[STARTS_IN_FLIGHT:])
        assert all(state.runs[r]["status"] == "running" for r in rids), "a start left unreported"
    finally:
        held.release.set()
        await worker.stop()



async def test_a_committed_entry_of_starts_is_renewed_while_another_still_waits() -> None:
    """Of two StartRuns entries of one flush, the first commits and the second gets no answer:
    the first's attempts are renewed from then on, not left out of renewals (their leases
    lapsing) until the second's proposal gives up."""
    jobs = BATCH * 2
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    held = Holding()
    worker.executors["http"] = held  # type: ignore[assignment]
    node = service.node
    submit = node.submit  # type: ignore[attr-defined]
    unanswered: list[StartRuns] = []
    renewed: list[str] = []

    def second_unanswered(payload: bytes, callback: Any) -> None:
        cmd = decode_command(payload)
        if isinstance(cmd, StartRuns) and cmd.runs[0] != rids[0]:
            unanswered.append(cmd)  # never committed nor answered
            return
        if isinstance(cmd, RenewLeases):
            renewed.extend(cmd.runs)
        submit(payload, callback)

    node.submit = second_unanswered  # type: ignore[attr-defined]
    try:
        rids = await _start_long(service, clock, held, jobs)
        await _report_period(clock)
        assert len(unanswered) == 1
        first = [r for r in rids if state.runs[r]["status"] == "running"]
        assert len(first) == BATCH
        clock.advance(worker.lease / 3)  # the renewal period
        await _settle()
        assert set(first) <= set(renewed), "committed starts left out of the renewals"
        assert not set(unanswered[0].runs) & set(renewed)
    finally:
        held.release.set()
        await worker.stop()


async def test_an_estimate_that_moves_between_slices_holds_the_rest_of_the_wave_back() -> None:
    # A new sample between two slices says the leader's clock is 1 s behind this node's: the
    # slices after it wait for the instant by that estimate, never early.
    jobs = LAUNCH_SLICE * 2 + 100
    clock, state, service, worker, rec = await _setup(jobs=jobs)
    offset = {"s": 0.0}
    worker.cluster.estimate = lambda: ClockEstimate(offset["s"], 0.0, 0.0)  # type: ignore[method-assign]
    inner = rec.run

    async def run(attempt: Attempt) -> Outcome:
        offset["s"] = -1.0
        return await inner(attempt)

    rec.run = run  # type: ignore[method-assign]
    slot = T0 + timedelta(seconds=5)
    try:
        await _claim(service, [f"j{i:04d}" for i in range(jobs)], slot, "moved")
        clock.advance(5.0)
        for _ in range(3):
            await _settle()
        assert len(rec.fired) == LAUNCH_SLICE, "the slices after the new estimate started before their instant by it"
        clock.advance(0.999)
        await _settle()
        assert len(rec.fired) == LAUNCH_SLICE
        clock.advance(0.001)
        for _ in range(3):
            await _settle()
        assert len(rec.fired) == jobs and worker.declined == 0
        assert all(at >= slot + timedelta(seconds=1) for _, at in rec.fired[LAUNCH_SLICE:])
    finally:
        await worker.stop()


async def test_one_attempt_that_raises_on_its_way_out_does_not_drop_the_rest_of_its_wave() -> None:
    clock, state, service, worker, rec = await _setup(jobs=5)
    job = state.job

    def faulty(name: str) -> Any:
        if name == "j0002":
            raise RuntimeError("a bug reading this job")
        return job(name)

    def on_start(name: str, _late: float) -> None:
        if name == "j0003":
            raise RuntimeError("an observer's bug")

    worker.on_start = on_start
    try:
        await _claim(service, [f"j{i:04d}" for i in range(5)], T0 + timedelta(seconds=5), "boom")
        state.job = faulty  # type: ignore[method-assign]
        clock.advance(5.0)
        await _settle()
        state.job = job  # type: ignore[method-assign]
        # j0003's observer failed after it started: it runs all the same, and is reported.
        assert sorted(a.job for a, _ in rec.fired) == ["j0000", "j0001", "j0003", "j0004"]
        assert worker.declined == 1 and not [r for r in worker._running if state.runs[r]["job"] == "j0002"]
    finally:
        await worker.stop()
