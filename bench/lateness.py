"""Start lateness of `@every 1s` HTTP jobs: sink receive time minus the slot.

Lateness = the time a sink process received the request minus the instant in
its ``X-Raftcron-Slot`` header (same machine, same clock). K jobs with
``@every 1s`` make K runs per second; every run POSTs to a sink (bench/sink.py:
separate processes sharing one port with SO_REUSEPORT, recording cheaply).

Modes (each on fresh 3-node clusters, each writes its section of
bench/results/lateness.json):

- ``rates``  (default): 100, 1,000 and 2,000 runs/s, ``--seconds`` each, ``--repeat`` times;
  ``--aligned``: the jobs are ``* * * * * *`` instead, all due at each second's start (as crons
  align at :00), written to a section of its own (``rates-aligned``);
- ``search``: the highest rate sustained for 60 s with p99 < 1 s and >= 99 % of
  the slots delivered (tries 2000, 3000, 4000, stops at the first failure);
- ``kill``: 100 runs/s, kill -9 the leader mid-window; lateness of the slots
  within +-3 s of the kill, and every slot of the window checked in the sink
  and in the ledger (GET /v1/jobs/{name}/runs) for missed or doubled runs.
  ``--busy S``: the sink answers after S seconds, so attempts stay running, and
  the node killed is the follower running the most of them (the leader runs none
  while its followers have room); retried, doubled (and whether each came after a
  lost attempt) and late slots are reported. ``--restart-after N`` starts the
  killed node again N seconds after the kill (its orphans then reported by it).

Job anchors: an `@every` job's slots are anchored at its creation time, so the
K jobs are created paced over about one second; when the API cannot take K
writes in a second the creation takes longer, and the phases are still spread
(the JSON reports the busiest 10 ms phase bucket against the mean).

No APScheduler reference is run here; ``python -m bench.compare`` runs it beside raftcron in
one run. The APScheduler figures in the table this prints are an earlier day's, for scale only.

    python -m bench.lateness                 # rates, ~5 minutes
    python -m bench.lateness search          # ~5 minutes
    python -m bench.lateness kill            # ~1.5 minutes
    python -m bench.lateness kill --busy 2 --restart-after 1
    python -m bench.lateness --quick         # rates, ~1 minute
    python -m bench.lateness --aligned --rates 1000,2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster, Node

from .rig import (
    RESULTS,
    CpuMeter,
    common_args,
    cpu_seconds,
    free_port,
    fresh_cluster,
    leader_of,
    load,
    machine,
    median_of,
    ms,
    spawn,
    stop_process,
    summary,
    table,
    term_of,
    write_results,
)

APSCHEDULER_P99 = {100: 0.051, 1000: 0.302, 2000: 0.599}
GOALS = {100: 0.010, 1000: 0.050}


# ---- the sink ---------------------------------------------------------------------------------------


class SinkFarm:
    """``n`` sink processes on one port (SO_REUSEPORT); records come back at stop()."""

    def __init__(self, n: int = 2) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="raftcron-bench-sink-"))
        self.procs = [spawn("bench.sink", "--port", str(self.port), "--reuse-port", "--out", str(self.dir / f"{i}.json"))
                      for i in range(n)]

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) or 0.0 for p in self.procs)

    def received(self) -> int:
        """Requests the sink processes have answered so far (as of their last count, <= 250 ms old)."""
        total = 0
        for i in range(len(self.procs)):
            try:
                total += int((self.dir / f"{i}.json.count").read_text() or 0)
            except (OSError, ValueError):
                pass
        return total

    def stop(self) -> list[list[Any]]:
        records: list[list[Any]] = []
        for i, p in enumerate(self.procs):
            stop_process(p)
            f = self.dir / f"{i}.json"
            if f.exists():
                records += json.loads(f.read_text())
                f.unlink()
            for leftover in (f"{i}.json.count", f"{i}.json.count.tmp"):
                (self.dir / leftover).unlink(missing_ok=True)
        self.dir.rmdir()
        return records


def _capacity_client(url: str, seconds: float, inflight: int) -> int:
    async def run() -> int:
        done = 0
        deadline = time.monotonic() + seconds
        headers = {"X-Raftcron-Job": "capacity", "X-Raftcron-Slot": "2000-01-01T00:00:00Z", "X-Raftcron-Attempt": "1"}

        async def worker(s: aiohttp.ClientSession) -> None:
            nonlocal done
            while time.monotonic() < deadline:
                async with s.post(url, headers=headers) as r:
                    await r.read()
                done += 1

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight)) as s:
            await asyncio.gather(*(worker(s) for _ in range(inflight)))
        return done

    return asyncio.run(run())


def sink_capacity(procs: int, seconds: float = 3.0, clients: int = 2, inflight: int = 32) -> dict[str, Any]:
    """Requests/s the sink answered to ``clients`` client processes, and its CPU per request."""
    farm = SinkFarm(procs)
    try:
        cpu0, t0 = farm.cpu(), time.monotonic()
        with ProcessPoolExecutor(clients) as pool:
            counts = list(pool.map(_capacity_client, [farm.url()] * clients, [seconds] * clients, [inflight] * clients))
        wall, cpu = time.monotonic() - t0, farm.cpu() - cpu0
    finally:
        farm.stop()
    total = sum(counts)
    return {"sink_processes": procs, "client_processes": clients, "requests": total, "rate": round(total / wall),
            "sink_cpu_ms_per_request": round(1000 * cpu / total, 3) if total else None,
            "sink_capacity_if_cores_free": round(procs * total / cpu) if cpu else None, "load": load()}


# ---- jobs ---------------------------------------------------------------------------------------------


def every_job(name: str, url: str, schedule: str = "@every 1s") -> dict[str, Any]:
    return {"name": name, "schedule": schedule, "executor": "http", "http": {"url": url, "method": "POST"},
            "timeout": "10s", "labels": {"bench": "lateness"}}


ALIGNED = "* * * * * *"
"""``--aligned``: every second at .000, all jobs at once (a cron's :00), not spread over the second."""


class CreationTooSlow(Exception):
    pass


async def create_jobs(base: str, k: int, url: str, spread: float = 1.0, inflight: int = 64,
                      deadline: float = 120.0, schedule: str = "@every 1s") -> dict[str, Any]:
    """PUT k jobs, paced evenly over ``spread`` seconds (or as fast as the API takes them)."""
    t0 = time.monotonic()
    todo = iter(range(k))
    failures = 0

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal failures
        for i in todo:
            if time.monotonic() - t0 > deadline:
                raise CreationTooSlow(f"{i} of {k} jobs created after {deadline:g} s")
            delay = t0 + spread * i / k - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            for _attempt in range(50):
                try:
                    async with s.put(f"{base}/v1/jobs/l{i}", json=every_job(f"l{i}", url, schedule)) as r:
                        await r.read()
                        if r.status in (200, 201):
                            break
                except (TimeoutError, aiohttp.ClientError):
                    pass
                failures += 1
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"could not create job l{i}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight),
                                     timeout=aiohttp.ClientTimeout(total=30)) as s:
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
    return {"jobs": k, "seconds": round(time.monotonic() - t0, 2), "retries": failures}


