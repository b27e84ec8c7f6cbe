"""Free pages of the C heap go back to the system after a compaction and after a restore.

Each job's run records are one value of a kilobyte or two, made anew at every claim, start and
result, so they live on the C heap. A snapshot holds every job's old value while it is written;
the new values land above them, and when the snapshot lets the old ones go, the pages they free
stay resident behind the new values until ``malloc_trim`` hands them back.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from raftlog import heap
from raftlog.journal import _DurableJournal
from scheduler.state import State

pytestmark = pytest.mark.skipif(heap._TRIM is None, reason="the C library has no malloc_trim (not glibc)")


def _anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_pages_freed_below_live_blocks_are_handed_back() -> None:
    gc.collect()
    heap.release_free_memory()
    base = _anon_mb()
    # 60,000 values of 1.5 KB, as many jobs' records; every eighth one kept, as the jobs whose
    # new value was made after the old ones (live blocks spread over every page range).
    blocks = [bytes([i % 251]) * 1500 for i in range(60_000)]
    kept = blocks[::8]
    del blocks
    held = _anon_mb()
    assert held - base > 40, f"the test's values did not stay resident ({base:.0f} -> {held:.0f} MB)"
    assert heap.release_free_memory() is True
    after = _anon_mb()
    # What is live is ~11 MB (7,500 x 1.5 KB); the rest, ~75 MB, is freed in holes of seven values
    # (~10.8 KB), of which the whole pages (~62 %) can go back: at least a third must.
    assert held - after > (held - base) / 3, f"{held:.0f} MB before the release, {after:.0f} after (base {base:.0f})"
    assert len(kept) == 7_500


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The C call replaced by one that counts its calls (another test's raft thread, compacting
    in this process meanwhile, would move a shared counter)."""
    calls: list[int] = []
    monkeypatch.setattr(heap, "_TRIM", lambda pad: calls.append(pad) or 1)
    return calls


def test_a_compaction_releases_the_pages_it_freed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = _DurableJournal(str(tmp_path / "raft.journal"))
    for i in range(1, 201):
        journal.add(b"command-%d" % i, i, 1)
    calls = _counted(monkeypatch)
    journal.deleteEntriesTo(150)
    assert calls == [0]
    assert [idx for _, idx, _ in (journal[k] for k in range(len(journal)))] == list(range(151, 201))
    journal._destroy()


def test_a_restore_releases_the_pages_its_buffers_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = State().snapshot_bytes()
    from raftlog.node import NodeConfig, RaftNode
    from raftlog.snapshot import write_snapshot

    path = tmp_path / "dump"
    write_snapshot(str(path), iter([data]), {"last": [b"", 1, 1], "prev": [b"", 0, 0], "cluster": []}, fsync=False)
    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s"), State())
    calls = _counted(monkeypatch)
    node._deserialize(str(path))
    assert calls == [0]


# A process of its own: glibc's mmap threshold is the process's, and rises for good.
_THRESHOLD_PROBE = """
import ctypes, sys
from raftlog import heap

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
held = heap.hold_mmap_threshold() if sys.argv[1] == "held" else None
libc.free(libc.malloc(8 << 20))  # mapped (over 128 KiB), then freed: glibc alone lifts its threshold to 8 MiB
before = libc.mallinfo2().hblks
block = libc.malloc(2 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(held, mapped)
"""


def _has_mallinfo2() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "mallinfo2")  # glibc 2.33 and later


needs_mallinfo2 = pytest.mark.skipif(not _has_mallinfo2(), reason="glibc older than 2.33: no mallinfo2 to count mappings")


def _probe(mode: str, **env: str) -> tuple[str, int]:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _THRESHOLD_PROBE, mode], cwd=root, env={**run_env, **env},
                         check=True, capture_output=True, text=True).stdout.split()
    return out[0], int(out[1])


@needs_mallinfo2
def test_a_large_block_freed_leaves_the_next_ones_mapped_once_the_threshold_is_held() -> None:
    # glibc's own rule, which the agent stops: after an 8 MiB block was freed, 2 MiB come from the heap.
    assert _probe("glibc") == ("None", 0)
    # Held: it gets pages of its own, which go back to the system when it is freed.
    assert _probe("held") == ("True", 1)


@needs_mallinfo2
@pytest.mark.parametrize("env", [{"MALLOC_MMAP_THRESHOLD_": str(16 << 20)},
                                 {"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={16 << 20}"}])
def test_an_operators_own_threshold_stands(env: dict[str, str]) -> None:
    held, mapped = _probe("held", **env)
    assert held == "False"
    assert mapped == 0  # the 16 MiB the operator set: a 2 MiB block stays in the heap


def test_holding_is_a_no_op_where_it_cannot_be_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(heap, "_MALLOPT", lambda param, value: calls.append((param, value)) or 0)  # glibc refusing
    assert heap.hold_mmap_threshold() is False
    assert calls == [(-3, heap.MMAP_THRESHOLD)]  # M_MMAP_THRESHOLD
    monkeypatch.setattr(heap, "_MALLOPT", None)  # a C library without mallopt (musl, macOS)
    assert heap.hold_mmap_threshold() is False


def test_the_agent_holds_the_threshold_before_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import os

    from api import agent

    order: list[str] = []
    monkeypatch.setattr(agent, "setup_logging", lambda *_: None)
    monkeypatch.setattr(agent.zoneinfo, "reset_tzpath", lambda **_: None)
    monkeypatch.setattr(agent, "tune_collector", lambda: order.append("collector"))
    monkeypatch.setattr(agent, "hold_mmap_threshold", lambda: order.append("threshold") or True)
    monkeypatch.setattr(agent, "FreezeAfterSlowCollections", lambda: argparse.Namespace(install=lambda: None))
    monkeypatch.setattr(agent, "undumpable", lambda: None)

    def config(_: argparse.Namespace) -> None:
        order.append("config")
        raise ValueError("stop here")

    monkeypatch.setattr(agent, "config_from_args", config)
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        assert agent.run_agent(argparse.Namespace(log_format="text", log_level="info")) == 2
    finally:
        os.umask(umask)
    assert order == ["collector", "threshold", "config"]
