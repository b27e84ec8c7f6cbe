"""raftcron side by side with etcd and APScheduler, in one run, interleaved.

Figures measured on different hours of this machine compare nothing (its speed moves by a
third within an hour), so every measure here runs both sides in the same run, one after the
other, with the order swapped at each repetition or rate, and records the load average and
CPU count beside each figure:

- **writes**: a fresh 3-member etcd (fsync on, its defaults; writes through its HTTP/JSON
  gateway, ``POST /v3/kv/put``) and a fresh 3-node raftcron cluster (fsync on;
  ``PUT /v1/jobs/{name}``), the same aiohttp client and the same job document (as the
  value in etcd): sequential PUT latency at the leader, then writes/s at 1, 16 and 64 in
  flight, and the servers' CPU per write (the three processes, net of their idle burn);
- **failover**: kill -9 of the leader, ``--kills`` times on each side: the time from the
  kill to the first write answered 2xx (a PUT every 20 ms to the survivors), and the
  writes completed per 100 ms around each kill from 8 writers spread over all members;
- **lateness**: APScheduler 3 (``bench/apscheduler_peer.py``: one process, an
  ``AsyncIOScheduler`` with its defaults, an aiohttp POST per fire) against raftcron at
  each of ``--rates`` jobs firing every second, in two modes: ``spread`` (raftcron
  ``@every 1s`` jobs created over a second, APScheduler interval triggers started over a
  second) and ``aligned`` (``* * * * * *`` against ``CronTrigger(second="*")``: every job
  due at each second's start). The same sink processes time both; start lateness p50 /
  p99 / max, slots delivered, slots dropped (APScheduler's skipped runs; raftcron's missing).

Every figure comes with its ratio raftcron / peer, and whether that puts raftcron ahead or
behind. The JSON and the plots (bench/plots.py) go to ``--out`` (default ``docs/bench``;
``--quick`` writes to bench/results/compare-quick instead, to leave the published ones be).

Needs ``pip install -e '.[bench]'`` (APScheduler 3, matplotlib) and
``apt-get install etcd-server etcd-client``.

    python -m bench.compare            # ~15 minutes
    python -m bench.compare --quick    # ~5 minutes: fewer kills, rates 100 and 1,000, short windows
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from tests.cluster.harness import ROOT

from .api_writes import job_doc
from .etcd_cluster import EtcdCluster, etcd_binary, put_body
from .lateness import SinkFarm, analyse, run_rate
from .rig import (
    agents_cpu,
    caught_up,
    cpu_seconds,
    fresh_cluster,
    load,
    machine,
    median_of,
    pct,
    spawn,
    stop_process,
    summary,
    table,
)

SYSTEMS = ("etcd", "raftcron")
INFLIGHT = (1, 16, 64)


# ---- the two stores, behind one face --------------------------------------------------------------------------


class Member(Protocol):
    name: str

    @property
    def url(self) -> str: ...
    def alive(self) -> bool: ...
    def kill9(self) -> None: ...
    def start(self) -> None: ...


class Store:
    """A running 3-node cluster of one system: where to write, who leads, how to kill and restart."""

    system: str
    nodes: Sequence[Member]

    def request(self, base: str, name: str) -> tuple[str, str, bytes]:
        raise NotImplementedError

    def leader(self, timeout: float = 30.0, among: list[Any] | None = None) -> Any:
        raise NotImplementedError

    def caught_up(self, node: Any, timeout: float = 60.0) -> float:
        raise NotImplementedError

    def cpu(self) -> dict[str, float | None]:
        raise NotImplementedError

    async def put(self, s: aiohttp.ClientSession, base: str, name: str) -> int:
        """One write; its HTTP status (0 when the connection failed or timed out)."""
        method, url, body = self.request(base, name)
        try:
            async with s.request(method, url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                return r.status
        except (TimeoutError, aiohttp.ClientError):
            return 0


class RaftcronStore(Store):
    system = "raftcron"

    def __init__(self, cluster: Any) -> None:
        self.cluster, self.nodes = cluster, cluster.nodes

    def request(self, base: str, name: str) -> tuple[str, str, bytes]:
        return "PUT", f"{base}/v1/jobs/{name}", orjson.dumps(job_doc(name))

    def leader(self, timeout: float = 30.0, among: list[Any] | None = None) -> Any:
        return self.cluster.leader(timeout=timeout, among=among)

    def caught_up(self, node: Any, timeout: float = 60.0) -> float:
        return caught_up(self.cluster, node, timeout)

    def cpu(self) -> dict[str, float | None]:
        return agents_cpu(self.cluster)


class EtcdStore(Store):
    system = "etcd"

    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster, self.nodes = cluster, cluster.nodes

    def request(self, base: str, name: str) -> tuple[str, str, bytes]:
        return "POST", f"{base}/v3/kv/put", orjson.dumps(put_body(f"jobs/{name}", orjson.dumps(job_doc(name))))

    def leader(self, timeout: float = 30.0, among: list[Any] | None = None) -> Any:
        return self.cluster.leader(timeout=timeout, among=among)

    def caught_up(self, node: Any, timeout: float = 60.0) -> float:
        return self.cluster.caught_up(node, timeout)

    def cpu(self) -> dict[str, float | None]:
        return {m.name: m.cpu() for m in self.nodes}


@contextlib.contextmanager
def started(system: str, label: str, keep: bool) -> Iterator[Store]:
    if system == "raftcron":
        with fresh_cluster(f"compare-{label}", keep=keep) as cluster:
            yield RaftcronStore(cluster)
    else:
        etcd = EtcdCluster()
        try:
            etcd.start()
            yield EtcdStore(etcd)
        except BaseException:
            print(etcd.logs())
            raise
        finally:
            etcd.stop()


def _cpu_total(before: dict[str, float | None], after: dict[str, float | None]) -> float:
    """CPU seconds the processes used between two samples (a process missing from either is left out)."""
    total = 0.0
    for k, v in before.items():
        end = after.get(k)
        if v is not None and end is not None:
            total += end - v
    return total


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=aiohttp.ClientTimeout(total=10))


# ---- writes -----------------------------------------------------------------------------------------------------


async def _timed(store: Store, s: aiohttp.ClientSession, base: str, name: str) -> float | None:
    """One write's latency, None when it was not answered 2xx."""
    t0 = time.perf_counter()
    status = await store.put(s, base, name)
    return time.perf_counter() - t0 if 200 <= status < 300 else None


