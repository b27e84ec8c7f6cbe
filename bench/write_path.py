"""Where one sequential write's time goes: the hops of a PUT through the leader and a follower.

``bench.api_writes`` and ``bench.compare`` give a sequential PUT's latency (~2-2.5 ms here,
etcd's ~1.2 ms, the HTTP stack's floor ~0.2-0.55 ms); py-spy gives where CPU goes. This gives
where one request spends its time: the agents run with ``RAFTCRON_TRACE_DIR`` set, so every
process notes the instants it passes the marks of ``raftlog.trace`` (CLOCK_MONOTONIC, one
clock for the whole machine), and each PUT's interval is cut into hops by them:

    client -> http_in -> propose -> send_entries -> tx | rx -> entries_in -> sync ->
    synced -> tx | rx -> ack_in -> apply -> applied -> callback -> settled -> proposed ->
    http_out -> client

(left of ``|`` on the leader, right of it on the follower whose journal held the entry first;
the second ``|`` is the way back). ``woken`` (the raft thread taking a submit's wake-up) is not
in the chain: a raft thread already awake takes the command without it. A hop's figure is the
median over the PUTs of one cluster, then the median over repetitions. A PUT with a mark
missing from its interval (its entries sent with a heartbeat rather than eagerly, an
election) is left out and counted; a mark of something else inside the interval can be taken
for the PUT's own, which the stages are cut to withstand (see ``cut``). Beside the chain: the
leader's own journal sync of the entry (``leader_sync``).

In the same run: the same sequential PUTs to a cluster without marks (what the marks cost),
and to a server that only answers 200 (``bench/floor.py``, the HTTP floor), each repetition.

    python -m bench.write_path              # 3 repetitions of 400 PUTs (~2 minutes)
    python -m bench.write_path --quick      # 1 repetition of 200
    python -m bench.write_path --env PYTHONPATH=/tmp/site   # agents with a sitecustomize of yours

The JSON goes to bench/results/write_path.json (``--ab NAME``: also bench/ab/NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from raftlog.trace import ENV

from .api_writes import job_doc, sequential
from .rig import (
    ab_arg,
    common_args,
    free_port,
    fresh_cluster,
    leader_of,
    load,
    machine,
    spawn,
    stop_process,
    table,
    write_results,
)

WARMUP = 50  # PUTs before the measured ones: connections made, caches warm

# (process, mark) in the order a write passes them; "F" is the follower whose journal held the entry first.
CHAIN: tuple[tuple[str, str], ...] = (
    ("L", "http_in"), ("L", "propose"), ("L", "send_entries"), ("L", "tx"),
    ("F", "rx"), ("F", "entries_in"), ("F", "sync"), ("F", "synced"), ("F", "tx"),
    ("L", "rx"), ("L", "ack_in"), ("L", "apply"), ("L", "applied"), ("L", "callback"), ("L", "settled"),
    ("L", "proposed"), ("L", "http_out"),
)

# Hops grouped for the summary: (name, first hop's start, last hop's end).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("HTTP in (client to handler)", "client", "L:http_in"),
    ("leader: parse, validate, encode the command", "L:http_in", "L:propose"),
    ("leader: to the raft thread, appended", "L:propose", "L:send_entries"),
    ("leader: encode and send the entries", "L:send_entries", "L:tx"),
    ("to the follower (wire, wake-up, decode)", "L:tx", "F:entries_in"),
    ("follower: append", "F:entries_in", "F:sync"),
    ("follower: journal sync", "F:sync", "F:synced"),
    ("follower: answer encoded and sent", "F:synced", "F:tx"),
    ("back to the leader (wire, wake-up, decode)", "F:tx", "L:ack_in"),
    ("leader: commit and apply", "L:ack_in", "L:callback"),
    ("leader: raft thread to event loop", "L:callback", "L:settled"),
    ("leader: answer built", "L:settled", "L:http_out"),
    ("HTTP out (handler to client)", "L:http_out", "client_end"),
)


async def _traced_puts(base: str, n: int, prefix: str) -> list[tuple[int, int]]:
    """``WARMUP + n`` sequential PUTs of new jobs; the (start, end) monotonic ns of the last ``n``."""
    spans: list[tuple[int, int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        for i in range(WARMUP + n):
            name = f"{prefix}-{i:05d}"
            t0 = time.monotonic_ns()
            async with s.put(f"{base}/v1/jobs/{name}", json=job_doc(name)) as resp:
                await resp.read()
                if resp.status not in (200, 201):
                    raise AssertionError(f"PUT {name}: {resp.status}")
            t1 = time.monotonic_ns()
            if i >= WARMUP:
                spans.append((t0, t1))
    return spans


def _marks(trace_dir: Path, pid: int) -> list[tuple[int, str]]:
    """One process's marks, in time order. An agent that had to be killed wrote none (or half a
    line): its PUTs are then left out, not the run."""
    path = trace_dir / f"{pid}.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="ascii", errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            rows.append((int(parts[1]), parts[0]))
    rows.sort()
    return rows


def _next(rows: list[tuple[int, str]], tag: str, after: int, until: int) -> int | None:
    """The first ``tag`` at or after ``after`` and not after ``until``."""
    i = bisect.bisect_left(rows, (after, ""))
    while i < len(rows) and rows[i][0] <= until:
        if rows[i][1] == tag:
            return rows[i][0]
        i += 1
    return None


def chain(start: int, end: int, leader: list[tuple[int, str]],
          followers: list[list[tuple[int, str]]]) -> tuple[list[tuple[str, int]], list[tuple[int, str]]] | None:
    """One PUT's points: ``("client", start)``, then each mark of ``CHAIN`` in turn, the first
    after the one before, then ``("client_end", end)``; with the marks of the follower taken
    (the one whose journal held the entry first: its answer commits it, as a rule). None when a
    mark is missing from the interval, or the entries went out other than by the eager send."""
    points = [("client", start)]
    prev = start
    follower: list[tuple[int, str]] | None = None
    for who, tag in CHAIN:
        if who == "F" and follower is None:
            follower = _first_to_hold(followers, prev, end)
            if follower is None:
                return None
        at = _next(leader if who == "L" else follower or [], tag, prev, end)
        if at is None:
            return None
        points.append((f"{who}:{tag}", at))
        prev = at
    points.append(("client_end", end))
    assert follower is not None
    return points, follower


def _first_to_hold(followers: list[list[tuple[int, str]]], sent: int, end: int) -> list[tuple[int, str]] | None:
    """Of the followers, the one that synced the entries sent at ``sent`` first."""
    synced = []
    for rows in followers:
        got = _next(rows, "entries_in", sent, end)
        done = _next(rows, "synced", got, end) if got is not None else None
        if done is not None:
            synced.append((done, rows))
    return min(synced, key=lambda s: s[0])[1] if synced else None


def cut(spans: list[tuple[int, int]], leader: list[tuple[int, str]],
        followers: list[list[tuple[int, str]]]) -> tuple[dict[str, list[float]], int]:
    """Each PUT's hops in microseconds (``"a->b"``), and how many PUTs were left out (``chain``).

    A mark of something else inside a PUT's interval can be taken for the PUT's own: a frame
    read (``rx``) of a heartbeat, a keepalive or the other follower, say. The stages
    (``STAGES``) are cut so that each ``rx`` falls inside one of them, which such a mix-up
    then leaves whole. A proposal of the leader loop's between the PUT's ``http_in`` and its own
    ``propose`` would be taken for it too; that loop proposes every few seconds at most here."""
    hops: dict[str, list[float]] = {}
    left_out = 0
    for start, end in spans:
        got = chain(start, end, leader, followers)
        if got is None:
            left_out += 1
            continue
        points = got[0]
        for (a, ta), (b, tb) in zip(points, points[1:], strict=False):
            hops.setdefault(f"{a}->{b}", []).append((tb - ta) / 1e3)
    return hops, left_out


def leader_sync(spans: list[tuple[int, int]], leader: list[tuple[int, str]],
                followers: list[list[tuple[int, str]]]) -> dict[str, Any]:
    """The leader's own journal sync of each PUT's entry, for the PUTs ``cut`` keeps (not in the
    chain: Raft lets it run beside the followers'): how long it took, how long after the eager
    send it began, and how often it ended after the first follower's answer had left (the
    leader then takes that answer only once its own sync is done)."""
    took, began, after = [], [], 0
    for start, end in spans:
        got = chain(start, end, leader, followers)
        if got is None:
            continue
        points = dict(got[0])
        sent, answered = points["L:send_entries"], points["F:tx"]
        sync = _next(leader, "disk_sync", sent, end)
        synced = _next(leader, "disk_synced", sync, end) if sync is not None else None
        if sync is None or synced is None:
            continue
        took.append((synced - sync) / 1e3)
        began.append((sync - sent) / 1e3)
        after += synced > answered
    if not took:
        return {"puts": 0}
    return {"puts": len(took), "took_p50_us": round(statistics.median(took), 1),
            "took_p90_us": round(sorted(took)[int(len(took) * 0.9)], 1),
            "began_after_send_p50_us": round(statistics.median(began), 1),
            "ended_after_the_answer_left": round(after / len(took), 3)}


def _stage_us(per_put: dict[str, list[float]]) -> dict[str, float]:
    """Each stage's median over the PUTs: the sum of its hops, PUT by PUT."""
    order = ["client", *(f"{w}:{t}" for w, t in CHAIN), "client_end"]
    out = {}
    for name, first, last in STAGES:
        i, j = order.index(first), order.index(last)
        keys = [f"{a}->{b}" for a, b in zip(order[i:j], order[i + 1:j + 1], strict=True)]
        sums = [sum(vals) for vals in zip(*(per_put[k] for k in keys), strict=True)]
        out[name] = round(statistics.median(sums), 1)
    return out


