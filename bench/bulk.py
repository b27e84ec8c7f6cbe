"""Loading many jobs: POST /v1/jobs:batch against single PUTs, with every node's health watched.

For each repetition and each way (``batch``: ``--batch-size`` documents per request,
``--batch-inflight`` requests in flight; ``single``: one PUT per job, ``--inflight`` in flight),
on a fresh 3-node cluster (fsync on unless ``--no-fsync``):

- ``--jobs`` jobs (hourly crons at minute ``i % 60``, as in issue 15) are created, and the
  load's wall time gives jobs/s (created jobs over the time from the first request sent to
  the last answer read);
- a prober in its own process reads ``GET /v1/health`` on every node every ``--probe-every``
  seconds during the load and records each answer's time (a failed or timed-out probe counts
  as its timeout): the worst, p99 and p50 per node;
- afterwards, each agent's RSS (``VmRSS`` from /proc) and the jobs each node holds
  (``raftcron_jobs`` from /metrics, once every node has caught up).

    python -m bench.bulk                   # 100,000 jobs, 3 repetitions of each way
    python -m bench.bulk --quick           # 10,000 jobs, 1 repetition

The JSON goes to bench/results/bulk.json; ``--ab NAME`` also copies it to bench/ab/NAME.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import time
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster, wait_for

from .rig import (
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

WAYS = ("batch", "single")


def job_doc(i: int) -> dict[str, Any]:
    return {"name": f"bulk-{i:07d}", "schedule": f"{i % 60} * * * *", "executor": "http",
            "labels": {"team": f"t{i % 10}"}, "http": {"url": "http://127.0.0.1:9/never"}, "timeout": "5s"}


# ---- the prober (its own process, so the loader's CPU does not delay its clock) --------------------


def _probe(urls: list[str], every: float, timeout: float, stop: EventType, out: Any) -> None:
    asyncio.run(_probe_loop(urls, every, timeout, stop, out))


async def _probe_loop(urls: list[str], every: float, timeout: float, stop: EventType, out: Any) -> None:
    times: dict[str, list[float]] = {u: [] for u in urls}
    slowest: dict[str, list[tuple[float, float]]] = {u: [] for u in urls}  # (seconds, monotonic start)
    failures: dict[str, int] = {u: 0 for u in urls}
    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def one(s: aiohttp.ClientSession, url: str) -> None:
        while not stop.is_set():
            t0, t0_mono = time.perf_counter(), time.monotonic()
            try:
                async with s.get(url + "/v1/health") as resp:
                    await resp.read()
                    good = resp.status == 200
            except (TimeoutError, aiohttp.ClientError):
                good = False
            dt = time.perf_counter() - t0
            times[url].append(dt if good else max(dt, timeout))
            slowest[url] = sorted([*slowest[url], (times[url][-1], round(t0_mono, 3))], reverse=True)[:5]
            failures[url] += 0 if good else 1
            await asyncio.sleep(max(0.0, every - dt))

    lags: list[tuple[float, float]] = []  # (seconds late, monotonic start): the prober's own stalls

    async def lag() -> None:
        """How late the prober's own 10 ms sleeps wake: a stall of the prober (or of the whole
        machine) shows here at the same instant as a slow answer, and is not the agent's."""
        while not stop.is_set():
            t0, t0_mono = time.perf_counter(), time.monotonic()
            await asyncio.sleep(0.01)
            late = time.perf_counter() - t0 - 0.01
            if late > 0.05:
                lags.append((late, round(t0_mono, 3)))

    async with aiohttp.ClientSession(timeout=client_timeout) as s:
        await asyncio.gather(lag(), *(one(s, u) for u in urls))
    nodes = {u: {"count": len(v), "failed": failures[u], "max": max(v, default=None), "p99": pct(v, 99),
                 "p50": pct(v, 50), "slowest": slowest[u]} for u, v in times.items()}
    out.put({"nodes": nodes, "prober_lag": {"max": max((x for x, _ in lags), default=0.0),
                                            "slowest": sorted(lags, reverse=True)[:5]}})


