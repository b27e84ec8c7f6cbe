"""A burst: N jobs due at the same instant, against this machine's HTTP floor, in one run.

Real crons align (``0 * * * *``): at every :00 all of a team's hourly jobs fall due in the
same second. Per size N and repetition, interleaved:

1. **floor**: three client processes (one per node of a cluster) do nothing but send N POSTs
   between them, from the same instant, to the same sink raftcron's workers deliver to, with
   the same aiohttp client the HTTP executor uses (``--floor-inflight``:
   requests in flight per process, 0 for no bound; the executor holds at most 256 connections
   to one host); the floor is the best of those;
2. **raftcron**: a fresh 3-node cluster (fsync on); N jobs created through
   ``POST /v1/jobs:batch``, each with the 6-field cron ``S M * * * *`` of one instant T a
   few seconds after the creation is expected to end (so the leader meets them as it would
   an hourly burst: planned ahead, woken a horizon before T); every slot's first delivery.

Reported per N: p50 / p99 / max start lateness (sink receive time minus T), the time to the
last start (the max), delivered, early and doubled slots, and the ratio of raftcron's time to
the last start against the floor's (the goal: <= 1.5).

    python -m bench.burst                       # N = 1,000 and 10,000, 2 repetitions
    python -m bench.burst --sizes 100000 --repeat 1
    python -m bench.burst --quick               # N = 1,000, 1 repetition
    python -m bench.burst --profile 3           # and py-spy on every agent from just before T

The JSON goes to bench/results/burst.json (``--ab NAME``: also bench/ab/NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import subprocess
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster, Node

from .bulk import _send
from .lateness import SinkFarm, _epoch
from .profile import top
from .rig import (
    AB,
    RESULTS,
    CpuMeter,
    ab_arg,
    common_args,
    fresh_cluster,
    leader_of,
    load,
    machine,
    median_of,
    ms,
    summary,
    table,
    write_results,
)

PREFIX = "b"
CLIENTS = 3  # floor processes: one per node of the cluster it stands for


def burst_job(i: int, url: str, at: datetime) -> dict[str, Any]:
    return {"name": f"{PREFIX}{i:06d}", "schedule": f"{at.second} {at.minute} * * * *", "executor": "http",
            "http": {"url": url, "method": "POST"}, "timeout": "60s", "labels": {"bench": "burst"}}


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the floor ----------------------------------------------------------------------------------------


def _floor_client(url: str, names: list[str], at: float, inflight: int) -> dict[str, Any]:
    """Wait for ``at``, then POST once per name as fast as this process can (a process of its own)."""
    async def run() -> dict[str, Any]:
        slot = _iso(at)
        connector = aiohttp.TCPConnector(limit=inflight)
        errors = 0
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as s:

            async def one(name: str) -> None:
                nonlocal errors
                headers = {"X-Raftcron-Job": name, "X-Raftcron-Slot": slot, "X-Raftcron-Attempt": "1"}
                try:
                    async with s.post(url, headers=headers) as r:
                        await r.read()
                except (TimeoutError, aiohttp.ClientError):
                    errors += 1

            await asyncio.sleep(max(0.0, at - time.time()))
            t0 = time.time()
            await asyncio.gather(*(one(n) for n in names))
        return {"sent": len(names), "errors": errors, "started_late_s": round(t0 - at, 4)}

    return asyncio.run(run())


def floor(n: int, inflight: int, sink_procs: int) -> dict[str, Any]:
    """N POSTs from CLIENTS processes at one instant; lateness of each as the sink received it."""
    farm = SinkFarm(sink_procs)
    names = [f"{PREFIX}{i:06d}" for i in range(n)]
    shares = [names[k::CLIENTS] for k in range(CLIENTS)]
    try:
        with ProcessPoolExecutor(CLIENTS) as pool:
            list(pool.map(int, "0" * CLIENTS))  # the processes exist (and have imported) before the instant
            at = float(math.ceil(time.time() + 2.0))
            clients = list(pool.map(_floor_client, [farm.url()] * CLIENTS, shares, [at] * CLIENTS,
                                    [inflight] * CLIENTS))
    finally:
        records = farm.stop()
    out = analyse(records, n, at)
    out["inflight_per_process"] = inflight
    out["clients"] = clients
    return out


# ---- raftcron -----------------------------------------------------------------------------------------


async def _create(base: str, docs: list[dict[str, Any]], size: int = 1000, inflight: int = 4) -> dict[str, Any]:
    batches = iter(range(0, len(docs), size))
    errors: list[str] = []
    created = 0

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal created
        for start in batches:
            status, payload = await _send(s, "POST", base + "/v1/jobs:batch",
                                          {"mode": "apply", "jobs": docs[start : start + size]})
            if status == 200:
                created += int(payload["changes"]["created"])
            else:
                errors.append(f"{status}: {str(payload)[:200]}")

    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
    return {"created": created, "seconds": round(time.monotonic() - t0, 2), "errors": errors[:5]}


def raftcron(n: int, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": load()}
    farm = SinkFarm(a.sink_procs)
    try:
        extra = [*(["--log-level", a.agent_log] if a.agent_log else []),
                 *(x for arg in a.agent_arg for x in arg.split())]
        with fresh_cluster(f"burst{n}", extra=extra, keep=a.keep) as cluster:
            leader = leader_of(cluster)
            # The instant: after the creation is expected to end (at a conservative 1,000 jobs/s)
            # and a lead for the leader to meet the jobs as it would any burst planned long before.
            at = float(math.ceil(time.time() + n / 1000 + a.lead))
            when = datetime.fromtimestamp(at, UTC)
            out["create"] = asyncio.run(_create(leader.url, [burst_job(i, farm.url(), when) for i in range(n)]))
            out["created_ahead_s"] = round(at - time.time(), 2)
            if out["create"]["created"] != n or out["created_ahead_s"] < 2.0:
                out["aborted"] = f"{out['create']['created']} of {n} jobs created, {out['created_ahead_s']} s ahead"
                return out
            bound = at + max(30.0, n / 200)  # a bound, not a figure: the wait ends when every slot arrived
            with CpuMeter(cluster) as cpu:
                time.sleep(max(0.0, at - 3.0 - time.time()))
                spies = _spies(cluster, leader, at, a.profile, n) if a.profile else {}
                while time.time() < bound and farm.received() < n:
                    time.sleep(0.1)
                out["last_received_s"] = round(time.time() - at, 2)  # when this loop saw the count (<= 350 ms late)
            out["cpu"] = cpu.result
            if spies:
                out["profile"] = _read_spies(spies, a.profile)
            time.sleep(a.drain)
            out["load_after"] = load()
    finally:
        records = farm.stop()
    out.update(analyse(records, n, at))
    return out


def _spies(cluster: Cluster, leader: Node, at: float, seconds: float, n: int) -> dict[str, tuple[Any, Path]]:
    """py-spy on every agent from half a second before the instant, ``seconds`` long (GIL holders only)."""
    time.sleep(max(0.0, at - 0.5 - time.time()))
    spies = {}
    for node in cluster.nodes:
        if node.proc is None:
            continue
        name = node.name + ("-leader" if node is leader else "")
        path = RESULTS / f"profile-burst{n}-{name}.txt"
        proc = subprocess.Popen(["py-spy", "record", "-p", str(node.proc.pid), "-d", str(math.ceil(seconds)), "-r", "200",
                                 "-f", "raw", "--gil", "--nonblocking", "-o", str(path)],
                                stdout=subprocess.DEVNULL, stderr=open(path.with_suffix(".err"), "wb"))
        spies[name] = (proc, path)
    return spies


def _read_spies(spies: dict[str, tuple[Any, Path]], seconds: float) -> dict[str, Any]:
    out = {}
    for name, (proc, path) in spies.items():
        proc.wait(seconds + 60)
        if not path.exists():
            continue
        total, own, incl = top(path, 25)
        out[name] = {"samples": total, "file": str(path.relative_to(RESULTS.parent.parent)),
                     "self": [(f, round(v, 1)) for f, v in own],
                     "inclusive": [(f, round(v, 1)) for f, v in incl if v < 99.0]}
        print(f"== {name}: {total} samples holding the GIL in {seconds:g} s at 200 Hz")
        for f, v in own[:12]:
            print(f"   self {v:5.1f}%  {f}")
        for f, v in [x for x in incl if x[1] < 99.0][:12]:
            print(f"   incl {v:5.1f}%  {f}")
    return out


# ---- analysis ---------------------------------------------------------------------------------------------


def analyse(records: list[list[Any]], n: int, at: float) -> dict[str, Any]:
    first: dict[str, tuple[float, str | None]] = {}
    count: Counter[str] = Counter()
    for received, job, slot, attempt in records:
        if job is None or slot is None or not job.startswith(PREFIX) or abs(_epoch(slot) - at) > 0.5:
            continue
        count[job] += 1
        if job not in first or received < first[job][0]:
            first[job] = (received, attempt)
    late = [t - at for t, _ in first.values()]
    return {"n": n, "at": at, "delivered": len(first), "missing": n - len(first),
            "first_delivered_by_a_retry": sum(1 for _, attempt in first.values() if attempt not in (None, "1")),
            "doubled": sum(1 for c in count.values() if c > 1), "early": sum(1 for x in late if x < 0),
            "lateness": summary(late), "last_start_s": round(max(late), 4) if late else None}


# ---- the run -------------------------------------------------------------------------------------------------


def _cells(r: dict[str, Any]) -> list[Any]:
    lat = r.get("lateness") or {}
    return [ms(lat.get("p50")), ms(lat.get("p99")), ms(r.get("last_start_s")),
            f"{r.get('delivered', 0)}/{r.get('n')}", r.get("early"), r.get("doubled")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=2)
    p.add_argument("--sizes", default="1000,10000", help="jobs due at the same instant, comma separated")
    p.add_argument("--floor-inflight", default="64,256", help="floor: requests in flight per process (0: no bound)")
    p.add_argument("--sink-procs", type=int, default=2)
    p.add_argument("--lead", type=float, default=12.0, help="seconds from the creation's expected end to the instant")
    p.add_argument("--drain", type=float, default=2.0, help="seconds after the last delivery before the sink is read")
    p.add_argument("--agent-log", default=None, help="the agents' --log-level (with --keep: logs to read; costs time)")
    p.add_argument("--agent-arg", action="append", default=[], metavar="FLAGS",
                   help="more agent flags, e.g. --agent-arg '--http-connections-per-host 64' (repeatable)")
    p.add_argument("--profile", type=float, default=0.0, metavar="S",
                   help="py-spy (pip install -e '.[bench]') on every agent for S seconds from 0.5 s before the instant")
    ab_arg(p)
    a = p.parse_args()
    if a.quick:
        a.sizes, a.repeat = "1000", 1
    if a.profile and shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy: pip install -e '.[bench]'")
    if a.profile:
        RESULTS.mkdir(parents=True, exist_ok=True)  # the profiles go there; a new checkout has none
    sizes = [int(x) for x in a.sizes.split(",")]
    inflights = [int(x) for x in a.floor_inflight.split(",")]
    doc: dict[str, Any] = {"machine": machine(), "sizes": sizes, "runs": []}
    for rep in range(a.repeat):
        for n in sizes:
            floors = [floor(n, k, a.sink_procs) for k in inflights]
            best = min(floors, key=lambda f: f["last_start_s"] if f["last_start_s"] is not None else math.inf)
            ours = raftcron(n, a)
            ratio = (ours["last_start_s"] / best["last_start_s"]
                     if ours.get("last_start_s") is not None and best["last_start_s"] else None)
            run = {"n": n, "repetition": rep, "floor": floors, "floor_best": best["inflight_per_process"],
                   "raftcron": ours, "ratio_to_floor": round(ratio, 2) if ratio is not None else None}
            doc["runs"].append(run)
            print(f"[bench] N={n} rep {rep}: floor last start {ms(best['last_start_s'])} "
                  f"(in flight {best['inflight_per_process']}), raftcron {ms(ours.get('last_start_s'))} "
                  f"{ours.get('aborted', '')}, ratio {run['ratio_to_floor']}", flush=True)
    rows = []
    for n in sizes:
        mine = [r for r in doc["runs"] if r["n"] == n]
        for r in mine:
            best = next(f for f in r["floor"] if f["inflight_per_process"] == r["floor_best"])
            rows.append([f"{n:,}", r["repetition"], "floor", *_cells(best), ""])
            rows.append([f"{n:,}", r["repetition"], "raftcron", *_cells(r["raftcron"]), r["ratio_to_floor"]])
        doc.setdefault("median_ratio", {})[str(n)] = median_of(r["ratio_to_floor"] for r in mine)
    print(table(["N", "rep", "who", "p50", "p99", "last start", "delivered", "early", "doubled", "ratio"], rows))
    print("median ratio to the floor:", doc["median_ratio"])
    write_results("burst", doc)
    if a.ab:
        AB.mkdir(exist_ok=True)
        (AB / f"{a.ab}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
