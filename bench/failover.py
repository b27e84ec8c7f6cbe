"""Leader failover time, and elections nobody asked for.

On one fresh 3-node cluster:

1. Spurious elections: every node's ``term`` (GET /v1/cluster) sampled every
   0.2 s for ``--idle`` seconds with the cluster idle, then for ``--load``
   seconds while 64 concurrent PUTs run against the leader (the api_writes
   load). Every increase of the highest term seen is an election; none was
   caused by us.
2. Failover: ``--jobs`` `@every 1s` jobs keep the cluster doing real work (HTTP
   to a sink process); then, ``--kills`` times: kill -9 the leader, fire a PUT
   every 20 ms at the survivors (alternating, not waiting for the previous one)
   and take the time from the kill to the first PUT answered 2xx; restart the
   killed node and wait until it has applied what the leader had committed.
   The whole run stops at ``--cap`` seconds, whatever the count.

    python -m bench.failover              # 20 kills, ~5 minutes
    python -m bench.failover --quick      # 5 kills, shorter samples, ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import aiohttp

from tests.cluster.harness import Cluster, Node, http

from .api_writes import job_doc, saturate
from .lateness import SinkFarm, every_job
from .rig import (
    caught_up,
    common_args,
    fresh_cluster,
    leader_of,
    load,
    machine,
    pct,
    summary,
    table,
    term_of,
    write_results,
)

GOAL_MEDIAN, GOAL_MAX = 1.0, 3.0


class TermSampler:
    """Samples every node's term in a thread; counts the elections seen."""

    def __init__(self, nodes: list[Node], interval: float = 0.2) -> None:
        self.nodes, self.interval = nodes, interval
        self.samples: list[tuple[float, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for n in self.nodes:
                try:
                    status, body = http("GET", n.url + "/v1/cluster", timeout=1.0)
                except OSError:
                    continue
                if status == 200:
                    self.samples.append((time.monotonic(), n.name, int(body["term"])))
            self._stop.wait(self.interval)

    def __enter__(self) -> TermSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def result(self) -> dict[str, Any]:
        terms = [t for _, _, t in self.samples]
        changes, highest = 0, None
        for _, _, t in sorted(self.samples):
            if highest is not None and t > highest:
                changes += t - highest
            highest = t if highest is None else max(highest, t)
        return {"samples": len(self.samples), "first_term": terms[0] if terms else None,
                "last_term": max(terms) if terms else None, "term_changes": changes}


async def _first_write(nodes: list[Node], kill_at: float, tag: str, every: float = 0.02, bound: float = 30.0) -> dict[str, Any]:
    """Fire a PUT every ``every`` s at the nodes in turn; when does the first one come back 2xx?"""
    done = asyncio.Event()
    first: dict[str, Any] = {}
    statuses: dict[str, int] = {}
    first_any: dict[str, float] = {}

    async def one(s: aiohttp.ClientSession, node: Node, i: int, sent: float) -> None:
        name = f"{tag}-{i}"
        try:
            async with s.put(f"{node.url}/v1/jobs/{name}", json=job_doc(name)) as r:
                await r.read()
                code = r.status
        except (TimeoutError, aiohttp.ClientError):
            code = 0
        statuses[str(code)] = statuses.get(str(code), 0) + 1
        if code and "first_answer_s" not in first_any:
            first_any["first_answer_s"] = round(time.monotonic() - kill_at, 3)
        if code in (200, 201) and not first:
            first.update({"seconds": time.monotonic() - kill_at, "via": node.name, "sent_after": round(sent - kill_at, 3)})
            done.set()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        tasks = []
        i = 0
        while not done.is_set() and time.monotonic() - kill_at < bound:
            sent = time.monotonic()
            tasks.append(asyncio.create_task(one(s, nodes[i % len(nodes)], i, sent)))
            i += 1
            try:
                await asyncio.wait_for(done.wait(), every)
            except TimeoutError:
                pass
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {**first, **first_any, "puts_sent": i, "answers": statuses}


def kill_loop(cluster: Cluster, a: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    kills: list[dict[str, Any]] = []
    for k in range(a.kills):
        if time.monotonic() > deadline:
            print(f"  stopping after {k} kills: the {a.cap:g} s cap is reached", flush=True)
            break
        leader = leader_of(cluster)
        time.sleep(a.settle)
        survivors = [n for n in cluster.nodes if n is not leader]
        term = leader.get("/v1/cluster")["term"]
        kill_at = time.monotonic()
        leader.kill9()
        res = asyncio.run(_first_write(survivors, kill_at, f"fo{k}"))
        res.update({"kill": k, "killed": leader.name, "term_before": term, "load": load()})
        res["term_after_failover"] = max((t for n in survivors if (t := term_of(n)) is not None), default=None)
        t_restart = time.monotonic()
        leader.start()
        try:
            caught_up(cluster, leader, timeout=60)
        except AssertionError as exc:
            res["restart_error"] = str(exc)
        res["restart_caught_up_s"] = round(time.monotonic() - t_restart, 3)
        res["term_after_restart"] = max((t for n in cluster.nodes if (t := term_of(n)) is not None), default=None)
        kills.append(res)
        print(f"  kill {k}: {leader.name} -> first write after {res.get('seconds', float('nan')):.3f} s "
              f"(via {res.get('via')}), node back and caught up in {res['restart_caught_up_s']} s, load {res['load']['1m']}",
              flush=True)
    return kills


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, repeat=1)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--cap", type=float, default=480.0, help="seconds: the whole run stops by then (default 480)")
    p.add_argument("--idle", type=float, default=60.0, help="seconds of idle term sampling (default 60)")
    p.add_argument("--load", type=float, default=20.0, help="seconds of term sampling under write load (default 20)")
    p.add_argument("--jobs", type=int, default=20, help="`@every 1s` jobs running during the kills (default 20)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds a leader leads before it is killed (default 2)")
    a = p.parse_args()
    if a.quick:
        a.kills, a.idle, a.load, a.cap = 5, 15.0, 6.0, 120.0
    t_start = time.monotonic()
    deadline = t_start + a.cap
    doc: dict[str, Any] = {"benchmark": "failover", "machine": machine(), "params": vars(a)}
    farm = SinkFarm(1)
    try:
        with fresh_cluster("failover", keep=a.keep) as cluster:
            leader_of(cluster)
            print(f"idle: sampling terms for {a.idle:g} s", flush=True)
            doc["idle_load"] = load()
            with TermSampler(cluster.nodes) as idle:
                time.sleep(a.idle)
            doc["idle"] = idle.result()
            leader = leader_of(cluster)
            print(f"load: sampling terms for {a.load:g} s of 64 concurrent PUTs", flush=True)
            doc["write_load_load"] = load()
            with TermSampler(cluster.nodes) as busy:
                doc["write_load"] = asyncio.run(saturate(leader.url, 10**9, a.load, 64, "fl"))
            doc["write_load"]["terms"] = busy.result()
            for i in range(a.jobs):
                cluster.put_job(every_job(f"bg{i}", farm.url()), via=leader_of(cluster))
            print(f"kills: up to {a.kills}, cap {a.cap:g} s", flush=True)
            doc["kills"] = kill_loop(cluster, a, deadline)
    finally:
        farm.stop()
    times = [k["seconds"] for k in doc["kills"] if "seconds" in k]
    doc["failover"] = {**summary(times), "kills": len(doc["kills"]), "no_write_within_bound": len(doc["kills"]) - len(times)}
    ks = [k for k in doc["kills"] if k.get("term_after_failover") and k.get("term_after_restart")]
    doc["elections"] = {
        "per_failover": [k["term_after_failover"] - k["term_before"] for k in ks],
        "caused_by_the_restarted_node": sum(k["term_after_restart"] - k["term_after_failover"] for k in ks),
    }
    doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
    f = doc["failover"]
    print()
    print(table(["measure", "value", "goal"], [
        ["kills", f["kills"], ">= 20"],
        ["failover median s", _s(f["p50"]), f"<= {GOAL_MEDIAN:g}"],
        ["failover p90 s", _s(f["p90"]), ""],
        ["failover max s", _s(f["max"]), f"<= {GOAL_MAX:g}"],
        ["kills without a write in 30 s", f["no_write_within_bound"], "0"],
        ["term increments per failover (median)", pct(doc["elections"]["per_failover"], 50), "1"],
        ["term increments while the killed node rejoined", doc["elections"]["caused_by_the_restarted_node"], "0"],
        ["restart to caught up s (median / max)",
         f"{pct([k['restart_caught_up_s'] for k in doc['kills']], 50)} / {max((k['restart_caught_up_s'] for k in doc['kills']), default=None)}", ""],
        [f"term changes, {a.idle:g} s idle", doc["idle"]["term_changes"], "0"],
        [f"term changes, {a.load:g} s of write load", doc["write_load"]["terms"]["term_changes"], "0"],
        ["writes/s during that load", round(doc["write_load"]["rate"]), ""],
        ["load 1m (idle / write load / kills)",
         f"{doc['idle_load']['1m']} / {doc['write_load_load']['1m']} / "
         f"{round(pct([k['load']['1m'] for k in doc['kills']], 50) or 0, 2) if doc['kills'] else '-'}", ""],
    ]))
    write_results("failover", doc)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
