"""The worker's result path: results kept until their commit is acknowledged, and the
attempts a restarted node held reported lost (scheduler/worker.py, invariant 5).

One in-memory replica on a FakeClock; its write path fails chosen commands the ways
``raftlog.Bridge`` fails (not committed, or outcome unknown with the entry applied or
not), so a test can say which submission of which command goes wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from memraft import MemoryCommitter, MemoryNode

from raftlog import ClockEstimate
from raftlog.bridge import NotCommitted, UnknownOutcome
from scheduler.clock import FakeClock
from scheduler.commands import Claim, ClaimSlots, FinishRuns, Noop, PutJob, RegisterNode, StartRuns, decode_command
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.service import Service
from scheduler.state import State
from scheduler.worker import Worker

LOCAL0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
JOB = {"name": "tick", "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"}}
LEASE = 5.0

# How a planned submission fails: refused before any commit (no leader), outcome unknown
# with nothing applied, outcome unknown although the entry was applied (the answer was lost).
REFUSED, LOST, APPLIED = "refused", "unknown, not applied", "unknown, applied"


class FlakyCommitter(MemoryCommitter):
    """The in-memory write path, failing the next submissions of a command tag as ``plan`` says."""

    def __init__(self, node: MemoryNode) -> None:
        super().__init__(node)
        self.plan: dict[str, list[str]] = {}
        self.submitted: list[str] = []  # the tag of every submission, failed or not

    async def submit(self, payload: bytes, timeout: float = 5.0) -> Any:
        tag = decode_command(payload).TAG
        self.submitted.append(tag)
        faults = self.plan.get(tag)
        fault = faults.pop(0) if faults else None
        if fault == REFUSED:
            raise NotCommitted("MISSING_LEADER", "not committed: missing leader")
        if fault == LOST:
            raise UnknownOutcome("TIMEOUT", "outcome unknown")
        result = await super().submit(payload, timeout)
        if fault == APPLIED:
            raise UnknownOutcome("TIMEOUT", "outcome unknown")
        return result

    def count(self, tag: str) -> int:
        return self.submitted.count(tag)


class OffsetNode(MemoryNode):
    """The in-memory replica whose estimate of the leader's clock is ``offset`` seconds off ours."""

    def __init__(self, state: State, offset: float) -> None:
        super().__init__(state)
        self.offset = offset

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        return ClockEstimate(self.offset, 0.001, 0.0) if self.leading else None


class Executor:
    """Runs each attempt through ``handler``; records the attempts it was given."""

    def __init__(self, clock: FakeClock, handler: Callable[[Attempt], Awaitable[OutcomeStatus]] | None = None) -> None:
        self.clock = clock
        self.handler = handler
        self.attempts: list[Attempt] = []
        self.finished: list[datetime] = []

    async def run(self, attempt: Attempt) -> Outcome:
        self.attempts.append(attempt)
        started = self.clock.now()
        status = await self.handler(attempt) if self.handler is not None else OutcomeStatus.SUCCEEDED
        self.finished.append(self.clock.now())
        return Outcome(status=status, started_at=started, finished_at=self.finished[-1])


class Rig:
    def __init__(self, offset: float = 0.0) -> None:
        self.clock = FakeClock(LOCAL0)
        self.state = State()
        self.node = OffsetNode(self.state, offset)
        self.committer = FlakyCommitter(self.node)
        self.service = Service(self.state, self.node, self.committer, self.clock, "n1")
        self.executor = Executor(self.clock)
        self.worker = Worker(self.service, self.clock, {"http": self.executor}, lease=LEASE, flush_interval=0.01)

    async def setup(self) -> None:
        for node_id in ("n1", "n2"):
            await self.service.propose(RegisterNode(at_us=us(LOCAL0), node_id=node_id, raft_addr=f"mem:{node_id}",
                                                    http_addr=f"http:{node_id}"))
        await self.service.propose(PutJob(at_us=us(LOCAL0), spec=parse_job(JOB).to_doc()))

    def go_live(self) -> None:
        """From here on the worker sees applied entries as a live process does."""
        self.node.hooks.append(lambda a: self.worker.on_applied(a, False))
        self.worker.start()

    async def claim(self, key: str, node: str = "n1", at: timedelta = timedelta(seconds=1)) -> str:
        result, _ = await self.service.propose(ClaimSlots(at_us=us(LOCAL0), leader="n1", term=1, claims=(
            Claim(job="tick", slot_us=us(LOCAL0 + at), trigger="manual", node=node, request_key=key),)))
        return str(result["runs"][0]["id"])

    async def run_for(self, seconds: float, step: float = 0.05) -> None:
        """Move fake time by ``step`` at a time, letting every task act at each step."""
        for _ in range(round(seconds / step)):
            self.clock.advance(step)
            await self.clock.settle()

    async def run_until(self, what: str, done: Callable[[], bool], limit: float = 30.0, step: float = 0.05) -> None:
        for _ in range(round(limit / step)):
            if done():
                return
            self.clock.advance(step)
            await self.clock.settle()
        raise AssertionError(f"not {what} after {limit}s of fake time")

    def status(self, rid: str) -> str:
        return str(self.state.runs[rid]["status"])

    async def close(self) -> None:
        await self.worker.stop()