async def _sequential(store: Store, base: str, n: int, prefix: str) -> dict[str, Any]:
    async with _session(1) as s:
        times = [await _timed(store, s, base, f"{prefix}-{i}") for i in range(n)]
    lat = [t for t in times if t is not None]
    return {**summary(lat), "errors": len(times) - len(lat)}


async def _saturate(store: Store, base: str, seconds: float, inflight: int, prefix: str) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0
    counter = iter(range(10**9))
    deadline = time.monotonic() + seconds

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            dt = await _timed(store, s, base, f"{prefix}-{next(counter)}")
            if dt is not None:
                lat.append(dt)
            else:
                errors += 1

    async with _session(inflight) as s:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(s) for _ in range(inflight)))
        wall = time.monotonic() - t0
    return {"inflight": inflight, "ok": len(lat), "errors": errors, "seconds": round(wall, 3),
            "rate": len(lat) / wall, "latency": summary(lat)}


def measure_writes(store: Store, a: argparse.Namespace, tag: str) -> dict[str, Any]:
    leader = store.leader()
    out: dict[str, Any] = {"system": store.system, "load_before": load(), "leader": leader.name}
    c0, t0 = store.cpu(), time.monotonic()
    time.sleep(a.idle)
    idle_rate = _cpu_total(c0, store.cpu()) / (time.monotonic() - t0)
    out["idle_cores"] = round(idle_rate, 3)
    out["sequential"] = asyncio.run(_sequential(store, leader.url, a.seq, f"{tag}-seq"))
    out["throughput"] = []
    for k in INFLIGHT:
        c0 = store.cpu()
        res = asyncio.run(_saturate(store, leader.url, a.write_seconds, k, f"{tag}-i{k}"))
        busy = _cpu_total(c0, store.cpu())
        res["server_cpu_s"] = round(busy, 3)
        res["server_cpu_ms_per_write"] = (round(1000 * max(0.0, busy - idle_rate * res["seconds"]) / res["ok"], 3)
                                          if res["ok"] else None)
        out["throughput"].append(res)
    out["load_after"] = load()
    return out


