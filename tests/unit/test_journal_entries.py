"""The durable journal keeps only its newest commands in memory; older ones are read back.

pysyncobj's FileJournal holds every entry since the last compaction in a list, so an agent's
memory grew by the journal's size between snapshots. Now the journal keeps each record's place,
index and term, and the commands of the newest ``_Entries.TAIL_BYTES``; what it answers is what
was written, whatever mix of appends, cut suffixes, compactions, clears and restarts came before.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj.syncobj import SyncObj

from raftlog import journal as journal_mod
from raftlog.journal import _DurableJournal, _Entries
from tests.unit.test_journal_pages import _AROUND_KB, _mapped_kb


def _command(rng: random.Random, idx: int) -> bytes:
    return idx.to_bytes(8, "little") + bytes([idx % 251]) * rng.choice((0, 1, 40, 700, 5000, 70_000))


def _check(journal: _DurableJournal, model: list[tuple[bytes, int, int]]) -> None:
    assert len(journal) == len(model)
    assert [journal[k] for k in range(len(model))] == model
    if model:
        assert journal[0] == model[0] and journal[-1] == model[-1]
        k = len(model) // 2
        assert list(journal[k:]) == model[k:]  # the open-ended slice pysyncobj asks for
        assert journal[k:][-1] == model[-1] and len(journal[k:]) == len(model) - k
        assert list(journal[k:k + 3]) == model[k:k + 3] == journal[k:k + 3][:]
        assert journal[::2] == model[::2]
    with pytest.raises(IndexError):
        journal[len(model)]


@pytest.mark.parametrize("seed", range(6))
def test_the_journal_answers_what_was_written_through_cuts_compactions_clears_and_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(_Entries, "TAIL_BYTES", 100_000)  # most commands read back from the file
    rng = random.Random(seed)
    path = str(tmp_path / "raft.journal")
    journal = _DurableJournal(path)
    model: list[tuple[bytes, int, int]] = []
    idx, term = 1, 1
    try:
        for _ in range(120):
            op = rng.random()
            if op < 0.55:
                for _ in range(rng.randint(1, 30)):
                    entry = (_command(rng, idx), idx, term)
                    journal.defer = rng.random() < 0.5
                    journal.add(*entry)
                    journal.defer = False
                    model.append(entry)
                    idx += 1
                journal.sync()
            elif op < 0.7 and model:  # a conflicting suffix, as a new leader's log dictates
                k = rng.randrange(len(model) + 1)
                journal.deleteEntriesFrom(k)
                del model[k:]
                idx = model[-1][1] + 1 if model else 1
                term += 1
            elif op < 0.82 and model:  # a compaction after a snapshot
                k = rng.randrange(len(model) + 1)
                journal.deleteEntriesTo(k)
                del model[:k]
            elif op < 0.87:  # a snapshot the journal does not follow
                journal.clear()
                model.clear()
                idx = rng.randint(idx, idx + 50)
            elif op < 0.95:  # a restart reads the file again
                journal._destroy()
                journal = _DurableJournal(path)
            _check(journal, model)
        journal._destroy()
        journal = _DurableJournal(path)
        _check(journal, model)
    finally:
        journal._destroy()


def test_the_journal_holds_its_newest_commands_only(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    journal = _DurableJournal(path)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1, 5001):  # 20 MB of commands
            journal.defer = True
            journal.add(bytes([i % 251]) * 4000, i, 1)
            journal.defer = False
            if i % 100 == 0:
                journal.sync()
        journal.sync()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The tail's commands and ~30 bytes a record; pysyncobj's list held all 20 MB.
    assert held <= _Entries.TAIL_BYTES + 1_000_000, held
    assert journal[0] == (bytes([1]) * 4000, 1, 1)
    assert journal[2499][0] == bytes([2500 % 251]) * 4000
    journal._destroy()
    again = _DurableJournal(path)
    try:
        assert len(again) == 5000 and again[4999] == (bytes([5000 % 251]) * 4000, 5000, 1)
    finally:
        again._destroy()


def _filled(path: Path, entries: int, size: int) -> _DurableJournal:
    journal = _DurableJournal(str(path))
    for i in range(1, entries + 1):
        journal.defer = True
        journal.add(bytes([i % 251]) * size, i, 1)
    journal.defer = False
    journal.sync()
    return journal


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[Callable[[int, int], _DurableJournal]]:
    """``filled(entries, size)``: a journal at ``tmp_path / "raft.journal"`` holding that many
    commands of that size (entry i: byte i % 251, index i, term 1), closed after the test."""
    opened: list[_DurableJournal] = []

    def make(entries: int, size: int) -> _DurableJournal:
        opened.append(_filled(tmp_path / "raft.journal", entries, size))
        return opened[-1]

    yield make
    for journal in opened:
        journal._destroy()


@pytest.fixture
def small_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands beyond the newest 10,000 bytes read back from the file."""
    monkeypatch.setattr(_Entries, "TAIL_BYTES", 10_000)


def _count_reads(journal: _DurableJournal, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    real = journal._read_back

    def counted(at: int, size: int) -> Any:
        reads.append(at)
        return real(at, size)

    monkeypatch.setattr(journal, "_read_back", counted)
    return reads


def _as_pysyncobj_reads(journal: _DurableJournal, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int]]:
    """A stand-in for the SyncObj holding ``journal`` (its ``__getEntries`` reads only the
    journal), and the reads back from the file from now on. The first entry, read on every
    call and then kept, is read before."""
    journal[0]
    return SimpleNamespace(_SyncObj__raftLog=journal), _count_reads(journal, monkeypatch)


