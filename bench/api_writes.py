"""PUT /v1/jobs/{name}: commit latency and write throughput through the API.

For each configuration (default: journal fsync on; ``--no-fsync``) and each
repetition, on a fresh 3-node cluster:

- latency: one client, one request at a time, ``--seq`` PUTs (each a new job),
  to the leader and then through a follower (which forwards to the leader);
- throughput: ``--inflight`` concurrent PUTs, until ``--requests`` are done or
  ``--seconds`` have passed, to the leader and through a follower;
- the Raft term on every node before and after each phase (an election during
  load shows as a term change).

Reference in the same run: the same client against a minimal aiohttp server in
its own process (bench/floor.py) that answers 200: the HTTP stack's floor.

    python -m bench.api_writes            # 2 repetitions, ~5 minutes
    python -m bench.api_writes --quick    # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster

from .rig import (
    CpuMeter,
    common_args,
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

CONFIGS: dict[str, list[str]] = {"fsync": [], "no-fsync": ["--no-fsync"]}
GOAL_P50 = 0.005
GOAL_RATE = 2000.0


def job_doc(name: str) -> dict[str, Any]:
    """A realistic small job: a daily cron (03:00 UTC), so a run of the bench creates no runs (unless it spans 03:00)."""
    return {"name": name, "schedule": "0 3 * * *", "executor": "http", "description": "bench write",
            "labels": {"bench": "api-writes"}, "http": {"url": "http://127.0.0.1:9/never", "method": "POST"},
            "timeout": "5s"}


async def _put(session: aiohttp.ClientSession, base: str, name: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    try:
        async with session.put(f"{base}/v1/jobs/{name}", json=job_doc(name)) as resp:
            await resp.read()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError):
        status = 0
    return time.perf_counter() - t0, status


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=30))


async def sequential(base: str, n: int, prefix: str) -> dict[str, Any]:
    lat, errors = [], 0
    async with _session(1) as s:
        for i in range(n):
            dt, status = await _put(s, base, f"{prefix}-{i}")
            if status in (200, 201):
                lat.append(dt)
            else:
                errors += 1
    return {**summary(lat), "errors": errors}


async def saturate(base: str | Callable[[int], str], requests: int, seconds: float, inflight: int,
                   prefix: str) -> dict[str, Any]:
    """``inflight`` workers PUT until ``requests`` are sent or ``seconds`` pass; writes/s of the 2xx."""
    counter = itertools.count()
    lat: list[float] = []
    errors: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    url = base if callable(base) else (lambda _i: base)

    async def worker(s: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            i = next(counter)
            if i >= requests:
                return
            dt, status = await _put(s, url(i), f"{prefix}-{i}")
            if status in (200, 201):
                lat.append(dt)
            else:
                errors[status] = errors.get(status, 0) + 1

    async with _session(inflight) as s:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
        elapsed = time.monotonic() - t0
    return {"ok": len(lat), "errors": errors, "seconds": round(elapsed, 3), "rate": len(lat) / elapsed,
            "latency": summary(lat)}


def _terms(cluster: Cluster) -> dict[str, int | None]:
    return {n.name: term_of(n) for n in cluster.nodes}


def measure_cluster(cluster: Cluster, a: argparse.Namespace, tag: str) -> dict[str, Any]:
    leader = leader_of(cluster)
    follower = next(n for n in cluster.nodes if n is not leader)
    out: dict[str, Any] = {"load_before": load(), "leader": leader.name, "follower": follower.name, "phases": {}}
    terms0 = _terms(cluster)
    with CpuMeter(cluster) as idle:
        time.sleep(a.idle)
    out["idle_cpu"] = idle.result
    for where, node in (("leader", leader), ("follower", follower)):
        with CpuMeter(cluster) as cpu:
            out["phases"][f"seq_{where}"] = asyncio.run(sequential(node.url, a.seq, f"{tag}-s{where[0]}"))
        out["phases"][f"seq_{where}"]["cpu"] = cpu.result
    for where, node in (("leader", leader), ("follower", follower)):
        with CpuMeter(cluster) as cpu:
            out["phases"][f"load_{where}"] = asyncio.run(
                saturate(node.url, a.requests, a.seconds, a.inflight, f"{tag}-t{where[0]}"))
        out["phases"][f"load_{where}"]["cpu"] = cpu.result
    terms1 = _terms(cluster)
    out["terms_before"], out["terms_after"] = terms0, terms1
    out["term_changes"] = max((t for t in terms1.values() if t is not None), default=0) - \
        max((t for t in terms0.values() if t is not None), default=0)
    out["load_after"] = load()
    return out


def measure_floor(a: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    proc = spawn("bench.floor", "--port", str(port))
    try:
        base = f"http://127.0.0.1:{port}"
        return {"load_before": load(), "phases": {
            "seq": asyncio.run(sequential(base, a.seq, "floor")),
            "load": asyncio.run(saturate(base, a.requests, a.seconds, a.inflight, "floor")),
        }, "load_after": load()}
    finally:
        stop_process(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=2)
    p.add_argument("--seq", type=int, default=500, help="sequential PUTs per target (default 500)")
    p.add_argument("--requests", type=int, default=5000, help="PUTs per throughput phase (default 5000)")
    p.add_argument("--seconds", type=float, default=20.0, help="time cap per throughput phase (default 20)")
    p.add_argument("--inflight", type=int, default=64, help="concurrent PUTs in the throughput phase (default 64)")
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured first, subtracted per write")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    a = p.parse_args()
    if a.quick:
        a.repeat, a.seq, a.requests, a.seconds = 1, 150, 2000, 6.0
    configs = [c for c in a.configs.split(",") if c]
    doc: dict[str, Any] = {"benchmark": "api_writes", "machine": machine(), "params": vars(a), "runs": []}
    t_start = time.monotonic()
    for r in range(a.repeat):
        floor = measure_floor(a)
        doc["runs"].append({"repeat": r, "config": "floor", **floor})
        print(f"[{time.monotonic() - t_start:5.0f}s] repeat {r}: floor "
              f"p50 {ms(floor['phases']['seq']['p50'], 2)} ms, {floor['phases']['load']['rate']:.0f}/s", flush=True)
        for cfg in configs:
            with fresh_cluster(f"writes-{cfg}", CONFIGS[cfg], keep=a.keep) as cluster:
                res = measure_cluster(cluster, a, f"r{r}")
            doc["runs"].append({"repeat": r, "config": cfg, **res})
            ph = res["phases"]
            print(f"[{time.monotonic() - t_start:5.0f}s] repeat {r}: {cfg}: seq p50 {ms(ph['seq_leader']['p50'])} ms, "
                  f"load {ph['load_leader']['rate']:.0f}/s, terms +{res['term_changes']}, load {res['load_before']['1m']}",
                  flush=True)
    doc["summary"] = _summarise(doc["runs"], configs)
    _print(doc["summary"])
    write_results("api_writes", doc)


def _summarise(runs: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    rows = []
    for cfg in ["floor", *configs]:
        rs = [r for r in runs if r["config"] == cfg]
        targets = [("-", "seq", "load")] if cfg == "floor" else [("leader", "seq_leader", "load_leader"),
                                                                 ("follower", "seq_follower", "load_follower")]
        for where, seq, thr in targets:
            rows.append({
                "config": cfg, "target": where, "repeats": len(rs),
                "p50_ms": _m(median_of(r["phases"][seq]["p50"] for r in rs)),
                "p99_ms": _m(median_of(r["phases"][seq]["p99"] for r in rs)),
                "writes_per_s": round(median_of(r["phases"][thr]["rate"] for r in rs) or 0),
                "load_p50_ms": _m(median_of(r["phases"][thr]["latency"]["p50"] for r in rs)),
                "load_p99_ms": _m(median_of(r["phases"][thr]["latency"]["p99"] for r in rs)),
                "errors": sum(r["phases"][seq]["errors"] + sum(r["phases"][thr]["errors"].values()) for r in rs),
                "term_changes": None if cfg == "floor" else sum(r["term_changes"] for r in rs),
                "cores_used_under_load": _r2(median_of(r["phases"][thr].get("cpu", {}).get("cores_used") for r in rs)),
                "agent_cpu_ms_per_write": _m(median_of(_cpu_per_write(r["phases"][thr], r.get("idle_cpu")) for r in rs)),
                "load_1m": [r["load_before"]["1m"] for r in rs],
            })
    return rows


def _cpu_per_write(phase: dict[str, Any], idle: dict[str, Any] | None) -> float | None:
    """Agents' CPU seconds per committed write, all three nodes, less what they burn idle."""
    cpu = phase.get("cpu")
    if not cpu or not phase["ok"] or not idle:
        return None
    busy = sum(v for k, v in cpu["cpu_s"].items() if k != "bench" and v is not None)
    idle_rate = sum(v for k, v in idle["cpu_s"].items() if k != "bench" and v is not None) / idle["wall_s"]
    return float(max(0.0, busy - idle_rate * cpu["wall_s"]) / phase["ok"])


def _r2(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _m(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def _print(rows: list[dict[str, Any]]) -> None:
    print()
    print(table(["config", "target", "PUT p50 ms", "PUT p99 ms", "writes/s (64 in flight)", "p50/p99 ms under load",
                 "errors", "term changes", "agent CPU ms/write (net of idle)", "cores busy", "load 1m"],
                [[r["config"], r["target"], r["p50_ms"], r["p99_ms"], r["writes_per_s"],
                  f"{r['load_p50_ms']}/{r['load_p99_ms']}", r["errors"], r["term_changes"],
                  r["agent_cpu_ms_per_write"], r["cores_used_under_load"],
                  ",".join(str(x) for x in r["load_1m"])] for r in rows]))
    print(f"goals: PUT p50 <= {GOAL_P50 * 1000:.0f} ms, >= {GOAL_RATE:.0f} writes/s")


if __name__ == "__main__":
    main()
