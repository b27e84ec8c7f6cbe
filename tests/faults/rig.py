"""A fault rig: a three-node cluster in namespaces, the receiver, two jobs, and the judge.

Both the network tests and the soak use it: start, inject faults through ``net`` and the
nodes' signals, note each fault's interval, then ``judge`` the window by the checker.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.harness import Cluster, Node, Sink, job_doc, wait_for

from .checker import Expect, Verdict, check
from .network import Network, missing_tools
from .nodes import build

LEASE = 2.0  # seconds: a short lease keeps each fault test short
JOBS = [Expect("alo", "at-least-once"), Expect("amo", "at-most-once")]
FIGURES: list[str] = []  # lines the suite quotes at its end (the conftest prints them)


def require_tools() -> str | None:
    """None when the rig can run here, else why not (what is missing)."""
    missing = missing_tools()
    return f"the fault suite needs {', '.join(missing)}" if missing else None


def required() -> bool:
    """Under CI=1 a fault test that cannot run fails instead of skipping."""
    return os.environ.get("CI", "") not in ("", "0")


@dataclass
class Rig:
    tmp: Path
    net: Network = field(default_factory=lambda: Network(3))
    sink: Sink | None = None
    cluster: Cluster | None = None
    faults: list[tuple[float, float]] = field(default_factory=list)

    def start(self) -> Rig:
        self.net.setup()
        self.sink = Sink(host=self.net.host)
        self.cluster = build(self.net, self.tmp, lease=f"{LEASE:g}s").start()
        self.cluster.wait_registered(timeout=60)
        for expect in JOBS:
            self.cluster.put_job(job_doc(expect.name, self.sink.url(f"/{expect.name}"), "@every 1s",
                                         delivery=expect.delivery, timeout="5s",
                                         catchup={"policy": "all", "window": "5m"},
                                         history={"keep": 10000}), timeout=60)
        for expect in JOBS:
            wait_for(f"a delivery of {expect.name}", functools.partial(self.delivered, expect.name), timeout=60)
        return self

    @property
    def c(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def s(self) -> Sink:
        assert self.sink is not None
        return self.sink

    def delivered(self, job: str, after: float = 0.0) -> int:
        return sum(1 for d in self.s.of(job) if d.at > after)

    def index(self, node: Node) -> int:
        return self.c.nodes.index(node)

    def status(self, node: Node) -> dict[str, Any]:
        """A node's own view: its leader, term and commit index (``/v1/cluster``)."""
        body: dict[str, Any] = node.get("/v1/cluster", timeout=3)
        return body

    def leader(self, timeout: float = 60.0) -> Node:
        return self.c.leader(timeout=timeout)

    def term(self, node: Node) -> int:
        return int(self.status(node)["term"])

    def fault(self, start: float, end: float) -> None:
        self.faults.append((start, end))

    def wait_recovered(self, timeout: float = 90.0) -> Node:
        """Every node up, one leader they agree on, and a slot delivered after now."""
        leader = self.leader(timeout)
        since = time.time()
        for expect in JOBS:
            wait_for(f"{expect.name} delivered again after the fault",
                     functools.partial(self.delivered, expect.name, since), timeout=timeout)
        return leader

    def judge(self, t0: float, t1: float | None = None, settle_timeout: float = 90.0) -> Verdict:
        """The checker's verdict on the slots from ``t0`` to ``t1`` (default: now less a second)."""
        end = (time.time() - 1.0) if t1 is None else t1
        return check(self.s, self.c, JOBS, (t0, end), faults=self.faults, lease=LEASE, settle_timeout=settle_timeout)

    def logs(self) -> str:
        return self.c.dump_logs() if self.cluster is not None else ""

    def close(self) -> None:
        try:
            if self.cluster is not None:
                self.cluster.stop()
        finally:
            try:
                if self.sink is not None:
                    self.sink.close()
            finally:
                self.net.close()

