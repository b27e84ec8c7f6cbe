"""Real `raftcron agent` processes on 127.0.0.1, and an HTTP sink that records deliveries.

Every wait is bounded and says what it waited for. Processes are ended only by
the PIDs this harness started.

Agents can run under libfaketime (Debian's ``faketime`` package) with a wall-clock offset
each reads from its own file, settable while it runs (``Node.set_clock_offset``), so a test
can skew a node it picked by its role after the election.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Imported as `sitecustomize` by agents started under libfaketime: faketime_site/sitecustomize.py says why.
FAKETIME_SITE = Path(__file__).resolve().parent / "faketime_site"
# Lines a test wants quoted at the end of the run (the conftest prints them in the summary).
REPORT: list[str] = []


def libfaketime() -> Path | None:
    """The preload library of Debian's libfaketime package (where `dpkg -L libfaketime` puts
    it), or None when it is not installed."""
    try:
        listed = subprocess.run(["dpkg-query", "-L", "libfaketime"], capture_output=True, text=True,
                                timeout=20).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        listed = []
    candidates = [Path(line) for line in listed if line.endswith("/libfaketime.so.1")]
    candidates += sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    candidates.append(Path("/usr/local/lib/faketime/libfaketime.so.1"))
    return next((p for p in candidates if p.is_file()), None)


def faketime_env(library: Path, clock_file: Path) -> dict[str, str]:
    """What an agent's environment needs to run with the offset written in ``clock_file``.

    The monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC=1), decided by experiment
    with libfaketime 0.9.10 and Python 3.11: faked, it makes every timed wait of a thread
    (Event.wait, Lock.acquire, queue.get with a timeout) hang (an Event.wait(0.2) had not
    returned after 10 s), because Python computes the deadline from the faked clock and
    glibc's sem_clockwait, which the library does not intercept, compares it with the real
    one; the agent's start (RaftNode.start) waits like that. Skew between machines is a matter
    of wall clocks anyway: a monotonic clock only measures intervals. Left alone, it breaks
    time.sleep instead (EINVAL), which the sitecustomize in FAKETIME_SITE mends. The offset file is read at most once a second
    (FAKETIME_CACHE_DURATION=1), so a new offset holds within about a second.

    The library's "monotonic fix" is turned off (FAKETIME_FORCE_MONOTONIC_FIX=0). On glibc 2.36
    it turns itself on, and then every pthread_cond_timedwait on a monotonic condition returns at
    once, the interpreter's own among them: a thread waiting for the GIL, meant to wait 5 ms
    before asking for it, spins instead (measured: a thread back from a 10 ms sleep took the GIL
    from a busy one in 0.2 ms, against 5.4 ms without the library). Agents so treated used about
    twice the CPU (6-7 s against 3 s over the same 45 s), and their raft thread, at offset 0,
    went silent for 0.5-1 s at a time, long enough for an election. Off, the handover takes the
    5.4 ms it takes without the library, and the waits of ``faketime_site`` are unchanged.
    """
    return {"LD_PRELOAD": str(library), "FAKETIME_TIMESTAMP_FILE": str(clock_file),
            "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_FORCE_MONOTONIC_FIX": "0",
            "PYTHONPATH": os.pathsep.join([str(FAKETIME_SITE), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _ephemeral_range() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_ports(n: int) -> list[int]:
    """Ports free now and outside the kernel's ephemeral range.

    A port the kernel hands out for bind(0) comes from the ephemeral range, which outgoing
    connections draw their local ports from too: a node restarted on its port could find it
    taken by another connection's local end (EADDRINUSE). Below that range only listeners
    take ports.
    """
    ephemeral = _ephemeral_range()
    pool = [p for p in range(10_000, 30_000) if p not in ephemeral]
    ports: list[int] = []
    for port in random.sample(pool, len(pool)):
        if len(ports) == n:
            break
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    assert len(ports) == n, f"only {len(ports)} of {n} free ports below the ephemeral range"
    return ports


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - a node may be down while we wait
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def http(method: str, url: str, body: Any = None, timeout: float = 5.0, token: str | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


@dataclass
class Node:
    name: str
    raft_port: int
    http_port: int
    data_dir: Path
    log_path: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    clock_file: Path | None = None  # set when the agent runs under libfaketime

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def raft_addr(self) -> str:
        return f"127.0.0.1:{self.raft_port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "api.cli", "agent", *self.args], cwd=ROOT,
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"{self.name} ignored SIGTERM for {timeout}s") from None
        return int(self.proc.returncode)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, timeout: float = 5.0, catching_up: float = 60.0) -> Any:
        """A 503 of a node catching up after its start is waited out, for at most ``catching_up``
        seconds, as the CLI does."""
        deadline = time.monotonic() + catching_up
        while True:
            status, body = http("GET", self.url + path, timeout=timeout)
            if status != 503 or "catching up" not in str(body) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200, f"GET {path} on {self.name}: {status} {body}"
        return body

    def metric(self, family: str) -> float:
        """The sum of a family's series on this node's ``/metrics`` (a family without labels:
        its one value)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((family + "{", family + " ")))

    def set_clock_offset(self, seconds: float) -> None:
        """Set this agent's wall clock to ours plus ``seconds`` (it holds within about a second)."""
        assert self.clock_file is not None, f"{self.name} was not started under libfaketime"
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+g}s\n")
        tmp.replace(self.clock_file)  # the library never reads a half-written file

    def clock_offset(self) -> float:
        """This agent's wall clock minus ours, to within a second: the Date header of an API
        answer, which is the agent's time truncated to the second, so the result lies in
        (offset - 1, offset + the request's duration]."""
        before = time.time()
        with urllib.request.urlopen(self.url + "/v1/health", timeout=5) as resp:
            stamp = email.utils.parsedate_to_datetime(resp.headers["Date"]).timestamp()
        return stamp - before