# ---- failover ----------------------------------------------------------------------------------------------------


async def _failover_once(store: Store, victim: Member, survivors: list[Member], a: argparse.Namespace,
                         tag: str) -> dict[str, Any]:
    """Writers on every member from ``settle`` s before the kill to ``after`` s past it, and from the
    kill on a PUT every 20 ms at the survivors (each its own connection) until one is answered 2xx.
    The failover time is the kill to the first 2xx of any write sent after the kill, timed from
    the moment the signal went, not from when it was planned."""
    events: list[tuple[float, float, int]] = []  # (sent, completed, status), monotonic seconds
    stop = time.monotonic() + a.settle + a.after
    planned = time.monotonic() + a.settle
    kill: dict[str, float] = {}
    counter = iter(range(10**9))
    done = asyncio.Event()

    async def write(s: aiohttp.ClientSession, node: Member, name: str) -> int:
        sent = time.monotonic()
        status = await store.put(s, node.url, name)
        events.append((sent, time.monotonic(), status))
        if 200 <= status < 300 and "at" in kill and sent >= kill["at"]:
            done.set()
        return status

    async def writer(s: aiohttp.ClientSession, w: int) -> None:
        while time.monotonic() < stop:
            i = next(counter)
            node = store.nodes[(w + i) % len(store.nodes)]
            if not node.alive():  # the killed member: the next one is alive
                continue
            if not 200 <= await write(s, node, f"{tag}-w{i}") < 300:
                # A refusal can come back at once (raftcron answers 503 without a leader): do not
                # turn it into a busy loop that takes the survivors' CPU from their election.
                await asyncio.sleep(0.02)

    async def probe() -> int:
        await asyncio.sleep(max(0.0, planned - time.monotonic()))
        kill["at"] = time.monotonic()
        victim.kill9()
        i = 0
        # no connection limit: a probe hung on a request to the dead leader must not hold up later ones
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=a.bound)) as s:
            tasks = []
            while not done.is_set() and time.monotonic() - kill["at"] < a.bound:
                tasks.append(asyncio.create_task(write(s, survivors[i % len(survivors)], f"{tag}-p{i}")))
                i += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.02)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return i

    async with _session(a.writers) as s:
        probes, *_ = await asyncio.gather(probe(), *(writer(s, w) for w in range(a.writers)))
    k0 = kill["at"]
    out: dict[str, Any] = {"probes_sent": probes, "kill_late_s": round(k0 - planned, 4)}
    after = [done_at - k0 for sent, done_at, st in events if sent >= k0 and 200 <= st < 300]
    if after:
        out["seconds"] = round(min(after), 4)
    bins = [0] * round((a.settle + a.after) / 0.1)
    for _sent, t, status in events:
        b = math.floor(round((t - k0 + a.settle) * 10, 6))
        if 200 <= status < 300 and 0 <= b < len(bins):
            bins[b] += 1
    out.update({"writes_per_100ms": bins, "timeline_from_s": -a.settle,
                "errors": sum(1 for _, _, st in events if not 200 <= st < 300)})
    return out


def measure_failover(store: Store, a: argparse.Namespace, tag: str) -> dict[str, Any]:
    kills = []
    for k in range(a.kills):
        leader = store.leader()
        survivors = [n for n in store.nodes if n is not leader]
        res = asyncio.run(_failover_once(store, leader, survivors, a, f"{tag}-k{k}"))
        res.update({"kill": k, "killed": leader.name, "load": load()})
        leader.start()
        try:
            res["rejoined_s"] = round(store.caught_up(leader, timeout=60), 3)
        except AssertionError as exc:
            res["rejoin_error"] = str(exc)
        kills.append(res)
        print(f"    {store.system} kill {k}: {leader.name} -> first write after {res.get('seconds', float('nan')):.3f} s, "
              f"load {res['load']['1m']}", flush=True)
    return {"system": store.system, "kills": kills}


# ---- lateness ----------------------------------------------------------------------------------------------------


