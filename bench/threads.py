"""Where each agent's CPU goes, thread by thread: idle, then under writes at the leader.

On each of ``--repeat`` fresh 3-node clusters: every thread's CPU time (user and system, from
``/proc/<pid>/task/<tid>/stat``) over ``--idle`` seconds of an idle cluster, then over
``--seconds`` of ``--inflight`` concurrent PUTs to the leader (after 3 s of the same load not
counted). Threads are named as the OS shows them: ``main`` is the event loop (the process's
first thread), ``raftcron-raft`` the raft thread, others by their name (``python`` when
unnamed). Reported per node and role: cores while idle, and per write the CPU of each thread.
CPU of threads that ended between the two readings (what the process's own counters hold beyond
its threads', user and system together) is ``(ended threads)``.

    python -m bench.threads                 # 3 clusters, ~2 minutes
    python -m bench.threads --ab NAME       # and copy the JSON to bench/ab/NAME.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from .api_writes import saturate
from .rig import ab_arg, common_args, fresh_cluster, leader_of, machine, median_of, table, write_results

TICKS = os.sysconf("SC_CLK_TCK")


def thread_times(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, float, float]]:
    """Every thread of ``pid``: tid -> (name, user seconds, system seconds); ``main`` for the
    first thread. Threads that end while read are left out."""
    out: dict[int, tuple[str, float, float]] = {}
    try:
        tids = os.listdir(proc / str(pid) / "task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = (proc / str(pid) / "task" / tid / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        utime, stime = int(fields[11]) / TICKS, int(fields[12]) / TICKS  # stat's fields 14 and 15
        out[int(tid)] = ("main" if int(tid) == pid else name, utime, stime)
    return out


def process_times(pid: int, proc: Path = Path("/proc")) -> tuple[float, float] | None:
    """The whole process's user and system seconds: its threads', with those of threads that
    ended (``/proc/<pid>/stat``); None for a process gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


ENDED = "(ended threads)"


Reading = tuple[tuple[float, float] | None, tuple[float, float] | None]
"""The process's own times (``process_times``) just before and just after its threads were read."""


def spent(before: dict[int, tuple[str, float, float]], after: dict[int, tuple[str, float, float]],
          whole: tuple[Reading, Reading] | None = None) -> dict[str, dict[str, float]]:
    """CPU seconds between two readings, summed by thread name: {name: {"user", "system"}}.

    With ``whole`` (the process's own times around each reading), what the process spent beyond
    its threads read in both goes to ``ENDED``: a thread that ended between the readings is not
    in the second, and one that began and ended between them is in neither. Counted from the end
    of the first reading to the start of the second, so the CPU spent while the threads were
    being read is never taken for an ended thread's, and only beyond a tick a thread (the
    kernel's rounding of each). It is user and system together, as ``user``: the kernel divides
    the two for each thread and for the process apart, and they disagree by more than that."""
    by_name: dict[str, dict[str, float]] = {}
    for tid, (name, user, system) in after.items():
        _, user0, system0 = before.get(tid, (name, 0.0, 0.0))
        row = by_name.setdefault(name, {"user": 0.0, "system": 0.0})
        row["user"] += user - user0
        row["system"] += system - system0
    if whole is not None:
        (_, first_done), (last_begun, _) = whole
        if first_done is not None and last_begun is not None:
            threads = sum(r["user"] + r["system"] for r in by_name.values())
            ended = sum(last_begun) - sum(first_done) - threads
            if ended > (len(after) + 1) / TICKS:
                by_name[ENDED] = {"user": ended, "system": 0.0}
    return {name: {k: round(v, 3) for k, v in row.items()} for name, row in by_name.items()}


