"""``history.max_age``: records older than a job's max age go, swept once a minute of the log's
own time, the same way on every replica; attempts in flight and dead letters stay."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.commands import DeleteJob, Noop, PutJob
from scheduler.errors import ValidationFailed
from scheduler.model import parse_job
from scheduler.state import HISTORY_SWEEP_US, State
from tests.unit.conftest import SEC, Harness, job_doc, slot

DAY = 86_400 * SEC


def _ran(h: Harness, job: str, n: int, status: str = "succeeded") -> str:
    run = h.claim_one(job, slot(n), at_us=slot(n))
    h.finish("n1", run["id"], status, slot(n) + SEC)
    return str(run["id"])


def _tick(h: Harness, at_us: int) -> None:
    h.ok(Noop(at_us=at_us, node="n1", term=1))


def test_records_older_than_max_age_go_at_the_next_sweep_and_younger_ones_stay(h: Harness) -> None:
    h.put("ping", history={"keep": 100, "max_age": "10m"})
    h.put("plain")  # no max_age: kept by count alone
    old = [_ran(h, "ping", n) for n in (1, 2, 3)]  # each ended a second after its slot
    plain = _ran(h, "plain", 1)
    young = _ran(h, "ping", 12)
    # The claim at slot(12) swept, cutting at slot(2): slot(1)'s record went, slot(2)'s ended after the cut.
    assert h.state.job_runs["ping"] == [old[1], old[2], young] and old[0] not in h.state.runs
    _tick(h, slot(12) + 30 * SEC)  # no sweep due
    assert old[1] in h.state.runs
    _tick(h, slot(13))  # cuts at slot(3): slot(2)'s record goes, slot(3)'s ended a second after the cut
    assert h.state.job_runs["ping"] == [old[2], young] and old[1] not in h.state.runs
    assert plain in h.state.runs


def test_the_sweep_runs_at_most_once_a_minute_of_the_logs_time(h: Harness) -> None:
    h.put("ping", history={"max_age": "1m"})  # the first applied entry with an aged job sweeps
    assert h.state.history_sweep_us == slot(0) + HISTORY_SWEEP_US
    first = _ran(h, "ping", 1)  # its claim, at slot(1), swept: the next is due at slot(2)
    assert h.state.history_sweep_us == slot(2)
    _tick(h, slot(2))  # cuts at slot(1); the record ended a second later and stays
    assert first in h.state.runs
    _tick(h, slot(2) + 30 * SEC)  # the record is now 89 s old, but no sweep is due
    _tick(h, slot(2) + 1)  # nor at an entry stamped earlier than the last one
    assert first in h.state.runs
    _tick(h, slot(3))
    assert first not in h.state.runs


def test_attempts_in_flight_and_dead_letters_outlive_max_age(h: Harness) -> None:
    h.put("ping", retries={"max": 1, "backoff": "1s"}, history={"max_age": "5m"})
    first = h.claim_one("ping", slot(1), at_us=slot(1))
    h.finish("n1", first["id"], "failed", slot(1) + SEC)
    retry = h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=first["id"], at_us=slot(1) + 2 * SEC)
    h.finish("n1", retry["id"], "failed", slot(1) + 3 * SEC)
    assert retry["id"] in h.state.dead
    running = h.claim_one("ping", slot(2), at_us=slot(2))
    h.start("n1", running["id"], at_us=slot(2), lease_until_us=slot(60))
    ended = _ran(h, "ping", 3)
    _tick(h, slot(30))
    assert first["id"] not in h.state.runs and ended not in h.state.runs
    assert h.state.job_runs["ping"] == [retry["id"], running["id"]]
    assert h.state.runs[running["id"]]["status"] == "running"


def test_a_refused_entry_sweeps_nothing(h: Harness) -> None:
    h.put("ping", history={"max_age": "1m"})
    done = _ran(h, "ping", 1)
    h.state.history_sweep_us = 0  # a sweep is due at any entry that is applied
    before = h.semantic()
    h.rejected(PutJob(at_us=slot(9), spec=job_doc("ping"), expect_version=99))
    assert done in h.state.runs and h.semantic() == before
    _tick(h, slot(9))
    assert done not in h.state.runs


def test_a_replica_restored_from_a_snapshot_sweeps_at_the_same_entries_as_the_others() -> None:
    a, b = Harness(), Harness()
    for x in (a, b):
        x.node("n1")
        x.put("ping", history={"max_age": "2m"})
    ran = [_ran(a, "ping", n) for n in range(1, 4)]  # the claim at slot(3) swept: the next sweep is at slot(4)
    b.state.restore(a.state.snapshot_bytes())
    b.index = a.index
    for x in (a, b):
        _tick(x, slot(4) - SEC)  # not a sweep, though slot(1)'s record is now over 2 m old
    assert ran[0] in a.state.runs and ran[0] in b.state.runs
    for x in (a, b):
        _tick(x, slot(4))  # cuts at slot(2)
    assert ran[0] not in b.state.runs and ran[1] in b.state.runs
    assert a.state.snapshot_bytes() == b.state.snapshot_bytes()


def test_an_edit_that_sets_max_age_takes_effect_at_the_next_sweep(h: Harness) -> None:
    h.put("ping")
    ran = [_ran(h, "ping", n) for n in (1, 2)]
    _tick(h, slot(30))
    assert all(r in h.state.runs for r in ran)
    h.put("ping", at_us=slot(30) + SEC, history={"max_age": "10m"})
    _tick(h, slot(30) + 2 * SEC)
    assert not any(r in h.state.runs for r in ran)
    h.put("ping", at_us=slot(31), history={"keep": 5})  # unset again: nothing more goes by age
    late = _ran(h, "ping", 32)
    _tick(h, slot(32) + DAY)
    assert late in h.state.runs


@pytest.mark.parametrize(("value", "message"), [
    ("30s", "history.max_age: must be between 1m and 3650d"),
    ("0s", "history.max_age: must be between 1m and 3650d"),
    ("3651d", "history.max_age: must be between 1m and 3650d"),
    ("soon", "history.max_age: invalid duration 'soon'"),
    ([], "history.max_age"),
])
def test_a_bad_max_age_is_refused_naming_the_field(value: Any, message: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_job(job_doc("ping", history={"max_age": value}))
    assert message in str(err.value)


def test_max_age_reads_back_as_written() -> None:
    job = parse_job(job_doc("ping", history={"keep": 7, "max_age": "720h"}))
    assert job.history.max_age == 30 * DAY / SEC
    assert job.to_doc()["history"] == {"keep": 7, "max_age": "30d"}
    assert parse_job(job.to_doc()) == job
    assert "max_age" not in parse_job(job_doc("ping", history={"keep": 7})).to_doc()["history"]


def test_a_state_without_aged_jobs_never_moves_its_sweep_instant(h: Harness) -> None:
    h.put("ping")
    _ran(h, "ping", 1)
    _tick(h, slot(100))
    assert h.state.history_sweep_us == 0  # snapshots of clusters that never set max_age are as before


def test_the_aged_job_index_follows_edits_and_deletes_as_a_rebuild_would(h: Harness) -> None:
    h.put("a", history={"max_age": "1h"})
    assert h.state.aged_jobs() == {"a": 3_600 * SEC}
    h.put("b", history={"max_age": "2h"})
    h.put("a", at_us=slot(1), history={"keep": 3})  # unset
    h.put("c")
    h.put("c", at_us=slot(2), history={"max_age": "1d"})  # set by an edit
    h.ok(DeleteJob(at_us=slot(3), name="b"))
    rebuilt = State()
    rebuilt.restore(h.state.snapshot_bytes())
    assert h.state.aged_jobs() == rebuilt.aged_jobs() == {"c": 86_400 * SEC}


def test_after_a_restore_the_first_entry_parses_no_job(h: Harness) -> None:
    for i in range(50):
        h.put(f"j{i:02d}", history={"max_age": "1h"} if i % 2 else None)
    fresh = Harness()
    fresh.state.restore(h.state.snapshot_bytes())
    fresh.index = h.index
    _tick(fresh, slot(600))  # a sweep is due: it must find the aged jobs without parsing every job
    assert fresh.state._parsed == {}
    assert len(fresh.state.aged_jobs()) == 25