# ---- analysis -------------------------------------------------------------------------------------------


def _epoch(slot: str) -> float:
    return datetime.fromisoformat(slot.replace("Z", "+00:00")).timestamp()


CDF_POINTS = 200
"""``cdf=True``: the lateness quantiles kept, at every half percent (a plot's CDF, not the raw values)."""


def analyse(records: list[list[Any]], k: int, t0: float, t1: float, cdf: bool = False) -> dict[str, Any]:
    """Deliveries of the slots in [t0, t1): first-delivery lateness, missing and doubled slots
    (with ``cdf``, the lateness at each of CDF_POINTS + 1 evenly spaced quantiles, in seconds)."""
    first: dict[tuple[str, float], float] = {}
    first_attempt: dict[tuple[str, float], str | None] = {}
    count: Counter[tuple[str, float]] = Counter()
    phases: Counter[int] = Counter()
    for at, job, slot, _attempt in records:
        if job is None or slot is None or not job.startswith("l"):
            continue
        s = _epoch(slot)
        if not t0 <= s < t1:
            continue
        key = (job, s)
        count[key] += 1
        if key not in first or at < first[key]:
            first[key] = at
            first_attempt[key] = _attempt
        phases[int((s % 1.0) * 100)] += 1
    late = [first[key] - key[1] for key in first]
    doubled = sorted(f"{job}@{slot:.6f}" for (job, slot), c in count.items() if c > 1)
    late_a1 = [first[key] - key[1] for key in first if first_attempt[key] == "1"]
    expected = k * round(t1 - t0)
    delivered = len(first)
    bucket_mean = delivered / 100 if delivered else 0
    out = {
        "expected_slots": expected, "delivered_slots": delivered, "missing_slots": max(0, expected - delivered),
        "doubled_slots": len(doubled), "doubled": doubled, "delivery_ratio": delivered / expected if expected else None,
        "lateness": summary(late), "early": sum(1 for x in late if x < 0),
        "late_over_1s": sum(1 for x in late if x > 1.0),
        "first_delivered_by_a_retry": len(late) - len(late_a1), "lateness_first_attempts": summary(late_a1),
        "phase_spread": {"busiest_10ms_bucket": max(phases.values(), default=0), "mean_10ms_bucket": round(bucket_mean, 1)},
    }
    if cdf:
        qs = [min(late), *statistics.quantiles(late, n=CDF_POINTS, method="inclusive"), max(late)] if len(late) > 1 else late
        out["lateness_quantiles"] = [round(q, 6) for q in qs]
    return out


