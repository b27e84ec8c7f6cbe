"""The sorted job-name index the list route pages through: in step with puts, batch puts and
deletes, equal to a sort of the jobs after any sequence, rebuilt after a restore; and a reader
paging through it while names come and go sees every name that stays, once, in order."""

from __future__ import annotations

import bisect
import random

from api.routes.jobs import _names_after
from scheduler.commands import DeleteJob, PutJobs
from scheduler.state import State
from tests.unit.conftest import SEC, Harness, job_doc, slot


def test_the_index_follows_every_put_and_delete_as_a_sort_would(h: Harness) -> None:
    rng = random.Random(1512)
    assert h.state.job_names() == []
    for step in range(400):
        name = f"j{rng.randrange(60):02d}"
        roll = rng.random()
        if roll < 0.5:
            h.put(name, at_us=slot(step))
        elif roll < 0.7:
            docs = tuple(job_doc(f"b{rng.randrange(60):02d}") for _ in range(3))
            h.apply(PutJobs(at_us=slot(step), specs=docs))
        elif name in h.state.jobs:
            h.ok(DeleteJob(at_us=slot(step), name=name))
        assert h.state.job_names() == sorted(h.state.jobs), step
    restored = State()
    restored.restore(h.state.snapshot_bytes())
    assert restored.job_names() == h.state.job_names()


def test_paging_while_names_are_inserted_and_deleted_skips_and_repeats_nothing_that_stays() -> None:
    names = [f"n{i:04d}" for i in range(0, 2000, 2)]
    stays = set(names[::3])
    seen: list[str] = []
    rng = random.Random(7)
    for i, name in enumerate(_names_after(names, None, step=16)):
        seen.append(name)
        if i % 5 == 0:  # what the raft thread may do between two slices: one insert, one delete
            new = f"n{rng.randrange(2000):04d}x"
            if new not in names:
                bisect.insort(names, new)
            victim = rng.choice(names)
            if victim not in stays:
                names.remove(victim)
    assert seen == sorted(set(seen)), "out of order or repeated"
    assert stays <= set(seen)


def test_a_page_starts_after_the_cursor_name_even_if_it_was_deleted() -> None:
    names = ["a", "c", "e"]
    assert list(_names_after(names, "b")) == ["c", "e"]
    assert list(_names_after(names, "e")) == []
    assert list(_names_after([], None)) == []


def test_after_a_restore_a_finished_run_finds_its_dependents_without_parsing_every_job(h: Harness) -> None:
    h.put("up")
    h.put("down", schedule=None, depends_on={"job": "up", "on": "any"})
    for i in range(50):
        h.put(f"other{i:02d}")
    fresh = Harness()
    fresh.state.restore(h.state.snapshot_bytes())
    fresh.index = h.index
    fresh.node("n1")
    run = fresh.claim_one("up", slot(1), at_us=slot(1))
    fresh.finish("n1", run["id"], "succeeded", slot(1) + 1)
    assert [d["job"] for d in fresh.state.pending_deps.values()] == ["down"]
    assert not any(name.startswith("other") for name in fresh.state._parsed)


def test_an_edit_that_adds_or_drops_a_dependency_is_seen_by_the_index(h: Harness) -> None:
    h.put("up")
    h.put("down", schedule=None, depends_on={"job": "up", "on": "any"})
    assert h.state.dependents_of("up") == ["down"]
    h.put("down", at_us=slot(1), schedule="@hourly")
    assert h.state.dependents_of("up") == []
    h.put("side", at_us=slot(2), schedule=None, depends_on={"job": "up", "on": "any"})
    h.put("plain", at_us=slot(3))  # no dependency before or after: the index is kept
    assert h.state.dependents_of("up") == ["side"]


def test_the_failing_index_follows_failures_successes_deletes_and_restores(h: Harness) -> None:
    h.put("a")
    h.put("b")
    assert h.state.failing_jobs() == {}
    for n, (job, status) in enumerate([("a", "failed"), ("b", "succeeded"), ("b", "failed"), ("a", "succeeded")],
                                      start=1):
        run = h.claim_one(job, slot(n))
        h.start("n1", run["id"], at_us=slot(n))
        h.finish("n1", run["id"], status, slot(n) + SEC)
        expected = {name for name, rec in h.state.jobs.items() if rec["consecutive_failures"]}
        assert set(h.state.failing_jobs()) == expected, (n, job, status)
    assert set(h.state.failing_jobs()) == {"b"}
    restored = State()
    restored.restore(h.state.snapshot_bytes())
    assert set(restored.failing_jobs()) == {"b"}
    h.ok(DeleteJob(at_us=slot(9), name="b"))
    assert h.state.failing_jobs() == {}
    h.put("b", at_us=slot(10))  # made again: a new job, no failures
    assert h.state.failing_jobs() == {}