@pytest.fixture
async def rig() -> Any:
    r = Rig()
    await r.setup()
    yield r
    await r.close()


# ---- results kept until acknowledged ----------------------------------------------------


@pytest.mark.parametrize("fault", [REFUSED, LOST, APPLIED])
async def test_a_result_whose_commit_failed_is_resubmitted_until_acknowledged(rig: Rig, fault: str) -> None:
    rig.go_live()
    rig.committer.plan["finish_runs"] = [fault, fault]
    rid = await rig.claim("k1")
    await rig.run_until("the result recorded and acknowledged",
                        lambda: rig.status(rid) == "succeeded" and rig.worker.pending_reports == 0)
    assert len(rig.executor.attempts) == 1, "the attempt ran once; only its report was repeated"
    assert rig.committer.count("finish_runs") == 3, "two failed submissions, then the one acknowledged"
    assert rig.worker.pending_reports == 0
    run = rig.state.runs[rid]
    assert run["outcome"] == "succeeded"
    assert run["finished_us"] == us(rig.executor.finished[0]), "the result as the attempt ended, not as committed"


async def test_a_result_waits_out_a_leaderless_spell_of_many_failures(rig: Rig) -> None:
    release = asyncio.Event()

    async def slow(_: Attempt) -> OutcomeStatus:
        await rig.clock.wait_for(release, None)
        return OutcomeStatus.FAILED

    rig.executor.handler = slow
    rig.go_live()
    rid = await rig.claim("k1")
    await rig.run_until("the attempt running", lambda: rig.status(rid) == "running")
    rig.node.leading = False  # every submission now refused: no leader
    release.set()
    await rig.run_for(10.0)
    assert rig.status(rid) == "running", "nothing could commit without a leader"
    assert rig.committer.count("finish_runs") >= 5, "the result was submitted again and again"
    assert rig.worker.pending_reports == 1, "the unacknowledged result is still held"
    rig.node.leading = True
    await rig.run_until("the result recorded after the leader came back", lambda: rig.status(rid) != "running")
    assert rig.state.runs[rid]["outcome"] == "failed"
    assert rig.worker.pending_reports == 0


async def test_a_result_applied_but_unacknowledged_is_recorded_once(rig: Rig) -> None:
    rig.go_live()
    rig.committer.plan["finish_runs"] = [APPLIED]
    rid = await rig.claim("k1")
    finished: list[Any] = []
    rig.node.hooks.append(lambda a: finished.append(a.result) if isinstance(a.command, FinishRuns) else None)
    await rig.run_until("both submissions applied", lambda: len(finished) == 2)
    assert [len(r["finished"]) for r in finished] == [1, 0]
    assert finished[1]["already"] == [rid], "the resubmission is recognised as the same result"
    assert rig.worker.pending_reports == 0


async def test_results_of_one_failed_batch_are_all_kept(rig: Rig) -> None:
    rig.go_live()
    rig.committer.plan["finish_runs"] = [REFUSED]
    rids = [await rig.claim(f"k{i}") for i in range(5)]
    await rig.run_until("every result recorded", lambda: all(rig.status(r) == "succeeded" for r in rids))
    assert rig.committer.count("finish_runs") == 2, "one batch refused whole, then committed whole"


# ---- orphans after a restart ------------------------------------------------------------