# ---- one measured run ---------------------------------------------------------------------------------------


def run_rate(k: int, seconds: float, a: argparse.Namespace, kill_at: float | None = None) -> dict[str, Any]:
    """Fresh sink and cluster, k jobs, measure the slots in a ``seconds`` window (kill the leader at kill_at)."""
    out: dict[str, Any] = {"rate": k, "seconds": seconds, "load_before": load()}
    farm = SinkFarm(a.sink_procs)
    records: list[list[Any]] = []
    try:
        with fresh_cluster(f"late{k}", extra=[x for arg in a.agent_arg for x in arg.split()], keep=a.keep) as cluster:
            leader = leader_of(cluster)
            try:
                url = farm.url(f"/slow?s={a.busy:g}") if kill_at is not None and a.busy else farm.url()
                out["create"] = asyncio.run(create_jobs(leader.url, k, url, spread=a.spread,
                                                        deadline=a.create_deadline,
                                                        schedule=ALIGNED if a.aligned else "@every 1s"))
            except CreationTooSlow as exc:
                out["aborted"] = str(exc)
                out["load_after"] = load()
                return out
            time.sleep(a.warmup)
            terms0 = {n.name: term_of(n) for n in cluster.nodes}
            t0 = float(int(time.time()) + 1)
            time.sleep(max(0.0, t0 - time.time()))
            t1 = t0 + seconds
            sink_cpu0 = farm.cpu()
            with CpuMeter(cluster) as cpu:
                if kill_at is not None:
                    out["kill"] = _kill(cluster, t0 + kill_at, a)
                if a.apply_during:
                    time.sleep(max(0.0, t0 + APPLY_AT - time.time()))
                    out["apply"] = apply_jobs(leader.url, a.apply_during)
                time.sleep(max(0.0, t1 - time.time()))
            out["cpu"] = cpu.result
            out["sink_cpu_s"] = round(farm.cpu() - sink_cpu0, 3)
            out["terms_before"] = terms0
            out["terms_after"] = {n.name: term_of(n) for n in cluster.nodes if n.alive()}
            time.sleep(a.drain)
            if kill_at is not None:
                out["ledger"] = ledger_check(cluster, k, t0, t1)
                if a.busy:
                    out["lost_runs"] = _lost_by_reason(cluster)
            out["load_after"] = load()
    finally:
        records = farm.stop()
    if "aborted" in out:
        return out
    out["window"] = [t0, t1]
    out["result"] = analyse(records, k, t0, t1, cdf=a.cdf)
    if kill_at is not None and "ledger" in out:
        lost = set(out["ledger"].pop("slots_with_a_lost_attempt"))
        out["result"]["doubled_after_a_lost_attempt"] = sum(d in lost for d in out["result"]["doubled"])
    if "apply" in out:  # the whole seconds the apply overlapped
        w0, w1 = math.floor(out["apply"]["start"]), math.ceil(out["apply"]["end"])
        out["during_apply"] = analyse(records, k, w0, min(w1, t1))
    if kill_at is not None:
        kt = out["kill"]["at"]
        near = [r for r in records if r[1] and r[2] and r[1].startswith("l") and abs(_epoch(r[2]) - kt) <= 3.0]
        out["near_kill"] = analyse(near, k, kt - 3.0, kt + 3.0)
        out["near_kill"]["expected_slots"] = None  # the +-3 s window is not whole seconds of every job
        out["near_kill"]["missing_slots"] = None
    return out


