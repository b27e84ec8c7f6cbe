"""Finding 5 from outside: a real agent with both tokens keeps job secrets from the read-only
token (API views, lists and the CLI's export), shows them to the write token, keeps them when a
masked document is PUT back, and prints no URL query string or webhook path in run errors or
its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import ROOT, Cluster, Node, Sink, free_ports, http, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.security]

W, R = "write-token-for-the-redaction-test", "read-token-for-the-redaction-test"
SECRETS = ("hunter2", "K3Y", "T0K", "H00K", "pw1")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Node]:
    cluster = Cluster.create(tmp_path / "c", 1, extra=["--api-token", W, "--api-read-token", R])
    cluster.start()
    node = cluster.nodes[0]
    try:
        wait_for("the agent to lead and register itself",
                 lambda: any(m.get("node_id") == node.name for m in
                             call(node, "GET", "/v1/cluster", token=W)["members"]), timeout=30)
        yield node
    except BaseException:
        print(cluster.dump_logs())
        raise
    finally:
        cluster.stop()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.close()


def call(node: Node, method: str, path: str, body: Any = None, *, token: str, status: int = 200) -> Any:
    got, answer = http(method, node.url + path, body, token=token)
    assert got == status, f"{method} {path}: {got} {answer}"
    return answer


def leaked(answer: Any) -> list[str]:
    text = answer if isinstance(answer, str) else json.dumps(answer)
    return [s for s in SECRETS if s in text]


def cli(node: Node, token: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTCRON_")}
    env.update(RAFTCRON_SERVER=node.url, RAFTCRON_TOKEN=token)
    done = subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_read_token_never_sees_job_secrets(agent: Node, sink: Sink) -> None:
    port = sink.port
    url = f"http://ops:hunter2@127.0.0.1:{port}/ping?api_key=K3Y"
    web = {"name": "web", "schedule": "@manually", "executor": "http",
           "http": {"url": url, "headers": {"X-Api-Key": "T0K"}},
           "alerts": {"webhook": f"http://127.0.0.1:{port}/services/T0/B0/H00K", "on": ["failure"]}}
    sh = {"name": "sh", "schedule": "@manually", "executor": "shell",
          "shell": {"command": ["true"], "env": {"DB_PASSWORD": "pw1"}}}
    for doc in (web, sh):
        call(agent, "PUT", f"/v1/jobs/{doc['name']}", doc, token=W, status=201)

    for path in ("/v1/jobs", "/v1/jobs/web", "/v1/jobs/sh"):
        answer = call(agent, "GET", path, token=R)
        assert not leaked(answer), f"GET {path} with the read token shows {leaked(answer)}"
        assert "***" in json.dumps(answer)
    spec = call(agent, "GET", "/v1/jobs/web", token=R)["spec"]
    assert spec["http"]["url"] == f"http://***@127.0.0.1:{port}/ping?***"
    assert spec["http"]["headers"] == {"X-Api-Key": "***"} and spec["alerts"]["webhook"] == "***"
    assert call(agent, "GET", "/v1/jobs/sh", token=R)["spec"]["shell"]["env"] == {"DB_PASSWORD": "***"}

    writer = call(agent, "GET", "/v1/jobs", token=W)
    assert sorted(leaked(writer)) == sorted(SECRETS), "the write token sees every secret"

    exported = cli(agent, R, "get", "jobs", "-o", "yaml")
    assert "web" in exported and "***" in exported and not leaked(exported), exported
    assert sorted(leaked(cli(agent, W, "get", "jobs", "-o", "yaml"))) == sorted(SECRETS)

    # What the reader was shown, applied back by a writer, keeps the secrets.
    for name in ("web", "sh"):
        shown = call(agent, "GET", f"/v1/jobs/{name}", token=R)["spec"]
        assert call(agent, "PUT", f"/v1/jobs/{name}", shown, token=W)["change"] == "unchanged"
    assert sorted(leaked(call(agent, "GET", "/v1/jobs", token=W))) == sorted(SECRETS)
    # The job then still calls with its credentials.
    run_id = call(agent, "POST", "/v1/jobs/web/run", token=W, status=202)["run_id"]
    run = wait_for("the run to finish", lambda: (r := call(agent, "GET", f"/v1/runs/{run_id}", token=W))["finished_at"]
                   and r)
    assert run["status"] == "succeeded", run
    hit = sink.at("/ping?api_key=K3Y")
    assert hit and hit[0].headers["X-Api-Key"] == "T0K", [d.path for d in sink.deliveries]
    assert hit[0].headers["Authorization"] == "Basic b3BzOmh1bnRlcjI="  # ops:hunter2


def test_run_errors_and_the_log_print_no_query_string_or_hook_path(agent: Node) -> None:
    closed = free_ports(2)
    doc = {"name": "down", "schedule": "@manually", "executor": "http", "retries": {"max": 0},
           "http": {"url": f"http://127.0.0.1:{closed[0]}/ping?api_key=K3Y"},
           "alerts": {"webhook": f"http://127.0.0.1:{closed[1]}/services/T0/B0/H00K", "on": ["failure"]}}
    call(agent, "PUT", "/v1/jobs/down", doc, token=W, status=201)
    run_id = call(agent, "POST", "/v1/jobs/down/run", token=W, status=202)["run_id"]
    run = wait_for("the run to fail", lambda: (r := call(agent, "GET", f"/v1/runs/{run_id}", token=R))["status"]
                   == "failed" and r)
    assert run["error"] == f"connection refused: http://127.0.0.1:{closed[0]}/ping?***", run
    for path in (f"/v1/runs/{run_id}", "/v1/jobs/down/runs", "/v1/jobs/down/explain", "/v1/runs"):
        for token in (R, W):  # the error is stored scrubbed: no token shows the query string
            assert "K3Y" not in json.dumps(call(agent, "GET", path, token=token)), path
    wait_for("the agent to log its failed alert delivery",
             lambda: f"127.0.0.1:{closed[1]}/***" in agent.log(), timeout=30)
    assert "connection refused" in agent.log()
    assert not leaked(agent.log()), [line for line in agent.log().splitlines() if leaked(line)]
