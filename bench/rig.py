"""The bench rig: fresh clusters of real agents, machine load, statistics, tables, JSON.

Every benchmark in this folder starts its own 3-node cluster through
tests/cluster/harness.py, stops only the processes it started (by the PIDs the
harness holds), and records the load average around each measurement: the
machine has 2 cores and is shared, so a number without its load is not a number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.cluster.harness import ROOT, Cluster, Node, free_ports, http, wait_for

__all__ = ["RESULTS", "AGENT_FLAGS", "common_args", "fresh_cluster", "machine", "load", "pct", "summary",
           "median_of", "table", "write_results", "leader_of", "term_of", "caught_up", "ms", "spawn",
           "stop_process", "free_port", "cpu_seconds", "agents_cpu", "CpuMeter"]

RESULTS = ROOT / "bench" / "results"
AB = ROOT / "bench" / "ab"  # committed JSON behind published figures (`--ab NAME`)
AGENT_FLAGS = ["--log-level", "warning"]
SECRET = "bench-secret-of-at-least-thirty-two-bytes"


def common_args(p: argparse.ArgumentParser, repeat: int = 3) -> None:
    p.add_argument("--repeat", type=int, default=repeat, help=f"fresh-cluster repetitions; medians are quoted (default {repeat})")
    p.add_argument("--quick", action="store_true", help="a ~1 minute version: fewer requests, shorter windows, repeat 1")
    p.add_argument("--keep", action="store_true", help="keep the clusters' data and logs under bench/results/runs/")


def ab_arg(p: argparse.ArgumentParser) -> None:
    """``--ab NAME``: the JSON also copied to bench/ab/NAME.json (``write_results``' ``ab``)."""
    p.add_argument("--ab", metavar="NAME", help="also copy the JSON to bench/ab/NAME.json")


# ---- the machine -----------------------------------------------------------------------------


def load() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"1m": round(one, 2), "5m": round(five, 2), "15m": round(fifteen, 2)}


def _busy_processes(limit: int = 6) -> list[str]:
    """The busiest processes right now (other work on the machine shows up here)."""
    try:
        out = subprocess.run(["ps", "-eo", "pcpu=,args=", "--sort=-pcpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [" ".join(line.split())[:120] for line in out.splitlines()[:limit]]


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "cpus": os.cpu_count(), "python": sys.version.split()[0], "commit": git("rev-parse", "--short", "HEAD"),
        "tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "load_at_start": load(), "busy_processes_at_start": _busy_processes(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "allocator_env": allocator_env(),
    }


def allocator_env() -> dict[str, str]:
    """The memory allocators' settings the processes measured inherit (they change RSS, bench/README)."""
    return {k: v for k, v in os.environ.items()
            if k in ("PYTHONMALLOC", "GLIBC_TUNABLES") or k.startswith("MALLOC_")}


# ---- clusters ------------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_cluster(label: str, extra: Sequence[str] = (), keep: bool = False, size: int = 3,
                  env: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A started, registered cluster; stopped (SIGTERM, then SIGKILL) on exit, by PID only.
    ``env``: more environment for every agent (the harness passes none of ours on)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"raftcron-bench-{label}-"))
    cluster = Cluster.create(tmp, size, secret=SECRET, extra=[*AGENT_FLAGS, *extra])
    for node in cluster.nodes:
        node.env.update(env or {})
    failed = False
    try:
        cluster.start()
        cluster.wait_registered(timeout=60)
        yield cluster
    except BaseException:
        failed = True
        raise
    finally:
        for n in cluster.nodes:
            if n.proc is not None and n.proc.poll() is None:
                try:
                    n.resume()
                    n.terminate(15)
                except AssertionError:
                    pass  # terminate() already SIGKILLed it
        if keep or failed:
            dest = RESULTS / "runs" / tmp.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            for log in tmp.glob("*.log"):
                dest.mkdir(exist_ok=True)
                shutil.copy(log, dest / log.name)
            if failed:
                print(f"[bench] agent logs kept in {dest}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)  # journals and snapshots: the logs were copied above


def leader_of(cluster: Cluster, timeout: float = 30.0) -> Node:
    return cluster.leader(timeout=timeout)


def term_of(node: Node, timeout: float = 2.0) -> int | None:
    """The node's Raft term, or None when it did not answer within ``timeout`` (an overloaded agent)."""
    try:
        status, body = http("GET", node.url + "/v1/cluster", timeout=timeout)
    except OSError:
        return None
    return int(body["term"]) if status == 200 else None


def caught_up(cluster: Cluster, node: Node, timeout: float = 60.0) -> float:
    """Wait until ``node`` applied everything the leader had committed when we asked; seconds taken."""
    t0 = time.monotonic()

    def check() -> bool:
        leader = cluster.leader(timeout=10)
        target = leader.get("/v1/cluster", timeout=2)["commit_index"]
        mine = node.get("/v1/cluster", timeout=2)
        return bool(mine.get("leader")) and mine["applied_index"] >= target

    wait_for(f"{node.name} to catch up with the leader", check, timeout, interval=0.05)
    return time.monotonic() - t0


# ---- statistics ---------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return None
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 50), "p90": pct(values, 90), "p99": pct(values, 99),
            "max": max(values) if values else None, "mean": statistics.fmean(values) if values else None}


def median_of(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.{digits}f}"


# ---- output ---------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *(line(r) for r in cells[1:])])


def write_results(name: str, doc: dict[str, Any], ab: str | None = None) -> Path:
    """``bench/results/<name>.json``; with ``ab``, a copy at ``bench/ab/<ab>.json`` too."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    if isinstance(doc.get("machine"), dict):
        doc["machine"]["load_at_end"] = load()
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    print(f"\n[bench] wrote {path.relative_to(ROOT)}")
    if ab:
        AB.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, AB / f"{ab}.json")
    return path


# ---- helper processes (floor server, sink) -----------------------------------------------------------


def spawn(module: str, *args: str, ready_timeout: float = 20.0) -> subprocess.Popen[str]:
    """Start ``python -m module args`` from the repo root; wait for its "ready" line."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + ready_timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == "ready":
            return proc
        if not line and proc.poll() is not None:
            break
    stop_process(proc)
    raise AssertionError(f"{module} did not say ready within {ready_timeout}s")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM one process we started, by its PID; SIGKILL if it ignores that."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def free_port() -> int:
    return free_ports(1)[0]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process (all its threads) has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agents_cpu(cluster: Cluster) -> dict[str, float | None]:
    """CPU seconds each agent of the cluster has used so far (None for one not running)."""
    return {n.name: cpu_seconds(n.proc.pid) if n.alive() and n.proc else None for n in cluster.nodes}


class CpuMeter:
    """CPU seconds used by each of the cluster's agents (and this process) over a phase."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._t0 = 0.0
        self._start: dict[str, float | None] = {}

    def _sample(self) -> dict[str, float | None]:
        out = agents_cpu(self.cluster)
        out["bench"] = cpu_seconds(os.getpid())
        return out

    def __enter__(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._start = self._sample()
        return self

    def __exit__(self, *exc: Any) -> None:
        end, wall = self._sample(), time.monotonic() - self._t0
        used: dict[str, float | None] = {}
        for k, v in self._start.items():
            e = end.get(k)
            used[k] = round(e - v, 3) if v is not None and e is not None else None
        busy = [v for v in used.values() if v is not None]
        self.result: dict[str, Any] = {"wall_s": round(wall, 3), "cpu_s": used,
                                       "cores_used": round(sum(busy) / wall, 2) if wall > 0 else None}
