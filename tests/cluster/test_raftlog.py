"""raftlog on real pysyncobj, three nodes in this process on 127.0.0.1: a
malformed command and a raising state machine wedge nothing; snapshots run on
our thread in msgpack; restart from dump + journal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from raftlog import ApplyContext, Bridge, MissingSecret, NodeConfig, RaftNode
from raftlog.snapshot import MAGIC

from .harness import free_ports, wait_for

pytestmark = pytest.mark.cluster


class KV:
    """A toy state machine: b"k=v" sets, b"boom" raises, anything else is refused."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.replayed: list[int] = []

    def apply(self, command: bytes, ctx: ApplyContext) -> Any:
        if ctx.replay:
            self.replayed.append(ctx.index)
        if command == b"boom":
            raise RuntimeError("a bug in apply")
        if b"=" not in command:
            return "rejected"
        k, v = command.decode().split("=", 1)
        self.data[k] = v
        return ctx.index

    def snapshot(self) -> Iterator[bytes]:
        return iter([msgpack.packb(dict(self.data))])

    def restore(self, data: bytes) -> None:
        self.data = msgpack.unpackb(data)


def _cluster(tmp: Path, compaction: int = 20000) -> list[RaftNode]:
    ports = free_ports(3)
    nodes = []
    for i, p in enumerate(ports):
        cfg = NodeConfig(raft_addr=f"127.0.0.1:{p}", peers=tuple(f"127.0.0.1:{q}" for q in ports if q != p),
                         data_dir=tmp / f"n{i}", secret="s", compaction_entries=compaction)
        nodes.append(RaftNode(cfg, KV()))
    for n in nodes:
        n.start()
    return nodes


async def _write(nodes: list[RaftNode], payload: bytes, via: int = 0) -> Any:
    bridge = Bridge(nodes[via], asyncio.get_running_loop())
    for _ in range(100):
        try:
            return await bridge.submit(payload, 2.0)
        except Exception:  # noqa: BLE001 - no leader yet
            await asyncio.sleep(0.1)
    raise AssertionError("no commit within 100 tries")


def _fsm(n: RaftNode) -> KV:
    return n._fsm  # type: ignore[attr-defined,return-value]


def test_refuses_to_start_without_secret(tmp_path: Path) -> None:
    with pytest.raises(MissingSecret, match="secret"):
        RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret=""), KV())


async def test_malformed_and_raising_commands_wedge_nothing(tmp_path: Path) -> None:
    nodes = _cluster(tmp_path)
    try:
        assert await _write(nodes, b"a=1") > 0
        assert await _write(nodes, b"\x00garbage", via=1) == "rejected"
        assert await _write(nodes, b"boom", via=2) is None  # raised inside apply: recorded as rejected
        for i in range(20):
            await _write(nodes, f"k{i}={i}".encode(), via=i % 3)
        wait_for("all replicas equal", lambda: all(_fsm(n).data == _fsm(nodes[0]).data for n in nodes), 10)
        assert _fsm(nodes[0]).data["k19"] == "19"
        statuses = [n.status() for n in nodes]
        assert sum(s.state == "leader" for s in statuses) == 1
        assert all(s.raft_thread_alive for s in statuses)
    finally:
        for n in nodes:
            n.stop()


async def test_snapshot_is_msgpack_and_restart_restores_it(tmp_path: Path) -> None:
    nodes = _cluster(tmp_path, compaction=30)
    try:
        for i in range(100):
            await _write(nodes, f"k{i}={i}".encode(), via=i % 3)
        wait_for("a snapshot on every node", lambda: all(n.status().last_snapshot_index > 0 for n in nodes), 20)
        dump = (tmp_path / "n0" / "raft.dump").read_bytes()
        assert dump.startswith(MAGIC)  # ours, not pysyncobj's gzip pickle
    finally:
        for n in nodes:
            n.stop()
    again = _cluster_from(tmp_path, nodes)
    try:
        wait_for("state restored on restart", lambda: all(len(_fsm(n).data) == 100 for n in again), 20)
        # entries that were in the journal at start are flagged as replay
        assert any(_fsm(n).replayed for n in again)
        await _write(again, b"after=1")
        wait_for("new write everywhere", lambda: all(_fsm(n).data.get("after") == "1" for n in again), 10)
    finally:
        for n in again:
            n.stop()


def _cluster_from(tmp: Path, old: list[RaftNode]) -> list[RaftNode]:
    nodes = [RaftNode(n.config, KV()) for n in old]
    for n in nodes:
        n.start()
    return nodes


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp shows them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


def test_raft_port_binds_only_the_given_address(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    node = RaftNode(NodeConfig(raft_addr=f"127.0.0.1:{port}", peers=(), data_dir=tmp_path, secret="s"), KV())
    node.start()
    try:
        assert _listeners(port) == {"0100007F"}, "raft must listen on 127.0.0.1 only, never 0.0.0.0"
    finally:
        node.stop()
