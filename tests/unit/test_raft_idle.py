"""A state machine's ``idle`` (``raftlog.fsm``) runs on the raft thread at its ticks, with no
entry applied; one that raises is logged once and raft goes on without it. A state machine that
lost state it kept locally (``LocalStateLost``, from apply or idle) takes its node out of raft."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from raftlog.fsm import ApplyContext, LocalStateLost
from raftlog.node import RAFT_THREAD_NAME, NodeConfig, RaftNode
from tests.unit.test_raft_compaction import Weighed


class Idles(Weighed):
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.threads: list[str] = []

    def idle(self) -> None:
        # The OS thread's name, as the node sets it on the raft thread (top -H shows it).
        self.threads.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())
        if self.fail:
            raise RuntimeError("housekeeping broke")


def _wait(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _node(tmp_path: Path, fsm: Weighed) -> RaftNode:
    return RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s" * 32, fsync=False), fsm)


def test_idle_runs_on_the_raft_thread_at_its_ticks(tmp_path: Path) -> None:
    fsm = Idles()
    node = _node(tmp_path, fsm)
    node.start()
    try:
        _wait("ten ticks' idle calls", lambda: len(fsm.threads) >= 10)
        assert set(fsm.threads) == {RAFT_THREAD_NAME}
    finally:
        node.stop()


def test_an_idle_that_raises_is_logged_once_and_raft_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fsm = Idles(fail=True)
    node = _node(tmp_path, fsm)
    node.start()
    try:
        _wait("the node leading", node.is_leader)
        _wait("a tick after the failure", lambda: node.status().applied_index >= 1 or len(fsm.threads) >= 1)
        time.sleep(0.2)  # more ticks: none of them calls idle again
        assert len(fsm.threads) == 1
        assert caplog.text.count("idle work failed") == 1
    finally:
        node.stop()


class Loses(Weighed):
    """Loses its local state on the entry ``b"lose"`` (from apply), or at its first idle call."""

    def __init__(self, in_idle: bool = False) -> None:
        self.in_idle = in_idle
        self.applied: list[bytes] = []

    def apply(self, command: bytes, ctx: ApplyContext) -> None:
        if command == b"lose":
            raise LocalStateLost("a scratch file could not be read back")
        self.applied.append(command)

    def idle(self) -> None:
        if self.in_idle and self.applied:
            raise LocalStateLost("a scratch file could not be read back")


def _submit(node: RaftNode, payload: bytes) -> None:
    node.submit(payload, lambda result, err: None)


@pytest.mark.parametrize("where", ["apply", "idle"])
def test_a_state_machine_that_lost_local_state_takes_the_node_out_of_raft(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str) -> None:
    fsm = Loses(in_idle=where == "idle")
    node = _node(tmp_path, fsm)
    node.start()
    try:
        _wait("the node leading", node.is_leader)
        _submit(node, b"first")
        _wait("the first entry applied", lambda: fsm.applied == [b"first"])
        if where == "apply":
            _submit(node, b"lose")
        _wait("the node out of raft", lambda: node.status().state == "refused")
        assert not node.is_leader()
        _submit(node, b"after")
        time.sleep(0.3)  # ticks go by: none applies anything more
        assert fsm.applied == [b"first"]
        assert "lost state it kept on this node" in caplog.text
    finally:
        node.stop()