class Prober:
    def __init__(self, urls: list[str], every: float, timeout: float) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._out = ctx.Queue()
        self._proc = ctx.Process(target=_probe, args=(urls, every, timeout, self._stop, self._out), daemon=True)

    def __enter__(self) -> Prober:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def result(self) -> dict[str, Any]:
        """Per node URL: count, failed, max, p99, p50 and the five slowest answers; the prober's
        own lag (its late wake-ups over 50 ms) is left in ``self.lag``."""
        got: dict[str, Any] = self._out.get(timeout=30)
        self._proc.join(10)
        self.lag: dict[str, Any] = got["prober_lag"]
        nodes: dict[str, Any] = got["nodes"]
        return nodes


# ---- the loads -------------------------------------------------------------------------------


async def _send(s: aiohttp.ClientSession, method: str, url: str, body: Any, attempts: int = 20) -> tuple[int, Any]:
    """One request, repeated on 503 (an election) and on a broken connection, a bounded number of times."""
    for _ in range(attempts):
        try:
            async with s.request(method, url, json=body) as resp:
                payload = await resp.json(content_type=None)
                if resp.status != 503:
                    return resp.status, payload
        except (TimeoutError, aiohttp.ClientError) as exc:
            payload = {"error": repr(exc)}
        await asyncio.sleep(0.5)
    return 0, payload


