"""The durable journal hands back the pages of records it has synced.

pysyncobj keeps every entry in a list and writes the journal file only through a shared mapping,
so every page written stayed mapped into the process and counted in its RSS beside the list.
Synced pages are now unmapped from the process (their bytes stay in the file and the page cache,
for the kernel to reclaim), and what is read back is what was written.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from raftlog import journal as journal_mod
from raftlog.journal import _DurableJournal

pytestmark = pytest.mark.skipif(not hasattr(mmap.mmap, "madvise") or not hasattr(mmap, "MADV_DONTNEED"),
                                reason="this platform's mmap has no madvise(MADV_DONTNEED)")

def _mapped_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
            inside = len(head) == 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


# A fault on a file mapping maps in its neighbours that are in the page cache as well (Linux's
# fault-around, 64 KiB by default): after a hand-back, the header's page and the tail's each bring
# up to that much back.
_AROUND_KB = 2 * 64 + 3 * mmap.PAGESIZE // 1024


def _fill(journal: _DurableJournal, entries: int, size: int, first: int = 1) -> None:
    for i in range(first, first + entries):
        journal.defer = True
        journal.add(bytes([i % 251]) * size, i, 1)
        journal.defer = False
        if i % 64 == 0:
            journal.sync()
    journal.sync()


def test_synced_records_do_not_stay_mapped_in(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = _DurableJournal(str(path))
    _fill(journal, 2000, 4000)  # ~8 MB written through the mapping
    written_kb = 2000 * 4000 // 1024
    resident = _mapped_kb(path)
    # Before, every page written stayed resident (~7,800 kB); now at most the step not yet
    # handed back, and the pages around the tail and the header.
    assert resident <= journal_mod._DROP_STEP // 1024 + _AROUND_KB, (resident, written_kb)
    assert [journal[k][1] for k in (0, 999, 1999)] == [1, 1000, 2000]
    journal._destroy()
    reopened = _DurableJournal(str(path))
    assert len(reopened) == 2000
    # Reading the journal at the start maps every page in; those are handed back too.
    assert _mapped_kb(path) <= _AROUND_KB
    # Older commands are read back from the mapping; what that maps in is handed back in steps.
    assert all(reopened[k][0] == bytes([(k + 1) % 251]) * 4000 for k in range(0, 2000, 7))
    assert _mapped_kb(path) <= journal_mod._DROP_STEP // 1024 + _AROUND_KB
    reopened._destroy()


def test_a_suffix_cut_off_and_written_again_reads_back_and_is_handed_back(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = _DurableJournal(str(path))
    _fill(journal, 1000, 4000)
    journal.deleteEntriesFrom(500)  # a conflicting suffix, as a new leader's log dictates
    journal.sync()
    _fill(journal, 800, 3000, first=501)
    assert len(journal) == 1300
    # What was written again after the cut is handed back as well, not kept resident.
    assert _mapped_kb(path) <= journal_mod._DROP_STEP // 1024 + _AROUND_KB
    journal._destroy()
    reopened = _DurableJournal(str(path))
    assert _mapped_kb(path) <= _AROUND_KB
    assert [reopened[k][1] for k in (0, 499, 500, 1299)] == [1, 500, 501, 1300]
    assert reopened[499][0] == bytes([500 % 251]) * 4000
    assert reopened[500][0] == bytes([501 % 251]) * 3000
    assert reopened[1299][0] == bytes([1300 % 251]) * 3000
    reopened._destroy()


def test_a_cleared_journal_written_again_is_handed_back(tmp_path: Path) -> None:
    # pysyncobj clears the journal when it loads a snapshot the journal does not follow (a
    # follower sent the leader's snapshot); the records after it are written from the start.
    path = tmp_path / "raft.journal"
    journal = _DurableJournal(str(path))
    _fill(journal, 1000, 4000)
    journal.clear()
    journal.sync()
    _fill(journal, 800, 3000, first=2001)
    assert len(journal) == 800
    assert _mapped_kb(path) <= journal_mod._DROP_STEP // 1024 + _AROUND_KB
    journal._destroy()
    reopened = _DurableJournal(str(path))
    assert [reopened[k][1] for k in (0, 799)] == [2001, 2800]
    assert reopened[799][0] == bytes([2800 % 251]) * 3000
    reopened._destroy()
