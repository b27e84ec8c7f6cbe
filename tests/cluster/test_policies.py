"""Policies on a real cluster: dependencies, target tags, shell placement,
concurrency forbid and replace."""

from __future__ import annotations

from typing import Any

import pytest

from .harness import Cluster, Sink, http, job_doc, wait_for

pytestmark = pytest.mark.cluster


def _runs(c: Cluster, job: str) -> list[dict[str, Any]]:
    return c.runs(job, via=c.leader())


def test_policies_on_a_cluster(make_cluster, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    # n1 is in zone a and may run shell jobs; n2 and n3 are in zone b and may not.
    c: Cluster = make_cluster(3, extra=["--lease", "2s"], per_node={
        0: ["--tag", "zone=a", "--allow-shell"], 1: ["--tag", "zone=b"], 2: ["--tag", "zone=b"]})
    c.wait_registered()

    # depends_on: each successful run of `extract` triggers one run of `load`
    c.put_job(job_doc("extract", sink.url("/extract"), schedule="@manually"))
    c.put_job(job_doc("load", sink.url("/load"), schedule=None, depends_on={"job": "extract", "on": "success"}))
    status, body = http("POST", f"{c.leader().url}/v1/jobs/extract/run")
    assert status == 202, body
    load = wait_for("the dependent run", lambda: [r for r in _runs(c, "load") if r["status"] == "succeeded"], 20)
    assert len(load) == 1 and load[0]["trigger"] == "dependency"
    upstream = _runs(c, "extract")[0]
    assert load[0]["slot"] == upstream["slot"]

    # target tags: every run of a zone=b job lands on n2 or n3
    c.put_job(job_doc("zoned", sink.url("/zoned"), target={"tags": {"zone": "b"}}))
    wait_for("several zoned runs", lambda: len([r for r in _runs(c, "zoned") if r["status"] == "succeeded"]) >= 4, 20)
    assert {r["node"] for r in _runs(c, "zoned") if r["node"]} <= {"n2", "n3"}

    # shell: only n1 may run it; a shell job targeted at zone b has no node and fails with the reason
    c.put_job({"name": "sh-ok", "schedule": "@manually", "executor": "shell", "shell": {"command": "echo hi"}})
    c.put_job({"name": "sh-nowhere", "schedule": "@manually", "executor": "shell", "shell": {"command": "echo hi"},
               "target": {"tags": {"zone": "b"}}})
    for name in ("sh-ok", "sh-nowhere"):
        assert http("POST", f"{c.leader().url}/v1/jobs/{name}/run")[0] == 202
    ok = wait_for("the shell run", lambda: [r for r in _runs(c, "sh-ok") if r["status"] == "succeeded"], 20)
    assert ok[0]["node"] == "n1"
    failed = wait_for("the unplaceable shell run", lambda: _runs(c, "sh-nowhere"), 20)
    assert failed[0]["status"] == "failed" and "allow-shell" in failed[0]["error"], failed[0]

    # forbid: a 5-second attempt every 2 s skips the slots that find it still running
    c.put_job(job_doc("forbid", sink.url("/slow?s=5"), schedule="@every 2s", concurrency="forbid"))
    wait_for("a skipped slot", lambda: [r for r in _runs(c, "forbid") if r["status"] == "skipped"], 30)
    skipped = next(r for r in _runs(c, "forbid") if r["status"] == "skipped")
    assert "concurrency forbid" in skipped["error"]
    # replace: the new slot cancels the running attempt
    c.put_job(job_doc("replace", sink.url("/slow?s=5"), schedule="@every 2s", concurrency="replace"))
    wait_for("a replaced run", lambda: [r for r in _runs(c, "replace") if r["status"] == "cancelled"], 30)
    for name in ("forbid", "replace"):
        running = [r for r in _runs(c, name) if r["status"] in ("running", "claimed")]
        assert len(running) <= 1, f"{name}: never two attempts at once: {running}"