def run_apscheduler(k: int, seconds: float, aligned: bool, a: argparse.Namespace) -> dict[str, Any]:
    """APScheduler's side of a lateness run: its own process, the same sink, the same window rules."""
    out: dict[str, Any] = {"rate": k, "seconds": seconds, "load_before": load()}
    farm = SinkFarm(a.sink_procs)
    tmp = Path(tempfile.mkdtemp(prefix="raftcron-bench-aps-"))
    stats_path = tmp / "stats.json"
    try:
        proc = spawn("bench.apscheduler_peer", "--jobs", str(k), "--url", farm.url(), "--out", str(stats_path),
                     "--mode", "aligned" if aligned else "spread", "--log", str(tmp / "apscheduler.log"))
        try:
            time.sleep(a.warmup)
            t0 = float(int(time.time()) + 1)
            time.sleep(max(0.0, t0 - time.time()))
            t1 = t0 + seconds
            cpu0, w0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(max(0.0, t1 - time.time()))
            cpu1, wall = cpu_seconds(proc.pid), time.monotonic() - w0
            out["cores_used"] = round((cpu1 - cpu0) / wall, 2) if cpu0 is not None and cpu1 is not None else None
            time.sleep(a.drain)
        finally:
            stop_process(proc)
        out["apscheduler"] = json.loads(stats_path.read_text()) if stats_path.exists() else None
        log = tmp / "apscheduler.log"
        out["log_lines"] = sum(1 for _ in log.open()) if log.exists() else 0
    finally:
        records = farm.stop()
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    out["window"] = [t0, t1]
    out["result"] = analyse(records, k, t0, t1, cdf=True)
    out["load_after"] = load()
    return out


def measure_lateness(system: str, k: int, aligned: bool, a: argparse.Namespace) -> dict[str, Any]:
    if system == "apscheduler":
        res = run_apscheduler(k, a.window, aligned, a)
    else:
        ns = argparse.Namespace(sink_procs=a.sink_procs, agent_arg=[], keep=a.keep, spread=1.0, create_deadline=120.0,
                                aligned=aligned, warmup=a.warmup, drain=a.drain, busy=0.0, apply_during=0,
                                restart_after=None, cdf=True)
        res = run_rate(k, a.window, ns)
        if "cpu" in res:
            res["cores_used"] = res["cpu"]["cores_used"]
    res.update({"system": system, "mode": "aligned" if aligned else "spread"})
    if "result" in res:
        r = res["result"]
        print(f"    {system:<11} {res['mode']:<7} {k:>5}/s: p50 {_ms(r['lateness']['p50'])} p99 {_ms(r['lateness']['p99'])} "
              f"max {_ms(r['lateness']['max'])} ms, delivered {100 * (r['delivery_ratio'] or 0):.1f} %, "
              f"load {res['load_before']['1m']}", flush=True)
    else:
        print(f"    {system} {res['mode']} {k}/s: {res.get('aborted')}", flush=True)
    return res


# ---- the summary -------------------------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _ratio(ours: float | None, theirs: float | None, higher_is_better: bool) -> dict[str, Any]:
    if ours is None or theirs is None:
        return {"ratio": None, "verdict": "not comparable"}
    if ours == theirs:
        return {"ratio": 1.0 if ours else None, "verdict": "level"}
    if ours <= 0 or theirs <= 0:  # a zero (nothing delivered, a 0 ms figure) has no ratio, only a side
        ahead = ours > theirs if higher_is_better else ours < theirs
        return {"ratio": None, "verdict": "ahead" if ahead else "behind"}
    ratio = ours / theirs
    ahead = ratio > 1 if higher_is_better else ratio < 1
    factor = max(ratio, 1 / ratio)
    verdict = "level" if factor < 1.05 else f"{'ahead' if ahead else 'behind'} by {factor:.2f}x"
    return {"ratio": round(ratio, 3), "verdict": verdict}