def test_what_pysyncobj_sends_a_follower_far_behind_is_read_once_and_no_further(
        filled: Callable[[int, int], _DurableJournal], small_tail: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # pysyncobj asks for every entry from the follower's next index to the end, then sends the
    # first 64 KiB of them: reading every entry to the end for each batch made a catch-up
    # quadratic, and its slice of what it had iterated read those entries a second time.
    journal = filled(2000, 1000)
    host, reads = _as_pysyncobj_reads(journal, monkeypatch)
    batch = SyncObj._SyncObj__getEntries(host, 101, None, 64 * 1024)
    assert [e[1] for e in batch] == list(range(101, 167))  # the 66th reaches 64 KiB
    assert len(reads) == 66 and len(set(reads)) == 66
    assert batch == [journal[k] for k in range(100, 166)]


def test_what_a_replay_applies_is_read_as_it_is_applied(
        filled: Callable[[int, int], _DurableJournal], small_tail: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A restart applies every committed entry in one slice: a list held the whole journal at once.
    journal = filled(2000, 1000)
    host, reads = _as_pysyncobj_reads(journal, monkeypatch)
    entries = SyncObj._SyncObj__getEntries(host, 2, 1990)
    assert len(entries) == 1990 and not reads
    for k, entry in enumerate(entries):
        assert entry == (bytes([(k + 2) % 251]) * 1000, k + 2, 1)
        assert len(reads) == k + 1


def test_entries_asked_for_before_the_journal_changed_are_not_read_after(filled: Callable[[int, int], _DurableJournal]) -> None:
    journal = filled(50, 100)
    for change in (lambda: journal.deleteEntriesTo(3), lambda: journal.deleteEntriesFrom(40), journal.clear):
        later = journal[5:]
        change()
        with pytest.raises(RuntimeError):
            later[0]
        for i in range(1, 51):
            journal.add(bytes([i % 251]) * 100, 1000 + i, 2)


def test_a_slice_reads_its_entries_after_later_appends_pushed_them_out_of_the_tail(
        filled: Callable[[int, int], _DurableJournal], small_tail: None, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = filled(100, 1000)
    later = journal[90:]
    for i in range(101, 151):
        journal.add(bytes([i % 251]) * 1000, i, 2)
    reads = _count_reads(journal, monkeypatch)
    assert list(later) == [(bytes([i % 251]) * 1000, i, 1) for i in range(91, 101)]
    assert len(reads) == 10  # from the file: appends moved no record


def test_the_last_entry_stays_in_memory_after_a_cut_of_the_whole_tail(
        filled: Callable[[int, int], _DurableJournal], small_tail: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # pysyncobj reads the last entry's index and term several times a tick.
    journal = filled(500, 1000)
    journal.deleteEntriesFrom(200)
    reads = _count_reads(journal, monkeypatch)
    assert all(journal[-1] == (bytes([200 % 251]) * 1000, 200, 1) for _ in range(100))
    assert not reads


def test_pages_read_back_are_handed_back_again(tmp_path: Path, filled: Callable[[int, int], _DurableJournal], small_tail: None) -> None:
    path = tmp_path / "raft.journal"
    journal = filled(3000, 4000)
    assert _mapped_kb(path) <= journal_mod._DROP_STEP // 1024 + _AROUND_KB
    for k in range(0, 2900):  # ~11 MB read back from pages handed back at the appends
        assert journal[k][1] == k + 1
    assert _mapped_kb(path) <= journal_mod._DROP_STEP // 1024 + _AROUND_KB


def test_small_commands_read_back_in_order_hand_pages_back_once_a_step(
        filled: Callable[[int, int], _DurableJournal], small_tail: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each read counted a whole fault-around window: reading small commands in order handed the
    # whole journal's pages back every 16 reads.
    journal = filled(20_000, 300)  # ~6 MB
    dropped: list[int] = []
    real = journal._rc_file.drop_pages

    def counted(offset: int, length: int) -> bool:
        dropped.append(length)
        return bool(real(offset, length))

    monkeypatch.setattr(journal._rc_file, "drop_pages", counted)
    for k in range(0, 19_000):
        journal[k]
    read_kb = 19_000 * 300 // 1024
    assert 1 <= len(dropped) <= 2 * read_kb // (journal_mod._DROP_STEP // 1024) + 1, len(dropped)


@pytest.mark.parametrize("kernel_copies", [0, 5000, None], ids=["none", "partly", "all"])
def test_a_compaction_keeps_the_records_whatever_the_kernel_copied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copies: int | None) -> None:
    # The kept records go to the side file through copy_file_range; where it copies nothing,
    # or stops part-way (another file system), the rest goes through the mapping.
    path = tmp_path / "raft.journal"
    journal = _filled(path, 300, 700)
    real = journal_mod.os.copy_file_range
    calls: list[int] = []

    def limited(src: int, dst: int, count: int, offset_src: int, offset_dst: int) -> int:
        calls.append(count)
        if kernel_copies is None:
            return int(real(src, dst, count, offset_src, offset_dst))
        if len(calls) == 1 and kernel_copies:
            return int(real(src, dst, min(count, kernel_copies), offset_src, offset_dst))
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(journal_mod.os, "copy_file_range", limited)
    try:
        journal.deleteEntriesTo(120)
        assert calls
        want = [(bytes([i % 251]) * 700, i, 1) for i in range(121, 301)]
        assert list(journal[0:]) == want
        journal._destroy()
        journal = _DurableJournal(str(path))
        assert list(journal[0:]) == want
    finally:
        journal._destroy()
