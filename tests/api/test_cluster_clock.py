"""The cluster's clock in the API: each member's offset to the leader in /v1/cluster, and
raftcron_clock_offset_seconds in /metrics."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from api.metrics import Metrics
from api.routes.cluster import cluster_view
from raftlog.node import MemberStatus, NodeStatus
from scheduler.state import State

if TYPE_CHECKING:
    from conftest import Cluster

module_loop = pytest.mark.asyncio(loop_scope="module")


@module_loop
async def test_cluster_members_carry_their_clock_offset(api: Cluster) -> None:
    body = await (await api.client.get("/v1/cluster")).json()
    [me] = body["members"]
    assert (me["role"], me["clock_offset_ms"], me["clock_error_ms"]) == ("leader", 0.0, 0.0)  # the cluster's time
    members = await (await api.client.get("/v1/members")).json()
    assert members["items"][0]["clock_offset_ms"] == 0.0


def _status() -> NodeStatus:
    return NodeStatus(
        raft_addr="10.0.0.1:7001", state="follower", leader="10.0.0.2:7001", term=3, commit_index=5,
        applied_index=5, has_quorum=True, raft_thread_alive=True, clock_offset=-0.0031, clock_error=0.0012,
        partners=(
            MemberStatus(raft_addr="10.0.0.2:7001", connected=True, match_index=None, clock_offset=0.0,
                         clock_error=0.0),
            MemberStatus(raft_addr="10.0.0.3:7001", connected=True, match_index=None,
                         clock_offset=2.9876543, clock_error=0.004),
            MemberStatus(raft_addr="10.0.0.4:7001", connected=False, match_index=None),  # not measured yet
        ),
    )


def _state() -> State:
    state = State()
    for i in (1, 2, 3, 4):
        state.nodes[f"n{i}"] = {"node_id": f"n{i}", "raft_addr": f"10.0.0.{i}:7001", "http_addr": None}
    return state


def test_a_followers_view_of_offsets_known_and_unknown() -> None:
    status = _status()
    ctx: Any = SimpleNamespace(node=SimpleNamespace(status=lambda: status), state=_state(),
                               raft_addr="10.0.0.1:7001", node_id="n1")
    members = {m["node_id"]: m for m in cluster_view(ctx)["members"]}
    got = {k: (m["clock_offset_ms"], m["clock_error_ms"]) for k, m in members.items()}
    assert got == {"n1": (-3.1, 1.2), "n2": (0.0, 0.0), "n3": (2987.654, 4.0), "n4": (None, None)}


def test_metrics_export_each_known_offset_by_node_id() -> None:
    status = _status()
    text = Metrics(node_id="n1", state=_state(), raft=lambda: status).render().decode()
    lines = sorted(line for line in text.splitlines() if line.startswith("raftcron_clock_offset_seconds{"))
    assert lines == [
        'raftcron_clock_offset_seconds{node="n1"} -0.0031',
        'raftcron_clock_offset_seconds{node="n2"} 0.0',
        'raftcron_clock_offset_seconds{node="n3"} 2.9876543',
    ]