APPLY_AT = 3.0  # seconds into the window when ``--apply-during`` starts its apply


def apply_jobs(base: str, n: int) -> dict[str, Any]:
    """``raftcron apply -f DIR`` of ``n`` new job documents (one file each, daily at 03:00 so none
    fires in the window), as a person would run it: the CLI in its own process. Timed from the
    command's start to its exit."""
    with tempfile.TemporaryDirectory(prefix="apply-") as tmp:
        for i in range(n):
            doc = {"name": f"applied-{i:06d}", "schedule": "0 3 * * *", "executor": "http",
                   "labels": {"team": f"t{i % 20}"}, "http": {"url": "http://127.0.0.1:9/never"}}
            Path(tmp, f"job-{i:06d}.json").write_text(json.dumps(doc))
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "api.cli", "--server", base, "-o", "name", "apply", "-f", tmp],
                              capture_output=True, text=True, timeout=600, check=False)
        end = time.time()
    out = {"jobs": n, "start": start, "end": end, "seconds": round(end - start, 3), "exit": done.returncode}
    if done.returncode != 0:
        out["stderr"] = done.stderr[-2000:]
    print(f"  apply -f of {n:,} jobs while firing: {out['seconds']} s (exit {done.returncode})", flush=True)
    return out


def _kill(cluster: Cluster, at: float, a: argparse.Namespace) -> dict[str, Any]:
    """Kill -9 the leader at ``at``, or with ``--busy`` the follower running the most attempts."""
    leader = leader_of(cluster)
    time.sleep(max(0.0, at - time.time()))
    victim, held = leader, 0
    if a.busy:
        running = _running_by_node(leader)
        victim = max((n for n in cluster.nodes if n is not leader), key=lambda n: running.get(n.name, 0))
        held = running.get(victim.name, 0)
    t = time.time()
    victim.kill9()
    info: dict[str, Any] = {"node": victim.name, "role": "leader" if victim is leader else "follower", "at": t}
    if a.busy:
        info["running_attempts_held"] = held
    survivors = [n for n in cluster.nodes if n is not victim]
    new = cluster.leader(timeout=30, among=survivors)
    info["new_leader"], info["new_leader_seen_after_s"] = new.name, round(time.time() - t, 3)
    if a.restart_after is not None:
        time.sleep(max(0.0, t + a.restart_after - time.time()))
        victim.start()
        info["restarted_after_s"] = round(time.time() - t, 3)
    return info


