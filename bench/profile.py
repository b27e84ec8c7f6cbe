"""Where the agents spend their time: py-spy on every agent of a fresh cluster under load.

    pip install -e '.[bench]'     # py-spy
    python -m bench.profile writes      # 64 concurrent PUTs against the leader
    python -m bench.profile runs --rate 1000   # RATE `@every 1s` HTTP jobs to a sink

Samples only threads holding the GIL (``--gil``: CPU, not waits), writes the
collapsed stacks to bench/results/profile-<load>-<node>.txt (feed them to
flamegraph.pl or speedscope) and prints each node's top frames, self and
inclusive.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .api_writes import saturate
from .lateness import SinkFarm, create_jobs
from .rig import RESULTS, CpuMeter, fresh_cluster, leader_of, load


def top(path: Path, n: int = 15) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = stack.split(";")
        own[frames[-1]] += c
        for f in set(frames):
            incl[f] += c

    def share(cnt: Counter[str]) -> list[tuple[str, float]]:
        return [(f, 100.0 * v / total) for f, v in cnt.most_common(n)]

    return total, share(own), share(incl)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("load", choices=("writes", "runs"))
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=1000, help="runs mode: jobs (= runs per second)")
    p.add_argument("--rate-hz", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--inflight", type=int, default=64, help="writes mode: requests in flight (1: sequential)")
    p.add_argument("--blocking", action="store_true",
                   help="pause each agent while sampling it: exact stacks, but the agents run slower")
    a = p.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy not found: pip install -e '.[bench]'")
    RESULTS.mkdir(parents=True, exist_ok=True)
    farm = SinkFarm(2) if a.load == "runs" else None
    info: dict[str, Any] = {"load_before": load()}
    try:
        with fresh_cluster(f"profile-{a.load}") as cluster:
            leader = leader_of(cluster)
            if farm is not None:
                asyncio.run(create_jobs(leader.url, a.rate, farm.url()))
                time.sleep(5)
            outs = {n.name + ("-leader" if n is leader else ""): RESULTS / f"profile-{a.load}-{n.name}.txt" for n in cluster.nodes}
            spies = [subprocess.Popen(["py-spy", "record", "-p", str(n.proc.pid), "-d", str(int(a.seconds)), "-r", str(a.rate_hz),
                                       "-f", "raw", "--gil", *([] if a.blocking else ["--nonblocking"]), "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for n, out in zip(cluster.nodes, outs.values(), strict=False) if n.proc is not None]
            with CpuMeter(cluster) as cpu:
                if a.load == "writes":
                    info["writes"] = asyncio.run(saturate(leader.url, 10**9, a.seconds, a.inflight, "prof"))["rate"]
                for s in spies:
                    s.wait(a.seconds + 60)
            info["cpu"] = cpu.result
    finally:
        if farm is not None:
            farm.stop()
    print(f"load {info['load_before']['1m']}, CPU over the window: {info['cpu']}"
          + (f", {info['writes']:.0f} writes/s" if "writes" in info else ""))
    for name, out in outs.items():
        if not out.exists():
            continue
        total, own, incl = top(out)
        print(f"\n== {name}: {total} samples with the GIL in {a.seconds:g} s at {a.rate_hz} Hz "
              f"({100 * total / (a.seconds * a.rate_hz):.0f}% of the time) -> {out}")
        print("  self:")
        for f, v in own[:10]:
            print(f"    {v:5.1f}%  {f}")
        print("  inclusive (below the thread roots):")
        for f, v in [x for x in incl if x[1] < 99.0][:15]:
            print(f"    {v:5.1f}%  {f}")


if __name__ == "__main__":
    main()
