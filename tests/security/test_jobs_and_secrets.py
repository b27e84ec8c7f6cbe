"""Hostile jobs and weak secrets, against real agents (issue 13, findings 3, 4 and 6).

A write-token holder must not reach the cluster secret or the API tokens through a shell
job; a regular expression must not freeze a node; a weak secret must not start a node; a
non-ASCII token is a 401; the journal and snapshots are private to the agent's user.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import ROOT, Cluster, Node, http, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.security]

SECRET = "security-test-secret-0123456789abcdef"
WRITE, READ = "write-token-of-the-security-test", "read-token-of-the-security-test"
DONE = {"succeeded", "failed", "timed_out", "lost", "dead"}
PLACEHOLDER = "replace-me-with-the-output-of-the-command-above"  # .env.example's (api.secretfile checks)


# ---- fixtures (kept here: tests/security has no conftest of its own) --------------------------


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """A one-node cluster with the API tokens set; ``extra`` agent flags, ``env`` additions."""
    made: list[Cluster] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> Node:
        cluster = Cluster.create(tmp_path / f"c{len(made)}", 1, secret=SECRET,
                                 extra=["--api-token", WRITE, "--api-read-token", READ, *extra])
        node = cluster.nodes[0]
        node.env.update(env or {})
        made.append(cluster)
        cluster.start()
        wait_for(f"{node.name} to lead",
                 lambda: (api(node, "GET", "/v1/cluster")[1].get("leader") or {}).get("node_id") == node.name, 30)
        wait_for(f"{node.name} registered", lambda: any(
            m["node_id"] == node.name for m in api(node, "GET", "/v1/cluster")[1]["members"]), 30)
        return node

    yield start
    for cluster in made:
        cluster.stop()


class EvilBody:
    """An HTTP server whose every answer is ``body``: the response a hostile endpoint gives."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def api(node: Node, method: str, path: str, body: Any = None, token: str = WRITE,
        timeout: float = 5.0) -> tuple[int, Any]:
    return http(method, node.url + path, body, timeout=timeout, token=token)


def put(node: Node, doc: dict[str, Any]) -> None:
    status, body = api(node, "PUT", f"/v1/jobs/{doc['name']}", doc)
    assert status in (200, 201), f"PUT {doc['name']}: {status} {body}"


def run_now(node: Node, job: str, within: float = 30.0) -> dict[str, Any]:
    """Start a run of ``job`` and wait for its end; the run as a read-only caller sees it."""
    status, body = api(node, "POST", f"/v1/jobs/{job}/run")
    assert status == 202, f"run {job}: {status} {body}"
    run_id = body["run_id"]

    def finished() -> dict[str, Any] | None:
        status, run = api(node, "GET", f"/v1/runs/{run_id}", token=READ, timeout=2.0)
        assert status == 200, f"GET run {run_id}: {status} {run}"
        return run if run["status"] in DONE else None

    return wait_for(f"run {run_id} of {job} to finish", finished, within)  # type: ignore[no-any-return]


def shell_job(name: str, command: str | list[str], **shell: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "@manually", "executor": "shell", "timeout": "20s",
            "shell": {"command": command, **shell}}


