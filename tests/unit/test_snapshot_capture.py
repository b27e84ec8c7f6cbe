"""A snapshot's capture: what the raft thread does, holding the GIL, before the snapshot is
packed in a thread of its own.

With 100,000 jobs and 400,000 run records the capture took 0.2-0.5 s in-process: it listed
every job as a pair, copied every job's notes, and dropped the run index's holes in a Python
walk over every record, while the API waited for the GIL. It now copies the tables alone (no
object per job or per record), which holds only because records and notes are replaced,
never changed in place.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack

from scheduler.commands import Claim, ClaimSlots, FinishRuns, JobPlanning, PauseJob, PutJobs, RegisterNode, StartRuns
from scheduler.state import State
from tests.unit.test_policy import MIN, T0, _apply

JOBS = 2_000


def _doc(i: int, schedule: str) -> dict[str, Any]:
    return {"name": f"job-{i:05d}", "schedule": schedule, "executor": "http", "http": {"url": "https://x.test/"},
            "history": {"keep": 2}, "labels": {"team": f"t{i % 10}"}}


def _round(state: State, k: int, index: list[int]) -> None:
    slot = T0 + k * MIN
    names = [f"job-{i:05d}" for i in range(JOBS)]
    out = _apply(state, ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=tuple(
        Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in names)), index)
    ids = tuple(r["id"] for r in out["runs"])
    _apply(state, StartRuns(at_us=slot + 1000, node="n1", runs=ids, started_us=dict.fromkeys(ids, slot + 1000),
                            lease_until_us=slot + 30_000_000), index)
    _apply(state, FinishRuns(at_us=slot + 50_000, node="n1", results=tuple(
        {"run_id": r, "status": "succeeded", "started_us": slot + 1000, "finished_us": slot + 50_000,
         "exit_code": None, "http_status": 200, "output": "", "error": None} for r in ids)), index)


def _busy_state() -> tuple[State, list[int]]:
    """``JOBS`` jobs, each edited (a note), keeping 2 records after 4 rounds (the run index
    holds the trimmed records' holes)."""
    state, index = State(), [0]
    _apply(state, RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"), index)
    _apply(state, PutJobs(at_us=T0, specs=tuple(_doc(i, "* * * * *") for i in range(JOBS))), index)
    _apply(state, PutJobs(at_us=T0 + 1, specs=tuple(_doc(i, "*/1 * * * *") for i in range(JOBS))), index)
    for k in range(1, 5):
        _round(state, k, index)
    return state, index


def test_the_capture_makes_no_object_per_job_or_per_record() -> None:
    state, _ = _busy_state()
    assert len(state.runs) == 2 * JOBS and len(state.notes) == JOBS
    assert None in state.runs._index.owners  # holes the capture must not walk (trimmed records)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        captured = state.snapshot()  # noqa: F841 (held: what it allocated stays traced)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    blocks = sum(d.count_diff for d in after.compare_to(before, "filename") if d.count_diff > 0)
    # Copies of a dozen tables, a few blocks each. The capture before listed each job's pair
    # and copied each job's notes: more than 2 x JOBS blocks.
    assert blocks < 100, f"the capture allocated {blocks} blocks for {JOBS} jobs"


def test_a_snapshot_holds_the_state_of_its_capture_while_the_state_moves_on() -> None:
    state, index = _busy_state()
    expected = state.snapshot_bytes()
    chunks = state.snapshot()  # captured now, packed below, after the state changed
    _apply(state, PauseJob(at_us=T0 + 10 * MIN, name="job-00001", paused=True, note="held"), index)  # a note appended
    _round(state, 5, index)  # every job's records replaced, the oldest trimmed
    _apply(state, PutJobs(at_us=T0 + 11 * MIN, specs=(_doc(JOBS, "@hourly"),)), index)  # a job added
    assert b"".join(chunks) == expected
    assert state.notes["job-00001"][-1]["reason"] == "held"
    assert len(state.notes["job-00001"]) == 2


def test_a_planning_error_recorded_or_cleared_after_the_capture_is_not_in_the_snapshot() -> None:
    # The record used to be changed in place: a snapshot being packed picked up the error, and
    # a replica restored from it, replaying the entry that set it, raised no alert where the
    # others had raised one.
    state, index = _busy_state()
    _apply(state, JobPlanning(at_us=T0 + 10 * MIN, job="job-00002", version=2, error="no slot in 5 years",
                              leader="n1", term=1), index)
    expected = state.snapshot_bytes()
    chunks = state.snapshot()
    _apply(state, JobPlanning(at_us=T0 + 11 * MIN, job="job-00002", version=2, error=None, leader="n1", term=1), index)
    _apply(state, JobPlanning(at_us=T0 + 11 * MIN, job="job-00003", version=2, error="no slot in 5 years",
                              leader="n1", term=1), index)
    assert "planning_error" not in state.jobs["job-00002"] and "planning_error" in state.jobs["job-00003"]
    assert b"".join(chunks) == expected


def test_notes_keep_the_newest_and_are_never_changed_in_place(monkeypatch: Any) -> None:
    import scheduler.store as store_module

    monkeypatch.setattr(store_module, "NOTES_KEPT", 3)
    state = State()
    for i in range(5):
        state.note("a", {"at_us": i, "decision": "paused", "reason": str(i)})
        held = state.notes.packed()["a"]  # what a capture holds: one immutable value a job
        assert isinstance(held, bytes)
    assert [n["at_us"] for n in state.notes["a"]] == [2, 3, 4]
    assert [n["at_us"] for n in msgpack.unpackb(held)] == [2, 3, 4]
    state.note("a", {"at_us": 5, "decision": "paused", "reason": "5"})
    assert [n["at_us"] for n in msgpack.unpackb(held)] == [2, 3, 4]  # the value captured before is what it was
