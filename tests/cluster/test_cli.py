"""The real `raftcron` program against a real cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import ROOT, Cluster, Sink, free_ports, wait_for

pytestmark = pytest.mark.cluster


def cli(*args: str, server: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTCRON_")}
    env["RAFTCRON_SERVER"] = server
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_tour_against_a_cluster(make_cluster, sink: Sink, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered()
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    server = ",".join([dead, *(n.url for n in c.nodes)])  # the first URL is a dead node
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.yaml").write_text(f"""
name: ping
labels: {{team: ops}}
schedule: "@manually"
executor: http
http: {{url: "{sink.url('/ping')}"}}
---
name: nightly
schedule: "0 2 * * *"
timezone: Europe/Berlin
executor: http
http: {{url: "{sink.url('/nightly')}"}}
alerts: {{on: [failure]}}
""")
    (jobs / "b.json").write_text(json.dumps({"name": "broken", "schedule": "@manually", "executor": "http",
                                              "http": {"url": sink.url("/fail")}}))
    first = cli("apply", "-f", str(jobs), server=server)
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.split("\n")[:3]) == ["job/broken created", "job/nightly created", "job/ping created"]
    second = cli("apply", "-f", str(jobs), server=server)
    assert second.returncode == 0 and second.stdout.count("unchanged") == 3, second.stdout

    listed = cli("-o", "json", "get", "jobs", server=server)
    assert {j["name"] for j in json.loads(listed.stdout)["items"]} == {"ping", "nightly", "broken"}
    assert "ping" in cli("get", "jobs", "-l", "team=ops", server=server).stdout
    described = cli("describe", "job", "nightly", server=server)
    assert described.returncode == 0 and "Europe/Berlin" in described.stdout and "UTC" in described.stdout

    ran = cli("run", "ping", "--wait", server=server)
    assert ran.returncode == 0, ran.stderr
    assert len(sink.at("/ping")) == 1
    run_id = json.loads(cli("-o", "json", "get", "runs", "--job", "ping", server=server).stdout)["items"][0]["id"]
    logs = cli("logs", run_id, server=server)
    assert logs.returncode == 0 and logs.stdout.strip() == "ok"
    failed = cli("run", "broken", "--wait", server=server)
    assert failed.returncode == 1, "run --wait exits 0 only when the run succeeded"
    explained = cli("-o", "json", "explain", "ping", server=server)
    assert json.loads(explained.stdout)["items"][0]["run_id"] == run_id

    assert cli("get", "job", "no-such-job", server=server).returncode == 3
    assert cli("get", "jobs", "--no-such-flag", server=server).returncode == 2
    assert cli("get", "jobs", server=dead).returncode == 1
    deleted = cli("delete", "job", "nightly", server=server)
    assert deleted.returncode == 0
    assert cli("describe", "job", "nightly", server=server).returncode == 3
    status = cli("status", server=server)
    assert status.returncode == 0 and "leader" in status.stdout.lower()


def test_members_add_and_remove(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered()
    raft, http_port = free_ports(2)
    peers = ",".join(n.raft_addr for n in c.nodes)
    env = {**c.nodes[0].env}
    log = open(tmp_path / "n4.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "agent", "--node-id", "n4", "--raft-addr",
                             f"127.0.0.1:{raft}", "--peers", peers, "--http-addr", f"127.0.0.1:{http_port}",
                             "--data-dir", str(tmp_path / "n4")], cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        server = c.nodes[1].url  # a follower: the change still goes through the leader
        added = cli("members", "add", "--node-id", "n4", "--raft-addr", f"127.0.0.1:{raft}",
                    "--http-addr", f"127.0.0.1:{http_port}", server=server)
        assert added.returncode == 0, added.stderr
        wait_for("n4 registered and reachable", lambda: any(
            m["node_id"] == "n4" and m["reachable"] for m in c.leader().get("/v1/cluster")["members"]), 20)
        c.put_job({"name": "after-join", "schedule": "@manually", "executor": "http",
                   "http": {"url": "http://127.0.0.1:9/x"}})
        n4 = f"http://127.0.0.1:{http_port}"
        wait_for("n4 replicates", lambda: cli("get", "job", "after-join", server=n4).returncode == 0, 20)
        removed = cli("members", "remove", "n4", server=server)
        assert removed.returncode == 0, removed.stderr
        wait_for("n4 out of the configuration", lambda: next(
            m for m in c.leader().get("/v1/cluster")["members"] if m["node_id"] == "n4")["role"] == "removed", 20)
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
    c.put_job({"name": "after-leave", "schedule": "@manually", "executor": "http",
               "http": {"url": "http://127.0.0.1:9/x"}})
