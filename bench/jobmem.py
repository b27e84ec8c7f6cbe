"""Where a job's bytes go, in-process: the replicated state as a follower applies it, traced.

A state machine (``scheduler.state.State``) applies, as every replica does, the entries an
agent's cluster writes for ``--jobs`` jobs (default 30,000), and tracemalloc counts the bytes
still held after each stage, per job:

1. ``created``: the jobs, 1,000 documents an entry (``PutJobs``, as ``POST /v1/jobs:batch``
   writes them; hourly crons, a label, an HTTP target, ``history: {keep: 10}``);
2. ``edited``: each job's document edited once (to fire each second of a minute), as
   ``bench.scale --history`` edits them: a new version, an edit note;
3. ``planned``: each job's next slot noted as a leader notes it (``NoteNextSlots``);
4. ``ran``: ``--rounds`` slots of every job claimed, started and finished (as ``bench.history``
   writes them), and the next slots noted again after each.

Then the snapshot is packed and restored into a fresh state, traced the same way
(``restored``). Each stage also lists the allocation sites holding the most (``--top``).
Unlike RSS, the figures do not move between runs of one tree: what they compare is code.

``--tree PATH`` measures PATH's ``scheduler`` package too (an earlier commit checked out with
``git worktree add``), in a process of its own.

    python -m bench.jobmem                    # 30,000 jobs, this tree
    python -m bench.jobmem --tree /tmp/old    # and an earlier commit

The JSON goes to bench/results/jobmem.json (``--ab NAME``: also bench/ab/NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000_000_000  # 2027-01-15, on a minute
MIN = 60_000_000
BATCH = 1000


def _traced(tracemalloc: Any, jobs: int, top: int) -> dict[str, Any]:
    import gc

    gc.collect()
    snap = tracemalloc.take_snapshot()
    stats = snap.statistics("lineno")
    total = sum(s.size for s in stats)
    here = ROOT.as_posix() + "/"
    return {
        "bytes_per_job": round(total / jobs, 1),
        "top": [{"site": f"{s.traceback[0].filename.replace(here, '')}:{s.traceback[0].lineno}",
                 "bytes_per_job": round(s.size / jobs, 1), "objects_per_job": round(s.count / jobs, 2)}
                for s in stats[:top]],
    }


def child(jobs: int, rounds: int, top: int) -> dict[str, Any]:
    """The stages in this process (the ``scheduler`` package on ``sys.path`` is the form measured)."""
    import tracemalloc

    from history import T0 as HISTORY_T0
    from history import _round as run_round  # bench/history.py beside this file: the same rounds

    from raftlog.fsm import ApplyContext
    from scheduler.commands import (
        NoteNextSlots,
        PutJobs,
        RegisterNode,
        encode_command,
    )
    from scheduler.planner import next_slot_record, walk_from_us
    from scheduler.state import State

    assert HISTORY_T0 == T0
    s = State()
    index = 0

    def apply(cmd: Any) -> Any:
        nonlocal index
        index += 1
        out = s.apply(encode_command(cmd), ApplyContext(index=index))
        assert not hasattr(out, "reason"), out
        return out

    names = [f"job-{i:07d}" for i in range(jobs)]

    def put(at_us: int, schedule: Any) -> None:
        for start in range(0, jobs, BATCH):
            apply(PutJobs(at_us=at_us, specs=tuple(
                {"name": n, "schedule": schedule(i), "executor": "http", "timeout": "5s",
                 "http": {"url": "http://127.0.0.1:9/hook"}, "history": {"keep": 10}, "labels": {"team": f"t{i % 10}"}}
                for i, n in enumerate(names[start:start + BATCH], start))))

    def plan(term: int, slot_us: int) -> None:
        # As a leader notes the slots it walked to: each job's from its record as it stands.
        for start in range(0, jobs, BATCH):
            apply(NoteNextSlots(at_us=slot_us - 5_000_000, leader="n1", term=term, slots=tuple(
                next_slot_record(s.jobs[n], n, walk_from_us(s.jobs[n]), slot_us) for n in names[start:start + BATCH])))

    tracemalloc.start()
    apply(RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"))
    base = _traced(tracemalloc, jobs, 0)["bytes_per_job"]
    stages: dict[str, Any] = {}
    put(T0, lambda i: f"{i % 60} * * * *")
    stages["created"] = _traced(tracemalloc, jobs, top)
    put(T0 + MIN // 2, lambda i: f"{i % 60} * * * * *")
    stages["edited"] = _traced(tracemalloc, jobs, top)
    plan(1, T0 + MIN)
    stages["planned"] = _traced(tracemalloc, jobs, top)
    for k in range(1, rounds + 1):
        run_round(apply, names, k)  # slot k of every job claimed, started and finished
        plan(1, T0 + (k + 1) * MIN)
    stages["ran"] = _traced(tracemalloc, jobs, top)
    for stage in stages.values():
        stage["bytes_per_job"] = round(stage["bytes_per_job"] - base, 1)
    data = s.snapshot_bytes()
    s = State()  # the applied state and its interned names gone, as in a process restarting
    names.clear()
    tracemalloc.stop()
    tracemalloc.start()  # anew: only what the restore makes is traced
    fresh = State()
    fresh.restore(data)
    del data
    stages["restored"] = _traced(tracemalloc, jobs, top)
    return {"jobs": jobs, "rounds": rounds, "stages": stages}


def measure(tree: Path, jobs: int, rounds: int, top: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(jobs), str(rounds), str(top)],
                         env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
        return
    sys.path.insert(0, str(ROOT))
    from bench.rig import ab_arg, machine, write_results

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=30_000)
    p.add_argument("--rounds", type=int, default=3, help="slots of every job run (default 3)")
    p.add_argument("--top", type=int, default=12, help="allocation sites listed per stage (default 12)")
    p.add_argument("--tree", type=Path, help="also measure this checkout's scheduler package")
    ab_arg(p)
    a = p.parse_args()
    trees = {"this": ROOT, **({"tree": a.tree.resolve()} if a.tree else {})}
    doc: dict[str, Any] = {"machine": machine(), "jobs": a.jobs, "rounds": a.rounds, "results": {}}
    for label, tree in trees.items():
        got = measure(tree, a.jobs, a.rounds, a.top)
        doc["results"][label] = {"tree": str(tree), **got}
    for stage in ("created", "edited", "planned", "ran", "restored"):
        row = "  ".join(f"{label} {doc['results'][label]['stages'][stage]['bytes_per_job']:8.1f}" for label in trees)
        print(f"{stage:9s} bytes a job: {row}")
    write_results("jobmem", doc, a.ab)


if __name__ == "__main__":
    main()
