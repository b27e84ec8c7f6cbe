"""A journal a crash left torn opens with what was synced: the torn last record is cut off
instead of the node refusing to start (pysyncobj raises struct.error on it) or reading garbage.
The layout is pysyncobj's: a 40-byte header naming the end of the last record, then records
``size | idx term command | size``."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.journal import _DurableJournal
from raftlog.recovery import recover_journal, remove_partial_files
from raftlog.snapshot import write_snapshot

HEADER = 40
LAST_OFFSET_AT = 36


def _write(path: Path, n: int) -> list[int]:
    """A journal of ``n`` entries; answers each record's end offset."""
    journal = _DurableJournal(str(path))
    ends = []
    for i in range(1, n + 1):
        journal.add(b"command-%d" % i, i, 1)
        ends.append(_last(path))
    journal._destroy()
    return ends


def _last(path: Path) -> int:
    return int(struct.unpack_from("<I", path.read_bytes(), LAST_OFFSET_AT)[0])


def _entries(path: Path) -> list[tuple[bytes, int, int]]:
    journal = _DurableJournal(str(path))
    try:
        return [(bytes(c), i, t) for c, i, t in (journal[k] for k in range(len(journal)))]
    finally:
        journal._destroy()


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_whole_journal_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    ends = _write(path, 3)
    before = path.read_bytes()
    rec = recover_journal(path)
    assert rec is not None and (rec.records, rec.end, rec.dropped) == (3, ends[-1], 0)
    assert path.read_bytes() == before
    assert [i for _, i, _ in _entries(path)] == [1, 2, 3]


def test_header_past_a_record_that_never_reached_the_disk(tmp_path: Path) -> None:
    # The header's page was written, the last record's was not: zeros where it should be.
    path = tmp_path / "raft.journal"
    ends = _write(path, 3)
    _patch(path, ends[1], bytes(ends[2] - ends[1]))
    assert [i for _, i, _ in _entries(path)] == [1, 2]
    assert _last(path) == ends[1]


def test_a_record_torn_inside(tmp_path: Path) -> None:
    # A prefix of the last record reached the disk; its trailing size did not.
    path = tmp_path / "raft.journal"
    ends = _write(path, 3)
    _patch(path, ends[2] - 6, bytes(6))
    assert [(c, i) for c, i, _ in _entries(path)] == [(b"command-1", 1), (b"command-2", 2)]


def test_header_past_the_end_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    ends = _write(path, 2)
    with open(path, "r+b") as f:
        f.truncate(ends[1] - 3)
    assert [i for _, i, _ in _entries(path)] == [1]


def test_a_record_that_does_not_follow_its_predecessor_ends_the_journal(tmp_path: Path) -> None:
    # A whole-looking record whose index does not follow is left from an older, longer file.
    path = tmp_path / "raft.journal"
    ends = _write(path, 3)
    _patch(path, ends[1] + 4, struct.pack("<Q", 7))
    assert [i for _, i, _ in _entries(path)] == [1, 2]


@pytest.mark.parametrize("content", [b"", b"PYSYNC", bytes(4096)], ids=["empty", "short", "zeros"])
def test_a_journal_created_but_never_synced_starts_empty(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(content)
    assert _entries(path) == []
    journal = _DurableJournal(str(path))
    journal.add(b"after", 1, 1)
    journal._destroy()
    assert _entries(path) == [(b"after", 1, 1)]


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    path.write_bytes(b"something else entirely, and long enough to hold a header")
    with pytest.raises(ValueError, match="not a raft journal"):
        recover_journal(path)


def test_side_files_of_interrupted_writes_are_removed(tmp_path: Path) -> None:
    for name in ("raft.dump.partial", "raft.journal.meta.tmp", "raft.dump", "raft.journal", "other.tmp"):
        (tmp_path / name).write_bytes(b"x")
    removed = remove_partial_files(tmp_path)
    assert sorted(p.name for p in removed) == ["raft.dump.partial", "raft.journal.meta.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.tmp", "raft.dump", "raft.journal"]


def test_a_snapshot_write_that_fails_leaves_no_side_file(tmp_path: Path) -> None:
    # A full disk mid-snapshot: the half-written side file would hold the space the next try needs.
    def chunks() -> Iterator[bytes]:
        yield b"state"
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "raft.dump"
    with pytest.raises(OSError, match="No space"):
        write_snapshot(str(path), chunks(), {"last": [b"", 1, 1], "prev": [b"", 0, 0], "cluster": []}, fsync=True)
    assert list(tmp_path.iterdir()) == []


class PowerLoss(Exception):
    pass


def test_a_crash_during_compaction_loses_no_kept_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pysyncobj compacts by rewriting the journal in place. Power lost before that rewrite is
    # synced leaves any of its pages on the disk over the synced journal (writeback has no
    # order): every such mix must still hold every entry the compaction keeps.
    path = tmp_path / "raft.journal"
    journal = _DurableJournal(str(path))
    for i in range(1, 121):
        journal.add(b"command-%03d-" % i * 8, i, 1)
    before = path.read_bytes()

    def lose(fd: int) -> None:
        raise PowerLoss

    monkeypatch.setattr(os, "fdatasync", lose)
    monkeypatch.setattr(os, "fsync", lose)
    with pytest.raises(PowerLoss):
        journal.deleteEntriesTo(60)  # keeps entries 61..120
    during = path.read_bytes()  # what the page cache held when the power went
    monkeypatch.undo()
    journal._destroy()
    page = 4096
    for p in range((max(len(before), len(during)) + page - 1) // page):
        mixed = bytearray(before)
        chunk = during[p * page : (p + 1) * page]
        mixed[p * page : p * page + len(chunk)] = chunk
        for side in tmp_path.iterdir():
            side.unlink()
        path.write_bytes(bytes(mixed))
        remove_partial_files(tmp_path)
        idxs = [i for _, i, _ in _entries(path)]
        assert set(range(61, 121)) <= set(idxs), f"page {p} of the rewrite on the disk: entries {idxs[:3]}..{idxs[-3:]}"
