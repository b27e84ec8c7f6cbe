"""Whole-cluster restart: stop all three agents, start all three, time to the first committed write.

On one fresh 3-node cluster holding ``--jobs`` jobs (a daily cron each) plus
``--every`` `@every 1s` jobs that build run history for ``--history`` seconds
(HTTP to a sink process), then ``--repeat`` times each, alternating:

- ``sigterm``: SIGTERM all three (clean shutdown), wait for them to exit;
- ``kill9``: SIGKILL all three at once;

then start all three at once and fire a PUT every 20 ms at the nodes in turn:
the figure is the time from the start command to the first PUT answered 2xx.
Between rounds the cluster is left to catch up and settle.

    python -m bench.cold_restart            # 1,000 jobs, 5 x 2 restarts, ~3 minutes
    python -m bench.cold_restart --quick    # 300 jobs, 2 x 2 restarts, ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster, http, wait_for

from .api_writes import job_doc
from .failover import _first_write
from .lateness import SinkFarm, every_job
from .rig import (
    caught_up,
    common_args,
    fresh_cluster,
    leader_of,
    load,
    machine,
    median_of,
    summary,
    table,
    write_results,
)


async def _create(base: str, docs: list[dict[str, Any]], inflight: int = 32) -> None:
    todo = iter(docs)

    async def worker(s: aiohttp.ClientSession) -> None:
        for doc in todo:
            for _ in range(50):
                async with s.put(f"{base}/v1/jobs/{doc['name']}", json=doc) as r:
                    await r.read()
                    if r.status in (200, 201):
                        break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"could not create {doc['name']}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        await asyncio.gather(*(worker(s) for _ in range(inflight)))


def _disk(cluster: Cluster) -> dict[str, int]:
    return {n.name: sum(f.stat().st_size for f in Path(n.data_dir).rglob("*") if f.is_file()) for n in cluster.nodes}


class _HealthWatch(threading.Thread):
    """GET /v1/health on every node every 20 ms until one answers 200: the first API up."""

    def __init__(self, cluster: Cluster, since: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.since = cluster, since
        self.first: float | None = None
        self.start()

    def run(self) -> None:
        while time.monotonic() - self.since < 90 and self.first is None:
            for n in self.cluster.nodes:
                try:
                    status, _ = http("GET", n.url + "/v1/health", timeout=0.5)
                except OSError:
                    continue
                if status == 200:
                    self.first = round(time.monotonic() - self.since, 3)
                    return
            time.sleep(0.02)


def restart(cluster: Cluster, how: str, k: int) -> dict[str, Any]:
    status = leader_of(cluster).get("/v1/cluster")
    t0 = time.monotonic()
    if how == "sigterm":
        for n in cluster.nodes:
            assert n.proc is not None
            n.proc.terminate()
        for n in cluster.nodes:
            assert n.proc is not None
            n.proc.wait(30)
    else:
        for n in cluster.nodes:
            assert n.proc is not None
            n.proc.kill()
        for n in cluster.nodes:
            assert n.proc is not None
            n.proc.wait(10)
    stop_s = time.monotonic() - t0
    exit_codes = {n.name: n.proc.returncode for n in cluster.nodes if n.proc is not None}
    start = time.monotonic()
    for n in cluster.nodes:
        n.start()
    api_up = _HealthWatch(cluster, start)
    first = asyncio.run(_first_write(cluster.nodes, start, f"cr{k}", bound=90.0))
    api_up.join(5)
    leader = leader_of(cluster, timeout=60)
    for n in cluster.nodes:
        caught_up(cluster, n, timeout=60)
    return {"how": how, "round": k, "commit_index_before": status["commit_index"], "stop_s": round(stop_s, 3),
            "exit_codes": exit_codes, "first_write_s": first.get("seconds"), "first_write_via": first.get("via"),
            "first_http_answer_s": api_up.first,
            "answers": first.get("answers"), "leader_after": leader.name,
            "all_caught_up_s": round(time.monotonic() - start, 3), "load": load()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=5)
    p.add_argument("--jobs", type=int, default=1000, help="jobs held by the cluster (default 1000)")
    p.add_argument("--every", type=int, default=50, help="of which `@every 1s` jobs making history (default 50)")
    p.add_argument("--history", type=float, default=20.0, help="seconds of runs before the first restart (default 20)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between rounds (default 3)")
    a = p.parse_args()
    if a.quick:
        a.repeat, a.jobs, a.every, a.history = 2, 300, 20, 8.0
    t_start = time.monotonic()
    doc: dict[str, Any] = {"benchmark": "cold_restart", "machine": machine(), "params": vars(a), "rounds": []}
    farm = SinkFarm(1)
    try:
        with fresh_cluster("cold", keep=a.keep) as cluster:
            leader = leader_of(cluster)
            docs = [job_doc(f"c{i}") for i in range(a.jobs - a.every)] + \
                [every_job(f"e{i}", farm.url()) for i in range(a.every)]
            t = time.monotonic()
            asyncio.run(_create(leader.url, docs))
            doc["create_s"] = round(time.monotonic() - t, 2)
            print(f"created {a.jobs} jobs in {doc['create_s']} s; {a.history:g} s of history", flush=True)
            time.sleep(a.history)
            wait_for("history", lambda: len(cluster.runs("e0")) > 3, 30)
            for k in range(a.repeat):
                for how in ("sigterm", "kill9"):
                    doc["disk_bytes_before"] = _disk(cluster)
                    r = restart(cluster, how, k)
                    r["runs_e0"] = len(cluster.runs("e0"))
                    doc["rounds"].append(r)
                    print(f"  round {k} {how}: stop {r['stop_s']} s, first write {r['first_write_s']:.3f} s after start, "
                          f"all caught up {r['all_caught_up_s']} s, commit index {r['commit_index_before']}, "
                          f"load {r['load']['1m']}", flush=True)
                    time.sleep(a.settle)
    finally:
        farm.stop()
    doc["summary"] = {}
    rows = []
    for how in ("sigterm", "kill9"):
        rs = [r for r in doc["rounds"] if r["how"] == how]
        s = summary([r["first_write_s"] for r in rs if r["first_write_s"] is not None])
        doc["summary"][how] = {**s, "stop_s_median": median_of(r["stop_s"] for r in rs),
                               "all_caught_up_s_median": median_of(r["all_caught_up_s"] for r in rs)}
        doc["summary"][how]["first_http_answer_s_median"] = median_of(r["first_http_answer_s"] for r in rs)
        rows.append([how, len(rs), _f(doc["summary"][how]["first_http_answer_s_median"]), _f(s["p50"]), _f(s["max"]), _f(doc["summary"][how]["stop_s_median"]),
                     _f(doc["summary"][how]["all_caught_up_s_median"]), ",".join(str(r["load"]["1m"]) for r in rs)])
    doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
    print()
    print(table(["stop", "rounds", "API answers s (median)", "first write s (median)", "max s", "stop took s", "all caught up s", "load 1m"], rows))
    print(f"jobs {a.jobs}, disk per node before the last round: {doc.get('disk_bytes_before')}")
    write_results("cold_restart", doc)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
