"""A full data directory: writes answer 507 ``insufficient_storage``, nothing acknowledged is
lost, and the node takes writes again once space returns.

Each node's data directory is a small tmpfs the test mounts (root only) and a filler file eats
its free space. The disk is filled two ways: under the API's floor (the guard answers 507), and
to the last byte with the floor off (``--min-free 0``): a journal append then meets ENOSPC in
the raft layer itself, which must fail cleanly (no SIGBUS from a write into an unbacked page of
the mapped journal, no torn record) and recover. A leader whose disk fills hands leadership to
a follower, so writes through the others go on.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.space import free_bytes
from tests.cluster.harness import Cluster, Node, Sink, http, job_doc, wait_for
from tests.faults.checker import check

pytestmark = pytest.mark.faults

TMPFS_SIZE = "16m"
START_TIMEOUT = 90.0


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if subprocess.run(["which", "mount"], capture_output=True).returncode != 0:
        return "mount is missing"
    return None


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path], Path]]:
    """Mounts a TMPFS_SIZE tmpfs at a path; every mount is unmounted after the test."""
    reason = _can_mount()
    if reason is not None:
        if os.environ.get("CI") == "1":
            pytest.fail(f"the disk-full test needs to mount a tmpfs and CI=1 is set: {reason}")
        pytest.skip(reason)
    mounted: list[Path] = []

    def mount(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "rcdiskfull", str(path)],
                       check=True, capture_output=True, timeout=30)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)


def _fill(data_dir: Path, leave: int) -> Path:
    """Take the directory's free space down to about ``leave`` bytes with a filler file."""
    filler = data_dir / "filler"
    size = free_bytes(data_dir) - leave
    assert size > 0, f"{data_dir} has only {free_bytes(data_dir)} bytes free"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return filler


