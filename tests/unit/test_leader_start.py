"""A new leader's first steps. Its first pass over every job (which of them have a next slot an
earlier leader recorded): at 100,000 jobs it took ~0.2-0.4 s in one go, during which the node
that had just been elected answered nothing; now it reads ``START_SLICE`` jobs between turns of
the loop. And a leader with no instant to plan by (its clocks not judged yet) says so when
that lasts, and a side task of a leadership that dies on an error is logged: before, both
went unsaid."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import scheduler.leader as leader_module
from scheduler.commands import PutJobs
from scheduler.instants import us
from scheduler.leader import NOT_PLANNING_SAY, LeaderConfig, LeaderLoop
from scheduler.runtime import _say_if_failed
from tests.unit.test_skew import JOB, LOCAL0, _run_until, _settle, _setup


async def test_a_new_leaders_first_pass_lets_the_loop_turn_and_counts_every_job_unplanned_until_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, state, _node, service, _ = await _setup(None)
    await service.propose(PutJobs(at_us=us(LOCAL0), specs=tuple(
        {**JOB, "name": f"job-{i:02d}", "schedule": "@daily"} for i in range(25))))
    total = len(state.jobs)
    assert total == 26
    monkeypatch.setattr(leader_module, "START_SLICE", 10)
    read = 0
    known_next_slot = leader_module.known_next_slot

    def counted(rec: dict[str, Any]) -> tuple[bool, int | None]:
        nonlocal read
        read += 1
        return known_next_slot(rec)

    monkeypatch.setattr(leader_module, "known_next_slot", counted)
    loop = LeaderLoop(service, clock, LeaderConfig(), lambda: {"n1"}, lambda: us(clock.now()))
    seen: list[tuple[int, int]] = []  # (jobs read by the pass, unplanned()) at each turn of the loop

    async def probe() -> None:
        while read < total:
            seen.append((read, loop.unplanned()))
            await asyncio.sleep(0)
        seen.append((read, loop.unplanned()))

    watcher = asyncio.create_task(probe())
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(watcher, 5.0)
        mid_pass = [unplanned for n, unplanned in seen if 0 < n < total]
        assert mid_pass, f"the loop never turned during the pass: {seen}"
        assert set(mid_pass) == {total}  # the pass not done: every job still counts as unplanned
        for _ in range(3):
            await _settle()
        assert loop.unplanned() == 0  # none had a next slot recorded: each one planned at the first ticks
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_leader_that_has_no_instant_to_plan_by_for_long_says_why_and_when_it_plans_again(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, state, _node, service, _ = await _setup(None)
    planning: list[int | None] = [None]
    loop = LeaderLoop(service, clock, LeaderConfig(), lambda: {"n1"}, lambda: planning[0],
                      lambda: "the reason it gives")

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "raftcron.leader" and r.levelno == level]

    task = asyncio.create_task(loop.run())
    try:
        with caplog.at_level(logging.INFO, logger="raftcron.leader"):
            await _run_until(clock, clock.now() + timedelta(seconds=NOT_PLANNING_SAY - 1))
            assert said(logging.WARNING) == [], "a leadership's first moments without an instant are normal"
            await _run_until(clock, clock.now() + timedelta(seconds=2))
            warned = said(logging.WARNING)
            assert len(warned) == 1, warned
            assert warned[0].startswith("this leader has planned nothing for ") and "the reason it gives" in warned[0]
            assert loop.claimed_total == 0 and state.job("tick") is not None
            planning[0] = us(clock.now())
            await _run_until(clock, clock.now() + timedelta(seconds=1))
            assert any(m.startswith("planning again, after ") for m in said(logging.INFO))
            assert loop.unplanned() == 0, "planned once an instant is known"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_leaders_side_task_that_dies_on_an_error_is_logged_and_a_cancelled_one_is_not(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise KeyError("n9")

    async def waiting() -> None:
        await asyncio.Event().wait()

    with caplog.at_level(logging.ERROR, logger="raftcron.runtime"):
        failed = asyncio.create_task(broken(), name="clock-skew")
        cancelled = asyncio.create_task(waiting(), name="alert-sender")
        for task in (failed, cancelled):
            task.add_done_callback(_say_if_failed)
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(failed, cancelled, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run at the loop's next turn
    said = [r.getMessage() for r in caplog.records if r.name == "raftcron.runtime"]
    assert said == ["clock-skew stopped on an error for the rest of this leadership: KeyError: 'n9'"]