def one_repetition(r: int, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"repeat": r, "load_before": load()}
    trace_dir = Path(tempfile.mkdtemp(prefix="raftcron-trace-"))
    try:
        with fresh_cluster(f"trace{r}", keep=a.keep, env={**a.agent_env, ENV: str(trace_dir)}) as cluster:
            leader = leader_of(cluster)
            spans = asyncio.run(_traced_puts(leader.url, a.seq, f"tr{r}"))
            pids = {n.name: n.proc.pid for n in cluster.nodes if n.proc is not None}
        # Read once the agents have stopped: each writes its marks out at its exit.
        marks = {name: _marks(trace_dir, pid) for name, pid in pids.items()}
        followers = [m for n, m in marks.items() if n != leader.name]
        per_put, left_out = cut(spans, marks[leader.name], followers)
        own_sync = leader_sync(spans, marks[leader.name], followers)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    client_us = sorted((b - a_) / 1e3 for a_, b in spans)
    out["traced"] = {
        "puts": len(spans), "left_out": left_out, "client_p50_us": round(statistics.median(client_us), 1),
        "hops_p50_us": {k: round(statistics.median(v), 1) for k, v in per_put.items()},
        "hops_p90_us": {k: round(sorted(v)[int(len(v) * 0.9)], 1) for k, v in per_put.items()},
        "stages_p50_us": _stage_us(per_put),
        "leader_sync": own_sync,
    }
    with fresh_cluster(f"plain{r}", keep=a.keep, env=a.agent_env) as cluster:
        plain = asyncio.run(sequential(leader_of(cluster).url, WARMUP + a.seq, f"pl{r}"))
    out["untraced_p50_us"] = round(plain["p50"] * 1e6, 1)
    port = free_port()
    proc = spawn("bench.floor", "--port", str(port))
    try:
        floor = asyncio.run(sequential(f"http://127.0.0.1:{port}", WARMUP + a.seq, f"fl{r}"))
    finally:
        stop_process(proc)
    out["floor_p50_us"] = round(floor["p50"] * 1e6, 1)
    out["load_after"] = load()
    print(f"repeat {r}: traced p50 {out['traced']['client_p50_us']:.0f} us ({left_out} of {len(spans)} left out), "
          f"untraced {out['untraced_p50_us']:.0f} us, floor {out['floor_p50_us']:.0f} us", flush=True)
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    stages = {name: med([r["traced"]["stages_p50_us"][name] for r in runs]) for name, _, _ in STAGES}
    syncs = [r["traced"]["leader_sync"] for r in runs if r["traced"]["leader_sync"]["puts"]]
    return {
        "stages_p50_us": stages, "sum_of_stages_us": round(sum(stages.values()), 1),
        "leader_sync_p50_us": med([s["took_p50_us"] for s in syncs]) if syncs else None,
        "leader_sync_ended_after_the_answer_left":
            round(statistics.median([s["ended_after_the_answer_left"] for s in syncs]), 3) if syncs else None,
        "traced_p50_us": med([r["traced"]["client_p50_us"] for r in runs]),
        "untraced_p50_us": med([r["untraced_p50_us"] for r in runs]),
        "floor_p50_us": med([r["floor_p50_us"] for r in runs]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=3)
    p.add_argument("--seq", type=int, default=400, help="sequential PUTs measured per cluster (default 400)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="more environment for every agent (repeatable), e.g. to try an interpreter setting")
    ab_arg(p)
    a = p.parse_args()
    if bad := [e for e in a.env if "=" not in e]:
        p.error(f"--env takes KEY=VALUE, not {bad[0]!r}")
    a.agent_env = dict(e.split("=", 1) for e in a.env)
    if a.quick:
        a.repeat, a.seq = 1, 200
    doc: dict[str, Any] = {"benchmark": "write_path", "machine": machine(), "params": vars(a), "runs": []}
    for r in range(1, a.repeat + 1):
        doc["runs"].append(one_repetition(r, a))
    doc["summary"] = s = summarise(doc["runs"])
    print()
    print(table(["stage", "p50 us"], [*s["stages_p50_us"].items(), ("sum of the stages", s["sum_of_stages_us"])]))
    if s["leader_sync_p50_us"] is not None:
        print(f"\nthe leader's own journal sync: p50 {s['leader_sync_p50_us']:.0f} us, ended after the first "
              f"follower's answer had left in {s['leader_sync_ended_after_the_answer_left']:.0%} of the PUTs")
    print(f"\nsequential PUT p50: traced {s['traced_p50_us']:.0f} us, untraced {s['untraced_p50_us']:.0f} us, "
          f"HTTP floor {s['floor_p50_us']:.0f} us")
    write_results("write_path", doc, ab=a.ab)


if __name__ == "__main__":
    main()