@dataclass
class Cluster:
    nodes: list[Node]
    secret: str
    extra: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, tmp: Path, size: int = 3, *, secret: str = "cluster-test-secret-of-at-least-32-bytes",
               extra: list[str] | None = None, per_node: dict[int, list[str]] | None = None,
               secrets: dict[int, str] | None = None, faketime: Path | None = None) -> Cluster:
        """``faketime``: the libfaketime library to start every agent under, each with offset 0
        until its ``set_clock_offset``."""
        tmp.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * size)
        raft, httpp = ports[:size], ports[size:]
        nodes = []
        for i in range(size):
            peers = ",".join(f"127.0.0.1:{raft[j]}" for j in range(size) if j != i)
            data = tmp / f"n{i + 1}"
            args = ["--node-id", f"n{i + 1}", "--raft-addr", f"127.0.0.1:{raft[i]}", "--peers", peers,
                    "--http-addr", f"127.0.0.1:{httpp[i]}", "--data-dir", str(data), *(extra or []),
                    *((per_node or {}).get(i, []))]
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTCRON_")}
            env["RAFTCRON_SECRET"] = (secrets or {}).get(i, secret)
            env["PYTHONUNBUFFERED"] = "1"
            clock = None
            if faketime is not None:
                clock = tmp / f"n{i + 1}.faketime"
                clock.write_text("+0s\n")
                env.update(faketime_env(faketime, clock))
            nodes.append(Node(f"n{i + 1}", raft[i], httpp[i], data, tmp / f"n{i + 1}.log", args, env, clock_file=clock))
        return cls(nodes, secret, extra or [])

    def start(self) -> Cluster:
        for n in self.nodes:
            n.start()
        return self

    def kill9_and_start_all(self) -> None:
        """Every node killed (SIGKILL), then every node started again."""
        for n in self.nodes:
            n.kill9()
        for n in self.nodes:
            n.start()

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.resume()
                try:
                    n.terminate(15)
                except AssertionError:
                    pass

    def by_name(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive()]

    def leader(self, timeout: float = 20.0, among: list[Node] | None = None) -> Node:
        """The node every live member agrees leads, once the barrier has registered everyone."""
        group = among or self.live()

        def agreed() -> Node | None:
            seen = set()
            for n in group:
                body = n.get("/v1/cluster", timeout=2)
                leader = body.get("leader") or {}
                seen.add(leader.get("node_id"))
            names = {n.name for n in group}
            if len(seen) == 1 and None not in seen and seen <= names:
                return self.by_name(seen.pop())
            return None

        return wait_for("a leader all live nodes agree on", agreed, timeout)

    def wait_registered(self, timeout: float = 20.0) -> None:
        names = {n.name for n in self.nodes}
        wait_for("every node registered", lambda: {m["node_id"] for m in self.leader().get("/v1/cluster")["members"]} >= names, timeout)

    def put_job(self, doc: dict[str, Any], via: Node | None = None, timeout: float = 20.0) -> dict[str, Any]:
        target = via or self.leader()

        def attempt() -> Any:
            status, body = http("PUT", f"{target.url}/v1/jobs/{doc['name']}", doc, timeout=6)
            if status in (200, 201):
                return body
            if status in (503, 504):
                return None
            raise AssertionError(f"PUT job {doc['name']}: {status} {body}")

        return wait_for(f"job {doc['name']} stored", attempt, timeout)  # type: ignore[no-any-return]

    def runs(self, job: str, via: Node | None = None) -> list[dict[str, Any]]:
        node = via or self.live()[0]
        items: list[dict[str, Any]] = []
        cursor = None
        for _ in range(200):
            q = f"/v1/jobs/{job}/runs?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            body = node.get(q)
            items += body["items"]
            cursor = body["next_cursor"]
            if not cursor:
                break
        return items

    def dump_logs(self) -> str:
        return "\n".join(f"===== {n.name} =====\n{n.log()[-6000:]}" for n in self.nodes)


@dataclass
class Delivery:
    at: float  # wall clock, seconds
    path: str
    headers: dict[str, str]
    body: bytes = b""
    answered: int = 200


class Sink:
    """Records every request it receives; ``/slow?s=N`` holds the answer N seconds."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host  # an address the agents reach: the fault suite's agents live in other namespaces
        self.deliveries: list[Delivery] = []
        self.failing: set[str] = set()  # paths answered 500 until removed
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                now = time.time()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status = 500 if self.path.startswith("/fail") or self.path in sink.failing else 200
                with sink._lock:
                    sink.deliveries.append(Delivery(now, self.path, {k: v for k, v in self.headers.items()}, body, status))
                if self.path.startswith("/slow"):
                    seconds = float(self.path.split("s=")[-1]) if "s=" in self.path else 30.0
                    time.sleep(seconds)
                reply = b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                try:
                    self.wfile.write(reply)
                except OSError:
                    pass

            do_GET = do_POST = do_PUT = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def of(self, job: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.headers.get("X-Raftcron-Job") == job]

    def at(self, path: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def job_doc(name: str, url: str, schedule: str = "@every 1s", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "schedule": schedule, "executor": "http",
                           "http": {"url": url, "method": "POST"}, "timeout": "20s"}
    doc.update(extra)
    return doc
