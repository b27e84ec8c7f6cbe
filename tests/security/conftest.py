"""Real agents behind a low open-file limit, for the attacks on their raft port."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import ROOT, Cluster, Node

# The agent's open-file limit in these tests, soft and hard (the agent raises its soft limit to
# its hard one at start, so both are set): the idle-connection attack needs only ~300
# connections to reach it, as in the report that found the listener dying at 256.
AGENT_FD_LIMIT = 256


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (AGENT_FD_LIMIT, AGENT_FD_LIMIT))


class LimitedNode(Node):
    """A harness node started with the open-file limit above (``prlimit`` in the child)."""

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "api.cli", "agent", *self.args], cwd=ROOT,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_fds)


@pytest.fixture(scope="module")
def limited_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = Cluster.create(Path(tmp_path_factory.mktemp("raftport")), 3)
    nodes: list[Node] = [LimitedNode(n.name, n.raft_port, n.http_port, n.data_dir, n.log_path, n.args, n.env)
                         for n in base.nodes]
    cluster = Cluster(nodes, base.secret, base.extra)
    # This process holds the attackers' sockets: several hundred at once.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 and (hard == resource.RLIM_INFINITY or hard > soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard) if hard != resource.RLIM_INFINITY else 4096, hard))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