def summarise(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def row(measure: str, ours: float | None, theirs: float | None, peer: str, unit: str, higher: bool,
            **extra: Any) -> None:
        rows.append({"measure": measure, "raftcron": ours, "peer": peer, "peer_value": theirs, "unit": unit,
                     **_ratio(ours, theirs, higher), **extra})

    w = doc.get("writes", [])
    by = {s: [r for r in w if r["system"] == s] for s in SYSTEMS}
    if all(by.values()):
        def seq(s: str, q: str) -> float | None:
            return median_of(r["sequential"][q] for r in by[s])

        row("sequential PUT p50", _r(seq("raftcron", "p50"), 1000), _r(seq("etcd", "p50"), 1000), "etcd", "ms", False)
        row("sequential PUT p99", _r(seq("raftcron", "p99"), 1000), _r(seq("etcd", "p99"), 1000), "etcd", "ms", False)
        def level(s: str, i: int, key: str) -> float | None:
            return median_of(r["throughput"][i][key] for r in by[s])

        for i, k in enumerate(INFLIGHT):
            row(f"writes/s, {k} in flight", _r(level("raftcron", i, "rate"), 1, 0), _r(level("etcd", i, "rate"), 1, 0),
                "etcd", "writes/s", True)
            if k == INFLIGHT[-1]:
                row(f"server CPU per write, {k} in flight (3 processes, net of idle)",
                    _r(level("raftcron", i, "server_cpu_ms_per_write"), 1, 3),
                    _r(level("etcd", i, "server_cpu_ms_per_write"), 1, 3), "etcd", "ms", False)
        row("servers' CPU while idle (3 processes)", _r(median_of(r["idle_cores"] for r in by["raftcron"]), 1, 3),
            _r(median_of(r["idle_cores"] for r in by["etcd"]), 1, 3), "etcd", "cores", False)
    f = {s: [k for run in doc.get("failover", []) if run["system"] == s for k in run["kills"]] for s in SYSTEMS}
    bound = float(doc.get("params", {}).get("bound", 30.0))
    if all(f.values()):
        def fo(s: str, q: float) -> float | None:
            # a kill after which no write came back within the bound counts as the bound
            return pct([k.get("seconds", bound) for k in f[s]], q)

        never = {s: sum(1 for k in f[s] if "seconds" not in k) for s in SYSTEMS}
        row("failover: kill -9 leader -> first write, median", _r(fo("raftcron", 50), 1, 3), _r(fo("etcd", 50), 1, 3),
            "etcd", "s", False, kills=len(f["raftcron"]), peer_kills=len(f["etcd"]), without_a_write=never)
        row("failover: max", _r(fo("raftcron", 100), 1, 3), _r(fo("etcd", 100), 1, 3), "etcd", "s", False)

        def back(s: str) -> float | None:
            return median_of(k.get("rejoined_s") for k in f[s])

        row("failover: killed member restarted -> caught up, median", _r(back("raftcron"), 1, 3), _r(back("etcd"), 1, 3),
            "etcd", "s", False)
    lat = doc.get("lateness", [])
    for mode in ("spread", "aligned"):
        for k in sorted({r["rate"] for r in lat}):
            mine = [r for r in lat if r["system"] == "raftcron" and r["mode"] == mode and r["rate"] == k and "result" in r]
            theirs = [r for r in lat if r["system"] == "apscheduler" and r["mode"] == mode and r["rate"] == k and "result" in r]
            if not mine or not theirs:
                continue
            ours_d = median_of(r["result"]["delivery_ratio"] for r in mine) or 0.0
            theirs_d = median_of(r["result"]["delivery_ratio"] for r in theirs) or 0.0
            for q in ("p50", "p99", "max"):
                row(f"start lateness {q}, {k:,}/s {mode}",
                    _r(median_of(r["result"]["lateness"][q] for r in mine), 1000),
                    _r(median_of(r["result"]["lateness"][q] for r in theirs), 1000), "APScheduler", "ms", False,
                    rate=k, mode=mode)
                if abs(ours_d - theirs_d) > 0.01:
                    # Lateness is of the slots delivered: a side that dropped more has fewer, and
                    # its late ones are the ones it dropped. Only the delivered row compares.
                    rows[-1].update({"ratio": None, "verdict": f"not comparable: delivered {100 * ours_d:.1f} % "
                                                               f"against {100 * theirs_d:.1f} %"})
            row(f"slots delivered, {k:,}/s {mode}", _r(ours_d, 100, 2), _r(theirs_d, 100, 2), "APScheduler", "%", True,
                rate=k, mode=mode)
    return rows


def _r(v: float | None, scale: float = 1.0, digits: int = 2) -> float | None:
    return None if v is None else round(v * scale, digits)


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "%":
        return f"{v:.1f} %"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown(summary: list[dict[str, Any]]) -> str:
    """The summary as README's table: related measures in one row, values and verdicts joined by " / "."""
    by = {r["measure"]: r for r in summary}
    groups: list[tuple[str, list[str]]] = [
        ("sequential PUT p50 / p99 (ms)", ["sequential PUT p50", "sequential PUT p99"]),
        ("writes/s, 1 / 16 / 64 in flight", [f"writes/s, {k} in flight" for k in INFLIGHT]),
        ("server CPU per write at 64 in flight, three processes, net of idle (ms)",
         [f"server CPU per write, {INFLIGHT[-1]} in flight (3 processes, net of idle)"]),
        ("the three servers' CPU while idle (cores)", ["servers' CPU while idle (3 processes)"]),
        ("kill -9 of the leader -> first write answered, median / max (s)",
         ["failover: kill -9 leader -> first write, median", "failover: max"]),
        ("the killed member restarted -> caught up, median (s)", ["failover: killed member restarted -> caught up, median"]),
    ]
    for mode in ("spread", "aligned"):
        for k in sorted({r["rate"] for r in summary if r.get("mode") == mode}):
            groups.append((f"{k:,} jobs/s {mode}: start lateness p50 / p99 / max (ms), slots delivered",
                           [f"start lateness {q}, {k:,}/s {mode}" for q in ("p50", "p99", "max")]
                           + [f"slots delivered, {k:,}/s {mode}"]))
    lines = ["| measure | raftcron | peer | raftcron / peer | verdict |", "|---|---|---|---|---|"]
    for title, names in groups:
        rows = [by[n] for n in names if n in by]
        if not rows:
            continue
        peer = rows[0]["peer"]
        lines.append("| " + " | ".join([
            title, " / ".join(_fmt(r["raftcron"], r["unit"]) for r in rows),
            f"{peer} " + " / ".join(_fmt(r["peer_value"], r["unit"]) for r in rows),
            " / ".join("-" if r["ratio"] is None else f"{r['ratio']:.2f}" for r in rows),
            _verdicts([r["verdict"] for r in rows])]) + " |")
    return "\n".join(lines)


def _verdicts(vs: list[str]) -> str:
    """"behind by 2.49x / behind by 1.97x" reads "behind by 2.49x / 1.97x"; a verdict repeated is said once."""
    out: list[str] = []
    for i, v in enumerate(vs):
        prev = vs[i - 1] if i else None
        if v == prev and v.startswith("not comparable"):
            continue
        word = v.split(" by ")[0]
        if prev is not None and " by " in v and prev.split(" by ")[0] == word:
            v = v.split(" by ", 1)[1]
        out.append(v)
    return " / ".join(out)


def print_summary(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    print(f"\n{m['cpus']} CPUs, load 1m at start {m['load_at_start']['1m']}, commit {m['commit']}")
    print(table(["measure", "raftcron", "peer", "peer value", "unit", "raftcron / peer", "verdict"],
                [[r["measure"], r["raftcron"], r["peer"], r["peer_value"], r["unit"], r["ratio"], r["verdict"]]
                 for r in doc["summary"]]))


# ---- main ----------------------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a ~5 minute version (repeat 1, 3 kills, rates 100 and 1,000)")
    p.add_argument("--repeat", type=int, default=2, help="write-measure repetitions, order swapped each time (default 2)")
    p.add_argument("--parts", default="writes,failover,lateness", help="comma list of writes, failover, lateness")
    p.add_argument("--seq", type=int, default=300, help="sequential PUTs per cluster (default 300)")
    p.add_argument("--write-seconds", type=float, default=6.0, help="seconds per in-flight level (default 6)")
    p.add_argument("--idle", type=float, default=2.0, help="seconds of idle CPU measured before the writes")
    p.add_argument("--kills", type=int, default=10, help="leader kills per system (default 10), split over --repeat")
    p.add_argument("--writers", type=int, default=8, help="failover: concurrent writers over all members (default 8)")
    p.add_argument("--settle", type=float, default=2.0, help="failover: seconds of writes before each kill")
    p.add_argument("--after", type=float, default=6.0, help="failover: seconds of writes after each kill")
    p.add_argument("--bound", type=float, default=30.0, help="failover: give up waiting for a write after this")
    p.add_argument("--rates", default="100,1000,2000,4000", help="jobs firing every second (default 100,1000,2000,4000)")
    p.add_argument("--modes", default="spread,aligned", help="lateness modes: spread, aligned (default both)")
    p.add_argument("--window", type=float, default=20.0, help="lateness: measured seconds per run (default 20)")
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--drain", type=float, default=4.0)
    p.add_argument("--sink-procs", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep raftcron agents' logs under bench/results/runs/")
    p.add_argument("--out", default=None, help="where the JSON and plots go (default docs/bench; --quick: bench/results/compare-quick)")
    p.add_argument("--from", dest="again", type=Path, default=None, metavar="JSON",
                   help="measure nothing: work out the summary and draw the plots of an earlier run's JSON again, in place")
    p.add_argument("--markdown", action="store_true", help="with --from: print the summary as README's table")
    a = p.parse_args()
    if a.again is not None:
        doc = json.loads(a.again.read_text())
        doc["summary"] = summarise(doc)
        if a.markdown:
            print(markdown(doc["summary"]))
            return
        print_summary(doc)
        a.again.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        from .plots import render
        for written in render(doc, a.again.parent):
            print(f"[bench] drew {written}")
        return
    if a.quick:
        a.repeat, a.seq, a.write_seconds, a.kills, a.rates, a.window, a.after = 1, 100, 3.0, 3, "100,1000", 8.0, 4.0
    a.rates = [int(x) for x in str(a.rates).split(",") if x]
    a.modes = [x for x in str(a.modes).split(",") if x]
    parts = {x for x in a.parts.split(",") if x}
    out_dir = Path(a.out) if a.out else (ROOT / "bench" / "results" / "compare-quick" if a.quick else ROOT / "docs" / "bench")
    etcd_binary()  # fail before anything starts when etcd is missing
    doc: dict[str, Any] = {"benchmark": "compare", "machine": machine(), "params": {**vars(a), "parts": sorted(parts)},
                           "writes": [], "failover": [], "lateness": []}
    t_start = time.monotonic()

    def order(i: int) -> tuple[str, str]:
        return SYSTEMS if i % 2 == 0 else (SYSTEMS[1], SYSTEMS[0])

    if "writes" in parts:
        print(f"[{time.monotonic() - t_start:5.0f}s] writes", flush=True)
        for r in range(a.repeat):
            for system in order(r):
                with started(system, f"writes{r}", a.keep) as store:
                    res = measure_writes(store, a, f"r{r}")
                res["repeat"] = r
                doc["writes"].append(res)
                print(f"    {system:<8} seq p50 {_ms(res['sequential']['p50'])} ms, "
                      + ", ".join(f"{t['inflight']} in flight {t['rate']:.0f}/s" for t in res["throughput"])
                      + f", load {res['load_before']['1m']}", flush=True)
    if "failover" in parts:
        print(f"[{time.monotonic() - t_start:5.0f}s] failover", flush=True)
        per = [a.kills // a.repeat + (1 if r < a.kills % a.repeat else 0) for r in range(a.repeat)]
        for r in range(a.repeat):
            for system in order(r):
                with started(system, f"failover{r}", a.keep) as store:
                    sub = argparse.Namespace(**{**vars(a), "kills": per[r]})
                    res = measure_failover(store, sub, f"f{r}")
                res["repeat"] = r
                doc["failover"].append(res)
    if "lateness" in parts:
        print(f"[{time.monotonic() - t_start:5.0f}s] lateness", flush=True)
        i = 0
        for mode in a.modes:
            for k in a.rates:
                for system in (("apscheduler", "raftcron") if i % 2 == 0 else ("raftcron", "apscheduler")):
                    doc["lateness"].append(measure_lateness(system, k, mode == "aligned", a))
                i += 1
    doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
    doc["machine"]["load_at_end"] = load()
    doc["summary"] = summarise(doc)
    print_summary(doc)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "compare.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"\n[bench] wrote {path}")
    from .plots import render
    for written in render(doc, out_dir):
        print(f"[bench] drew {written}")


if __name__ == "__main__":
    main()
