"""A snapshot file that cannot be read stops the node's start with a message, instead of
pysyncobj logging it and running on the journal alone (the entries after the snapshot, without
the state before it). Seen after a crash with --no-fsync: a dump renamed into place unsynced
was empty, and the node came up without most of its jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog import CodecError, NodeConfig, RaftNode
from raftlog.snapshot import MAGIC

from .harness import free_ports
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
