"""A 3-member etcd cluster on 127.0.0.1 for bench.compare: started, killed and restarted by PID.

etcd comes from Debian (``apt-get install etcd-server etcd-client``: etcd 3.4 on bookworm) and
runs with its defaults (fsync on, heartbeat 100 ms, election timeout 1 s) apart from the
addresses, data directories and ``--log-level warn``. Clients talk to its HTTP/JSON gateway
(``POST /v3/kv/put``, keys and values base64), which lets the benchmark drive etcd and
raftcron with the same aiohttp client: each write is one JSON request either way.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.harness import free_ports, http, wait_for

from .rig import cpu_seconds


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if not found:
        raise SystemExit("etcd is not installed: apt-get install etcd-server etcd-client (Debian ships etcd 3.4)")
    return found


def put_body(key: str, value: bytes) -> dict[str, str]:
    """The gateway's PutRequest: key and value as base64 strings."""
    return {"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(value).decode()}


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    initial_cluster: str
    token: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        peer = f"http://127.0.0.1:{self.peer_port}"
        # with a data directory that holds a WAL, etcd ignores the initial-cluster flags and rejoins
        args = [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial_cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--log-level", "warn", "--logger", "zap"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def status(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """``/v3/maintenance/status``: this member's id, the leader's id, raft index and term."""
        try:
            code, body = http("POST", self.url + "/v3/maintenance/status", {}, timeout=timeout)
        except OSError:
            return None
        return body if code == 200 and isinstance(body, dict) else None

    def cpu(self) -> float | None:
        return cpu_seconds(self.proc.pid) if self.alive() and self.proc else None


class EtcdCluster:
    """Three members in a temporary directory; ``stop()`` ends only the processes it started."""

    def __init__(self, size: int = 3) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raftcron-bench-etcd-"))
        ports = free_ports(2 * size)
        names = [f"e{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://127.0.0.1:{ports[size + i]}" for i, n in enumerate(names))
        token = f"compare-{time.time_ns()}"
        self.nodes = [Member(n, ports[i], ports[size + i], self.dir / n, self.dir / f"{n}.log", initial, token)
                      for i, n in enumerate(names)]

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        for m in self.nodes:
            m.start()
        self.leader(timeout)
        return self

    def stop(self) -> None:
        for m in self.nodes:
            m.terminate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def leader(self, timeout: float = 30.0, among: list[Member] | None = None) -> Member:
        """The member the live members agree leads (each member's status names the leader's id)."""
        pool = among if among is not None else self.nodes

        def agreed() -> Member | None:
            ids: dict[str, Member] = {}
            leaders = set()
            for m in pool:
                if not m.alive():
                    continue
                st = m.status()
                if st is None or str(st.get("leader", "0")) == "0":
                    return None
                ids[str(st["header"]["member_id"])] = m
                leaders.add(str(st["leader"]))
            if len(leaders) == 1:
                return ids.get(leaders.pop())
            return None

        found: Member = wait_for("an etcd leader", agreed, timeout, interval=0.05)
        return found

    def caught_up(self, member: Member, timeout: float = 60.0) -> float:
        """Wait until ``member`` has applied the leader's committed index as of when we asked (as the
        raftcron side waits for its applied index); seconds taken."""
        t0 = time.monotonic()

        def check() -> bool:
            lead = self.leader(timeout=min(10.0, max(0.1, t0 + timeout - time.monotonic())))
            target = (lead.status() or {}).get("raftIndex")
            mine = member.status()
            return target is not None and mine is not None and int(mine.get("raftAppliedIndex", 0)) >= int(target)

        wait_for(f"etcd {member.name} to catch up", check, timeout, interval=0.05)
        return time.monotonic() - t0

    def logs(self) -> str:
        return "\n".join(f"--- {m.name}\n" + m.log_path.read_text(errors="replace")[-3000:]
                         for m in self.nodes if m.log_path.exists())
