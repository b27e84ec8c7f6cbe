"""``Store.paused_jobs``: the jobs whose document says paused, kept in step with every write
(a scrape of ``/metrics`` counted them over every job: 0.3 s of an agent's event loop at
100,000 jobs while run records filled)."""

from __future__ import annotations

import random
from typing import Any

from raftlog.fsm import ApplyContext
from scheduler.commands import Command, DeleteJob, PauseJob, PutJob, PutJobs, encode_command
from scheduler.state import State
from tests.unit.conftest import T0


def _job(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"}, **extra}


def _paused_by_walk(s: State) -> set[str]:
    return {name for name, rec in s.jobs.items() if rec["spec"].get("paused")}


def test_the_paused_index_follows_every_write_and_a_restore() -> None:
    rng = random.Random(1406)
    s = State()
    names = [f"j{i}" for i in range(12)]
    index = 0

    def apply(cmd: Command) -> None:
        nonlocal index
        index += 1
        s.apply(encode_command(cmd), ApplyContext(index=index))

    for step in range(600):
        name = rng.choice(names)
        at = T0 + step * 1_000_000
        match rng.randrange(5):
            case 0:  # a document written paused or not (an edit can pause or resume a job too)
                apply(PutJob(at_us=at, spec=_job(name, paused=rng.random() < 0.5)))
            case 1:
                apply(PutJobs(at_us=at, specs=tuple(_job(n, paused=rng.random() < 0.3) for n in rng.sample(names, 3))))
            case 2:
                apply(PauseJob(at_us=at, name=name, paused=rng.random() < 0.6, note="by hand"))
            case 3:
                apply(PutJob(at_us=at, spec=_job(name, description=f"edit {step}")))  # no paused: resumes it
            case _:
                apply(DeleteJob(at_us=at, name=name))
        assert set(s.paused_jobs()) == _paused_by_walk(s), step
    assert 0 < len(s.paused_jobs()) < len(s.jobs)
    restored = State()
    restored.restore(s.snapshot_bytes())
    assert set(restored.paused_jobs()) == _paused_by_walk(s)
