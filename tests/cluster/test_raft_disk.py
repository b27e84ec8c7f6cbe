"""raftlog and a failing disk, on real pysyncobj in this process.

A snapshot file that cannot be read stops the node's start with a message, instead of
pysyncobj logging it and running on the journal alone (the entries after the snapshot, without
the state before it). Seen after a crash with --no-fsync: a dump renamed into place unsynced
was empty, and the node came up without most of its jobs.

A journal that fails to sync once acknowledges nothing more (seen in the crash test: the next
tick committed what the failed sync had not written)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from raftlog import Bridge, CodecError, NodeConfig, RaftNode, SubmitError
from raftlog.snapshot import MAGIC

from .harness import free_ports, wait_for
from .test_raftlog import KV

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("content", [b"", b"garbage", MAGIC + b"\0\0\0\x40\x81"], ids=["empty", "foreign", "cut"])
def test_an_unreadable_snapshot_stops_the_start(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "raft.dump").write_bytes(content)
    node = RaftNode(NodeConfig(raft_addr=f"127.0.0.1:{free_ports(1)[0]}", peers=(), data_dir=tmp_path,
                               secret="s"), KV())
    try:
        with pytest.raises(CodecError, match="refusing to start on the journal alone"):
            node.start()
    finally:
        node.stop()


async def test_a_failed_journal_sync_acknowledges_nothing_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = RaftNode(NodeConfig(raft_addr=f"127.0.0.1:{free_ports(1)[0]}", peers=(), data_dir=tmp_path,
                               secret="s"), KV())
    node.start()
    try:
        await asyncio.to_thread(wait_for, "the single node leading", node.is_leader, 60)
        bridge = Bridge(node, asyncio.get_running_loop())
        assert isinstance(await bridge.submit(b"a=1", 10.0), int)

        real = os.fdatasync
        failures: list[int] = []

        def eio(fd: int) -> None:
            failures.append(fd)
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises((SubmitError, TimeoutError)):
            await bridge.submit(b"b=2", 3.0)
        assert failures, "the write never reached a sync"
        monkeypatch.setattr(os, "fdatasync", real)  # the disk "works" again: nothing proves the lost pages
        with pytest.raises((SubmitError, TimeoutError)):
            await bridge.submit(b"c=3", 3.0)
        assert "b" not in node._fsm.data and "c" not in node._fsm.data  # type: ignore[attr-defined]
    finally:
        node.stop()
