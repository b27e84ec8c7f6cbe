"""What a job's record holds is shared, not copied: values equal across the state are one
object, whatever entry or snapshot decoded them (bench/jobmem.py measures the bytes)."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from raftlog.fsm import ApplyContext
from scheduler.commands import NoteNextSlots, PutJobs, RegisterNode, encode_command
from scheduler.planner import PLAN_EPOCH, known_next_slot, next_slot_record, stored_next_slot, walk_from_us
from scheduler.state import State

T0 = 1_800_000_000_000_000
MIN = 60_000_000
SEC = 1_000_000


class Replica:
    """A state applying encoded entries, as a follower does: every value it keeps was decoded."""

    def __init__(self) -> None:
        self.state = State()
        self.index = 0
        self.apply(RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"))

    def apply(self, cmd: Any) -> Any:
        self.index += 1
        out = self.state.apply(encode_command(cmd), ApplyContext(index=self.index))
        assert not hasattr(out, "reason"), out
        return out.result

    def put(self, names: list[str], at_us: int, schedule: str) -> None:
        self.apply(PutJobs(at_us=at_us, specs=tuple(
            {"name": n, "schedule": schedule, "executor": "http", "http": {"url": "http://127.0.0.1:9/x"}}
            for n in names)))

    def note(self, names: list[str], slot_us: int) -> dict[str, Any]:
        jobs = self.state.jobs
        return self.apply(NoteNextSlots(at_us=T0, leader="n1", term=1, slots=tuple(
            next_slot_record(jobs[n], n, walk_from_us(jobs[n]), slot_us) for n in names)))  # type: ignore[no-any-return]


NAMES = [f"job-{i:05d}" for i in range(2000)]


def test_a_noted_next_slot_keeps_the_objects_its_job_record_already_holds() -> None:
    r = Replica()
    r.put(NAMES, T0, "* * * * *")
    assert r.note(NAMES, T0 + MIN) == {"kept": len(NAMES)}
    kept = [r.state.jobs[n]["next_slot"] for n in NAMES]
    for n, record in zip(NAMES, kept, strict=True):
        rec = r.state.jobs[n]
        assert record == [PLAN_EPOCH, rec["version"], rec["created_us"], walk_from_us(rec), T0 + MIN]
        assert record[0] is PLAN_EPOCH
        assert record[2] is rec["created_us"] and record[3] is walk_from_us(rec)
        assert known_next_slot(rec) == (True, T0 + MIN)
    assert len({id(record[4]) for record in kept}) == 1  # one object for the entry's one instant
    # What a leader compares its walk against is equal to what was kept: nothing is noted twice.
    assert all(r.state.jobs[n]["next_slot"] == stored_next_slot(
        next_slot_record(r.state.jobs[n], n, walk_from_us(r.state.jobs[n]), T0 + MIN)) for n in NAMES)
    assert r.note(NAMES, T0 + MIN) == {"kept": 0}


def test_noting_next_slots_holds_under_150_bytes_a_job() -> None:
    # Each item's epoch string and three instants past 2**30, decoded for every job and kept,
    # made the note hold ~250 bytes a job (the record's list and its new key included); ~100 now.
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC: jobs made before this test began would not be counted freed
        tracemalloc.stop()
    tracemalloc.start()  # before the jobs: the records a note replaces are traced, and their release counted
    try:
        r = Replica()
        r.put(NAMES, T0, "* * * * *")
        raw = encode_command(NoteNextSlots(at_us=T0, leader="n1", term=1, slots=tuple(
            next_slot_record(r.state.jobs[n], n, walk_from_us(r.state.jobs[n]), T0 + MIN) for n in NAMES)))
        gc.collect()
        before = tracemalloc.take_snapshot()
        r.index += 1
        out = r.state.apply(raw, ApplyContext(index=r.index))
        assert out.result == {"kept": len(NAMES)}  # type: ignore[union-attr]
        del out
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert held / len(NAMES) < 150, held / len(NAMES)


def test_a_job_name_is_one_object_in_its_key_document_and_parse_after_edits_and_restores() -> None:
    r = Replica()
    r.put(NAMES[:50], T0, "* * * * *")
    r.put(NAMES[:50], T0 + MIN, "*/2 * * * *")  # an edit: a document decoded anew

    def one_object(state: State) -> None:
        for key, rec in state.jobs.items():
            assert rec["spec"]["name"] is key
            job = state.job(key)
            assert job is not None and job.name is key

    one_object(r.state)
    assert r.state.jobs[NAMES[0]]["version"] == 2
    restored = State()
    restored.restore(r.state.snapshot_bytes())  # names decoded twice: the key and the document's
    assert restored.snapshot_bytes() == r.state.snapshot_bytes()
    one_object(restored)
    follower = Replica()
    follower.state = restored
    follower.index = restored.applied_index
    follower.put(NAMES[:50], T0 + 2 * MIN, "*/3 * * * *")  # and an edit after the restore
    one_object(follower.state)


def test_not_alerted_is_no_field_so_a_record_stays_in_a_dicts_smallest_table(h: Any) -> None:
    # A dict holds at most 10 fields in its 16-slot table; an 11th doubles it (272 bytes a job
    # record against 464). A success kept "failure_alerted": False as an 11th field beside the
    # noted next slot; not alerted is now the field's absence.
    h.put("ping", retries={"max": 0})
    n = 0

    def slot(k: int) -> int:
        return T0 + k * MIN

    def once(status: str) -> dict[str, Any]:
        nonlocal n
        n += 1
        run = h.claim_one("ping", slot(n))
        h.start("n1", run["id"], at_us=slot(n))
        h.finish("n1", run["id"], status, slot(n) + SEC)
        rec: dict[str, Any] = h.state.jobs["ping"]
        return rec

    def alerts() -> list[str]:
        return [a["event"] for a in sorted(h.state.alerts.values(), key=lambda a: a["id"])]

    assert "failure_alerted" not in once("succeeded")
    assert once("failed")["failure_alerted"] is True and alerts() == ["failure"]
    assert "failure_alerted" not in once("succeeded") and alerts() == ["failure", "recovery"]
    assert once("failed")["failure_alerted"] is True and alerts() == ["failure", "recovery", "failure"]
    once("succeeded")
    rec = h.state.jobs["ping"]
    h.ok(NoteNextSlots(at_us=T0, leader="n1", term=1,
                       slots=(next_slot_record(rec, "ping", walk_from_us(rec), slot(n + 1)),)))
    rec = h.state.jobs["ping"]
    assert "next_slot" in rec and "failure_alerted" not in rec and len(rec) <= 10, sorted(rec)
    # As an earlier release kept it (and snapshots hold it): gone at the next success, no alert.
    h.state.jobs["ping"] = {**rec, "failure_alerted": False}
    assert "failure_alerted" not in once("succeeded") and alerts() == ["failure", "recovery", "failure", "recovery"]


def test_a_snapshot_whose_records_hold_not_alerted_as_false_restores_without_it(h: Any) -> None:
    # As an earlier release wrote them: a restore takes the field away, so replicas of this
    # release hold the same records (and snapshot bytes) whether they restored or replayed.
    for name in ("a", "b"):
        h.put(name)
    plain = h.state.snapshot_bytes()
    h.state.jobs["a"] = {**h.state.jobs["a"], "failure_alerted": False}
    h.state.jobs["b"] = {**h.state.jobs["b"], "failure_alerted": True}
    restored = State()
    restored.restore(h.state.snapshot_bytes())
    assert "failure_alerted" not in restored.jobs["a"] and restored.jobs["b"]["failure_alerted"] is True
    del restored.jobs["b"]["failure_alerted"]  # what only "b" holds: the rest is as the plain state
    assert restored.snapshot_bytes() == plain
