"""SchedulerRuntime against an in-memory node on a FakeClock: leadership by events, restarts with backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from memraft import MemoryCommitter, MemoryNode

from raftlog import ApplyContext
from scheduler.base import observed_role
from scheduler.clock import FakeClock
from scheduler.commands import Noop, PutJob
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.planner import due_retries
from scheduler.runtime import RuntimeConfig, SchedulerRuntime
from scheduler.service import Service
from scheduler.state import Applied, State

START = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class Recorder:
    """The executor: records each attempt's job and fake start time."""

    clock: FakeClock
    ran: list[tuple[str, datetime]] = field(default_factory=list)

    async def run(self, attempt: Attempt) -> Outcome:
        now = self.clock.now()
        self.ran.append((attempt.job, now))
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=now, finished_at=now)


@dataclass
class Rig:
    clock: FakeClock
    state: State
    node: MemoryNode
    runtime: SchedulerRuntime
    service: Service
    executor: Recorder
    barriers: list[tuple[float, int]]  # (fake monotonic time, term) of every committed Noop

    async def put(self, name: str, schedule: str) -> None:
        doc = {"name": name, "schedule": schedule, "executor": "http", "http": {"url": "http://sink.test/x"}}
        await self.service.propose(PutJob(at_us=us(self.clock.now()), spec=parse_job(doc).to_doc()))


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    clock = FakeClock(START)
    state = State()
    node = MemoryNode(state)
    executor = Recorder(clock)
    runtime = SchedulerRuntime(state, clock, RuntimeConfig(node_id="n1", raft_addr="mem:1", http_addr="mem:2"),
                               {"http": executor}, asyncio.get_running_loop())
    barriers: list[tuple[float, int]] = []

    def applied(a: Applied) -> None:
        if isinstance(a.command, Noop):
            barriers.append((clock.monotonic(), a.command.term))
        # What RaftNode(on_applied=...) does on the raft thread.
        runtime.applied_from_raft(ApplyContext(index=node.index), a)

    node.hooks.append(applied)
    node.role_hooks.append(runtime.role_from_raft)
    service = runtime.start(node, MemoryCommitter(node))
    await clock.settle()
    try:
        yield Rig(clock, state, node, runtime, service, executor, barriers)
    finally:
        await runtime.stop()


async def test_a_slot_is_claimed_run_and_recorded_through_the_runtime(rig: Rig) -> None:
    assert rig.runtime.leading and len(rig.barriers) == 1, "leading from the start, barrier first"
    assert "n1" in rig.state.nodes, "the node registered itself"
    await rig.put("tick", "*/2 * * * * *")
    await rig.clock.run_for(7)
    assert rig.executor.ran == [("tick", START.replace(second=s)) for s in (2, 4, 6)]
    recorded = {r["slot_us"]: r["status"] for r in rig.state.runs.values()}
    assert [recorded[us(START.replace(second=s))] for s in (2, 4, 6)] == ["succeeded"] * 3


async def test_leadership_follows_role_events(rig: Rig) -> None:
    rig.node.leading = False
    await rig.clock.settle()
    assert not rig.runtime.leading
    rig.node.leading = True
    await rig.clock.settle()
    assert rig.runtime.leading and [t for _, t in rig.barriers] == [1, 1], "a new loop, barrier first"
    rig.node.term = 2  # re-elected in a new term: the loop starts over, barrier first
    await rig.clock.settle()
    assert rig.runtime.leading and [t for _, t in rig.barriers] == [1, 1, 2]
    rig.runtime.on_role(observed_role(rig.node.status()))  # a repeat (only the leader's address, say)
    await rig.clock.run_for(1)
    assert rig.runtime.leading and [t for _, t in rig.barriers] == [1, 1, 2], "the same leadership goes on"


async def test_a_crashing_leader_loop_restarts_with_backoff(rig: Rig, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    broken = True
    crashed: list[float] = []

    # A fault in the loop itself (one job's planning error is caught per job, see
    # test_job_isolation.py): the scan of attempts in flight, which every loop's first tick runs.
    def retries(*args: Any, **kwargs: Any) -> Any:
        if broken:
            crashed.append(rig.clock.monotonic())
            raise OverflowError("date value out of range")
        return due_retries(*args, **kwargs)

    monkeypatch.setattr("scheduler.leader.due_retries", retries)
    caplog.set_level(logging.ERROR, logger="raftcron.runtime")
    await rig.put("tick", "@every 1s")  # planned at once: the first crash, at 0 s
    await rig.clock.run_for(30)
    # A barrier per start of the loop: 0.1 s after the first crash, then each wait doubles up to 5 s.
    # (The first loop had ticked before the fault was put in: it crashes at its next scan.)
    starts = [at for at, _ in rig.barriers]
    assert [round(b - a, 3) for a, b in zip(crashed, starts[1:], strict=False)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    assert crashed[1:] == starts[1:len(crashed)], "each restarted loop crashed at its first tick"
    logged = [r for r in caplog.records if "leader loop crashed" in r.getMessage()]
    assert len(logged) == rig.runtime.restarts == len(crashed), "one log line per crash"
    assert all(r.exc_info is not None and "OverflowError" in r.getMessage() for r in logged)

    broken = False  # healthy for longer than restart_healthy (30 s): the backoff starts over
    await rig.clock.run_for(40)
    assert rig.executor.ran, "the job runs once planning works"
    crashed.clear()
    again = len(rig.barriers)
    broken = True
    await rig.clock.run_for(3)
    starts = [at for at, _ in rig.barriers[again:]]
    assert [round(b - a, 3) for a, b in zip([crashed[0], *starts], starts, strict=False)][:3] == [0.1, 0.2, 0.4]
