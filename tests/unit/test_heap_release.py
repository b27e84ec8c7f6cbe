"""Free pages of the C heap go back to the system after a compaction (fsync on or off) and after a
restore.

Each job's run records are one value of a kilobyte or two, made anew at every claim, start and
result, so they live on the C heap. A snapshot holds every job's old value while it is written;
the new values land above them, and when the snapshot lets the old ones go, the pages they free
stay resident behind the new values until ``malloc_trim`` hands them back.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pysyncobj.syncobj as _pso
import pytest

from raftlog import heap
from raftlog.journal import journal_factory
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


@pytest.mark.parametrize("durable", [True, False], ids=["fsync on", "fsync off"])
def test_a_compaction_releases_the_pages_it_freed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  durable: bool) -> None:
    # With fsync off the journal is pysyncobj's own; its compactions, each right after a snapshot
    # is written, trimmed nothing before _TrimmingJournal.
    with journal_factory(durable=durable):
        journal = _pso.createJournal(str(tmp_path / "raft.journal"))
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
