"""A million run records: what the run ledger costs one agent, in-process.

A state machine (``scheduler.state.State``) is filled through its own commands, as a replica
applies them: ``--jobs`` jobs (``history: {keep: K}``), then rounds of one slot per job
claimed, started and finished (``succeeded``, ``http_status`` 200, as an HTTP job reports),
until every job holds ``--keep`` records: ``jobs x keep`` run records (default 100,000 x 10).
Each form is measured in a process of its own, so its RSS is its own:

- RSS with the jobs alone, then with the records, and the bytes per record (their difference
  over the count);
- seconds to apply one round (one record per job: claim, start, finish) while the records fill
  (``round_s``, the median), and one round once every job holds ``--keep`` (``round_full_s``:
  each claim also drops its job's oldest record, as in an agent whose history is full);
- the snapshot: bytes, seconds to pack it, and milliseconds to capture it (``snapshot_capture_ms``,
  median of 3: what the raft thread does before a thread of its own packs, holding the GIL);
- a restore into a fresh process: seconds, and the RSS after it; then one more round applied to
  the restored state (``round_after_restore_s``: what replaying a journal after a restart costs,
  against ``round_full_s`` on the state that applied everything);
- reading one job's 10 newest runs (what ``GET /v1/jobs/{name}/runs`` reads), microseconds;
- then every job's history moved out of memory into a scratch file (``scheduler.spill``, as an
  agent's sweep moves a job's once it has not changed for a few seconds) and the heap trimmed:
  RSS then (``rss_cold_mb``) and the bytes per record (``bytes_per_record_cold``), the file's
  megabytes, and one more round with each job's value read back at its claim (``round_cold_s``).

Each process sets the collector as an agent does (``raftlog.heap``: its thresholds, and a freeze
after a slow full collection), and restores as an agent's raft node does (``quiet_restore``),
from the measured tree (``agent_heap`` in the JSON: false for a tree older than them, measured
with the interpreter's defaults; runs before 2026-12-07 used those defaults for every tree).

The JSON records the allocator settings the processes inherit (``PYTHONMALLOC``, ``MALLOC_*``,
``GLIBC_TUNABLES``), as ``bench.scale`` does for its agents. ``--snapshots`` also takes snapshots
while the records fill, as an agent does: once the entries applied since the last weigh
``RaftNode``'s ``compaction_entries`` and ``compaction_share`` of the records (its defaults), the
state is captured on the applying thread, then packed and written to a file (fsync off) on a
thread of its own by the measured tree's ``raftlog.snapshot.SnapshotWriter``, while the applies
go on (``snapshots_taken``); once each is written the C heap is trimmed, as the compaction that
follows it in an agent does. What the packing leaves in the heap shows in the bytes per record.

``--tree PATH`` also runs the same measure with PATH's ``scheduler`` package (an earlier
commit checked out with ``git worktree add``), interleaved with this tree's, as the reference.

    python -m bench.history                         # 100,000 jobs x 10 records, 2 repetitions
    python -m bench.history --jobs 10000 --repeat 1 # quick
    python -m bench.history --tree /tmp/old         # and an earlier commit, in the same run
    python -m bench.history --keep 4 --snapshots    # with an agent's snapshots while filling

The JSON goes to bench/results/history.json (``--ab NAME``: also bench/ab/NAME.json).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000_000_000  # 2027-01-15, on a minute
MIN = 60_000_000


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _Snapshots:
    """Snapshots taken as ``RaftNode`` takes them (``_count_weight``) and written by the measured
    tree's own ``raftlog.snapshot.SnapshotWriter``: captured on the applying thread, packed and
    written to a file (fsync off) on a thread of its own. Once one is written, the C heap is
    trimmed (the tree's ``raftlog.heap.release_free_memory``), as the journal compaction that
    follows each written snapshot in an agent with fsync on does (``raftlog.journal``).

    As in pysyncobj, a snapshot asked for while the last one is still being written is taken at
    the first entry applied after that one is done; the applies never wait for the writing."""

    def __init__(self, state: Any, path: Path) -> None:
        import dataclasses

        from raftlog.node import NodeConfig
        from raftlog.snapshot import SnapshotWriter

        defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
        self.state = state
        self.path = path
        self.writer = SnapshotWriter(state, fsync=False)
        self.entries = int(defaults["compaction_entries"])
        self.share = float(defaults["compaction_share"])
        self.weight = 0
        self.taken = 0
        self.packed_bytes = 0
        self._asked = False
        self._writing = False

    def applied(self, index: int) -> None:
        self.weight += max(1, int(self.state.entry_weight))
        if self.weight >= self.entries and self.weight >= self.state.records() * self.share:
            self.weight = 0
            self._asked = True
        if not self._asked or not self._done():
            return
        self._asked = False
        self.taken += 1
        # (command, index, term) of the last two entries, as pysyncobj hands them over.
        self.writer.start(str(self.path) + ".tmp", ((b"", index, 1), (b"", index - 1, 1), []))
        self._writing = True
        self._done()  # a capture that failed fails the run now

    def _done(self) -> bool:
        """Whether no snapshot is being written; raises if the last one failed."""
        from pysyncobj.config import SERIALIZER_STATE

        from raftlog.heap import release_free_memory

        if not self._writing:
            return True
        state = self.writer.check()
        if state == SERIALIZER_STATE.SERIALIZING:
            return False
        self._writing = False
        if state != SERIALIZER_STATE.SUCCESS:
            self.path.unlink(missing_ok=True)
            raise RuntimeError(f"writing a snapshot failed (serializer state {state}; the writer logged why)")
        self.packed_bytes += self.path.stat().st_size
        release_free_memory()  # as the journal's compaction does right after a snapshot is written
        return True

    def join(self) -> None:
        try:
            while not self._done():
                self.writer.join(1.0)
        finally:
            self.path.unlink(missing_ok=True)


def _as_an_agent() -> tuple[Callable[[], Any], bool]:
    """The measured tree's collector settings, set as an agent sets them at its start
    (``tune_collector``, ``FreezeAfterSlowCollections``), and the context its raft node restores a
    snapshot in (``quiet_restore``: the collector paused, what was built frozen, the C heap
    trimmed); for a tree older than those, the interpreter's defaults and a bare restore."""
    try:
        from raftlog.heap import FreezeAfterSlowCollections, quiet_restore, tune_collector
    except ImportError:
        return contextlib.nullcontext, False
    tune_collector()
    FreezeAfterSlowCollections().install()
    return quiet_restore, True


def child(jobs: int, keep: int, restore_from: str | None, snapshots: bool = False) -> dict[str, Any]:
    """One measure in this process (the ``scheduler`` package on ``sys.path`` is the form measured)."""
    from raftlog.fsm import ApplyContext
    from scheduler.commands import PutJobs, RegisterNode, encode_command
    from scheduler.state import State

    restoring, agent_heap = _as_an_agent()
    s = State()
    index = 0
    snaps = _Snapshots(s, Path(os.environ.get("TMPDIR", "/tmp")) / f"history-snapshots-{os.getpid()}.bin") if snapshots else None

    def apply(cmd: Any) -> Any:
        nonlocal index
        index += 1
        out = s.apply(encode_command(cmd), ApplyContext(index=index))
        if snaps is not None:
            snaps.applied(index)
        return out

    if restore_from is not None:
        data = Path(restore_from).read_bytes()
        gc.collect()
        before = rss_mb()
        t0 = time.perf_counter()
        with restoring():
            s.restore(data)
        took = time.perf_counter() - t0
        del data
        gc.collect()
        rss_restored = rss_mb()
        # What a replica replays of its journal after the restore: the next round, on a cold state.
        index = s.applied_index
        replay = _round(apply, sorted(s.jobs), keep + 2)
        return {"restore_s": took, "rss_restored_mb": rss_restored, "rss_before_restore_mb": before,
                "records": len(s.runs), "round_after_restore_s": replay, "agent_heap": agent_heap}

    apply(RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"))
    names = [f"job-{i:07d}" for i in range(jobs)]
    for start in range(0, jobs, 1000):
        specs = tuple({"name": n, "schedule": "* * * * *", "executor": "http", "timeout": "5s",
                       "http": {"url": "http://127.0.0.1:9/hook"}, "history": {"keep": keep},
                       "labels": {"team": f"t{i % 10}"}} for i, n in enumerate(names[start:start + 1000], start))
        apply(PutJobs(at_us=T0, specs=specs))
    gc.collect()
    rss_jobs = rss_mb()
    round_s = [_round(apply, names, k) for k in range(1, keep + 1)]
    records = len(s.runs)
    taken = packed = 0
    if snaps is not None:
        snaps.join()
        taken, packed, snaps = snaps.taken, snaps.packed_bytes, None  # the rest is measured as before
    gc.collect()
    rss_runs = rss_mb()
    round_full = _round(apply, names, keep + 1)  # the history full: every claim trims
    reads: list[float] = []
    for n in names[:: max(1, jobs // 200)]:
        t0 = time.perf_counter()
        ids = s.job_runs.get(n) or []
        got = [s.runs.get(rid) for rid in reversed(ids[-10:])]
        reads.append(time.perf_counter() - t0)
        assert len(got) == min(10, keep) and all(r is not None for r in got)
    captures = []
    for _ in range(3):  # the capture alone (what the raft thread does, holding the GIL), then packed
        t0 = time.perf_counter()
        chunks = s.snapshot()
        captures.append(time.perf_counter() - t0)
        del chunks
    t0 = time.perf_counter()
    data = s.snapshot_bytes()
    pack_s = time.perf_counter() - t0
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"history-snapshot-{os.getpid()}.bin"
    path.write_bytes(data)
    snapshot_bytes = len(data)
    del data
    cold = _cold(s, apply, names, keep + 2, records, rss_jobs)
    return {
        "records": records, "rss_jobs_mb": rss_jobs, "rss_runs_mb": rss_runs,
        "bytes_per_record": (rss_runs - rss_jobs) * 1024 * 1024 / max(records, 1),
        "round_s": statistics.median(round_s), "round_full_s": round_full, "snapshot_bytes": snapshot_bytes, "snapshot_pack_s": pack_s,
        "snapshot_capture_ms": statistics.median(captures) * 1000,
        "read_10_us": statistics.median(reads) * 1e6, "snapshot_path": str(path),
        "snapshots_taken": taken, "snapshots_packed_bytes": packed, "agent_heap": agent_heap, **cold,
    }


def _cold(s: Any, apply: Callable[[Any], Any], names: list[str], k: int, records: int, rss_jobs: float) -> dict[str, Any]:
    """Every job's history moved out of memory, as an agent's sweep moves a job's once it has
    not changed for a few seconds (``scheduler.spill``), the heap trimmed as after a compaction:
    RSS then and the bytes per record; then one more round, each job's value read back from the
    file at its claim (``round_cold_s``). None for a tree without it."""
    import tempfile

    try:
        from raftlog.heap import release_free_memory
        from scheduler.spill import Spiller
    except ImportError:
        return {"rss_cold_mb": None, "bytes_per_record_cold": None, "round_cold_s": None}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as scratch:
        s.runs.spill_to(Spiller(Path(scratch)))
        s.runs.sweep(len(names) + 1, everything=True)  # a spiller just set: one round over every job
        spilled_mb = s.runs.spilled()[1] / 1024 / 1024
        gc.collect()
        release_free_memory()
        rss_cold = rss_mb()
        round_cold = _round(apply, names, k)
        return {"rss_cold_mb": rss_cold, "bytes_per_record_cold": (rss_cold - rss_jobs) * 1024 * 1024 / max(records, 1),
                "round_cold_s": round_cold, "spilled_mb": spilled_mb}


def _round(apply: Callable[[Any], Any], names: list[str], k: int) -> float:
    """Slot ``k`` (minutes from T0) of every job claimed, started and finished, 1,000 jobs an
    entry, as the leader and a worker write them; its seconds."""
    from scheduler.commands import Claim, ClaimSlots, FinishRuns, StartRuns

    slot = T0 + k * MIN
    t0 = time.perf_counter()
    for start in range(0, len(names), 1000):
        part = names[start:start + 1000]
        out = apply(ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=tuple(
            Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in part)))
        ids = tuple(r["id"] for r in out.result["runs"])
        apply(StartRuns(at_us=slot + 1000, node="n1", runs=ids, started_us={r: slot + 1000 for r in ids},
                        lease_until_us=slot + 30_000_000))
        apply(FinishRuns(at_us=slot + 50_000, node="n1", results=tuple(
            {"run_id": r, "status": "succeeded", "started_us": slot + 1000, "finished_us": slot + 50_000,
             "exit_code": None, "http_status": 200, "output": "", "error": None} for r in ids)))
    return time.perf_counter() - t0


def measure(tree: Path, jobs: int, keep: int, snapshots: bool = False) -> dict[str, Any]:
    # This file run as a script: its own directory first on sys.path, then ``tree``'s packages.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    out = json.loads(subprocess.run([*me, "build", str(jobs), str(keep), *(["snapshots"] if snapshots else [])], env=env, check=True,
                                    capture_output=True, text=True, cwd=tree).stdout.splitlines()[-1])
    path = out.pop("snapshot_path")
    try:
        restored = json.loads(subprocess.run([*me, "restore", path, str(keep)], env=env, check=True, capture_output=True,
                                             text=True, cwd=tree).stdout.splitlines()[-1])
    finally:
        os.unlink(path)
    return {**out, **{k: v for k, v in restored.items() if k != "records"}}


def _child_main(argv: list[str]) -> None:
    if argv[0] == "build":
        print(json.dumps(child(int(argv[1]), int(argv[2]), None, argv[3:4] == ["snapshots"])))
    else:
        print(json.dumps(child(0, int(argv[2]), argv[1])))


def main() -> None:
    from .rig import ab_arg, allocator_env  # here, not at the top: the children run this file as a script

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000, help="jobs (default 100,000)")
    p.add_argument("--keep", type=int, default=10, help="records per job (default 10)")
    p.add_argument("--repeat", type=int, default=2, help="repetitions of each form (default 2)")
    p.add_argument("--tree", type=Path, help="also measure this checkout's scheduler package (the reference)")
    p.add_argument("--snapshots", action="store_true",
                   help="take snapshots while the records fill, written on a thread by the tree's own "
                        "SnapshotWriter, as an agent does")
    ab_arg(p)
    a = p.parse_args()
    forms = {"this": ROOT} | ({"reference": a.tree.resolve()} if a.tree else {})
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in forms}
    for r in range(a.repeat):
        for name, tree in forms.items():
            res = measure(tree, a.jobs, a.keep, a.snapshots)
            runs[name].append(res)
            print(f"[{r + 1}/{a.repeat}] {name}: " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in res.items()), flush=True)
    summary = {name: {k: all(x[k] for x in rs) if isinstance(rs[0][k], bool) else statistics.median(x[k] for x in rs)
                      for k in rs[0]} for name, rs in runs.items()}

    def commit_of(tree: Path) -> str:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()

    head = commit_of(ROOT)
    result = {"bench": "history", "jobs": a.jobs, "keep": a.keep, "repeat": a.repeat, "snapshots": a.snapshots,
              "commit": head, "allocator_env": allocator_env(),
              "reference_tree": str(a.tree) if a.tree else None, "reference_commit": commit_of(a.tree) if a.tree else None, "runs": runs, "median": summary,
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print("\nmedians:")
    keys = list(summary["this"])
    print(f"{'':24}" + "".join(f"{n:>14}" for n in summary))
    for k in keys:
        print(f"{k:24}" + "".join(f"{summary[n][k]:>14.4g}" for n in summary))
    out = ROOT / "bench" / "results" / "history.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if a.ab:
        (ROOT / "bench" / "ab" / f"{a.ab}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child_main(sys.argv[2:])
    else:
        main()
