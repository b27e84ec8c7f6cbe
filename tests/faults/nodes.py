"""Agents started inside the namespaces of a :class:`~tests.faults.network.Network`.

The harness's Node and Cluster, with each agent bound to its namespace's address: the same
raft and HTTP ports in every namespace, so a node restarted finds its port free, and every
peer dials one raft address per node whatever the faults.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.harness import ROOT, Cluster, Node

from .network import Network

RAFT_PORT, HTTP_PORT = 7000, 8000


@dataclass
class NsNode(Node):
    ns: str = ""
    address: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.http_port}"

    @property
    def raft_addr(self) -> str:
        return f"{self.address}:{self.raft_port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        with open(self.log_path, "ab") as log:
            # `ip netns exec` execs the agent after entering the namespace: the PID is the agent's,
            # so kill -9, SIGSTOP and SIGCONT reach it and nothing else.
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-m", "api.cli", "agent",
                                          *self.args], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)


def build(net: Network, tmp: Path, *, lease: str = "2s", extra: list[str] | None = None,
          secret: str = "fault-suite-secret-of-at-least-32-bytes!") -> Cluster:
    """A cluster of ``net.size`` agents, one per namespace, not started."""
    tmp.mkdir(parents=True, exist_ok=True)
    nodes: list[Node] = []
    for i in range(net.size):
        addr = net.address(i)
        peers = ",".join(f"{net.address(j)}:{RAFT_PORT}" for j in range(net.size) if j != i)
        args = ["--node-id", f"n{i + 1}", "--raft-addr", f"{addr}:{RAFT_PORT}", "--peers", peers,
                "--http-addr", f"{addr}:{HTTP_PORT}", "--data-dir", str(tmp / f"n{i + 1}"), "--lease", lease,
                *(extra or [])]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTCRON_")}
        env.update(RAFTCRON_SECRET=secret, PYTHONUNBUFFERED="1")
        nodes.append(NsNode(f"n{i + 1}", RAFT_PORT, HTTP_PORT, tmp / f"n{i + 1}", tmp / f"n{i + 1}.log", args, env,
                            ns=net.ns(i), address=addr))
    return Cluster(nodes, secret, extra or [])


def index(cluster: Cluster, node: Node) -> int:
    """The node's place in the network (n1 is 0)."""
    return cluster.nodes.index(node)
