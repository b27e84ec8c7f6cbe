"""Agents on uvloop (``--event-loop uvloop``): a cluster elects, takes writes and runs a job's
every slot once, as on asyncio's loop."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from .harness import Cluster, Sink, job_doc, wait_for

pytestmark = pytest.mark.cluster


def test_a_cluster_on_uvloop_runs_every_slot_once(make_cluster, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3, extra=["--event-loop", "uvloop"])
    c.wait_registered()
    c.put_job(job_doc("tick", sink.url()))
    wait_for("five slots delivered", lambda: len({d.headers.get("X-Raftcron-Slot") for d in sink.of("tick")}) >= 5,
             timeout=60)
    assert all(", event loop uvloop" in n.log() for n in c.nodes), [n.log()[:2000] for n in c.nodes]
    time.sleep(0.5)
    per_slot = Counter(d.headers.get("X-Raftcron-Slot") for d in sink.of("tick"))
    assert not [s for s, n in per_slot.items() if n > 1], per_slot
    runs = wait_for("runs of the delivered slots recorded succeeded",
                    lambda: [r for r in c.runs("tick") if r["status"] == "succeeded"] or None, timeout=30)
    assert runs
