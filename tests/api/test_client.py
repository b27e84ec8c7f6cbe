"""The client and the CLI against a fake raftcron API served in memory on 127.0.0.1.

``main()`` runs its own event loop, so it is called in a worker thread
(``asyncio.to_thread``) while the fake serves from the test's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from api import cli
from api.client import Client, ClientError, NoClusterError, NotFoundError, retry_delay

DEFAULTS = {"timezone": "UTC", "executor": "http", "paused": False, "concurrency": "allow",
            "delivery": "at-least-once"}
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "skipped", "missed", "dead"}


def fail(status: int, code: str, message: str, details: list[Any] | None = None,
         headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return web.json_response(body, status=status, headers=headers)


@dataclass
class FakeCluster:
    """Just enough of the API: jobs with the change logic, runs that advance when polled."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # per job: one list of statuses per attempt; each GET of the run moves one step
    scripts: dict[str, list[list[str]]] = field(default_factory=dict)
    steps: dict[str, list[str]] = field(default_factory=dict)
    unavailable: int = 0          # answer this many requests with 503 first
    retry_after: str = "0"
    outcome_unknown: int = 0      # answer this many requests with 504 first
    page_size: int = 2
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.gate])
        app.router.add_get("/v1/health", self.health)
        app.router.add_get("/v1/cluster", self.cluster)
        app.router.add_get("/v1/jobs", self.list_jobs)
        app.router.add_put("/v1/jobs/{name}", self.put_job)
        app.router.add_get("/v1/jobs/{name}", self.get_job)
        app.router.add_delete("/v1/jobs/{name}", self.delete_job)
        app.router.add_post("/v1/jobs/{name}/run", self.run_job)
        app.router.add_get("/v1/jobs/{name}/runs", self.job_runs)
        app.router.add_get("/v1/runs/{id}", self.get_run)
        app.router.add_get("/v1/jobs/{name}/explain", self.explain)
        return app

    @web.middleware
    async def gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs,
                              request.headers.get("Authorization")))
        if self.unavailable > 0:
            self.unavailable -= 1
            return fail(503, "unavailable", "election in progress",
                        headers={"Retry-After": self.retry_after})
        if self.outcome_unknown > 0 and request.method != "GET":
            self.outcome_unknown -= 1
            return fail(504, "outcome_unknown", "commit not confirmed")
        response: web.StreamResponse = await handler(request)
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "node_id": "n1"})

    async def cluster(self, request: web.Request) -> web.Response:
        leader = {"node_id": "n1", "raft_addr": "127.0.0.1:7001", "http_addr": "127.0.0.1:8001"}
        members = [dict(leader, role="leader", reachable=True, tags={}, allow_shell=False),
                   {"node_id": "n2", "raft_addr": "127.0.0.1:7002",
                    "http_addr": "127.0.0.1:8002", "role": "follower", "reachable": False,
                    "tags": {"zone": "b"}, "allow_shell": True}]
        return web.json_response({"node_id": "n1", "leader": leader, "term": 3,
                                  "commit_index": 12, "applied_index": 12,
                                  "raft_thread_alive": True, "members": members})

    def job_or_404(self, name: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise web.HTTPNotFound(text=json.dumps({"error": {
                "code": "not_found", "message": f"no job named {name!r}", "details": []}}),
                content_type="application/json")
        return self.jobs[name]

    async def list_jobs(self, request: web.Request) -> web.Response:
        names = sorted(self.jobs)
        labels = request.query.getall("label", [])
        for selector in labels:
            key, _, value = selector.partition("=")
            names = [n for n in names if self.jobs[n]["spec"].get("labels", {}).get(key) == value]
        start = int(request.query.get("cursor", "0"))
        size = min(int(request.query.get("limit", self.page_size)), self.page_size)
        chunk = names[start:start + size]
        more = start + size < len(names)
        return web.json_response({"items": [self.jobs[n] for n in chunk],
                                  "next_cursor": str(start + size) if more else None})

    async def put_job(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        document = await request.json()
        details = []
        if document.get("executor", "http") == "http" and not (document.get("http") or {}
                                                               ).get("url"):
            details.append({"field": "http.url", "message": "is required"})
        if "schedule" not in document:
            details.append({"field": "schedule", "message": "is required"})
        if details:
            return fail(400, "invalid", "invalid job", details)
        spec = {**DEFAULTS, **document}
        old = self.jobs.get(name)
        if old is None:
            change, version, status = "created", 1, 201
        elif old["spec"] == spec:
            change, version, status = "unchanged", old["version"], 200
        else:
            change, version, status = "configured", old["version"] + 1, 200
        self.jobs[name] = {"name": name, "spec": spec, "version": version,
                           "created_at": "2026-03-04T10:00:00Z",
                           "updated_at": "2026-03-04T11:00:00Z",
                           "status": {"paused": False, "last_run": None,
                                      "next_slots": ["2026-03-05T01:00:00Z"],
                                      "consecutive_failures": 0}}
        return web.json_response({**self.jobs[name], "change": change}, status=status)

    async def get_job(self, request: web.Request) -> web.Response:
        return web.json_response(self.job_or_404(request.match_info["name"]))

    async def delete_job(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.job_or_404(name)
        del self.jobs[name]
        return web.json_response({"deleted": name})

    def new_run(self, job: str, slot: str, attempt: int) -> dict[str, Any]:
        run_id = f"r{next(self.ids)}"
        script = self.scripts.get(job, [["succeeded"]])
        self.steps[run_id] = list(script[min(attempt, len(script)) - 1])
        run = {"id": run_id, "job": job, "slot": slot, "attempt": attempt, "trigger": "manual",
               "status": "claimed", "node": "n1", "duration_ms": 12, "exit_code": 0,
               "http_status": None, "output": f"attempt {attempt}\n", "error": None}
        self.runs[run_id] = run
        return run

    async def run_job(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.job_or_404(name)
        run = self.new_run(name, "2026-03-04T12:00:00Z", 1)
        return web.json_response({"run_id": run["id"]}, status=202)

    async def job_runs(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.job_or_404(name)
        items = [r for r in reversed(list(self.runs.values())) if r["job"] == name]
        return web.json_response({"items": items, "next_cursor": None})

    async def explain(self, request: web.Request) -> web.Response:
        self.job_or_404(request.match_info["name"])
        unknown = set(request.query) - {"since"}
        if unknown:  # like the real server: unknown query parameters are a 400
            return fail(400, "invalid", "bad query",
                        [{"field": f"query.{k}", "message": "unknown query parameter"}
                         for k in sorted(unknown)])
        items = [{"slot": f"2026-03-04T0{h}:00:00Z", "decision": "claimed", "reason": "due",
                  "run_id": f"x{h}", "term": 3, "leader": "n1", "at": "2026-03-04T00:00:01Z"}
                 for h in (1, 2, 3)]
        return web.json_response({"items": items, "next_cursor": None})

    async def get_run(self, request: web.Request) -> web.Response:
        run_id = request.match_info["id"]
        run = self.runs.get(run_id)
        if run is None:
            return fail(404, "not_found", f"no run {run_id!r}")
        steps = self.steps.get(run_id) or []
        if steps:
            run["status"] = steps.pop(0)
            if run["status"] == "retrying":
                self.new_run(run["job"], run["slot"], run["attempt"] + 1)
            if run["status"] in TERMINAL and run["status"] != "succeeded":
                run["exit_code"] = 1
        return web.json_response(run)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeCluster, str]]:
    cluster = FakeCluster()
    server = TestServer(cluster.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield cluster, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A port that refuses connections: bound (so nobody else takes it) but not listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture(autouse=True)
def _cli_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAFTCRON_SERVER", "RAFTCRON_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli, "POLL_INTERVAL", 0.01)


async def run_cli(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


def add_job(cluster: FakeCluster, name: str, **spec: Any) -> None:
    cluster.jobs[name] = {"name": name, "spec": {**DEFAULTS, "name": name, **spec},
                          "version": 1, "created_at": "2026-03-04T10:00:00Z",
                          "updated_at": "2026-03-04T10:00:00Z",
                          "status": {"paused": False, "last_run": None, "next_slots": [],
                                     "consecutive_failures": 0}}


# --- reaching the cluster ---------------------------------------------------------------

async def test_falls_back_past_a_dead_server_and_remembers_the_live_one(
        fake: tuple[FakeCluster, str], dead_url: str) -> None:
    cluster, url = fake
    async with Client([dead_url, url], timeout=5) as client:
        assert (await client.health())["status"] == "ok"
        assert client.server == url
        await client.cluster()
        assert client.server == url
    assert len(cluster.requests) == 2


async def test_cli_falls_back_past_a_dead_server(fake: tuple[FakeCluster, str], dead_url: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "a", schedule="@daily", http={"url": "https://x.test"})
    assert await run_cli("get", "jobs", "-o", "json", "--server", f"{dead_url},{url}") == 0
    assert [j["name"] for j in json.loads(capsys.readouterr().out)["items"]] == ["a"]


async def test_nothing_reachable_is_exit_1(dead_url: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_cli("status", "--server", f"{dead_url},{dead_url}") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no raftcron server reachable")
    with pytest.raises(NoClusterError):
        async with Client([dead_url]) as client:
            await client.health()


async def test_503_is_retried_honouring_retry_after(fake: tuple[FakeCluster, str]) -> None:
    cluster, url = fake
    cluster.unavailable, cluster.retry_after = 2, "3"
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with Client([url], sleep=sleep) as client:
        assert (await client.cluster())["leader"]["node_id"] == "n1"
    assert waits == [3.0, 3.0]
    assert len(cluster.requests) == 3


async def test_503_retries_are_bounded(fake: tuple[FakeCluster, str]) -> None:
    cluster, url = fake
    cluster.unavailable, cluster.retry_after = 100, "4"
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with Client([url], sleep=sleep, retry_budget=15) as client:
        with pytest.raises(ClientError) as caught:
            await client.health()
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    assert waits == [4.0, 4.0, 4.0]


async def test_cli_rides_out_an_election(fake: tuple[FakeCluster, str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    cluster.unavailable = 2
    assert await run_cli("status", "--server", url) == 0
    assert "Leader:        n1" in capsys.readouterr().out


async def test_504_is_retried_only_for_repeatable_writes(fake: tuple[FakeCluster, str]
                                                         ) -> None:
    cluster, url = fake
    add_job(cluster, "a", schedule="@daily", http={"url": "https://x.test"})

    async def sleep(seconds: float) -> None:
        pass

    async with Client([url], sleep=sleep) as client:
        cluster.outcome_unknown = 1
        answer = await client.put_job("b", {"name": "b", "schedule": "@daily",
                                            "http": {"url": "https://x.test"}})
        assert answer["change"] == "created"
        cluster.outcome_unknown = 1
        with pytest.raises(ClientError) as caught:
            await client.run_job("a")
    assert (caught.value.status, caught.value.code) == (504, "outcome_unknown")
    assert not cluster.runs  # the run was not submitted twice


async def test_token_is_sent_as_bearer(fake: tuple[FakeCluster, str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, url = fake
    assert await run_cli("status", "--server", url, "--token", "tok1") == 0
    monkeypatch.setenv("RAFTCRON_TOKEN", "tok2")
    monkeypatch.setenv("RAFTCRON_SERVER", url)
    assert await run_cli("status") == 0
    assert [auth for _, _, auth in cluster.requests] == ["Bearer tok1", "Bearer tok2"]


def test_retry_delay_parses_seconds_dates_and_falls_back_to_backoff() -> None:
    from datetime import datetime
    now = datetime(2026, 3, 4, 12, 0, 0, tzinfo=UTC)
    assert retry_delay("2", 0) == 2.0
    assert retry_delay("0", 0) == 0.1
    assert retry_delay("Wed, 04 Mar 2026 12:00:05 GMT", 0, now) == 5.0
    assert [retry_delay(None, n) for n in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]


# --- errors and exit codes --------------------------------------------------------------

@pytest.mark.parametrize("argv", [["get", "jobs", "nope"], ["describe", "job", "nope"],
                                  ["delete", "job", "nope"], ["logs", "r404"],
                                  ["run", "nope"]])
async def test_not_found_is_exit_3(fake: tuple[FakeCluster, str], argv: list[str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, url = fake
    assert await run_cli(*argv, "--server", url) == 3
    captured = capsys.readouterr()
    assert captured.err.startswith("error: no ")
    assert captured.out == ""


async def test_not_found_error_type(fake: tuple[FakeCluster, str]) -> None:
    _, url = fake
    async with Client([url]) as client:
        with pytest.raises(NotFoundError) as caught:
            await client.get_job("ghost")
    assert caught.value.message == "no job named 'ghost'"


# --- apply ------------------------------------------------------------------------------

JOBS_YAML = """\
name: alpha
schedule: "*/5 * * * *"
http: {url: "https://example.test/a"}
---
name: beta
schedule: "@daily"
http: {url: "https://example.test/b"}
"""


async def test_apply_twice_is_created_then_unchanged_then_configured(
        fake: tuple[FakeCluster, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    path = tmp_path / "jobs.yaml"
    path.write_text(JOBS_YAML)
    assert await run_cli("apply", "-f", str(path), "--server", url) == 0
    assert capsys.readouterr().out == "job/alpha created\njob/beta created\n"
    assert await run_cli("apply", "-f", str(path), "--server", url) == 0
    assert capsys.readouterr().out == "job/alpha unchanged\njob/beta unchanged\n"
    path.write_text(JOBS_YAML.replace("@daily", "@hourly"))
    assert await run_cli("apply", "-f", str(tmp_path), "--server", url) == 0
    assert capsys.readouterr().out == "job/alpha unchanged\njob/beta configured\n"
    assert cluster.jobs["beta"]["version"] == 2


async def test_apply_reports_every_field_error_and_applies_the_rest(
        fake: tuple[FakeCluster, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    (tmp_path / "a.yaml").write_text("name: broken\nexecutor: http\n---\n" + JOBS_YAML)
    (tmp_path / "b.yaml").write_text("name: [\n")
    (tmp_path / "c.json").write_text('{"schedule": "@daily"}')
    assert await run_cli("apply", "-f", str(tmp_path), "--server", url) == 1
    captured = capsys.readouterr()
    assert captured.out == "job/alpha created\njob/beta created\n"
    err = captured.err.splitlines()
    assert f"error: {tmp_path / 'a.yaml'}#1: job/broken: http.url: is required" in err
    assert f"error: {tmp_path / 'a.yaml'}#1: job/broken: schedule: is required" in err
    assert any(line.startswith(f"error: {tmp_path / 'b.yaml'}:") for line in err)
    assert f"error: {tmp_path / 'c.json'}: name is required" in err
    assert sorted(cluster.jobs) == ["alpha", "beta"]


async def test_apply_from_stdin_with_json_output(fake: tuple[FakeCluster, str],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, url = fake
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(
        [{"name": "s1", "schedule": "@daily", "http": {"url": "https://x.test"}}])))
    assert await run_cli("apply", "-f", "-", "-o", "json", "--server", url) == 0
    [item] = json.loads(capsys.readouterr().out)["items"]
    assert (item["name"], item["change"]) == ("s1", "created")


# --- get, describe, output formats ------------------------------------------------------

async def test_get_jobs_follows_cursors_and_outputs_json_and_yaml(
        fake: tuple[FakeCluster, str], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    for name in "abcde":
        add_job(cluster, name, schedule="@daily", labels={"team": "x" if name < "c" else "y"})
    assert await run_cli("get", "jobs", "-o", "json", "--server", url) == 0
    assert [j["name"] for j in json.loads(capsys.readouterr().out)["items"]] == list("abcde")
    assert await run_cli("get", "jobs", "-o", "yaml", "--limit", "3", "--server", url) == 0
    assert [j["name"] for j in yaml.safe_load(capsys.readouterr().out)["items"]] == list("abc")
    assert await run_cli("get", "jobs", "-l", "team=y", "-o", "name", "--server", url) == 0
    assert capsys.readouterr().out == "c\nd\ne\n"


async def test_get_jobs_table_and_members(fake: tuple[FakeCluster, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "nightly", schedule="0 2 * * *", timezone="Europe/Berlin")
    assert await run_cli("get", "jobs", "--server", url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "SCHEDULE", "TIMEZONE"]
    assert lines[1].startswith("nightly") and "Europe/Berlin" in lines[1]
    assert await run_cli("get", "members", "-o", "json", "--server", url) == 0
    members = json.loads(capsys.readouterr().out)["items"]
    assert [m["node_id"] for m in members] == ["n1", "n2"]
    assert await run_cli("get", "member", "n9", "--server", url) == 3


async def test_describe_job(fake: tuple[FakeCluster, str],
                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "nightly", schedule="0 2 * * *", timezone="Europe/Berlin",
            http={"url": "https://x.test", "method": "POST"})
    cluster.jobs["nightly"]["status"]["next_slots"] = ["2026-07-01T00:00:00Z"]
    assert await run_cli("describe", "job", "nightly", "--server", url) == 0
    out = capsys.readouterr().out
    assert "2026-07-01 02:00:00 CEST" in out and "2026-07-01 00:00:00 UTC" in out


# --- run, logs ------------------------------------------------------------------------------

async def test_run_without_wait_prints_the_run_id(fake: tuple[FakeCluster, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@manually")
    assert await run_cli("run", "j", "--server", url) == 0
    assert capsys.readouterr().out.strip() in cluster.runs


@pytest.mark.parametrize(("script", "code", "final"), [
    ([["running", "succeeded"]], 0, "succeeded"),
    ([["running", "failed"]], 1, "failed"),
    ([["timed_out"]], 1, "timed_out"),
    ([["running", "retrying"], ["running", "retrying"], ["running", "succeeded"]], 0,
     "succeeded"),
    ([["running", "retrying"], ["running", "dead"]], 1, "dead"),
])
async def test_run_wait_exit_codes(fake: tuple[FakeCluster, str], script: list[list[str]],
                                   code: int, final: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@manually")
    cluster.scripts["j"] = script
    assert await run_cli("run", "j", "--wait", "--timeout", "20", "--server", url) == code
    captured = capsys.readouterr()
    attempts = len(script)
    assert captured.out.startswith(f"run/r{attempts} {final} (attempt {attempts}")
    if attempts > 1:
        assert f"attempt {attempts}: running" in captured.err


async def test_run_wait_gives_up_after_its_timeout(fake: tuple[FakeCluster, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@manually")
    cluster.scripts["j"] = [["running"]]
    assert await run_cli("run", "j", "--wait", "--timeout", "0.3", "--server", url) == 1
    assert "error: gave up waiting after 0.3s: run/r1 is still running" in capsys.readouterr().err


async def test_run_wait_json_prints_the_final_run(fake: tuple[FakeCluster, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@manually")
    assert await run_cli("run", "j", "--wait", "-o", "json", "--server", url) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "succeeded"


async def test_logs_prints_output_on_stdout_and_status_on_stderr(
        fake: tuple[FakeCluster, str], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@manually")
    run = cluster.new_run("j", "2026-03-04T12:00:00Z", 1)
    assert await run_cli("logs", run["id"], "--server", url) == 0
    captured = capsys.readouterr()
    assert captured.out == "attempt 1\n"
    assert captured.err.startswith(f"run/{run['id']} job=j attempt=1 status=succeeded")


async def test_delete_job(fake: tuple[FakeCluster, str],
                          capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@daily")
    assert await run_cli("delete", "job", "j", "--server", url) == 0
    assert capsys.readouterr().out == "job/j deleted\n"
    assert not cluster.jobs


async def test_explain_limits_on_the_client_side(fake: tuple[FakeCluster, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cluster, url = fake
    add_job(cluster, "j", schedule="@hourly")
    assert await run_cli("explain", "j", "--since", "2h", "--limit", "2", "-o", "json",
                         "--server", url) == 0
    assert [i["run_id"] for i in json.loads(capsys.readouterr().out)["items"]] == ["x1", "x2"]
    _, path, _ = cluster.requests[-1]
    assert path.startswith("/v1/jobs/j/explain?since=") and "limit" not in path
    assert await run_cli("explain", "j", "--server", url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["SLOT", "DECISION", "RUN"] and len(lines) == 4