def _running_by_node(node: Node) -> Counter[str]:
    """Running attempts per node, as ``node`` sees them (one read, all pages)."""
    held: Counter[str] = Counter()
    cursor = None
    for _ in range(100):
        body = node.get("/v1/runs?status=running&limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        held.update(r["node"] for r in body["items"])
        cursor = body["next_cursor"]
        if not cursor:
            break
    return held


def _lost_by_reason(cluster: Cluster) -> dict[str, int]:
    """Lost attempts by what ended them (its node's restart report or the leader's lease expiry)."""
    node = next(n for n in cluster.nodes if n.alive())
    reasons: Counter[str] = Counter()
    cursor = None
    for _ in range(100):
        body = node.get("/v1/runs?status=lost&limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        reasons.update(str(r["error"]) for r in body["items"])
        cursor = body["next_cursor"]
        if not cursor:
            break
    return dict(reasons)


def _us(slot: str) -> int:
    return int(round(_epoch(slot) * 1e6))


def ledger_check(cluster: Cluster, k: int, t0: float, t1: float) -> dict[str, Any]:
    """Every job's runs for the window's slots, as the ledger of a live node has them."""
    node = next(n for n in cluster.nodes if n.alive())
    statuses: Counter[str] = Counter()
    missing = doubled = retried = 0
    with_lost: list[str] = []
    examples: dict[str, list[str]] = defaultdict(list)
    lo, hi, per_job = int(t0 * 1e6), int(t1 * 1e6), round(t1 - t0)
    for i in range(k):
        by_slot: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in cluster.runs(f"l{i}", via=node):
            s = _us(r["slot"])
            if lo <= s < hi:
                by_slot[s].append(r)
        phases = {s % 1_000_000 for s in by_slot}
        if len(phases) != 1:  # no record at all in the window (or a job off its 1 s grid)
            missing += per_job - len(by_slot)
            examples["job_without_grid"].append(f"l{i}: {len(by_slot)} slots, phases {sorted(phases)[:3]}")
            continue
        phase = phases.pop()
        for n in range(per_job):
            s = lo + n * 1_000_000 + phase
            got = by_slot.get(s, [])
            if not got:
                missing += 1
                examples["missing"].append(f"l{i}@{s / 1e6:.6f}")
                continue
            for r in got:
                statuses[r["status"]] += 1
            if any(r["status"] == "lost" for r in got):
                with_lost.append(f"l{i}@{s / 1e6:.6f}")
            ok = [r for r in got if r["status"] == "succeeded"]
            if len(ok) > 1:
                doubled += 1
                examples["doubled"].append(f"l{i}@{s / 1e6:.6f}")
            if len(got) > 1:
                retried += 1
                examples["retried"].append(f"l{i}@{s / 1e6:.6f}: " + "/".join(f"{r['attempt']}:{r['status']}@{r['node']}" for r in got))
            if not ok:
                examples["not_succeeded"].append(f"l{i}@{s / 1e6:.6f}: " + "/".join(r["status"] for r in got))
    return {"slots_without_record": missing, "slots_succeeded_twice": doubled, "slots_with_retries": retried,
            "slots_with_a_lost_attempt": with_lost,
            "run_statuses": dict(statuses), "examples": {k_: v[:5] for k_, v in examples.items()}}


# ---- modes ----------------------------------------------------------------------------------------------------


def mode_rates(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    runs = []
    for r in range(a.repeat):
        for k in a.rates:
            res = run_rate(k, a.seconds, a)
            res["repeat"] = r
            runs.append(res)
            _progress(res)
    doc["runs"] = runs
    rows = []
    for k in a.rates:
        everything = [x for x in runs if x["rate"] == k]
        rs = [x for x in everything if "aborted" not in x]
        rows.append({
            "rate": k, "repeats": len(everything), "aborted": len(everything) - len(rs),
            "p50_ms": _m(median_of(x["result"]["lateness"]["p50"] for x in rs)),
            "p99_ms": _m(median_of(x["result"]["lateness"]["p99"] for x in rs)),
            "max_ms": _m(median_of(x["result"]["lateness"]["max"] for x in rs)),
            "p99_ms_each": [_m(x["result"]["lateness"]["p99"]) for x in rs],
            "delivered": median_of(x["result"]["delivery_ratio"] for x in rs),
            "doubled": sum(x["result"]["doubled_slots"] for x in rs),
            "apscheduler_p99_ms": _m(APSCHEDULER_P99.get(k)), "goal_p99_ms": _m(GOALS.get(k)),
            "cores_used": median_of(x["cpu"]["cores_used"] for x in rs),
            "load_1m": [x["load_before"]["1m"] for x in everything],
        })
        if a.apply_during:
            during = [x["during_apply"] for x in rs if "during_apply" in x]
            rows[-1].update({
                "apply_jobs": a.apply_during, "apply_s_each": [x["apply"]["seconds"] for x in rs],
                "apply_exit_each": [x["apply"]["exit"] for x in rs],
                "during_apply_p50_ms": _m(median_of(d["lateness"]["p50"] for d in during)),
                "during_apply_p99_ms": _m(median_of(d["lateness"]["p99"] for d in during)),
                "during_apply_delivered": median_of(d["delivery_ratio"] for d in during),
            })
    doc["summary"] = rows
    if a.apply_during:
        print()
        print(table(["runs/s", "apply -f jobs", "apply s each", "exit", "p50 ms while applying", "p99 ms while applying",
                     "delivered while applying"],
                    [[x["rate"], x["apply_jobs"], ",".join(str(v) for v in x["apply_s_each"]),
                      ",".join(str(v) for v in x["apply_exit_each"]), x["during_apply_p50_ms"], x["during_apply_p99_ms"],
                      _pctf(x["during_apply_delivered"])] for x in rows]))
    print()
    print(table(["runs/s", "p50 ms", "p99 ms (median)", "p99 each run", "max ms", "delivered", "doubled", "aborted",
                 "APScheduler p99", "goal p99", "cores busy", "load 1m"],
                [[x["rate"], x["p50_ms"], x["p99_ms"], ",".join(str(v) for v in x["p99_ms_each"]), x["max_ms"],
                  _pctf(x["delivered"]), x["doubled"], x["aborted"], x["apscheduler_p99_ms"], x["goal_p99_ms"], x["cores_used"],
                  ",".join(str(v) for v in x["load_1m"])] for x in rows]))


def _sustained(res: dict[str, Any]) -> bool:
    if "aborted" in res:
        return False
    lat = res["result"]
    return lat["lateness"]["p99"] is not None and lat["lateness"]["p99"] < 1.0 and (lat["delivery_ratio"] or 0) >= 0.99


def mode_search(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    """Up the list until a rate fails; if the first already fails, down --search-down until one holds."""
    runs, best = [], None
    for k in a.search_rates:
        res = run_rate(k, a.search_seconds, a)
        res["sustained"] = _sustained(res)
        runs.append(res)
        _progress(res)
        if not res["sustained"]:
            break
        best = k
    if best is None:
        for k in a.search_down:
            res = run_rate(k, a.search_seconds, a)
            res["sustained"] = _sustained(res)
            runs.append(res)
            _progress(res)
            if res["sustained"]:
                best = k
                break
    doc["runs"], doc["highest_sustained"] = runs, best
    print()
    print(table(["runs/s", "seconds", "p50 ms", "p99 ms", "max ms", "delivered", "sustained", "cores busy", "load 1m"],
                [[x["rate"], x["seconds"], *_lat_cells(x), x["sustained"], x.get("cpu", {}).get("cores_used"),
                  x["load_before"]["1m"]] for x in runs]))
    print(f"highest rate sustained for {a.search_seconds:g} s with p99 < 1 s: {best if best else 'none of the rates tried'}")


def _lat_cells(x: dict[str, Any]) -> list[Any]:
    if "aborted" in x:
        return ["aborted", "-", "-", x["aborted"]]
    lat = x["result"]["lateness"]
    return [_m(lat["p50"]), _m(lat["p99"]), _m(lat["max"]), _pctf(x["result"]["delivery_ratio"])]


def mode_kill(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    runs = []
    for r in range(a.kill_repeat):
        res = run_rate(a.kill_rate, a.kill_seconds, a, kill_at=a.kill_seconds / 2)
        res["repeat"] = r
        runs.append(res)
        _progress(res)
    doc["runs"] = runs
    print()
    print(table(["run", "killed", "running held", "restarted after s", "new leader after s", "+-3s p50 ms",
                 "+-3s p99 ms", "+-3s max ms", "+-3s p99 ms, attempt 1 only", "+-3s slots run by a retry",
                 "window p99 ms", "late >1s", "sink missing", "sink doubled", "doubled after a lost attempt",
                 "ledger missing", "ledger succeeded twice", "retried slots", "lost by reason", "load 1m"],
                [[x["repeat"], f"{x['kill']['node']} ({x['kill']['role']})", x["kill"].get("running_attempts_held", "-"),
                  x["kill"].get("restarted_after_s", "-"), x["kill"]["new_leader_seen_after_s"],
                  _m(x["near_kill"]["lateness"]["p50"]), _m(x["near_kill"]["lateness"]["p99"]),
                  _m(x["near_kill"]["lateness"]["max"]), _m(x["near_kill"]["lateness_first_attempts"]["p99"]),
                  x["near_kill"]["first_delivered_by_a_retry"], _m(x["result"]["lateness"]["p99"]),
                  x["result"]["late_over_1s"], x["result"]["missing_slots"], x["result"]["doubled_slots"],
                  x["result"].get("doubled_after_a_lost_attempt", "-"), x["ledger"]["slots_without_record"],
                  x["ledger"]["slots_succeeded_twice"], x["ledger"]["slots_with_retries"],
                  "; ".join(f"{k}: {v}" for k, v in x.get("lost_runs", {}).items()) or "-", x["load_before"]["1m"]]
                 for x in runs]))


def _progress(res: dict[str, Any]) -> None:
    if "aborted" in res:
        print(f"  rate {res['rate']}/s: aborted: {res['aborted']}, load {res['load_before']['1m']}", flush=True)
        return
    lat = res["result"]["lateness"]
    print(f"  rate {res['rate']}/s: p50 {ms(lat['p50'])} ms, p99 {ms(lat['p99'])} ms, max {ms(lat['max'])} ms, "
          f"delivered {_pctf(res['result']['delivery_ratio'])}, created in {res['create']['seconds']} s, "
          f"cores {res['cpu']['cores_used']}, load {res['load_before']['1m']}", flush=True)


def _m(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def _pctf(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="rates", choices=("rates", "search", "kill"))
    common_args(p, repeat=2)
    p.add_argument("--rates", default="100,1000,2000", help="runs/s for the rates mode")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window per rate (rates mode, default 30)")
    p.add_argument("--search-rates", default="2000,3000,4000")
    p.add_argument("--search-seconds", type=float, default=60.0)
    p.add_argument("--kill-rate", type=int, default=100)
    p.add_argument("--kill-seconds", type=float, default=30.0)
    p.add_argument("--kill-repeat", type=int, default=1)
    p.add_argument("--restart-after", type=float, default=None, help="kill mode: restart the killed node after N s")
    p.add_argument("--busy", type=float, default=0.0,
                   help="kill mode: the sink answers after S s and the follower running the most attempts is killed")
    p.add_argument("--sink-procs", type=int, default=2)
    p.add_argument("--create-deadline", type=float, default=120.0, help="give up a rate whose jobs take longer to create")
    p.add_argument("--search-down", default="1000,500,200",
                   help="search mode: rates tried, highest first, when the first --search-rates fails")
    p.add_argument("--agent-arg", action="append", default=[], metavar="FLAGS",
                   help="more agent flags, e.g. --agent-arg '--http-connections-per-host 256' (repeatable)")
    p.add_argument("--aligned", action="store_true",
                   help=f"jobs {ALIGNED!r}: every job due at the same instant each second (a section of its own)")
    p.add_argument("--spread", type=float, default=1.0, help="seconds over which the jobs are created")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds between the last job created and the window")
    p.add_argument("--drain", type=float, default=5.0, help="seconds after the window before the sink is read")
    p.add_argument("--apply-during", type=int, default=0, metavar="N",
                   help=f"rates mode: {APPLY_AT:g} s into each window, raftcron apply -f of N new jobs; its time and "
                        "the lateness of the slots due while it ran are reported (section rates-apply)")
    p.set_defaults(cdf=False)
    a = p.parse_args()
    a.rates = [int(x) for x in str(a.rates).split(",") if x]
    a.search_rates = [int(x) for x in str(a.search_rates).split(",") if x]
    a.search_down = [int(x) for x in str(a.search_down).split(",") if x]
    if a.quick:
        a.repeat, a.seconds, a.search_seconds, a.kill_seconds, a.warmup, a.drain = 1, 10.0, 20.0, 16.0, 3.0, 3.0
        a.rates = [x for x in a.rates if x <= 1000] if a.mode == "rates" else a.rates
    doc: dict[str, Any] = {"benchmark": f"lateness/{a.mode}", "machine": machine(), "params": vars(a)}
    doc["sink_capacity"] = sink_capacity(a.sink_procs)
    c = doc["sink_capacity"]
    print(f"sink: {c['rate']}/s answered to {c['client_processes']} client processes (client-bound), "
          f"{c['sink_cpu_ms_per_request']} ms CPU per request -> ~{c['sink_capacity_if_cores_free']}/s "
          f"with {c['sink_processes']} free cores; load {c['load']['1m']}", flush=True)
    {"rates": mode_rates, "search": mode_search, "kill": mode_kill}[a.mode](a, doc)
    path = RESULTS / "lateness.json"
    merged: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if "benchmark" in merged:
        merged = {}
    doc["machine"]["load_at_end"] = load()
    merged[a.mode + ("-aligned" if a.aligned else "") + ("-apply" if a.apply_during else "")] = doc
    write_results("lateness", merged)


if __name__ == "__main__":
    main()
