"""One job cannot stop the others (issue 12, bug 5): the leader and the job views; and a retried
report never stops its own attempt (bug 3). Leader, worker and service on the in-memory node."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from api.views import job_view
from scheduler.commands import StartRuns
from scheduler.executors.base import Attempt, Outcome, OutcomeStatus
from scheduler.instants import us
from scheduler.state import State
from tests.unit.test_simulation import _job, _sim

FAR = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _break(state: State, name: str) -> None:
    """Stand-in for a job this version's bounds refuse but an older version stored (the issue's
    ``starts_at: 9999-12-31T23:59:59Z`` with ``@hourly``): stepping its schedule overflows."""
    job = state.job(name)
    assert job is not None
    state._parsed[name] = (state.jobs[name]["spec"], dataclasses.replace(job, starts_at=FAR))


async def test_a_job_that_cannot_be_planned_leaves_the_others_running() -> None:
    sim = await _sim(datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC))
    try:
        await sim.put(_job("broken", "@hourly"))
        _break(sim.state, "broken")
        await sim.put(_job("tick", "*/10 * * * * *"))
        for _ in range(30):
            await sim.step(1.0)
        assert not sim.task.done(), "the leader loop must go on"
        assert [a.slot.second for a, _ in sim.executor.fired] == [10, 20, 30]
        assert all(a.job == "tick" for a, _ in sim.executor.fired)
        err = sim.state.planning_errors["broken"]
        assert "OverflowError" in err["error"] and err["version"] == 1
        # Retried with backoff, not on every tick: 1 s, 2 s, 4 s, 8 s, 16 s within 30 s.
        assert err["retry_s"] == 16.0
        view = job_view(sim.state, "broken", us(sim.clock.now()))
        assert view is not None and "cannot plan this job" in view["error"]
        assert job_view(sim.state, "tick", us(sim.clock.now())) is not None
        assert "error" not in (job_view(sim.state, "tick", us(sim.clock.now())) or {})
        # Replicated, so a follower's view shows it too (its own loop never planned the job), and
        # alerted once for the version, not on each of the five retries.
        recorded = sim.state.jobs["broken"]["planning_error"]
        assert recorded["version"] == 1 and "OverflowError" in recorded["error"]
        follower = dict(sim.state.planning_errors)
        sim.state.planning_errors.clear()
        view = job_view(sim.state, "broken", us(sim.clock.now()))
        assert view is not None and "cannot plan this job" in view["error"]
        sim.state.planning_errors.update(follower)
        raised = [a for a in sim.state.alerts.values() if a["event"] == "unplannable"]
        assert [(a["job"], a["node"]) for a in raised] == [("broken", "n1")], raised
        # Fixing the job (an edit) clears the error at once, without waiting for the backoff.
        await sim.put(_job("broken", "@hourly", description="fixed"))
        await sim.step(0.0)
        assert "broken" not in sim.state.planning_errors
        assert "planning_error" not in sim.state.jobs["broken"]  # the next plan that worked cleared it
        assert "error" not in (job_view(sim.state, "broken", us(sim.clock.now())) or {})
    finally:
        await sim.close()


def test_a_view_whose_next_slots_cannot_be_computed_shows_the_error(h: Any) -> None:
    h.put("ping", schedule="@hourly")
    h.put("pong", schedule="@hourly")
    _break(h.state, "ping")
    view = job_view(h.state, "ping", us(datetime(2026, 6, 1, tzinfo=UTC)))
    assert view is not None and view["status"]["next_slots"] == []
    assert view["error"].startswith("the next slots cannot be computed: OverflowError")
    other = job_view(h.state, "pong", us(datetime(2026, 6, 1, tzinfo=UTC)))
    assert other is not None and "error" not in other and len(other["status"]["next_slots"]) == 5


def test_a_stored_document_that_no_longer_parses_still_has_a_view(h: Any) -> None:
    h.put("ping", schedule="@hourly")
    rec = h.state.jobs["ping"]
    h.state.jobs["ping"] = {**rec, "spec": {**rec["spec"], "starts_at": "9999-12-31T23:59:59Z"}}
    h.state._parsed.pop("ping")
    view = job_view(h.state, "ping", us(datetime(2026, 6, 1, tzinfo=UTC)))
    assert view is not None and "ValidationFailed" in view["error"] and "starts_at" in view["error"]
    assert view["spec"]["starts_at"] == "9999-12-31T23:59:59Z"


async def test_a_retried_start_report_that_had_committed_leaves_the_attempt_running() -> None:
    """Issue 12, bug 3: the worker resubmits StartRuns after an unknown outcome; if the first copy
    committed, the second must not fence the attempt (before: stale, executor cancelled, lost, run again)."""
    sim = await _sim(datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC))
    starts: list[StartRuns] = []
    sim.node.hooks.append(lambda a: starts.append(a.command) if isinstance(a.command, StartRuns) else None)

    async def run(attempt: Attempt) -> Outcome:
        began = sim.clock.now()
        sim.executor.fired.append((attempt, began))
        await sim.clock.sleep(3.0)
        return Outcome(status=OutcomeStatus.SUCCEEDED, started_at=began, finished_at=sim.clock.now())

    sim.worker.executors["http"].run = run  # type: ignore[method-assign]
    try:
        await sim.put(_job("long", "@at 2026-06-01T12:00:05Z"))
        for _ in range(6):
            await sim.step(1.0)
        assert len(starts) == 1
        result, _ = await sim.service.propose(starts[0])  # the same report, committed a second time
        assert result["stale"] == [] and result["already"] == list(starts[0].runs)
        for _ in range(10):
            await sim.step(1.0)
        assert [(r["attempt"], r["status"]) for r in sim.state.runs.values()] == [(1, "succeeded")]
        assert [a.attempt for a, _ in sim.executor.fired] == [1]
    finally:
        await sim.close()