def exits_with(args: list[str], env: dict[str, str], within: float = 30.0,
               launcher: tuple[str, ...] = ()) -> tuple[int, str]:
    """Run ``raftcron agent ARGS``; its exit code and output, failing if it is still up."""
    proc = subprocess.run([*launcher, sys.executable, "-m", "api.cli", "agent", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=within, check=False)
    return proc.returncode, proc.stdout.decode(errors="replace")


def base_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RAFTCRON_")}, "PYTHONUNBUFFERED": "1"}


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


# ---- finding 3: a shell job reads the agent's secrets ---------------------------------------------


def test_a_shell_job_sees_neither_the_secret_nor_the_tokens(start_agent: Callable[..., Node]) -> None:
    # Everything through the environment, as compose passes the secret.
    node = start_agent("--allow-shell", env={"RAFTCRON_API_TOKEN": WRITE, "RAFTCRON_API_READ_TOKEN": READ,
                                             "RAFTCRON_ALERT_WEBHOOK": "http://127.0.0.1:9/hook?key=k"})
    put(node, shell_job("leak", ["env"], env={"MINE": "mine"}))
    run = run_now(node, "leak")
    assert run["status"] == "succeeded", run
    output = run["output"]
    assert "MINE=mine" in output and "RAFTCRON_JOB=leak" in output
    for secret in (SECRET, WRITE, READ, "RAFTCRON_SECRET", "RAFTCRON_API_TOKEN", "RAFTCRON_API_READ_TOKEN",
                   "RAFTCRON_ALERT_WEBHOOK", "PYTHONUNBUFFERED"):
        assert secret not in output, f"{secret!r} reached the job:\n{output}"


@pytest.mark.skipif(os.geteuid() != 0, reason="--shell-user needs a root agent")
def test_a_shell_user_job_cannot_read_the_agents_environment_or_data(start_agent: Callable[..., Node]) -> None:
    node = start_agent("--allow-shell", "--shell-user", "nobody")
    assert node.proc is not None
    script = (f"id -u; cat /proc/{node.proc.pid}/environ >/dev/null 2>&1 || echo no-environ; "
              f"ls {node.data_dir} >/dev/null 2>&1 || echo no-data")
    put(node, shell_job("who", script))
    run = run_now(node, "who")
    lines = run["output"].split()
    assert lines[0] == str(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout.strip())
    assert "no-environ" in lines and "no-data" in lines, run["output"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to start a non-root agent")
def test_an_agent_not_running_as_root_refuses_a_shell_user(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o777)
    code, out = exits_with(["--node-id", "n1", "--raft-addr", free_addr(), "--http-addr", free_addr(),
                            "--data-dir", str(data), "--secret", SECRET, "--allow-shell", "--shell-user", "nobody"],
                           # Non-root, yet able to read a checkout kept in a directory only root may enter
                           # (a clone in ``mktemp -d``, mode 0700): reading, not the root check, is lent.
                           base_env(), launcher=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                 "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"))
    assert code == 2, out
    assert "--shell-user 'nobody' needs the agent to run as root" in out


def test_a_fork_bomb_and_a_memory_hog_are_bounded(start_agent: Callable[..., Node]) -> None:
    if os.geteuid() == 0:
        node = start_agent("--allow-shell", "--shell-user", "nobody")  # RLIMIT_NPROC does not bind root
    else:
        node = start_agent("--allow-shell")
    forker = ("import os, time\nn = 0\ntry:\n    for _ in range(300):\n        if os.fork() == 0:\n"
              "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
              "except OSError as exc:\n    print('refused after', n)\nprint('forked', n)\n")
    put(node, shell_job("bomb", ["python3", "-c", forker], limits={"processes": 32}))
    hog = "b = bytearray(1 << 30); print('allocated')"
    put(node, shell_job("hog", ["python3", "-c", hog], limits={"memory": "128Mi"}))
    bomb = run_now(node, "bomb")
    assert "refused after" in bomb["output"], bomb
    assert int(bomb["output"].split("forked")[-1].split()[0]) < 32
    mem = run_now(node, "hog")
    assert mem["status"] == "failed" and "MemoryError" in mem["output"], mem


# ---- finding 3 (second half): weak secrets --------------------------------------------------------


@pytest.mark.parametrize("secret", [PLACEHOLDER, "short-secret", "x" * 31])
def test_the_agent_refuses_a_weak_secret(tmp_path: Path, secret: str) -> None:
    env = {**base_env(), "RAFTCRON_SECRET": secret}
    code, out = exits_with(["--node-id", "n1", "--raft-addr", free_addr(), "--http-addr", free_addr(),
                            "--data-dir", str(tmp_path / "d")], env)
    assert code == 2, out
    assert out.startswith("error: --secret (RAFTCRON_SECRET) is ")
    assert not (tmp_path / "d").exists()


def test_a_secret_file_starts_a_node(tmp_path: Path) -> None:
    path = tmp_path / "vol" / "secret"
    assert subprocess.run([sys.executable, "-m", "api.secretfile", str(path)], cwd=ROOT, check=False,
                          capture_output=True).returncode == 0
    cluster = Cluster.create(tmp_path / "c", 1)
    node = cluster.nodes[0]
    del node.env["RAFTCRON_SECRET"]
    node.env["RAFTCRON_SECRET_FILE"] = str(path)
    cluster.start()
    try:
        wait_for("a leader with the generated secret", lambda: cluster.leader(30) is node, 40)
    finally:
        cluster.stop()


# ---- finding 4: ReDoS in expect_body ----------------------------------------------------------------


def test_a_catastrophic_pattern_does_not_freeze_the_node(start_agent: Callable[..., Node]) -> None:
    # Python's re needs ~2^n steps for (a+)+$ against n 'a' and a 'b': n = 25 froze a node
    # 9 s; at 40 it would never finish. RE2 answers at once, and the node keeps serving.
    evil = EvilBody(b"a" * 40 + b"b")
    try:
        node = start_agent()
        doc = {"name": "redos", "schedule": "@manually", "executor": "http", "timeout": "10s",
               "http": {"url": evil.url, "method": "GET", "expect_body": r"(a+)+$"}}
        put(node, doc)
        status, body = api(node, "POST", "/v1/jobs/redos/run")
        assert status == 202, body
        run_id = body["run_id"]

        def finished() -> dict[str, Any] | None:
            health, _ = api(node, "GET", "/v1/health", timeout=2.0)  # a frozen loop fails this
            assert health == 200
            _, run = api(node, "GET", f"/v1/runs/{run_id}", token=READ, timeout=2.0)
            return run if run["status"] in DONE else None

        run = wait_for("the expect_body run to finish while the node answers", finished, 30)
        assert run["status"] == "failed" and "does not match expect_body" in run["error"], run
    finally:
        evil.close()


def test_a_pattern_re2_refuses_is_a_400_naming_the_field(start_agent: Callable[..., Node]) -> None:
    node = start_agent()
    doc = {"name": "look", "schedule": "@hourly", "executor": "http",
           "http": {"url": "http://127.0.0.1:9/", "expect_body": r"(?=ok)ok"}}
    status, body = api(node, "PUT", "/v1/jobs/look", doc)
    assert status == 400, body
    assert [d["field"] for d in body["error"]["details"]] == ["http.expect_body"]


# ---- finding 6: non-ASCII tokens, world-readable journal ------------------------------------------


@pytest.mark.parametrize("raw", ["wé".encode(), b"\xff\xfe", "ключ".encode()])
def test_a_non_ascii_token_is_401(start_agent: Callable[..., Node], raw: bytes) -> None:
    node = start_agent()
    with socket.create_connection(("127.0.0.1", node.http_port), timeout=5) as s:
        s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + raw + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"401", answer[:300]
    assert b"Traceback" not in node.log().encode() and "unexpected error" not in node.log()


def test_the_data_directory_and_its_files_are_private(tmp_path: Path, start_agent: Callable[..., Node]) -> None:
    node = start_agent("--compaction-entries", "20")
    # A directory an older version left open, with an open file in it.
    for i in range(30):  # past compaction: a snapshot is written too
        put(node, {"name": f"j{i}", "schedule": "@hourly", "executor": "http",
                   "http": {"url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer job-secret"}}})
    wait_for("a snapshot file", lambda: any("dump" in p.name for p in node.data_dir.iterdir()), 30)
    assert stat.S_IMODE(node.data_dir.stat().st_mode) == 0o700
    files = [p for p in node.data_dir.rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, f"{p} is {oct(p.stat().st_mode)}"


def test_an_open_data_directory_from_before_is_tightened(tmp_path: Path) -> None:
    cluster = Cluster.create(tmp_path / "c", 1, secret=SECRET)
    node = cluster.nodes[0]
    node.data_dir.mkdir(parents=True, mode=0o755)
    node.data_dir.chmod(0o755)
    old = node.data_dir / "raft.journal.extra"
    old.write_text("from an older version")
    old.chmod(0o644)
    cluster.start()
    try:
        wait_for("the node to lead", lambda: cluster.leader(30) is node, 40)
        assert stat.S_IMODE(node.data_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(old.stat().st_mode) == 0o600
    finally:
        cluster.stop()

