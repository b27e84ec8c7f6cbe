"""Batches on a real 3-node cluster: POST /v1/jobs:batch through a follower, and `raftcron apply -f`
sending a directory in batches, reporting each, naming the file and field of a refused one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .harness import Cluster, Node, http, wait_for
from .test_cli import cli

pytestmark = pytest.mark.cluster

HOOK = "http://127.0.0.1:9/never"  # @manually jobs: never called


def doc(name: str, **over: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "@manually", "executor": "http", "http": {"url": HOOK}, **over}


def held_everywhere(c: Cluster, names: list[str]) -> bool:
    def has(n: Node, name: str) -> bool:
        status, _ = http("GET", f"{n.url}/v1/jobs/{name}", timeout=5)
        return status == 200

    return all(has(n, name) for n in c.nodes for name in names)


def post_batch(node: Node, body: dict[str, Any]) -> tuple[int, Any]:
    def attempt() -> tuple[int, Any] | None:
        status, answer = http("POST", f"{node.url}/v1/jobs:batch", body, timeout=30)
        return None if status == 503 else (status, answer)  # an election: ask again

    return wait_for("the batch answered", attempt, 60)  # type: ignore[no-any-return]


def test_batches_through_a_follower_and_from_the_cli(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered(timeout=60)
    leader = c.leader(timeout=60)
    follower = next(n for n in c.nodes if n is not leader)

    names = [f"via-follower-{i}" for i in range(20)]
    status, answer = post_batch(follower, {"mode": "create", "jobs": [doc(n) for n in names]})
    assert status == 200 and answer["changes"]["created"] == 20, answer
    wait_for("every node holding the batch", lambda: held_everywhere(c, names), 60)
    status, answer = post_batch(follower, {"mode": "create", "jobs": [doc("via-follower-new"), doc(names[3])]})
    assert status == 409 and answer["error"]["details"][0]["field"] == "jobs[1].name", answer

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.yaml").write_text("\n---\n".join(json.dumps(doc(f"cli-{i}")) for i in range(3)))
    (jobs / "b.json").write_text(json.dumps({"items": [doc("cli-3"), doc("cli-4")]}))
    server = ",".join(n.url for n in (follower, leader))
    first = cli("apply", "-f", str(jobs), "--batch-size", "2", server=server)
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.split()) == sorted([f"job/cli-{i}" for i in range(5)] + ["created"] * 5)
    assert [line.split(":")[0] for line in first.stderr.splitlines()] == ["batch 1/3", "batch 2/3", "batch 3/3"]
    assert "batch 3/3: 1 documents: 1 created, 0 configured, 0 unchanged" in first.stderr
    again = cli("apply", "-f", str(jobs), server=server)
    assert again.returncode == 0 and again.stdout.count("unchanged") == 5, again.stdout
    assert "batch 1/1: 5 documents: 0 created, 0 configured, 5 unchanged" in again.stderr

    # A bad document refuses its own batch (nothing of it stored) and is named by file and field.
    (jobs / "b.json").write_text(json.dumps({"items": [doc("cli-5"), doc("cli-6", http={"url": "ftp://x"})]}))
    bad = cli("apply", "-f", str(jobs), "--batch-size", "3", server=server)
    assert bad.returncode == 1, bad.stdout
    assert f"error: {jobs / 'b.json'}#2: job/cli-6: http.url:" in bad.stderr, bad.stderr
    assert "batch 2/2: 2 documents refused, none applied" in bad.stderr
    assert "batch 1/2: 3 documents: 0 created, 0 configured, 3 unchanged" in bad.stderr
    status, _ = http("GET", f"{leader.url}/v1/jobs/cli-5")
    assert status == 404, "a document of the refused batch was stored"
