"""Crash consistency: what the API acknowledged survives losing every byte the node had not
fsynced, with the last record torn, round after round.

The agent's data directory is a crashfs mount (``tests/faults/crashfs.py``). Each round: writers
PUT jobs concurrently, the node is killed with SIGKILL mid-stream, the filesystem loses what was
not synced (keeping a torn prefix of each file's last write), and the node restarts on what is
left. At the end every write acknowledged in any round must be there (the fault suite's checker,
``acknowledged=``). A single node, so an acknowledged write was on this one disk.

``RAFTCRON_FAULTS_CRASH_ROUNDS`` sets the rounds (10 by default). ``RAFTCRON_FAULTS_NO_FSYNC=1``
starts the agent with ``--no-fsync``: the test must then fail, which shows it can.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import REPORT, Cluster, Node, Sink, http, job_doc, wait_for
from tests.faults.checker import check
from tests.faults.crashfs import CrashFs, fuse_available

pytestmark = pytest.mark.faults

ROUNDS = int(os.environ.get("RAFTCRON_FAULTS_CRASH_ROUNDS", "10"))
NO_FSYNC = os.environ.get("RAFTCRON_FAULTS_NO_FSYNC") == "1"
WRITERS = 4
WRITES_PER_ROUND = 80  # the kill comes once this many are acknowledged (or after WRITE_SECONDS)
WRITE_SECONDS = 20.0
START_TIMEOUT = 90.0
COMPACTION_ENTRIES = 150  # a restart on a busy shared machine; a node that exits fails at once


@pytest.fixture
def fuse() -> None:
    reason = fuse_available()
    if reason is None:
        return
    if os.environ.get("CI") == "1":
        pytest.fail(f"the crash-consistency test needs FUSE and CI=1 is set: {reason}")
    pytest.skip(f"no FUSE here: {reason}")


@pytest.fixture
def crash_cluster(tmp_path: Path, fuse: None) -> Iterator[tuple[Cluster, CrashFs]]:
    # Compaction every few hundred entries, so crashes land around snapshots (the dump, its
    # side file, the journal rewritten after it) as well as around appends.
    extra = ["--compaction-entries", str(COMPACTION_ENTRIES), *(["--no-fsync"] if NO_FSYNC else [])]
    cluster = Cluster.create(tmp_path / "c", 1, extra=extra)
    node = cluster.nodes[0]
    fs = CrashFs(tmp_path / "backing", node.data_dir, tmp_path / "crashfs.sock", tmp_path / "crashfs.log")
    try:
        yield cluster, fs
    finally:
        cluster.stop()
        fs.unmount()


def _started(node: Node) -> bool:
    assert node.alive(), f"{node.name} exited on start:\n{node.log()[-4000:]}"
    status, body = http("GET", node.url + "/v1/cluster", timeout=2)
    return status == 200 and (body.get("leader") or {}).get("node_id") == node.name


class _Writers:
    """Threads PUTting fresh jobs until stopped; a write counts as acknowledged on 200/201."""

    def __init__(self, node: Node, round_no: int, sink: Sink) -> None:
        self.node, self.round_no, self.sink = node, round_no, sink
        self.acknowledged: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(WRITERS)]

    def _run(self, writer: int) -> None:
        for k in range(10_000):  # bounded; the round stops it long before
            if self.stop.is_set():
                return
            name = f"r{self.round_no}-w{writer}-{k}"
            fields = {"description": f"round {self.round_no} writer {writer} write {k}", "paused": True}
            doc = job_doc(name, self.sink.url(f"/{name}"), schedule="@every 1h", **fields)
            try:
                status, _ = http("PUT", f"{self.node.url}/v1/jobs/{name}", doc, timeout=10)
            except OSError:
                return  # the node is gone
            if status in (200, 201):
                with self.lock:
                    self.acknowledged[name] = fields

    def count(self) -> int:
        with self.lock:
            return len(self.acknowledged)

    def __enter__(self) -> _Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_acknowledged_writes_survive_losing_unsynced_bytes(crash_cluster: tuple[Cluster, CrashFs]) -> None:
    cluster, fs = crash_cluster
    node = cluster.nodes[0]
    sink = Sink()
    acknowledged: dict[str, dict[str, Any]] = {}
    dropped_total = torn_total = 0
    t0 = time.time()
    try:
        for round_no in range(ROUNDS):
            fs.mount()
            node.start()
            wait_for(f"{node.name} leading after restart {round_no}", lambda: _started(node), START_TIMEOUT)
            with _Writers(node, round_no, sink) as writers:
                wait_for(f"{WRITES_PER_ROUND} writes acknowledged in round {round_no}",
                         lambda: writers.count() >= WRITES_PER_ROUND or not node.alive(), WRITE_SECONDS)
                # Mid-stream, the writers still sending. Odd rounds lose power under the running
                # node (the filesystem fails every later write and sync, so nothing after the
                # crash is acknowledged); even rounds kill it first, its page cache kept.
                if round_no % 2:
                    dropped, torn = fs.crash()
                    node.kill9()
                else:
                    node.kill9()
                    dropped, torn = fs.crash()
            acknowledged.update(writers.acknowledged)
            fs.unmount()
            dropped_total += dropped
            torn_total += torn
        fs.mount()
        node.start()
        wait_for(f"{node.name} leading after the last crash", lambda: _started(node), START_TIMEOUT)
        verdict = check(sink, cluster, [], (t0, time.time()), acknowledged=acknowledged, settle_timeout=30, barrier=30)
    finally:
        sink.close()
    lost = sum(1 for v in verdict.violations if v.startswith("acknowledged write"))
    line = (f"crash consistency ({'no fsync' if NO_FSYNC else 'fsync'}): {ROUNDS} rounds, {lost} of "
            f"{len(acknowledged)} acknowledged writes lost; {dropped_total} unsynced bytes dropped, "
            f"{torn_total} files torn")
    REPORT.append(line)
    print(line)
    assert verdict.ok, verdict.report()
