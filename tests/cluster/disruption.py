"""A follower taken away and given back, and whether the leader survives it.

Used by tests/cluster/test_prevote.py and bench/prevote.py. Two ways to take a follower
away: ``LinkCut`` drops every packet to or from its raft port on 127.0.0.1 (an nftables
table of our own, deleted afterwards), and SIGSTOP. Every wait is bounded.

The cut matches one port, so it must catch every raft link of the follower by that port.
pysyncobj opens one TCP connection per pair of nodes, from the node whose address sorts
higher (``TCPTransport._shouldConnect``): a node whose address sorts lowest among the
members only ever accepts, and each of its links has its own port at one end.
``lowest_follower`` makes that node a follower (by restarting the leader once if it is the
one) before any measured round.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from .harness import Cluster, Node, http, wait_for

__all__ = ["LinkCut", "Round", "agreed", "lowest_follower", "nft_missing", "take_away"]

CUT_SECONDS = 10.0
SETTLE_TIMEOUT = 60.0  # how long the cluster may take to agree again after a heal (a busy box)


def nft_missing() -> str | None:
    """Why a cut cannot be made here, or None when it can."""
    if shutil.which("nft") is None:
        return "nft (the nftables package) is not installed"
    if os.geteuid() != 0:
        return "nftables rules need root"
    return None


class LinkCut:
    """Drop every TCP packet to or from ``port`` on this host while entered.

    The table is named ``prefix`` plus our PID and the port, so concurrent cuts (another
    test, another engineer) never touch each other's rules; it is deleted on exit."""

    def __init__(self, port: int, prefix: str = "rcprevote") -> None:
        self.port = port
        self.table = f"{prefix}_{os.getpid()}_{port}"

    def _nft(self, script: str) -> None:
        done = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True, timeout=20)
        assert done.returncode == 0, f"nft failed ({done.returncode}): {done.stderr.strip()}\n{script}"

    def __enter__(self) -> LinkCut:
        # On loopback every packet passes the input hook once: dropping there in both
        # directions of the port cuts the links however they were opened.
        self._nft(
            f"table inet {self.table} {{\n"
            f"  chain input {{ type filter hook input priority -10; policy accept;\n"
            f"    tcp dport {self.port} drop\n"
            f"    tcp sport {self.port} drop\n"
            f"  }}\n"
            f"}}\n"
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        self._nft(f"delete table inet {self.table}\n")


def view(node: Node) -> dict[str, Any]:
    status, body = http("GET", node.url + "/v1/cluster", timeout=3)
    assert status == 200, f"GET /v1/cluster on {node.name}: {status} {body}"
    return dict(body)


def agreed(cluster: Cluster) -> tuple[str, int] | None:
    """(leader's name, term) when every live node names the same leader at the same term,
    the leader sees every other live node reachable, and has a quorum; else None."""
    live = cluster.live()
    addrs = {n.raft_addr for n in live}
    views = {n.name: view(n) for n in live}
    pairs = {((v.get("leader") or {}).get("node_id"), v["term"]) for v in views.values()}
    if len(pairs) != 1:
        return None
    leader, term = pairs.pop()
    lead = views.get(leader) if leader else None
    if lead is None or lead["state"] != "leader" or not lead["has_quorum"]:
        return None
    if not all(m["reachable"] for m in lead["members"] if m["raft_addr"] in addrs):
        return None
    return leader, int(term)


def lowest_follower(cluster: Cluster, timeout: float = 90.0) -> Node:
    """The node whose raft address sorts lowest, made a follower (see the module docstring)."""
    low = min(cluster.nodes, key=lambda n: n.raft_addr)
    settled = wait_for("the cluster to agree on a leader", lambda: agreed(cluster), timeout)
    if settled[0] == low.name:
        low.kill9()
        wait_for("a new leader among the others", lambda: agreed(cluster), timeout)
        low.start()
        settled = wait_for("the restarted node to follow", lambda: agreed(cluster), timeout)
        assert settled[0] != low.name, f"{low.name} led again after its restart"
    return low


@dataclass(frozen=True, slots=True)
class Round:
    how: str  # cut | pause | restart
    leader_before: str
    term_before: int
    leader_after: str
    term_after: int
    went_away_s: float  # until the leader saw the follower unreachable (cut) or 0 (pause, restart)
    settled_s: float  # from the heal until the cluster agreed again

    @property
    def elections(self) -> int:
        return self.term_after - self.term_before

    @property
    def disrupted(self) -> bool:
        return self.elections > 0 or self.leader_after != self.leader_before

    def line(self) -> str:
        return (f"{self.how}: leader {self.leader_before}->{self.leader_after} term {self.term_before}->"
                f"{self.term_after} (settled {self.settled_s:.1f}s after the heal)")


def take_away(cluster: Cluster, follower: Node, how: str, seconds: float = CUT_SECONDS,
              settle_timeout: float = SETTLE_TIMEOUT) -> Round:
    """Cut (``how="cut"``) or SIGSTOP (``"pause"``) ``follower`` for ``seconds``, or kill -9 it and
    start it again at once (``"restart"``); give it back and wait until the cluster agrees on a
    leader again. The terms before and after say whether it took an election."""
    leader_before, term_before = wait_for("the cluster to agree before the round", lambda: agreed(cluster),
                                          settle_timeout)
    assert leader_before != follower.name, f"{follower.name} leads; it must be a follower"
    # A node asks only the peers it heard announce pre-vote (keepalives, every 0.5 s): one
    # restarted a moment ago has not heard them yet. Agents without the field have no pre-vote.
    wait_for(f"{follower.name} to hear its peers announce pre-vote",
             lambda: all(m.get("prevote", True) for m in view(follower)["members"]), settle_timeout)
    lead = cluster.by_name(leader_before)
    started = time.monotonic()
    went_away = 0.0
    if how == "cut":
        with LinkCut(follower.raft_port):
            wait_for(f"{leader_before} to see {follower.name} unreachable",
                     lambda: not next(m["reachable"] for m in view(lead)["members"]
                                      if m["raft_addr"] == follower.raft_addr), seconds + 20.0)
            went_away = time.monotonic() - started
            time.sleep(max(0.0, seconds - went_away))  # the fault's length itself, not a wait for a state
    elif how == "pause":
        follower.pause()
        try:
            time.sleep(seconds)  # the fault's length itself
        finally:
            follower.resume()
    elif how == "restart":
        follower.kill9()
        follower.start()  # at once: its journal holds the term it had, and it has heard no one yet
    else:
        raise ValueError(f"unknown way to take a follower away: {how!r}")
    healed = time.monotonic()
    leader_after, term_after = wait_for("the cluster to agree after the heal", lambda: agreed(cluster), settle_timeout)
    return Round(how, leader_before, term_before, leader_after, term_after, round(went_away, 2),
                 round(time.monotonic() - healed, 2))


def fail_over(cluster: Cluster, timeout: float = 60.0) -> tuple[Node, Node, float]:
    """kill -9 the leader; (the killed node, the new leader, seconds until the survivors agreed
    on it). The killed node is left down."""
    leader_name, _term = wait_for("the cluster to agree before the kill", lambda: agreed(cluster), timeout)
    old = cluster.by_name(leader_name)
    started = time.monotonic()
    old.kill9()
    new_name, _ = wait_for("the survivors to elect a leader", lambda: agreed(cluster), timeout, interval=0.02)
    return old, cluster.by_name(new_name), time.monotonic() - started