def _fill_up(data_dir: Path) -> Path:
    """Every last byte: the filler, then single blocks into a second file until ENOSPC."""
    filler = _fill(data_dir, 64 << 10)
    fd = os.open(data_dir / "filler.rest", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for k in range(1024):
            os.posix_fallocate(fd, k * 4096, 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert free_bytes(data_dir) < 4096, f"{data_dir} still has {free_bytes(data_dir)} bytes free"
    return filler


def _put(node: Node, name: str, timeout: float = 10) -> tuple[int, Any]:
    doc = job_doc(name, "http://127.0.0.1:9/unused", schedule="@every 1h", paused=True, description=name)
    try:
        return http("PUT", f"{node.url}/v1/jobs/{name}", doc, timeout=timeout)
    except OSError as exc:  # no answer: the node may have died
        return 0, str(exc)


def _started(node: Node) -> bool:
    assert node.alive(), f"{node.name} exited:\n{node.log()[-4000:]}"
    status, body = http("GET", node.url + "/v1/cluster", timeout=2)
    return status == 200 and bool((body.get("leader") or {}).get("node_id"))


class _Acked(dict[str, dict[str, Any]]):
    def put(self, node: Node, name: str) -> int:
        # A write the journal cannot take is retried by the agent until it gives up (outcome
        # unknown): a bound well past its three commit timeouts.
        status, body = _put(node, name, timeout=60)
        if status in (200, 201):
            self[name] = {"description": name, "paused": True}
        return status


def test_a_full_data_directory_answers_507_and_recovers(tmp_path: Path, tmpfs: Callable[[Path], Path]) -> None:
    cluster = Cluster.create(tmp_path / "c", 1)
    node = cluster.nodes[0]
    tmpfs(node.data_dir)
    acked = _Acked()
    sink = Sink()
    t0 = time.time()
    try:
        node.start()
        wait_for("the node leading", lambda: _started(node), START_TIMEOUT)
        for k in range(20):
            assert acked.put(node, f"before-{k}") in (200, 201)

        filler = _fill(node.data_dir, 1 << 20)  # under the 2 MiB floor
        status, body = _put(node, "refused")
        assert status == 507 and body["error"]["code"] == "insufficient_storage", (status, body)
        assert "MiB free" in body["error"]["message"], body
        assert node.get("/v1/jobs/before-0")["spec"]["description"] == "before-0"  # reads still served

        filler.unlink()  # space returns
        wait_for("a write accepted once space returned", lambda: acked.put(node, "after-0") in (200, 201), 30)
        node.kill9()
        node.start()
        wait_for("the node leading after a restart", lambda: _started(node), START_TIMEOUT)
        verdict = check(sink, cluster, [], (t0, time.time()), acknowledged=acked, settle_timeout=30, barrier=30)
        assert verdict.ok, verdict.report()
        assert "refused" not in {j["name"] for j in node.get("/v1/jobs?limit=1000")["items"]}
    finally:
        cluster.stop()
        sink.close()


def test_a_journal_that_meets_a_full_disk_fails_the_write_and_recovers(tmp_path: Path,
                                                                        tmpfs: Callable[[Path], Path]) -> None:
    # The floor off: the journal itself meets ENOSPC.
    cluster = Cluster.create(tmp_path / "c", 1, extra=["--min-free", "0"])
    node = cluster.nodes[0]
    tmpfs(node.data_dir)
    acked = _Acked()
    sink = Sink()
    t0 = time.time()
    try:
        node.start()
        wait_for("the node leading", lambda: _started(node), START_TIMEOUT)
        for k in range(20):
            assert acked.put(node, f"before-{k}") in (200, 201)
        filler = _fill_up(node.data_dir)
        refused = None
        for k in range(300):  # enough to outgrow whatever the journal had reserved
            status = acked.put(node, f"full-{k}")
            assert node.alive(), (f"the node died on a full disk (write {k}, exit status "
                                  f"{node.proc.returncode if node.proc else None}):\n{node.log()[-2000:]}")
            if status not in (200, 201):
                refused = status
                break
        assert refused in (503, 504), f"a write on a full disk answered {refused} (None: all 300 accepted)"
        filler.unlink()
        (node.data_dir / "filler.rest").unlink()
        wait_for("a write accepted once space returned", lambda: acked.put(node, "after-0") in (200, 201), 60)
        node.kill9()
        node.start()
        wait_for("the node leading after a restart", lambda: _started(node), START_TIMEOUT)
        verdict = check(sink, cluster, [], (t0, time.time()), acknowledged=acked, settle_timeout=30, barrier=30)
        assert verdict.ok, verdict.report()
    finally:
        cluster.stop()
        sink.close()


def _leader_name(node: Node) -> str | None:
    status, body = http("GET", node.url + "/v1/cluster", timeout=2)
    return (body.get("leader") or {}).get("node_id") if status == 200 else None


def test_a_leader_whose_disk_fills_hands_over_and_writes_go_on(tmp_path: Path,
                                                             tmpfs: Callable[[Path], Path]) -> None:
    cluster = Cluster.create(tmp_path / "c", 3)
    for n in cluster.nodes:
        tmpfs(n.data_dir)
    acked = _Acked()
    sink = Sink()
    t0 = time.time()
    try:
        cluster.start()
        cluster.wait_registered(START_TIMEOUT)
        full = cluster.leader()
        others = [n for n in cluster.nodes if n is not full]
        for k in range(10):
            assert acked.put(full, f"before-{k}") in (200, 201)

        filler = _fill_up(full.data_dir)  # to the last byte: its journal can take nothing more
        # Writes through a follower go on: the full leader hands over instead of holding every
        # forwarded write until it times out.
        wait_for("a write through a follower acknowledged after the leader's disk filled",
                 lambda: acked.put(others[0], "during-0") in (200, 201), 60)
        assert _leader_name(others[0]) != full.name
        # The other follower learns of the handover at the new leader's first AppendEntries;
        # until then it forwards to the full node, and its write times out (504, seen once in CI).
        wait_for("both followers naming the new leader", lambda: _leader_name(others[1]) == _leader_name(others[0])
                 not in (None, full.name), 30)
        for k in range(1, 10):
            assert acked.put(others[k % 2], f"during-{k}") in (200, 201)
        status, body = _put(full, "refused")
        assert status == 507 and body["error"]["code"] == "insufficient_storage", (status, body)
        assert full.alive(), full.log()[-3000:]

        filler.unlink()
        (full.data_dir / "filler.rest").unlink()
        wait_for(f"{full.name} caught up once space returned",
                 lambda: http("GET", f"{full.url}/v1/jobs/during-9", timeout=2)[0] == 200, 60)
        # An acknowledged write through a follower in the instant of the handover was lost here
        # in about 1 run in 10 before the full leader stopped leading in a term it could not
        # store (tests/unit/test_raft_term_store.py).
        verdict = check(sink, cluster, [], (t0, time.time()), acknowledged=acked, settle_timeout=30, barrier=30)
        assert verdict.ok, verdict.report()
    finally:
        cluster.stop()
        sink.close()
