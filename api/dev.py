"""`raftcron dev`: a local cluster on loopback, for trying raftcron without Docker.

Starts N agents as child processes (raft on 127.0.0.1:7001.., API on
127.0.0.1:8001..), with a secret generated once and kept in the data
directory, prints the URLs, and stops them all on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = ["add_dev_arguments", "run_dev"]


def add_dev_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5), help="cluster size (default 3)")
    p.add_argument("--data-dir", default="./raftcron-dev", help="where the nodes keep their data")
    p.add_argument("--raft-port", type=int, default=7001, help="first raft port (default 7001)")
    p.add_argument("--http-port", type=int, default=8001, help="first API port (default 8001)")
    p.add_argument("--allow-shell", action="store_true", help="let every node run shell jobs")
    p.add_argument("--log-format", choices=("text", "json"), default="text")


def _secret(data_dir: Path) -> str:
    path = data_dir / "secret"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/health", timeout=0.5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def run_dev(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    secret = _secret(data_dir)
    raft = [f"127.0.0.1:{args.raft_port + i}" for i in range(args.nodes)]
    http = [f"127.0.0.1:{args.http_port + i}" for i in range(args.nodes)]
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "RAFTCRON_SECRET": secret}
    for i in range(args.nodes):
        cmd = [sys.executable, "-m", "api.cli", "agent", "--node-id", f"n{i + 1}", "--raft-addr", raft[i],
               "--peers", ",".join(a for j, a in enumerate(raft) if j != i), "--http-addr", http[i],
               "--data-dir", str(data_dir / f"n{i + 1}"), "--log-format", args.log_format]
        if args.allow_shell:
            cmd.append("--allow-shell")
        procs.append(subprocess.Popen(cmd, env=env))
    stop = {"now": False}

    def _stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deadline = time.monotonic() + 30
    urls = [f"http://{h}" for h in http]
    while not stop["now"] and time.monotonic() < deadline and not all(_healthy(u) for u in urls):
        time.sleep(0.2)
    print(f"raftcron dev cluster: {args.nodes} node(s), data in {data_dir}", flush=True)
    for i, u in enumerate(urls):
        print(f"  n{i + 1}  API {u}   raft {raft[i]}", flush=True)
    print(f"try:  RAFTCRON_SERVER={','.join(urls)} raftcron status      (Ctrl-C stops the cluster)", flush=True)
    while not stop["now"] and all(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    return 0 if stop["now"] and all(c in (0, -signal.SIGTERM) for c in codes) else 1
