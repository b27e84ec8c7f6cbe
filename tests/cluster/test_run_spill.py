"""Run history kept out of memory in real agents: once a job's runs have not changed for a few
seconds, every node keeps them in its unnamed scratch file (``scheduler.spill``), reads them back
through the API as they were, leaves no file by name in its data directory, and after kill -9
of every node has them back (from the raft snapshot and journal: the file went with the process)."""

from __future__ import annotations

import os
from typing import Any

from .harness import Cluster, Node, Sink, http, job_doc, wait_for

RUNS = 8


def _runs(node: Node, job: str) -> list[dict[str, Any]]:
    return list(node.get(f"/v1/jobs/{job}/runs?limit=100")["items"])


def test_a_jobs_cold_history_is_kept_out_of_memory_and_read_back_whole(make_cluster: Any) -> None:
    sink = Sink()
    try:
        c: Cluster = make_cluster(3)
        c.wait_registered()
        # A schedule that never comes due in the test: every run is a "run now".
        c.put_job(job_doc("cold", sink.url(), schedule="0 0 1 1 *", history={"keep": 50}))
        leader = c.leader()
        for i in range(RUNS):
            status, body = http("POST", f"{leader.url}/v1/jobs/cold/run", {})
            assert status == 202, body
            wait_for(f"run {i + 1} delivered", lambda i=i: len(sink.of("cold")) > i, 30)
        for n in c.nodes:
            wait_for(f"{RUNS} runs ended on {n.name}", lambda n=n: sum(
                r["status"] == "succeeded" for r in _runs(n, "cold")) == RUNS, 30)
        expected = _runs(leader, "cold")
        whole = [leader.get(f"/v1/runs/{r['id']}") for r in expected]  # with their outputs
        assert len(whole) == RUNS and all(r["output"] for r in whole)
        for n in c.nodes:
            # Unchanged for COLD_AFTER (5 s), then met by the sweep (a slice each 0.1 s of the
            # raft thread's ticks, whether or not anything is applied).
            wait_for(f"the job's history out of memory on {n.name}",
                     lambda n=n: n.metric("raftcron_runs_spilled_jobs") >= 1, 90, interval=0.5)
            assert n.metric("raftcron_runs_spilled_bytes") > 0
            assert _runs(n, "cold") == expected  # read back from the file, as they were
            assert [n.get(f"/v1/runs/{r['id']}") for r in expected] == whole
            assert not [f for f in os.listdir(n.data_dir) if "spill" in f]  # unnamed: nothing to leave behind
        c.kill9_and_start_all()
        c.leader(timeout=60)
        for n in c.nodes:
            wait_for(f"the history back on {n.name}", lambda n=n: _runs(n, "cold") == expected, 60)
        status, body = http("POST", f"{c.leader().url}/v1/jobs/cold/run", {})
        assert status == 202, body  # and a run after the restart adds to it
        wait_for("the run after the restart delivered", lambda: len(sink.of("cold")) > RUNS, 30)
    finally:
        sink.close()