async def _held_before_restart(r: Rig) -> tuple[list[str], str, int]:
    """Claims applied before the worker is live, as a journal replays them: n1 holds one
    attempt claimed and one started; n2 holds one. Returns (n1's, n2's, replay boundary)."""
    claimed = await r.claim("a")
    running = await r.claim("b")
    await r.service.propose(StartRuns(at_us=us(LOCAL0), node="n1", runs=(running,),
                                      started_us={running: us(LOCAL0)}, lease_until_us=us(LOCAL0) + 5_000_000))
    other = await r.claim("c", node="n2")
    return [claimed, running], other, r.node.index


async def test_report_orphans_reports_this_nodes_attempts_from_before_the_restart_only(rig: Rig) -> None:
    mine, other, upto = await _held_before_restart(rig)
    rig.go_live()
    live = await rig.claim("d", at=timedelta(seconds=30))  # decided after the restart: not an orphan
    await rig.worker.report_orphans(upto)
    for rid in mine:
        run = rig.state.runs[rid]
        assert run["status"] == "lost" and run["error"] == "its node restarted", run
        assert run["retry_at_us"] is not None, "an at-least-once slot is retried at once"
    assert rig.status(other) == "claimed", "another node's attempt is not this node's to report"
    assert rig.status(live) == "claimed", "an attempt claimed after the restart is not an orphan"
    assert rig.committer.count("report_lost") == 1


async def test_report_orphans_waits_until_the_journal_is_replayed(rig: Rig) -> None:
    mine, _, upto = await _held_before_restart(rig)
    rig.go_live()
    task = asyncio.create_task(rig.worker.report_orphans(upto + 1))
    await rig.run_for(1.0)
    assert rig.committer.count("report_lost") == 0, "nothing reported before the replay reached its end"
    assert not task.done()
    await rig.service.propose(Noop(at_us=us(rig.clock.now())))
    await rig.run_until("the report done", task.done)
    await task
    assert [rig.status(r) for r in mine] == ["lost", "lost"]


async def test_report_orphans_retries_until_committed(rig: Rig) -> None:
    mine, _, upto = await _held_before_restart(rig)
    rig.go_live()
    # The service proposes three times per call: nine failures make three failed calls.
    rig.committer.plan["report_lost"] = [REFUSED] * 3 + [LOST] * 3 + [REFUSED] * 3
    task = asyncio.create_task(rig.worker.report_orphans(upto))
    await rig.run_until("the report committed", task.done)
    await task
    assert rig.committer.count("report_lost") == 10
    assert [rig.status(r) for r in mine] == ["lost", "lost"]


async def test_report_orphans_with_nothing_held_proposes_nothing(rig: Rig) -> None:
    await rig.claim("c", node="n2")
    rig.go_live()
    await rig.worker.report_orphans(rig.node.index)
    assert rig.committer.count("report_lost") == 0


@pytest.mark.parametrize("leader_ahead", [-30.0, 30.0])
async def test_report_orphans_stamps_the_loss_in_the_clusters_time(leader_ahead: float) -> None:
    """The loss (and so the retry's due time) is in the leader's clock, as every other report:
    stamped by this node's own clock 30 s ahead of the leader's, the retry would wait 30 s."""
    r = Rig(offset=leader_ahead)
    await r.setup()
    try:
        mine, _, upto = await _held_before_restart(r)
        r.go_live()
        await r.worker.report_orphans(upto)
        cluster_now = r.worker.cluster.now_us()
        assert cluster_now == us(LOCAL0) + round(leader_ahead * 1e6)
        for rid in mine:
            run = r.state.runs[rid]
            assert run["finished_us"] == cluster_now, "the loss stamped in the cluster's time"
            assert run["retry_at_us"] == cluster_now, "the retry due now by the leader's clock"
    finally:
        await r.close()


async def test_an_executor_that_raises_fails_the_attempt_with_its_urls_scrubbed(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    async def raising(attempt: Attempt) -> OutcomeStatus:
        raise ValueError("cannot reach https://hooks.test/T0/B1?api_key=SECRET123 now")

    rig.executor.handler = raising
    rig.go_live()
    rid = await rig.claim("k1")
    await rig.run_until("the failure recorded", lambda: rig.status(rid) == "failed")
    error = str(rig.state.runs[rid]["error"])
    assert error.startswith("executor error: ValueError: cannot reach https://hooks.test/") and "SECRET123" not in error
    assert "SECRET123" not in caplog.text
