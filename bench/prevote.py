"""Pre-vote, A/B: elections caused by a returning follower, and failover time.

For each side (this tree, and with ``--baseline PATH`` a checkout without pre-vote, e.g. a
worktree of main), on one fresh 3-node cluster whose agents run that side's code:

1. ``--cuts`` rounds: the follower whose raft address sorts lowest is cut off for
   ``--seconds`` (nftables drops its raft port; needs root and nft), then healed; a round
   took an election when the leader or its term changed (tests/cluster/disruption.py);
2. ``--pauses`` rounds: the same follower SIGSTOPed for ``--seconds``, then SIGCONT;
3. ``--kills`` times: kill -9 the leader, time from the kill to the first PUT answered 2xx
   (a PUT every 20 ms at the survivors, as bench.failover), restart it, wait until it caught up.

The harness and this script come from this tree either way; only the agents differ (each
node is started with the side's directory as its working directory). ``--parallel`` runs
the two sides at once, so both see the same machine load.

    python -m bench.prevote --baseline /path/to/main-worktree --parallel      # 20/20/10, ~15 min
    python -m bench.prevote --baseline /path/to/main-worktree --cuts 3 --pauses 3 --kills 3
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.cluster.disruption import Round, agreed, lowest_follower, nft_missing, take_away
from tests.cluster.harness import ROOT, Cluster, Node, wait_for

from .failover import _first_write
from .rig import AGENT_FLAGS, SECRET, caught_up, load, machine, pct, table, write_results


def _start_in(node: Node, root: Path) -> None:
    """Node.start with ``root`` as the agent's working directory, so ``python -m api.cli``
    imports that tree's code."""
    assert node.proc is None or node.proc.poll() is not None, f"{node.name} is already running"
    with open(node.log_path, "ab") as log:
        node.proc = subprocess.Popen([sys.executable, "-m", "api.cli", "agent", *node.args], cwd=root,
                                     env=node.env, stdout=log, stderr=subprocess.STDOUT)


def _cluster(label: str, root: Path) -> tuple[Cluster, Path]:
    tmp = Path(tempfile.mkdtemp(prefix=f"raftcron-bench-prevote-{label}-"))
    cluster = Cluster.create(tmp, 3, secret=SECRET, extra=list(AGENT_FLAGS))
    for node in cluster.nodes:
        node.start = (lambda n=node: _start_in(n, root))  # type: ignore[method-assign]
    cluster.start()
    cluster.wait_registered(timeout=90)
    return cluster, tmp


def _rounds(cluster: Cluster, how: str, count: int, seconds: float, label: str) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        # Each round: an election in the previous one may have made the lowest node leader
        # (then it is restarted once, outside the measured round).
        follower = lowest_follower(cluster)
        r: Round = take_away(cluster, follower, how, seconds)
        out.append({"how": how, "leader_before": r.leader_before, "leader_after": r.leader_after,
                    "term_before": r.term_before, "term_after": r.term_after, "elections": r.elections,
                    "disrupted": r.disrupted, "went_away_s": r.went_away_s, "settled_s": r.settled_s,
                    "load_1m": load()["1m"]})
        print(f"[{label}] {how} {i + 1}/{count}: {r.line()}", flush=True)
    return out


def _kills(cluster: Cluster, count: int, label: str) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        leader_name, _ = wait_for("the cluster to agree before the kill", lambda: agreed(cluster), 90)
        leader = cluster.by_name(leader_name)
        survivors = [n for n in cluster.nodes if n is not leader]
        kill_at = time.monotonic()
        leader.kill9()
        res = asyncio.run(_first_write(survivors, kill_at, f"pv{label}{i}"))
        leader.start()
        caught_up(cluster, leader, timeout=90)
        wait_for("the cluster to agree after the restart", lambda: agreed(cluster), 90)
        seconds = res.get("seconds")
        out.append({"seconds": seconds, "via": res.get("via"), "load_1m": load()["1m"]})
        print(f"[{label}] kill {i + 1}/{count}: first write {seconds if seconds is None else round(seconds, 3)} s",
              flush=True)
    return out


def run_side(label: str, root: Path, a: argparse.Namespace) -> dict[str, Any]:
    cluster, tmp = _cluster(label, root)
    try:
        cuts = _rounds(cluster, "cut", a.cuts, a.seconds, label) if a.cuts else []
        pauses = _rounds(cluster, "pause", a.pauses, a.seconds, label) if a.pauses else []
        kills = _kills(cluster, a.kills, label)
    finally:
        cluster.stop()
    if a.keep:
        print(f"[{label}] logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"label": label, "root": str(root), "cuts": cuts, "pauses": pauses, "kills": kills}


def _row(side: dict[str, Any]) -> list[Any]:
    def calm(rounds: list[dict[str, Any]]) -> str:
        return f"{sum(not r['disrupted'] for r in rounds)}/{len(rounds)}" if rounds else "-"

    def elections(rounds: list[dict[str, Any]]) -> int:
        return sum(r["elections"] for r in rounds)

    fo = [k["seconds"] for k in side["kills"] if k["seconds"] is not None]
    p50, p90 = pct(fo, 50), pct(fo, 90)
    return [side["label"], calm(side["cuts"]), elections(side["cuts"]), calm(side["pauses"]),
            elections(side["pauses"]), f"{len(fo)}/{len(side['kills'])}",
            None if p50 is None else round(p50, 3), None if p90 is None else round(p90, 3),
            round(max(fo), 3) if fo else None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, help="a checkout without pre-vote (e.g. a worktree of main)")
    p.add_argument("--cuts", type=int, default=20)
    p.add_argument("--pauses", type=int, default=20)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--seconds", type=float, default=10.0, help="how long a follower is away (default 10)")
    p.add_argument("--parallel", action="store_true", help="run both sides at once")
    p.add_argument("--keep", action="store_true", help="keep the clusters' data and logs")
    a = p.parse_args()
    if a.cuts and (missing := nft_missing()):
        p.error(f"the cut rounds cannot run: {missing} (use --cuts 0)")
    sides = [("prevote", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    doc: dict[str, Any] = {"machine": machine(), "args": {k: str(v) for k, v in vars(a).items()}}
    def side(label: str, root: Path) -> dict[str, Any]:
        try:
            return run_side(label, root, a)
        except Exception as exc:  # noqa: BLE001 - the other side's figures are still worth printing
            print(f"[{label}] failed: {exc!r}", flush=True)
            return {"label": label, "root": str(root), "error": repr(exc), "cuts": [], "pauses": [], "kills": []}

    if a.parallel and len(sides) > 1:
        with ThreadPoolExecutor(len(sides)) as pool:
            results = list(pool.map(lambda s: side(*s), sides))
    else:
        results = [side(label, root) for label, root in sides]
    doc["sides"] = results
    print()
    print(table(["side", "cuts calm", "cut elections", "pauses calm", "pause elections", "failovers",
                 "failover p50 s", "p90 s", "max s"], [_row(s) for s in results]))
    write_results("prevote", doc)


if __name__ == "__main__":
    main()
