"""No disruption from a returning node (pre-vote, raftlog.prevote), on real agents.

A follower cut off from its peers (nftables drops its raft port) or paused (SIGSTOP) for 10 s,
then given back, or killed with -9 and started again at once, must cost no election: the leader
and its term are the same afterwards.
Without pre-vote each such round deposed the leader (bench/prevote.py gives the figures).
A leader killed with -9 must still be replaced.

Rounds per kind: ``RAFTCRON_PREVOTE_ROUNDS`` (default 3). The cut needs nft and root: without
them the cut test skips with the reason, and fails when CI=1.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from .disruption import Round, agreed, fail_over, lowest_follower, nft_missing, take_away
from .harness import REPORT, Cluster, job_doc, wait_for

pytestmark = pytest.mark.cluster

ROUNDS = int(os.environ.get("RAFTCRON_PREVOTE_ROUNDS", "3"))


def _need_nft() -> None:
    missing = nft_missing()
    if missing is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI=1 and the link cut cannot run: {missing}")
    pytest.skip(f"the link cut cannot run: {missing}")


@pytest.mark.parametrize("how", ["cut", "pause", "restart"])
def test_a_returning_follower_does_not_depose_the_leader(make_cluster: Callable[..., Cluster], how: str) -> None:
    if how == "cut":
        _need_nft()
    cluster = make_cluster(3)
    cluster.wait_registered(timeout=60)
    follower = lowest_follower(cluster)
    rounds: list[Round] = []
    for _ in range(ROUNDS):
        rounds.append(take_away(cluster, follower, how))
        if rounds[-1].disrupted:
            break  # the follower may lead now: no further round could take it away
    REPORT.extend(f"prevote {r.line()}" for r in rounds)
    disrupted = [r.line() for r in rounds if r.disrupted]
    assert not disrupted, f"{len(disrupted)} of {len(rounds)} rounds took an election: {disrupted}"
    if how == "cut":  # the cut was real: the leader lost sight of the follower each time
        assert all(r.went_away_s > 0 for r in rounds)


def test_a_killed_leader_is_still_replaced(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    cluster.wait_registered(timeout=60)
    old, new, seconds = fail_over(cluster)
    REPORT.append(f"prevote: {new.name} leads {seconds:.2f}s after kill -9 of {old.name}")
    assert new.name != old.name
    cluster.put_job(job_doc("after-failover", "http://127.0.0.1:9/none", schedule="@every 1h"), via=new, timeout=30)
    old.start()
    wait_for(f"{old.name} to rejoin as a follower", lambda: (a := agreed(cluster)) is not None and a[0] != old.name
             and len(cluster.live()) == 3, 60)
