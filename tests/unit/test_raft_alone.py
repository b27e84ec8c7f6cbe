"""A node with no other member commits what is submitted at once, not at its next timer tick.

pysyncobj counts commits at the top of a tick and appends a submitted command later in it; in
a cluster a follower's answer ends the poll that follows, alone nothing does, so each write
waited out the rest of a tick period. ``_Pacer.on_tick`` now ends that poll."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from raftlog.node import RAFT_THREAD_NAME, NodeConfig, RaftNode
from raftlog.pacing import _Pacer
from tests.unit.test_raft_compaction import Weighed
from tests.unit.test_raft_pacing import FakeHost, entries

TICK = 2.0  # long enough that a commit waiting for the timer cannot pass for a prompt one


def _thread_names() -> set[str]:
    names = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:  # a thread that ended meanwhile
            continue
    return names


def test_a_leader_alone_wakes_its_poll_once_per_new_entry() -> None:
    host = FakeHost(entries(1, 3, 2), leader=True)
    host.otherNodes = []
    pacer = _Pacer(host)  # type: ignore[arg-type]
    host._SyncObj__raftCommitIndex = 3
    pacer.on_tick()
    assert not pacer._wake_pending  # nothing to commit
    host._SyncObj__raftLog += entries(4, 4, 2)
    pacer.on_tick()
    assert pacer._wake_pending  # entry 4 commits at the next tick, which starts at once
    pacer._woken()
    pacer.on_tick()
    assert not pacer._wake_pending  # once per entry: a commit that cannot move must not spin
    host._SyncObj__raftLog += entries(5, 5, 2)
    pacer.on_tick()
    assert pacer._wake_pending
    pacer._woken()
    host.otherNodes = ["b", "c"]  # with followers their answers end the poll
    host._SyncObj__raftLog += entries(6, 6, 2)
    pacer.on_tick()
    assert not pacer._wake_pending
    host.leader = False
    host.otherNodes = []
    host._SyncObj__raftLog += entries(7, 7, 2)
    pacer.on_tick()
    assert not pacer._wake_pending


def test_a_node_alone_commits_writes_well_inside_one_tick_period(tmp_path: Path) -> None:
    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s" * 32,
                               fsync=False, tick_period=TICK), Weighed())
    node.start()
    try:
        deadline = time.monotonic() + 6 * TICK  # an election is a tick or two here; bounded, not timed
        while not node.is_leader():
            assert time.monotonic() < deadline, "the node never led"
            time.sleep(0.05)
        assert RAFT_THREAD_NAME in _thread_names()  # as top -H and bench.threads show it
        took = []
        for _ in range(3):
            done = threading.Event()
            outcome: list[Any] = []

            def callback(result: Any, err: int, done: threading.Event = done, outcome: list[Any] = outcome) -> None:
                outcome.append(err)
                done.set()

            began = time.monotonic()
            node.submit(b"x", callback)
            assert done.wait(6 * TICK), "no commit"
            took.append(time.monotonic() - began)
            assert outcome == [0]
        # Before, each waited for the timer: ~2 s apiece. Now each ends in milliseconds.
        assert sum(took) < TICK, took
    finally:
        node.stop()
