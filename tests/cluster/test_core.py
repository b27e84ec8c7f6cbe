"""The replicated core with real agent processes: election, writes through any
node, kill -9 of the leader and of everyone, compaction, a wrong secret."""

from __future__ import annotations

import time

import pytest

from .harness import Cluster, http, wait_for

pytestmark = pytest.mark.cluster


def _job(name: str) -> dict[str, object]:
    return {"name": name, "schedule": "@manually", "executor": "http", "http": {"url": "http://127.0.0.1:9/x"}}


def _names(node) -> set[str]:  # type: ignore[no-untyped-def]
    names, cursor = set(), None
    while True:
        body = node.get("/v1/jobs?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        names |= {j["name"] for j in body["items"]}
        cursor = body["next_cursor"]
        if not cursor:
            return names


def test_election_and_write_through_a_follower(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    leader = c.leader()
    roles = {n.name: n.get("/v1/cluster")["state"] for n in c.nodes}
    assert sorted(roles.values()) == ["follower", "follower", "leader"], roles
    follower = next(n for n in c.nodes if n is not leader)
    status, body = http("PUT", f"{follower.url}/v1/jobs/via-follower", _job("via-follower"))
    assert status == 201, body
    assert body["change"] == "created"
    for n in c.nodes:  # answered after commit; every replica applies it shortly after
        wait_for(f"job visible on {n.name}", lambda n=n: "via-follower" in _names(n), 10)
        assert n.get("/v1/jobs/via-follower")["version"] == 1


def test_kill9_leader_elects_new_leader_and_loses_nothing(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    acked = set()
    for i in range(20):
        c.put_job(_job(f"before-{i}"))
        acked.add(f"before-{i}")
    old = c.leader()
    old.kill9()
    killed_at = time.monotonic()
    survivors = [n for n in c.nodes if n is not old]
    new = c.leader(among=survivors)
    assert new is not old
    c.put_job(_job("after-failover"), via=new)
    failover = time.monotonic() - killed_at
    for n in survivors:
        wait_for(f"all acknowledged jobs on {n.name}", lambda n=n: acked | {"after-failover"} <= _names(n), 10)
    old.start()
    wait_for("restarted node catches up", lambda: acked | {"after-failover"} <= _names(old), 20)
    assert failover < 15, f"failover took {failover:.1f}s"


@pytest.mark.parametrize("compaction", [False, True], ids=["journal", "after-compaction"])
def test_kill9_all_and_restart_keeps_every_acknowledged_write(make_cluster, compaction: bool) -> None:  # type: ignore[no-untyped-def]
    extra = ["--compaction-entries", "40"] if compaction else []
    c: Cluster = make_cluster(3, extra=extra)
    acked = set()
    leader = c.leader()
    for i in range(120):
        status, body = http("PUT", f"{leader.url}/v1/jobs/j{i}", _job(f"j{i}"))
        if status in (200, 201):
            acked.add(f"j{i}")
        else:
            leader = c.leader()
    assert len(acked) >= 100
    if compaction:
        wait_for("a snapshot on every node", lambda: all(n.get("/v1/cluster")["last_snapshot_index"] > 0 for n in c.nodes), 20)
        assert all((n.data_dir / "raft.dump").exists() for n in c.nodes)
    c.kill9_and_start_all()
    c.leader(timeout=30)
    for n in c.nodes:
        wait_for(f"every acknowledged job on {n.name} after restart", lambda n=n: acked <= _names(n), 30)
    c.put_job(_job("after-restart"))  # and the cluster still commits


def test_wrong_secret_cannot_join_and_says_why(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3, secrets={2: "not-the-cluster-secret-but-just-as-long"})
    good = c.nodes[:2]
    bad = c.nodes[2]
    c.leader(among=good)
    c.put_job(_job("secret-test"), via=good[0])
    wait_for("the wrong-secret node to explain itself", lambda: "secret differs" in bad.log(), 30)
    body = bad.get("/v1/cluster")
    assert body["leader"] is None and body["caught_up"] is False
    # It never heard from a leader: its reads are refused, and its replica, read anyway, is empty.
    status, refused = http("GET", f"{bad.url}/v1/jobs")
    assert status == 503 and "catching up" in refused["error"]["message"], refused
    assert bad.get("/v1/jobs?stale=true").get("items") == []


def test_survivors_restarted_from_snapshots_elect_a_leader(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """Kill -9 the leader three times, restarting each; after a compaction every restarted
    node comes back from its snapshot, and two such nodes must still elect one of them."""
    c: Cluster = make_cluster(3, extra=["--compaction-entries", "40"])
    for i in range(60):
        c.put_job(_job(f"j{i}"))
    wait_for("a snapshot on every node", lambda: all(n.get("/v1/cluster")["last_snapshot_index"] > 0 for n in c.nodes), 20)
    restarted: list[str] = []
    for round_ in range(3):
        leader = c.leader()
        leader.kill9()
        survivors = [n for n in c.nodes if n is not leader]
        new = c.leader(timeout=15, among=survivors)  # before the killed node is back
        assert new is not leader
        c.put_job(_job(f"after-kill-{round_}"), via=new)
        leader.start()
        restarted.append(leader.name)
        c.leader(timeout=20)
    assert len(set(restarted)) >= 2