async def load_batches(base: str, jobs: int, size: int, inflight: int) -> dict[str, Any]:
    starts = iter(range(0, jobs, size))
    created, errors, lat = 0, [], []

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal created
        for start in starts:
            docs = [job_doc(i) for i in range(start, min(start + size, jobs))]
            t0 = time.perf_counter()
            status, payload = await _send(s, "POST", base + "/v1/jobs:batch", {"mode": "apply", "jobs": docs})
            lat.append(time.perf_counter() - t0)
            if status == 200:
                created += int(payload["changes"]["created"])
            else:
                errors.append(f"{status}: {str(payload)[:200]}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
        elapsed = time.monotonic() - t0
    return {"created": created, "seconds": round(elapsed, 2), "rate": created / elapsed, "errors": errors[:10],
            "request_p50": pct(lat, 50), "request_max": max(lat, default=None)}


async def load_single(base: str, jobs: int, inflight: int) -> dict[str, Any]:
    counter = itertools.count()
    created, errors = 0, []

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal created
        while (i := next(counter)) < jobs:
            doc = job_doc(i)
            status, payload = await _send(s, "PUT", f"{base}/v1/jobs/{doc['name']}", doc)
            if status in (200, 201):
                created += payload.get("change") == "created"
            else:
                errors.append(f"{status}: {str(payload)[:200]}")

    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
        elapsed = time.monotonic() - t0
    return {"created": created, "seconds": round(elapsed, 2), "rate": created / elapsed, "errors": errors[:10]}


# ---- after the load ---------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_parts_mb(pid: int) -> dict[str, float] | None:
    """RSS split as the kernel counts it: anonymous memory (the heap), file-backed pages (the
    mapped raft journal among them) and shared memory, in MB."""
    parts: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                parts[key[3:].lower()] = int(rest.split()[0]) / 1024
    except OSError:
        return None
    return parts


def metric_total(url: str, family: str) -> int | None:
    """The sum of a family's series on a node's /metrics (``raftcron_jobs``: every job, by status;
    a family without labels: its one value)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((family + "{", family + " "))))


def jobs_held(url: str) -> int | None:
    return metric_total(url, "raftcron_jobs")


def measure(cluster: Cluster, way: str, a: argparse.Namespace) -> dict[str, Any]:
    leader = leader_of(cluster)
    out: dict[str, Any] = {"way": way, "load_before": load(), "leader": leader.name}
    with Prober([n.url for n in cluster.nodes], a.probe_every, a.probe_timeout) as prober:
        if way == "batch":
            out["load"] = asyncio.run(load_batches(leader.url, a.jobs, a.batch_size, a.batch_inflight))
        else:
            out["load"] = asyncio.run(load_single(leader.url, a.jobs, a.inflight))
    health = prober.result()
    out["health"] = {n.name: health[n.url] for n in cluster.nodes}
    out["worst_health"] = max((h["max"] for h in health.values() if h["max"] is not None), default=None)
    out["prober_lag"] = prober.lag
    out["load_after"] = load()
    expected = out["load"]["created"]
    try:
        wait_for(f"every node holding {expected} jobs",
                 lambda: all(jobs_held(n.url) == expected for n in cluster.nodes), timeout=120, interval=1.0)
    except AssertionError:
        pass  # recorded below as it is
    out["jobs_held"] = {n.name: jobs_held(n.url) for n in cluster.nodes}
    out["rss_mb"] = {n.name: rss_mb(n.proc.pid) if n.proc is not None else None for n in cluster.nodes}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=3)
    p.add_argument("--jobs", type=int, default=100_000, help="jobs loaded per run (default 100,000)")
    p.add_argument("--batch-size", type=int, default=1000, help="documents per batch (default 1,000)")
    p.add_argument("--batch-inflight", type=int, default=2, help="batches in flight (default 2)")
    p.add_argument("--inflight", type=int, default=64, help="single PUTs in flight (default 64)")
    p.add_argument("--probe-every", type=float, default=0.05, help="seconds between health probes per node")
    p.add_argument("--probe-timeout", type=float, default=10.0, help="a probe slower than this counts as this")
    p.add_argument("--ways", default=",".join(WAYS), help="comma list of batch, single")
    p.add_argument("--no-fsync", action="store_true", help="agents with --no-fsync")
    ab_arg(p)
    a = p.parse_args()
    if a.quick:
        a.repeat, a.jobs = 1, 10_000
    ways = [w for w in a.ways.split(",") if w]
    doc: dict[str, Any] = {"benchmark": "bulk", "machine": machine(), "params": vars(a), "runs": []}
    t_start = time.monotonic()
    for r in range(a.repeat):
        for way in ways:
            extra = ["--no-fsync"] if a.no_fsync else []
            with fresh_cluster(f"bulk-{way}", extra, keep=a.keep) as cluster:
                res = measure(cluster, way, a)
            doc["runs"].append({"repeat": r, **res})
            print(f"[{time.monotonic() - t_start:5.0f}s] repeat {r}: {way}: {res['load']['rate']:.0f} jobs/s, "
                  f"worst health {ms(res['worst_health'])} ms, RSS {res['rss_mb']}, held {res['jobs_held']}, "
                  f"load {res['load_before']['1m']}", flush=True)
    doc["summary"] = _summarise(doc["runs"], ways)
    print(table(["way", "jobs/s (median)", "runs", "worst health ms (median)", "runs", "RSS MB per agent (max)"],
                [[s["way"], f"{s['rate']:.0f}", s["rates"], ms(s["worst_health"]), s["worst_healths"],
                  s["rss_mb_max"]] for s in doc["summary"]]))
    write_results("bulk", doc, ab=a.ab)


def _summarise(runs: list[dict[str, Any]], ways: list[str]) -> list[dict[str, Any]]:
    rows = []
    for way in ways:
        rs = [r for r in runs if r["way"] == way]
        rates = [r["load"]["rate"] for r in rs]
        worst = [r["worst_health"] for r in rs]
        rss = [v for r in rs for v in r["rss_mb"].values() if v is not None]
        rows.append({"way": way, "rate": median_of(rates), "rates": [round(x) for x in rates],
                     "worst_health": median_of(worst), "worst_healths": [ms(w, 0) for w in worst],
                     "rss_mb_max": round(max(rss), 1) if rss else None,
                     "rss_mb_median": round(median_of(rss) or 0, 1)})
    return rows


if __name__ == "__main__":
    main()