def one_repetition(r: int, a: argparse.Namespace) -> dict[str, Any]:
    with fresh_cluster(f"threads-{r}", keep=a.keep) as cluster:
        leader = leader_of(cluster)
        pids = {n.name: n.proc.pid for n in cluster.nodes if n.proc is not None}
        roles = {n.name: "leader" if n is leader else "follower" for n in cluster.nodes}
        time.sleep(2.0)  # the start's own work settles
        def read() -> dict[str, tuple[dict[int, tuple[str, float, float]], Reading]]:
            out = {}
            for n, pid in pids.items():
                begun = process_times(pid)
                threads = thread_times(pid)
                out[n] = (threads, (begun, process_times(pid)))
            return out

        def between(first: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
            return {n: spent(first[n][0], last[n][0], (first[n][1], last[n][1])) for n in pids}

        before = read()
        time.sleep(a.idle)
        idle = between(before, read())
        asyncio.run(saturate(leader.url, 10**9, 3.0, a.inflight, f"warm{r}"))
        before = read()
        t0 = time.monotonic()
        load = asyncio.run(saturate(leader.url, 10**9, a.seconds, a.inflight, f"t{r}"))
        wall = time.monotonic() - t0
        busy = between(before, read())
    writes = load["ok"]
    run = {"repetition": r, "roles": roles, "idle_seconds": a.idle, "load_seconds": round(wall, 3), "writes": writes,
           "writes_per_s": round(writes / wall, 1), "errors": load["errors"], "idle": idle, "load": busy}
    print(f"[bench] repetition {r}: {run['writes_per_s']:.0f} writes/s; idle: "
          + ", ".join(f"{n} {sum(t['user'] + t['system'] for t in idle[n].values()) / a.idle:.3f} cores" for n in pids))
    return run


def per_write_us(run: dict[str, Any], node: str, name: str) -> float | None:
    row = run["load"][node].get(name)
    if row is None or not run["writes"]:
        return None
    return 1e6 * (row["user"] + row["system"]) / run["writes"]


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions, by role: the leader, and the followers taken together."""
    def by_role(run: dict[str, Any], role: str) -> list[str]:
        return [n for n, r in run["roles"].items() if r == role]

    out: dict[str, Any] = {"writes_per_s": median_of(r["writes_per_s"] for r in runs)}
    out["idle_cores_three"] = median_of(
        sum(t["user"] + t["system"] for n in r["idle"] for t in r["idle"][n].values()) / r["idle_seconds"] for r in runs)
    for role in ("leader", "follower"):
        names = sorted({name for r in runs for n in by_role(r, role) for name in r["load"][n]})
        out[f"{role}_us_per_write"] = {
            name: median_of(per_write_us(r, n, name) for r in runs for n in by_role(r, role)) for name in names}
        out[f"{role}_system_us_per_write"] = median_of(
            1e6 * sum(t["system"] for t in r["load"][n].values()) / r["writes"]
            for r in runs for n in by_role(r, role) if r["writes"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=3)
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of writes measured per cluster (default 10)")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of the idle cluster measured first (default 10)")
    p.add_argument("--inflight", type=int, default=64, help="concurrent PUTs to the leader (default 64)")
    ab_arg(p)
    a = p.parse_args()
    if a.quick:
        a.repeat, a.seconds, a.idle = 1, 5.0, 5.0
    doc: dict[str, Any] = {"benchmark": "threads", "machine": machine(), "params": vars(a), "runs": []}
    for r in range(1, a.repeat + 1):
        doc["runs"].append(one_repetition(r, a))
    doc["summary"] = s = summarise(doc["runs"])
    rows = [(role, name, f"{us:.0f}" if us is not None else "-")
            for role in ("leader", "follower") for name, us in s[f"{role}_us_per_write"].items()]
    print()
    print(table(["role", "thread", "CPU us per write (median)"], rows))
    print(f"\nwrites/s {s['writes_per_s']:.0f}; three idle agents {s['idle_cores_three']:.3f} cores; "
          f"system time per write: leader {s['leader_system_us_per_write']:.0f} us, "
          f"a follower {s['follower_system_us_per_write']:.0f} us")
    write_results("threads", doc, ab=a.ab)


if __name__ == "__main__":
    main()
