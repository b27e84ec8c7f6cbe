"""One cluster at scale: 100,000 jobs loaded, against the same cluster empty, in one run.

On a fresh 3-node cluster (fsync on unless ``--no-fsync``), per repetition:

1. empty: each agent's RSS, and the write rate of ``--writes`` single PUTs of new jobs at
   ``--inflight`` in flight (the reference);
2. ``--jobs`` jobs loaded through ``POST /v1/jobs:batch`` (hourly crons at minute ``i % 60``,
   labels ``team=t0..t9``), a prober in its own process reading ``/v1/health`` on every node
   every 50 ms from here to the end of step 4;
3. loaded: the same write rate measured again (its ratio to the reference is the figure),
   the first page of ``GET /v1/jobs?limit=100`` and of a label-filtered page
   (``label=team=t3``), 20 times each, ``raftcron get jobs -l team=t3 -o json`` (a process:
   10 % of the jobs, every page), each agent's RSS and the bytes per job it adds, and the most
   entries its event loop ever had queued from the raft thread (``raftcron_loop_handoff_peak``,
   ``handoff_peak_loaded``);
4. with ``--history K``: the same jobs edited (one ``POST /v1/jobs:batch`` per 1,000) to fire
   once a minute, each at second ``i % 60`` (``{i % 60} * * * * *``, so ~1/60 of them at each
   second), to a sink of this benchmark's own, keeping ``history: {keep: K}``; then waited on
   until every node's ledger holds ``jobs x K`` run records (``raftcron_ledger_runs``): each
   agent's RSS then, the bytes per record it adds over its RSS loaded, and the handoff peak
   again (``handoff_peak``). The jobs go on firing through step 5, so the restart is of a
   cluster at work with its history;
5. kill -9 of all three, start all three: seconds to the first committed write, and to the
   leader knowing every job's next slot (``raftcron_leader_unplanned_jobs`` reaching 0), the
   RSS after the restart, and the snapshot and journal bytes each node restarted from; with
   ``--history``, 60 s later (the jobs still firing once a minute) each agent's RSS again and the
   run history it keeps out of memory by then (``history.settled``).

Step 4 also reports the run history each node keeps out of memory (``spilled_jobs``,
``spilled_mb``: none with ``--agent-arg --runs-in-memory``).

RSS is reported whole and split into anonymous and file-backed pages (the mapped raft journal).
``--profile-restart S`` samples each agent with py-spy for S seconds from its restart (the JSON
gives, per node, the spans it spent restoring the snapshot and applying entries up to the first
write: ``restart.phases_to_first_write``);
``--profile-fill S`` for S seconds once 80 % of the history is held, and names what held the
GIL over the prober's slowest answers then (both need py-spy: ``pip install -e '.[bench]'``).

    python -m bench.scale                 # 100,000 jobs, 2 repetitions (~10 minutes)
    python -m bench.scale --quick         # 10,000 jobs, 1 repetition
    python -m bench.scale --history 10 --repeat 1   # and 1,000,000 run records (~12 more minutes)
    python -m bench.scale --history 10 --repeat 1 --profile-restart 20

The JSON goes to bench/results/scale.json (``--ab NAME``: also bench/ab/NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import ROOT, Cluster, wait_for

from .bulk import Prober, _send, job_doc, jobs_held, load_batches, metric_total, rss_mb, rss_parts_mb
from .failover import _first_write
from .lateness import SinkFarm
from .rig import (
    RESULTS,
    ab_arg,
    common_args,
    fresh_cluster,
    leader_of,
    load,
    machine,
    median_of,
    ms,
    pct,
    table,
    write_results,
)


def _doc(name: str) -> dict[str, Any]:
    return {"name": name, "schedule": "@daily", "executor": "http", "http": {"url": "http://127.0.0.1:9/never"},
            "timeout": "5s"}


async def write_rate(base: str, prefix: str, writes: int, inflight: int) -> dict[str, Any]:
    """``writes`` PUTs of new jobs, ``inflight`` at a time: jobs/s and latencies."""
    counter = itertools.count()
    lat: list[float] = []
    errors: list[str] = []

    async def worker(s: aiohttp.ClientSession) -> None:
        while (i := next(counter)) < writes:
            name = f"{prefix}-{i:06d}"
            t0 = time.perf_counter()
            status, payload = await _send(s, "PUT", f"{base}/v1/jobs/{name}", _doc(name))
            lat.append(time.perf_counter() - t0)
            if status not in (200, 201):
                errors.append(f"{status}: {str(payload)[:200]}")

    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
        elapsed = time.monotonic() - t0
    return {"rate": (writes - len(errors)) / elapsed, "seconds": round(elapsed, 2), "p50": pct(lat, 50),
            "p99": pct(lat, 99), "errors": errors[:5]}


async def page_times(url: str, count: int) -> dict[str, Any]:
    times: list[float] = []
    items = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        for _ in range(count):
            t0 = time.perf_counter()
            async with s.get(url) as resp:
                body = await resp.json()
                assert resp.status == 200, body
            times.append(time.perf_counter() - t0)
            items = len(body["items"])
    return {"p50": pct(times, 50), "max": max(times), "items": items}


def cli_list(server: str, selector: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "api.cli", "--server", server, "get", "jobs", "-l", selector,
                          "-o", "json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "api.cli", "--help"], cwd=ROOT, capture_output=True, timeout=60)
    startup = time.perf_counter() - t0
    return {"seconds": seconds, "python_startup_s": startup, "returncode": out.returncode,
            "jobs": out.stdout.count('"name":') if out.returncode == 0 else None, "stderr": out.stderr[-300:]}


def history_doc(i: int, url: str, keep: int) -> dict[str, Any]:
    """Job ``i`` of the load, firing once a minute at second ``i % 60`` and keeping ``keep`` runs."""
    return {**job_doc(i), "schedule": f"{i % 60} * * * * *", "http": {"url": url}, "history": {"keep": keep}}


async def edit_batches(base: str, jobs: int, url: str, keep: int) -> dict[str, Any]:
    """Every job of the load edited by ``history_doc``, 1,000 a batch, one batch at a time."""
    configured, errors = 0, []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        t0 = time.monotonic()
        for start in range(0, jobs, 1000):
            docs = [history_doc(i, url, keep) for i in range(start, min(start + 1000, jobs))]
            status, payload = await _send(s, "POST", base + "/v1/jobs:batch", {"mode": "apply", "jobs": docs})
            if status == 200:
                configured += int(payload["changes"]["configured"])
            else:
                errors.append(f"{status}: {str(payload)[:200]}")
    return {"configured": configured, "seconds": round(time.monotonic() - t0, 2), "errors": errors[:10]}


def fill_history(cluster: Cluster, a: argparse.Namespace, base: str, sink: str,
                 rss_loaded: dict[str, float | None]) -> dict[str, Any]:
    """Step 4: the jobs fire at ``sink`` until every node holds ``jobs x history`` records; RSS then."""
    want = a.jobs * a.history
    out: dict[str, Any] = {"records_wanted": want}
    t0 = time.monotonic()
    out["edit"] = asyncio.run(edit_batches(base, a.jobs, sink, a.history))
    bound = a.history * 60 * 3 + 300  # once a minute each: K minutes, three times over, and 5 more
    spies: list[tuple[str, float, subprocess.Popen[bytes]]] = []

    def filled() -> bool:
        held = [metric_total(n.url, "raftcron_ledger_runs") or 0 for n in cluster.nodes]
        if a.profile_fill and not spies and min(held) >= 0.8 * want:
            spies.extend(_spy(n.name, n.proc.pid, a.profile_fill, "fill") for n in cluster.nodes if n.proc is not None)
        return bool(min(held) >= want)

    with Prober([n.url for n in cluster.nodes], 0.05, 10.0) as prober:
        try:
            wait_for(f"every node holding {want} run records", filled, timeout=bound, interval=5.0)
        except AssertionError as exc:
            out["timed_out"] = str(exc)
    for _, _, spy in spies:
        spy.wait(a.profile_fill + 60)
    out["fill_s"] = round(time.monotonic() - t0, 1)
    held = {n.name: metric_total(n.url, "raftcron_ledger_runs") for n in cluster.nodes}
    out["records_held"] = held
    health = prober.result()
    out["health_max_s"] = {n.name: health[n.url]["max"] for n in cluster.nodes}
    out["health_p99_s"] = {n.name: health[n.url]["p99"] for n in cluster.nodes}
    out["health_slowest"] = {n.name: health[n.url]["slowest"] for n in cluster.nodes}
    if spies:
        out["stalls"] = {name: _stalls(name, started, health[n.url]["slowest"])
                         for (name, started, _), n in zip(spies, cluster.nodes, strict=False)}
    rss = {n.name: rss_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
    out["rss_mb"] = rss
    out["rss_parts_mb"] = {n.name: rss_parts_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
    per = [(rss[k] - before) * 1024 * 1024 / held[k] for k, before in rss_loaded.items()
           if rss.get(k) is not None and before is not None and held.get(k)]
    out["bytes_per_record"] = median_of(per)
    out["handoff_peak"] = {n.name: metric_total(n.url, "raftcron_loop_handoff_peak") for n in cluster.nodes}
    # The run history kept out of memory then (none with --runs-in-memory, or before that option).
    out["spilled_jobs"] = {n.name: metric_total(n.url, "raftcron_runs_spilled_jobs") for n in cluster.nodes}
    out["spilled_mb"] = {n.name: (metric_total(n.url, "raftcron_runs_spilled_bytes") or 0) / 1024 / 1024
                         for n in cluster.nodes}
    return out


SETTLE_S = 60.0


def settled(cluster: Cluster) -> dict[str, Any]:
    """``SETTLE_S`` after the restart's every next slot known (the jobs still firing once a
    minute): RSS per node, and the run history each keeps out of memory by then. A measure over
    a fixed span, the same with ``--runs-in-memory``, not a wait for a condition."""
    time.sleep(SETTLE_S)
    return {"after_s": SETTLE_S,
            "rss_mb": {n.name: rss_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None},
            "rss_parts_mb": {n.name: rss_parts_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None},
            "spilled_jobs": {n.name: metric_total(n.url, "raftcron_runs_spilled_jobs") for n in cluster.nodes},
            "spilled_mb": {n.name: (metric_total(n.url, "raftcron_runs_spilled_bytes") or 0) / 1024 / 1024
                           for n in cluster.nodes}}


def _spy(name: str, pid: int, seconds: float, what: str, lines: bool = True) -> tuple[str, float, subprocess.Popen[bytes]]:
    """py-spy on one agent for ``seconds``, with the GIL's holder only and each sample's instant
    (chrometrace), from now (the monotonic instant returned with it). ``lines``: frames told apart
    by line too (a function's frame then closes and opens again as its line moves)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"profile-{what}-{name}.json"
    proc = subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "-f",
                             "chrometrace", "--gil", "--nonblocking", *(() if lines else ("--nolineno",)),
                             "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return name, time.monotonic(), proc


def _stalls(name: str, started: float, slowest: list[tuple[float, float]], depth: int = 6) -> list[dict[str, Any]]:
    """For each of the prober's slowest answers from ``name`` while py-spy sampled it: each thread's
    innermost ``depth`` frames as last sampled, and for how long of that answer they stood.

    Not the time each held the GIL: py-spy's chrometrace writes a thread's frames only when a
    sample of it finds them changed, and with ``--gil`` a thread is sampled only while it holds
    the GIL, so a thread that went idle after its last sample stands here until its next one."""
    path = RESULTS / f"profile-fill-{name}.json"
    try:
        events = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    events.sort(key=lambda e: e["ts"])
    found = []
    for seconds, at in slowest:
        lo, hi = (at - started) * 1e6, (at - started + seconds) * 1e6
        if hi < 0 or not events or lo > events[-1]["ts"]:
            continue
        stacks: dict[Any, list[str]] = {}
        spent: dict[str, float] = {}
        last = None
        for e in events:
            if last is not None and min(e["ts"], hi) > max(last, lo):  # the stacks open since the last event
                dt = (min(e["ts"], hi) - max(last, lo)) / 1e6
                for tid, frames in stacks.items():
                    if frames:
                        key = f"{tid}: " + " < ".join(reversed(frames[-depth:]))
                        spent[key] = spent.get(key, 0.0) + dt
            if e["ts"] > hi:
                break
            last = e["ts"]
            frames = stacks.setdefault(e["tid"], [])
            label = f"{e['name']} ({e['args'].get('filename', '?').rsplit('/', 1)[-1]}:{e['args'].get('line')})"
            if e["ph"] == "B":
                frames.append(label)
            elif frames:
                frames.pop()
        top = sorted(spent.items(), key=lambda kv: -kv[1])[:5]
        found.append({"answer_s": seconds, "at": at, "held": [[k, round(v, 3)] for k, v in top]})
    return found


_RESTART_PHASES = (("restore", "State.restore"), ("apply", "SyncObj.__applyLogEntries"))
"""The frames whose spans a restart is read by. Before the first write, ``apply`` is the journal
behind the snapshot replayed (pysyncobj applies every committed entry in one call)."""


def _restart_phases(name: str, until_s: float, least_s: float = 0.05) -> dict[str, list[list[float]]]:
    """From the restart's py-spy samples of ``name``: per phase, the spans in which a thread was
    inside its frame, up to ``until_s`` (the first write; a span is cut there), lasting
    ``least_s`` or more; a frame closed and opened again within two samples is one span (py-spy
    sometimes reads a stack whole anew). In seconds from py-spy's start, begun right after the
    agent's (``restart_all``), to the sample's 10 ms: the first write's instant counts from
    before the first agent started, so the cut is late by the few tens of milliseconds the
    starts take.

    py-spy's chrometrace opens and closes frames only when a thread's sampled stack changes,
    and with ``--gil`` a thread is sampled only while it holds the GIL: a span's ends are
    exact to a sample, while the time between two events is not time the GIL was held."""
    try:
        events = json.loads((RESULTS / f"profile-restart-{name}.json").read_text())
    except (OSError, ValueError):
        return {}
    events.sort(key=lambda e: e["ts"])  # stable: a sample's E and B events stay in their order
    stacks: dict[Any, list[tuple[str, float]]] = {}
    out: dict[str, list[list[float]]] = {}
    for e in events:
        frames = stacks.setdefault(e["tid"], [])
        if e["ph"] == "B":
            frames.append((e["name"], e["ts"] / 1e6))
            continue
        if not frames:
            continue
        frame, began = frames.pop()
        for phase, mark in _RESTART_PHASES:
            if frame == mark and began <= until_s:
                spans = out.setdefault(phase, [])
                if spans and began - spans[-1][1] <= 0.02:  # closed and opened again within two samples
                    spans[-1][1] = e["ts"] / 1e6
                else:
                    spans.append([began, e["ts"] / 1e6])
    clipped = {phase: [(a, min(b, until_s)) for a, b in spans] for phase, spans in out.items()}
    return {phase: [[round(a, 2), round(b, 2)] for a, b in spans if b - a >= least_s]
            for phase, spans in clipped.items() if any(b - a >= least_s for a, b in spans)}


def unplanned(node_url: str) -> int | None:
    try:
        with urllib.request.urlopen(node_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("raftcron_leader_unplanned_jobs "):
            return int(float(line.split()[1]))
    return None


def restart_all(cluster: Cluster, k: int, profile_s: float = 0.0) -> dict[str, Any]:
    """kill -9 of every agent, then all started at once; with ``profile_s``, py-spy samples each
    from its start for that long (CPU with the GIL held, raw stacks in bench/results)."""
    for n in cluster.nodes:
        assert n.proc is not None
        n.proc.kill()
    for n in cluster.nodes:
        assert n.proc is not None
        n.proc.wait(10)
    on_disk = {n.name: _on_disk(n.data_dir) for n in cluster.nodes}
    start = time.monotonic()
    spies = []
    for n in cluster.nodes:
        n.start()
        if profile_s and n.proc is not None:
            spies.append(_spy(n.name, n.proc.pid, profile_s, "restart", lines=False)[2])
    first = asyncio.run(_first_write(cluster.nodes, start, f"restart{k}", bound=120.0))
    leader = leader_of(cluster, timeout=60)
    planned_s = None
    try:
        wait_for("the leader to know every job's next slot", lambda: unplanned(leader.url) == 0, timeout=120,
                 interval=0.1)
        planned_s = time.monotonic() - start
    except AssertionError:
        pass
    for spy in spies:
        spy.wait(profile_s + 60)
    out = {"first_write_s": first.get("seconds"), "all_planned_s": planned_s, "leader": leader.name,
           "answers": first.get("answers"), "on_disk": on_disk}
    if spies and first.get("seconds") is not None:
        out["phases_to_first_write"] = {n.name: _restart_phases(n.name, first["seconds"]) for n in cluster.nodes}
    return out


def _on_disk(data_dir: Path) -> dict[str, int | None]:
    """What a node restarts from: its snapshot's bytes, and the bytes of journal records behind it
    (the journal file's header names where its last record ends; the file itself is grown ahead)."""
    out: dict[str, int | None] = {}
    try:
        out["snapshot_bytes"] = (data_dir / "raft.dump").stat().st_size
    except OSError:
        out["snapshot_bytes"] = None
    try:
        with open(data_dir / "raft.journal", "rb") as f:
            head = f.read(40)
        out["journal_bytes"] = int.from_bytes(head[36:40], "little") if len(head) == 40 else None
    except OSError:
        out["journal_bytes"] = None
    return out


def measure(cluster: Cluster, a: argparse.Namespace, r: int) -> dict[str, Any]:
    leader = leader_of(cluster)
    out: dict[str, Any] = {"repeat": r, "load_before": load()}
    out["rss_empty_mb"] = {n.name: rss_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
    out["writes_empty"] = asyncio.run(write_rate(leader.url, f"ref-empty-{r}", a.writes, a.inflight))
    phases: dict[str, float] = {}  # monotonic instants, to place the prober's slowest answers
    out["phases"] = phases
    with Prober([n.url for n in cluster.nodes], 0.05, 10.0) as prober:
        phases["bulk"] = round(time.monotonic(), 3)
        out["bulk"] = asyncio.run(load_batches(leader.url, a.jobs, 1000, 2))
        expected = a.jobs + a.writes
        phases["settle"] = round(time.monotonic(), 3)
        try:
            wait_for(f"every node holding {expected} jobs",
                     lambda: all(jobs_held(n.url) == expected for n in cluster.nodes), timeout=180, interval=1.0)
        except AssertionError:
            pass
        out["jobs_held"] = {n.name: jobs_held(n.url) for n in cluster.nodes}
        phases["writes_loaded"] = round(time.monotonic(), 3)
        out["writes_loaded"] = asyncio.run(write_rate(leader.url, f"ref-loaded-{r}", a.writes, a.inflight))
        phases["pages"] = round(time.monotonic(), 3)
        out["first_page"] = asyncio.run(page_times(leader.url + "/v1/jobs?limit=100", 20))
        out["label_page"] = asyncio.run(page_times(leader.url + "/v1/jobs?limit=100&label=team=t3", 20))
        phases["cli"] = round(time.monotonic(), 3)
        out["cli_label"] = cli_list(leader.url, "team=t3")
        phases["end"] = round(time.monotonic(), 3)
    health = prober.result()
    out["health"] = {n.name: health[n.url] for n in cluster.nodes}
    out["prober_lag"] = prober.lag
    out["worst_health"] = max((h["max"] for h in health.values() if h["max"] is not None), default=None)
    out["rss_loaded_mb"] = {n.name: rss_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
    out["handoff_peak_loaded"] = {n.name: metric_total(n.url, "raftcron_loop_handoff_peak") for n in cluster.nodes}
    added = [out["rss_loaded_mb"][k] - out["rss_empty_mb"][k] for k in out["rss_loaded_mb"]
             if out["rss_loaded_mb"][k] is not None and out["rss_empty_mb"].get(k) is not None]
    out["bytes_per_job"] = median_of([x * 1024 * 1024 / (a.jobs + 2 * a.writes) for x in added])
    out["write_ratio"] = out["writes_loaded"]["rate"] / out["writes_empty"]["rate"]
    # With --history the jobs go on firing at the sink through the restart: it stays up until then.
    farm = SinkFarm(2) if a.history else None
    try:
        if farm is not None:
            out["history"] = fill_history(cluster, a, leader.url, farm.url(), out["rss_loaded_mb"])
            out["history"]["sink_received"] = farm.received()
        out["restart"] = restart_all(cluster, r, a.profile_restart)
        out["rss_restarted_mb"] = {n.name: rss_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
        out["rss_restarted_parts_mb"] = {n.name: rss_parts_mb(n.proc.pid) for n in cluster.nodes if n.proc is not None}
        if a.history:
            out["history"]["records_after_restart"] = {n.name: metric_total(n.url, "raftcron_ledger_runs")
                                                       for n in cluster.nodes}
            out["history"]["settled"] = settled(cluster)
    finally:
        if farm is not None:
            farm.stop()
    out["load_after"] = load()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=2)
    p.add_argument("--jobs", type=int, default=100_000, help="jobs loaded (default 100,000)")
    p.add_argument("--writes", type=int, default=3000, help="single PUTs per write-rate measure (default 3,000)")
    p.add_argument("--inflight", type=int, default=64, help="PUTs in flight (default 64)")
    p.add_argument("--no-fsync", action="store_true", help="agents with --no-fsync")
    p.add_argument("--agent-arg", action="append", default=[], metavar="FLAGS",
                   help="more agent flags, e.g. --agent-arg --runs-in-memory (repeatable)")
    p.add_argument("--history", type=int, default=0, metavar="K",
                   help="then fill K run records a job (once a minute each) before the restart (default 0: none)")
    p.add_argument("--profile-restart", type=float, default=0.0, metavar="S",
                   help="py-spy each agent for S seconds from its restart (bench/results/profile-restart-<node>.json)")
    p.add_argument("--profile-fill", type=float, default=0.0, metavar="S",
                   help="with --history: py-spy each agent for S seconds once 80%% of the records are held, and "
                        "name what held the GIL over the prober's slowest answers then (bench/results/profile-fill-<node>.json)")
    ab_arg(p)
    a = p.parse_args()
    if (a.profile_restart or a.profile_fill) and shutil.which("py-spy") is None:
        raise SystemExit("py-spy not found: pip install -e '.[bench]'")
    if a.quick:
        a.repeat, a.jobs, a.writes = 1, 10_000, 1000
    doc: dict[str, Any] = {"benchmark": "scale", "machine": machine(), "params": vars(a), "runs": []}
    t_start = time.monotonic()
    for r in range(a.repeat):
        flags = [*(["--no-fsync"] if a.no_fsync else []), *(x for arg in a.agent_arg for x in arg.split())]
        with fresh_cluster("scale", flags, keep=a.keep) as cluster:
            res = measure(cluster, a, r)
        doc["runs"].append(res)
        rs = res["restart"]
        print(f"[{time.monotonic() - t_start:5.0f}s] repeat {r}: load {res['bulk']['rate']:.0f} jobs/s, worst health "
              f"{ms(res['worst_health'])} ms (the prober's own worst lag {ms(res['prober_lag']['max'])} ms), writes {res['writes_empty']['rate']:.0f} -> "
              f"{res['writes_loaded']['rate']:.0f}/s ({res['write_ratio']:.2f}), first page "
              f"{ms(res['first_page']['p50'])}/{ms(res['first_page']['max'])} ms, label page "
              f"{ms(res['label_page']['p50'])}/{ms(res['label_page']['max'])} ms, CLI {res['cli_label']['seconds']:.2f} s, "
              f"RSS {res['rss_loaded_mb']} MB, {res['bytes_per_job']:.0f} B/job, restart: first write "
              f"{rs['first_write_s']} s, all planned {rs['all_planned_s']} s, RSS {res['rss_restarted_mb']}",
              flush=True)
        if "history" in res:
            h = res["history"]
            print(f"        history: {h['records_held']} records in {h['fill_s']} s, RSS {h['rss_mb']} MB, "
                  f"{h['bytes_per_record'] or 0:.0f} B/record, health max {h['health_max_s']} s while filling, "
                  f"records after the restart {h['records_after_restart']}", flush=True)
    runs = doc["runs"]

    def med(f: Any) -> float | None:
        return median_of([f(x) for x in runs])

    doc["summary"] = {
        "bulk_jobs_per_s": med(lambda x: x["bulk"]["rate"]),
        "worst_health_s": med(lambda x: x["worst_health"]),
        "prober_lag_max_s": med(lambda x: x["prober_lag"]["max"]),
        "rss_loaded_mb_min": med(lambda x: min(v for v in x["rss_loaded_mb"].values() if v is not None)),
        "writes_empty_per_s": med(lambda x: x["writes_empty"]["rate"]),
        "writes_loaded_per_s": med(lambda x: x["writes_loaded"]["rate"]),
        "write_ratio": med(lambda x: x["write_ratio"]),
        "first_page_p50_s": med(lambda x: x["first_page"]["p50"]),
        "first_page_max_s": med(lambda x: x["first_page"]["max"]),
        "label_page_p50_s": med(lambda x: x["label_page"]["p50"]),
        "label_page_max_s": med(lambda x: x["label_page"]["max"]),
        "cli_label_s": med(lambda x: x["cli_label"]["seconds"]),
        "rss_loaded_mb_max": med(lambda x: max(v for v in x["rss_loaded_mb"].values() if v is not None)),
        "rss_restarted_mb_max": med(lambda x: max(v for v in x["rss_restarted_mb"].values() if v is not None)),
        "bytes_per_job": med(lambda x: x["bytes_per_job"]),
        "restart_first_write_s": med(lambda x: x["restart"]["first_write_s"]),
        "restart_all_planned_s": med(lambda x: x["restart"]["all_planned_s"]),
    }
    if a.history:
        doc["summary"].update(
            history_rss_mb_max=med(lambda x: max(v for v in x["history"]["rss_mb"].values() if v is not None)),
            history_bytes_per_record=med(lambda x: x["history"]["bytes_per_record"]),
            history_fill_s=med(lambda x: x["history"]["fill_s"]),
        )
    s = doc["summary"]
    print(table(["figure", "median"], [[k, f"{v:.4g}" if isinstance(v, float) else v] for k, v in s.items()]))
    write_results("scale", doc, ab=a.ab)


if __name__ == "__main__":
    main()
