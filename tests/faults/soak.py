"""The randomised soak: faults of every kind, one after another, drawn from a seed, then one verdict.

Each round draws a fault (a node isolated, a one-way cut, a flapping link, delay with loss, a
node stopped, a node killed -9 and restarted), holds it a drawn time, undoes it, waits until
the cluster delivers again, and pauses a drawn quiet time. At the end the checker judges every
slot from the first fault's start to the end. The same seed draws the same faults (which node
is the leader at each round is the cluster's doing, not the seed's).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.harness import Node

from .checker import Verdict
from .rig import Rig

KINDS = ("isolate-leader", "isolate-follower", "one-way", "flap", "delay-loss", "stop-leader", "stop-follower",
         "kill-restart")


@dataclass
class Soak:
    seed: int
    minutes: float
    tmp: Path
    say: Callable[[str], None] = print
    done: Counter[str] = field(default_factory=Counter)
    terms: list[int] = field(default_factory=list)

    def run(self, shared: Rig | None = None) -> Verdict:
        """Start a rig (or use ``shared``, already started, left running), inject, judge."""
        rng = random.Random(self.seed)
        rig = shared or Rig(self.tmp)
        try:
            if shared is None:
                rig.start()
            t0 = time.time()
            end = t0 + self.minutes * 60
            longest = min(10.0, max(3.0, self.minutes * 60 / 4))
            for _ in range(int(self.minutes * 60) + 1):  # bounded: every round takes more than a second
                if time.time() >= end:
                    break
                kind = rng.choice(KINDS)
                length = rng.uniform(2.0, longest)
                self.one(rig, rng, kind, length)
                self.done[kind] += 1
                rig.wait_recovered(timeout=120)
                time.sleep(min(rng.uniform(1.0, 4.0), max(0.0, end - time.time())))
            self.terms.append(max(rig.term(n) for n in rig.c.nodes))
            verdict = rig.judge(t0)
            self.say(f"faults: {', '.join(f'{k} {v}' for k, v in sorted(self.done.items()))}; "
                     f"raft term at the end {self.terms[-1]}")
            return verdict
        except BaseException:
            if shared is None:
                self.say(rig.logs())
            raise
        finally:
            if shared is None:
                rig.close()

    def one(self, rig: Rig, rng: random.Random, kind: str, length: float) -> None:
        leader = rig.leader(timeout=120)
        followers = [n for n in rig.c.nodes if n is not leader]
        follower = rng.choice(followers)
        net = rig.net
        start = time.time()
        self.say(f"{time.strftime('%H:%M:%S')} {kind} {length:.1f}s (leader {leader.name}, follower {follower.name})")
        if kind in ("isolate-leader", "isolate-follower"):
            net.isolate(rig.index(leader if kind == "isolate-leader" else follower))
            time.sleep(length)
            net.heal()
        elif kind == "one-way":
            a, b = rng.sample([leader, follower], 2)
            net.cut(rig.index(a), rig.index(b))
            time.sleep(length)
            net.heal()
        elif kind == "flap":
            self.flap(rig, rng, leader, follower, start + length)
        elif kind == "delay-loss":
            net.slow(0.2, 0.1)
            net.lossy(5)
            time.sleep(length)
            net.calm()
        elif kind in ("stop-leader", "stop-follower"):
            node = leader if kind == "stop-leader" else follower
            node.pause()
            try:
                time.sleep(length)
            finally:
                node.resume()
        elif kind == "kill-restart":
            node = rng.choice(rig.c.nodes)
            node.kill9()
            time.sleep(length)
            node.start()
        rig.fault(start, time.time())

    def flap(self, rig: Rig, rng: random.Random, a: Node, b: Node, until: float) -> None:
        i, j = rig.index(a), rig.index(b)
        for _ in range(100):
            if time.time() >= until:
                break
            down = time.time()
            rig.net.cut(i, j)
            rig.net.cut(j, i)
            time.sleep(max(0.0, min(rng.uniform(1.0, 3.0), until - time.time())))
            rig.net.heal()
            rig.fault(down, time.time())
            time.sleep(max(0.0, min(rng.uniform(1.0, 3.0), until - time.time())))
