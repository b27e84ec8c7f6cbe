"""The durable journal: pysyncobj's journal, meta file and mmap-backed file, made to reach
the disk before anything they hold is acknowledged.

pysyncobj never fsyncs (measured: no sync call across 5,000 acknowledged writes), so a
power loss on a majority could lose acknowledged entries, or leave an empty meta file and
let a node vote twice in a term. Every pysyncobj private name used here is listed in
``pysyncobj_names``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pysyncobj.journal as _journal_module
import pysyncobj.syncobj as _pso
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET, FileJournal, MetaStorer, ResizableFile

from .heap import release_free_memory
from .recovery import journal_header, recover_journal
from .trace import mark

__all__ = ["_DurableJournal", "_DurableMeta", "_SizedFile", "align_to_snapshot", "journal_factory"]

_log = logging.getLogger("raftcron.raft")

# The journal grows by at most this much at a time (pysyncobj doubles it), so a disk with the
# API's floor of free space (``space.MIN_FREE``) can always take the next growth.
_GROW_STEP = 1 << 20
_RECORD_OVERHEAD = 4 + 16 + 4  # size, idx and term, size
_COMMAND_AT = 4 + 16  # a record's command, from the record's start
_FAULT_AROUND = 64 << 10  # what a fault on a file mapping maps in around its page (Linux's default)
_COPY_STEP = 1 << 20  # a compaction copies the records it keeps this much at a time
_HELD_OVERHEAD = 64  # what a command held in memory costs beyond its bytes (its object, its slot)


def _held(command: bytes | None) -> int:
    """What a command kept in memory is counted as (``_Entries``' tail, a ``_Span``'s reads)."""
    return len(command or b"") + _HELD_OVERHEAD

_KEPT_BYTES = 1 << 20  # what an iterated _Span keeps of the entries it read
# Synced journal bytes whose pages are handed back from the mapping at once (see
# ``_DurableJournal._drop_synced_pages``): one madvise per this much written.
_DROP_STEP = 1 << 20


class _DurableMeta(MetaStorer):  # type: ignore[misc]
    """pysyncobj's term / vote / commit-index file, replaced durably.

    pysyncobj writes a temporary file and renames it over the old one without
    syncing either, so a power loss can leave an empty file: the node restarts at
    term 0 with no vote and may vote twice in a term. Here the new file's data is
    synced before the rename and the directory after it (term changes are rare;
    the commit index is stored at most once a second).
    """

    def getMeta(self) -> dict[str, Any]:  # noqa: N802 - pysyncobj's name; closes the file it reads
        try:
            with open(self.getPath(), "rb") as f:
                meta = _journal_module.loads(f.read())
        except Exception:  # noqa: BLE001 - missing or unreadable: start from nothing, as pysyncobj does
            return {}
        return meta if isinstance(meta, dict) else {}

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 - pysyncobj's name
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_journal_module.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _SizedFile(ResizableFile):  # type: ignore[misc]
    """pysyncobj's mmap-backed journal file, knowing its own size.

    ResizableFile.write asks the mapping for its size (an fstat) before every write, and
    FileJournal.add writes twice per entry: two system calls per entry on every node, on
    the path of every write. The size changes only when a write grows the mapping, which
    stays with ResizableFile.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rc_size: int = self._ResizableFile__mm.size()
        # Back the whole mapping with blocks now: a store into a page with none behind it on a
        # full disk is a SIGBUS that kills the process, not an error (seen: exit status -7).
        os.posix_fallocate(self.fileno(), 0, self._rc_size)

    def reserve(self, end: int) -> None:
        """Make the file hold ``end`` bytes, with blocks allocated, or raise ``OSError``
        (ENOSPC) having written nothing. pysyncobj grows the file by truncating it longer
        (a sparse tail) and stores through the mapping, so a full disk met there was a SIGBUS
        halfway through a record."""
        if end <= self._rc_size:
            return
        target = max(end, self._rc_size + min(self._rc_size, _GROW_STEP))
        os.posix_fallocate(self.fileno(), self._rc_size, target - self._rc_size)
        try:
            self._ResizableFile__mm.resize(target)  # the file is that long already: only remaps
        except (SystemError, OSError):  # no mremap here: ResizableFile.write grows it its own way
            return
        self._rc_size = target

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end <= self._rc_size:
            self._ResizableFile__mm[offset:end] = values
            return
        super().write(offset, values)  # grows (or, where mmap cannot resize, remaps) the file
        self._rc_size = self._ResizableFile__mm.size()

    def fileno(self) -> int:
        """The descriptor of the file now (growing it without mremap reopens it)."""
        return self._ResizableFile__f.fileno()  # type: ignore[no-any-return]

    def drop_pages(self, offset: int, length: int) -> bool:
        """Unmap the pages of ``offset .. offset + length`` (page-aligned) from this process,
        keeping their bytes: the mapping is shared, so the file and the page cache keep them and
        a later access reads them back. False where the platform cannot."""
        try:
            self._ResizableFile__mm.madvise(mmap.MADV_DONTNEED, offset, length)
        except (AttributeError, OSError, ValueError):  # no madvise, or a range the mapping lost
            return False
        return True


class _TrimmingJournal(FileJournal):  # type: ignore[misc]
    """pysyncobj's own FileJournal (an agent with fsync off), handing the C heap's free pages back
    after each compaction as ``_DurableJournal`` does: the entries compacted away and the view of
    the snapshot written just before were freed then."""

    def deleteEntriesTo(self, entryTo: int) -> None:
        super().deleteEntriesTo(entryTo)
        release_free_memory()


class _Entries:
    """The durable journal's entries as FileJournal lists them, ``(command, idx, term)``, with
    the commands of the newest ``TAIL_BYTES`` in memory and only each older record's place,
    index and term: its command is read back from the journal's mapping when asked for.

    pysyncobj's list held every command since the last compaction, so an agent's memory grew
    by the journal's whole size between two snapshots (35.7 MB of records behind the snapshot
    at one kill of a cluster of 100,000 jobs and 1,000,000 run records, bench/README item 106).
    What pysyncobj reads on its hot paths stays in memory: the entries it sends and applies
    next (the tail), the last one always, and the first entry (its index, read on every send).
    A replay, or a follower far behind, reads older ones back, copying each out of the mapping
    with the GIL held and no system call: from the page cache, where a journal just written
    is, that costs no wait; a page the disk must give back again holds every thread while it
    comes. The journal hands the pages so read back again (``_DurableJournal._read_back``)."""

    __slots__ = ("_journal", "_at", "_size", "_idx", "_term", "_tail", "_tail_lo", "_tail_bytes", "_first", "changes")

    TAIL_BYTES = 4 << 20

    def __init__(self, journal: _DurableJournal) -> None:
        self._journal = journal
        self._at = array("q")  # each command's offset in the file
        self._size = array("q")
        self._idx = array("Q")
        self._term = array("Q")
        # The newest entries' commands, the last one last, from ``_tail_lo`` on (a list, not a
        # deque: read by position, and a deque's reads walk its blocks).
        self._tail: list[bytes | None] = []
        self._tail_lo = 0
        self._tail_bytes = 0
        self._first: tuple[bytes, int, int] | None = None  # the first entry, once read
        self.changes = 0  # entries cut, or all of them left for another object: a _Span taken before is void

    def note(self, at: int, command: bytes, idx: int, term: int) -> None:
        """A record written: its command's offset, the command, its index and term."""
        self._at.append(at)
        self._size.append(len(command))
        self._idx.append(idx)
        self._term.append(term)
        tail = self._tail
        tail.append(command)
        self._tail_bytes += _held(command)
        lo = self._tail_lo
        while self._tail_bytes > self.TAIL_BYTES and len(tail) - lo > 1:
            self._tail_bytes -= _held(tail[lo])
            tail[lo] = None
            lo += 1
        if lo > 1024 and 2 * lo > len(tail):
            del tail[:lo]
            lo = 0
        self._tail_lo = lo

    def record_start(self, k: int) -> int:
        """Where the ``k``-th record begins in the file."""
        return self._at[k] - _COMMAND_AT

    def cut(self, k: int) -> None:
        """Forget the entries from the ``k``-th on."""
        n = len(self._at)
        k = max(0, min(k, n))
        self.changes += 1
        tail = self._tail
        for _ in range(min(n - k, len(tail) - self._tail_lo)):
            self._tail_bytes -= _held(tail.pop())
        for column in (self._at, self._size, self._idx, self._term):
            del column[k:]
        if k == 0:
            self._first = None
        elif len(tail) == self._tail_lo:  # the tail all cut: the new last entry is read on every tick
            command = self._journal._read_back(self._at[-1], self._size[-1])
            self._tail, self._tail_lo, self._tail_bytes = [command], 0, _held(command)

    def moved(self, k: int, delta: int) -> _Entries:
        """The entries from the ``k``-th on, in a file where each record lies ``delta`` bytes
        further on (a compaction's new file); the commands in memory stay so."""
        kept = _Entries(self._journal)
        kept._at = array("q", (at + delta for at in self._at[k:]))
        kept._size = self._size[k:]
        kept._idx = self._idx[k:]
        kept._term = self._term[k:]
        n = len(self._at) - k
        tail = self._tail
        kept._tail = tail[max(self._tail_lo, len(tail) - n):] if n else []
        kept._tail_bytes = sum(map(_held, kept._tail))
        self.changes += 1  # this object's offsets are of the file left behind
        return kept

    def left(self) -> None:
        """The journal moved on to another ``_Entries`` (cleared): this one is read no more."""
        self.changes += 1

    def keys(self) -> list[tuple[int, int]]:
        """Each entry's (index, term), no command read."""
        return list(zip(self._idx, self._term, strict=True))

    def __len__(self) -> int:
        return len(self._at)

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self._at))
            if step == 1:  # what pysyncobj asks for to send and to apply: read as it is used
                return _Span(self, start, max(start, stop))
            return [self._entry(k) for k in range(start, stop, step)]
        n = len(self._at)
        k = key + n if key < 0 else key
        if not 0 <= k < n:
            raise IndexError("journal entry index out of range")
        return self._entry(k)

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        return (self._entry(k) for k in range(len(self._at)))

    def _entry(self, k: int) -> tuple[bytes, int, int]:
        behind = len(self._at) - k  # 1: the last
        tail = self._tail
        if behind <= len(tail) - self._tail_lo:
            return tail[-behind], self._idx[k], self._term[k]  # type: ignore[return-value]
        if k == 0:
            if self._first is None:
                self._first = self._journal._read_back(self._at[0], self._size[0]), self._idx[0], self._term[0]
            return self._first
        return self._journal._read_back(self._at[k], self._size[k]), self._idx[k], self._term[k]


class _Span:
    """Entries ``start .. stop`` of the journal as they were when asked for, each read when it
    is indexed or iterated. pysyncobj asks for every entry from a follower's next index to the
    end and sends the first 64 KiB of them, and applies the entries committed in one slice: a
    list would read back every entry to the end for each batch sent to a follower far behind,
    and hold the whole journal at once while a restart replays it. The entries an iteration
    read, up to ``_KEPT_BYTES``, are kept for the slice pysyncobj takes of them right after.
    Read after the journal cut or left its entries, it raises (it would read other records)."""

    __slots__ = ("_entries", "_start", "_stop", "_changes", "_read", "_read_bytes")

    def __init__(self, entries: _Entries, start: int, stop: int) -> None:
        self._entries, self._start, self._stop = entries, start, stop
        self._changes = entries.changes
        self._read: list[tuple[bytes, int, int]] = []  # entries start, start + 1, ... as iterated
        self._read_bytes = 0

    def __len__(self) -> int:
        return self._stop - self._start

    def __bool__(self) -> bool:
        return self._stop > self._start

    def _entry(self, k: int) -> tuple[bytes, int, int]:
        if k - self._start < len(self._read):
            return self._read[k - self._start]
        if self._entries.changes != self._changes:
            raise RuntimeError("journal entries read after the journal changed under them")
        return self._entries._entry(k)

    def __getitem__(self, key: int | slice) -> Any:
        span = range(self._start, self._stop)[key]
        if isinstance(span, range):
            return [self._entry(k) for k in span]
        return self._entry(span)

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        for k in range(self._start, self._stop):
            entry = self._entry(k)
            if k - self._start == len(self._read) and self._read_bytes < _KEPT_BYTES:
                self._read.append(entry)
                self._read_bytes += _held(entry[0])
            yield entry


class _DurableJournal(FileJournal):  # type: ignore[misc]
    """A FileJournal that syncs appended records before anyone is told of them.

    pysyncobj writes the journal through an mmap and never syncs it, so an
    acknowledged entry could vanish with a power loss on a majority. Syncing
    (in ``add``, or once per batch where ``defer`` says) puts it before the
    follower's AppendEntries answer and before the leader counts its own
    copy. ``fdatasync`` on the file (Linux writes a
    shared mapping's dirty pages with it) rather than pysyncobj's ``flush``:
    that is ``mmap.flush``, an msync of the whole mapping that holds the GIL
    and so froze the event loop for every entry.
    """

    def __init__(self, journal_file: str) -> None:
        recover_journal(Path(journal_file))  # a torn last record is cut off, not read or refused
        # FileJournal names its meta storer's and file's classes at construction; swap in ours.
        meta, _journal_module.MetaStorer = _journal_module.MetaStorer, _DurableMeta
        file, _journal_module.ResizableFile = _journal_module.ResizableFile, _SizedFile
        try:
            super().__init__(journal_file)
        finally:
            _journal_module.MetaStorer, _journal_module.ResizableFile = meta, file
        self._rc_file: _SizedFile = self._FileJournal__journalFile  # type: ignore[has-type]
        self._rc_path = journal_file
        self._rc_dirty = False
        # True only while pysyncobj appends new commands as leader (``_Host.
        # _checkCommandsToApply``): those appends are synced by ``sync`` at the end of
        # the same raft tick, after the AppendEntries carrying them went out, so the
        # leader's disk write overlaps the followers' (Raft lets a leader persist in
        # parallel with replication). No message is read in between, and a commit is
        # counted only at the next tick, after that sync. A follower's appends from one
        # AppendEntries are deferred too and synced once, before its answer is sent
        # (``_Host._SyncObj__sendNextNodeIdx``). Every other append (a new leader's no-op)
        # is synced at once.
        self.defer = False
        self.failed: OSError | None = None  # set for good by a failed sync, see _fdatasync
        self._rc_meta_warned = float("-inf")
        self._rc_dropped = 0  # the journal's bytes before this offset are not mapped in
        self._rc_read_back = 0  # bytes read back from below _rc_dropped since they were last handed back
        self._rc_window = -1  # the fault-around window of the last read back
        # FileJournal read every record into a list: keep the places, the newest commands only.
        # (So a start holds every command once, for a moment; the restore of the snapshot that
        # follows trims the heap, ``heap.quiet_restore``.)
        entries = self._entries = _Entries(self)
        at = FIRST_RECORD_OFFSET
        for command, idx, term in self._FileJournal__journal:  # type: ignore[has-type]
            entries.note(at + _COMMAND_AT, command, int(idx), int(term))
            at += _RECORD_OVERHEAD + len(command)
        self._FileJournal__journal = entries
        # The journal was just read through the mapping. Pages written at the start and not yet
        # synced (a new file's header, a torn tail cut off) are dirty: unmapping keeps them too.
        self._drop_synced_pages(0)

    def add(self, command: bytes, idx: int, term: int) -> None:
        """FileJournal's record (``size | idx, term, command | size``) and the header naming its
        end, written as FileJournal writes them; the entry kept in ``_Entries``."""
        data = _journal_module.to_bytes(command)
        start = int(self._FileJournal__currentOffset)  # type: ignore[has-type]
        end = start + _RECORD_OVERHEAD + len(data)
        # Space first: an ENOSPC raised here leaves the journal as it was (pysyncobj drops the
        # command; its submitter times out as outcome unknown), never half a record.
        self._rc_file.reserve(end)
        size = struct.pack("<I", len(data) + 16)
        self._rc_file.write(start, b"".join((size, struct.pack("<QQ", idx, term), data, size)))
        self._rc_file.write(LAST_RECORD_OFFSET_OFFSET, struct.pack("<I", end))
        self._FileJournal__currentOffset = end
        self._entries.note(start + _COMMAND_AT, data, idx, term)
        if self.defer:
            self._rc_dirty = True
        else:
            self._fdatasync()

    def _read_back(self, at: int, size: int) -> bytes:
        """A command's bytes from the mapping (``_Entries``). Once ``_DROP_STEP`` bytes have been
        read back from pages handed back before (a fault maps in its neighbours too: counted),
        those pages are handed back again."""
        data: bytes = self._rc_file._ResizableFile__mm[at:at + size]
        if at < self._rc_dropped:
            window = at // _FAULT_AROUND
            self._rc_read_back += size + (_FAULT_AROUND if window != self._rc_window else 0)
            self._rc_window = window
            if self._rc_read_back >= _DROP_STEP:
                self._rc_read_back = 0
                dropped = self._rc_dropped - self._rc_dropped % mmap.PAGESIZE
                if dropped:
                    self._rc_file.drop_pages(0, dropped)
        return data

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803 - pysyncobj's names
        """Stored, or left as it was: FileJournal changes its meta in memory before the store,
        and a failed store (a full disk) would have the next one-second store write a term and
        vote this node never took (see ``_Host._SyncObj__setCurrentTerm``)."""
        meta: dict[str, Any] = self._FileJournal__meta
        before = dict(meta)
        try:
            super().setCurrentTerm(term, votedForNodeId)
        except OSError:
            meta.clear()
            meta.update(before)
            raise

    def onOneSecondTimer(self) -> None:  # noqa: N802 - pysyncobj's name
        """The commit index stored once a second, when the disk takes it. It is a hint (a
        restart learns the commit index from the leader), and pysyncobj calls this at the top
        of every tick: a full disk raised there and skipped that whole tick, once a second, for
        as long as the disk stayed full. Kept unsaved, so the next second tries again."""
        try:
            super().onOneSecondTimer()
        except OSError as exc:
            now = time.monotonic()
            if now - self._rc_meta_warned >= 60.0:
                self._rc_meta_warned = now
                _log.warning("the raft meta file could not be stored (%s); trying again every second", exc)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 - pysyncobj's names
        """A conflicting suffix cut off (a follower's log against a new leader's): the header
        names the end of the entry before it, and the records after it are written again from
        there, through pages mapped in afresh."""
        entries = self._entries
        if 0 <= entryFrom < len(entries):
            end = entries.record_start(entryFrom)
            entries.cut(entryFrom)
            self._rc_file.write(LAST_RECORD_OFFSET_OFFSET, struct.pack("<I", end))
            self._FileJournal__currentOffset = end
        self._rc_dropped = min(self._rc_dropped, int(self._FileJournal__currentOffset))

    def clear(self) -> None:
        """Every entry dropped (pysyncobj, loading a snapshot the journal does not follow: at the
        start, or a follower sent the leader's snapshot); written again from the start."""
        self._entries.left()
        super().clear()
        self._FileJournal__journal = self._entries = _Entries(self)
        self._rc_dropped = 0

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        """Compaction: the entries from ``entryTo`` on, written to a side file, synced, and
        renamed over the journal.

        pysyncobj rewrites the journal in place, over records that were synced and
        acknowledged: power lost before that rewrite is synced leaves some of its pages on
        the disk over the old journal (writeback keeps no order), and the records past the
        first mixed page are gone (seen in the crash test: 8 of 3,770 acknowledged writes
        lost in 40 rounds). A crash now leaves the old journal or the new one, whole.
        """
        entries = self._entries
        entry_to = max(0, min(entryTo, len(entries)))
        current = int(self._FileJournal__currentOffset)
        start = entries.record_start(entry_to) if entry_to < len(entries) else current
        path = self._rc_path
        side = path + ".partial"
        end = FIRST_RECORD_OFFSET + current - start
        with open(side, "wb") as f:
            f.write(journal_header(end))
            f.flush()
            _copy_range(self._rc_file, f.fileno(), start, current, FIRST_RECORD_OFFSET)  # the records kept, as they lie
            f.flush()
            os.fdatasync(f.fileno())  # a new file: its length is synced with its data
        kept = entries.moved(entry_to, FIRST_RECORD_OFFSET - start)
        os.replace(side, path)
        _sync_dir(path)
        old = self._rc_file
        old._ResizableFile__mm.close()
        old._ResizableFile__f.close()
        self._rc_file = self._FileJournal__journalFile = _SizedFile(path)
        self._FileJournal__journal = self._entries = kept
        self._FileJournal__currentOffset = end
        self._rc_dirty = False
        self._rc_dropped = 0  # written through the file, not the new mapping: none of it mapped in
        self._rc_read_back = 0
        # The entries compacted away and the snapshot's view of the state were just freed.
        release_free_memory()

    def sync(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._rc_dirty:
            mark("disk_sync")
            self._fdatasync()
            mark("disk_synced")
            self._rc_dirty = False

    def _fdatasync(self) -> None:
        """Sync, or fail for good. After a failed fdatasync the kernel may have dropped the
        dirty pages and marked them clean, so a later sync succeeding proves nothing (seen in
        the crash test: the next tick's commit acknowledged entries the failed sync had not
        written, and 7 of 3,817 acknowledged writes were lost). ``failed`` stays set; the
        host stops taking part in raft (``_Host._onTick``)."""
        if self.failed is not None:
            raise self.failed
        try:
            os.fdatasync(self._rc_file.fileno())
        except OSError as exc:
            self.failed = exc
            raise
        self._drop_synced_pages(_DROP_STEP)

    def _drop_synced_pages(self, step: int) -> None:
        """Hand back the mapping's pages of records already synced, once ``step`` bytes of them
        are mapped in. pysyncobj keeps every entry in a list and writes the file only through the
        mapping, never reading it back after the start, so each page written stayed resident
        with the process: the same entries held twice (measured: 31 B for each run record an
        agent held, bench/README item 72). The pages stay in the page cache, clean once synced,
        for the kernel to keep or drop. The page being appended to is kept."""
        end = int(self._FileJournal__currentOffset)
        start = self._rc_dropped
        if end - start < step:
            return
        lo = start - start % mmap.PAGESIZE
        hi = end - end % mmap.PAGESIZE
        if hi > lo and self._rc_file.drop_pages(lo, hi - lo):
            self._rc_dropped = hi


def _copy_range(source: _SizedFile, fd: int, start: int, end: int, to: int) -> None:
    """Write the source file's bytes ``start .. end`` into ``fd`` at offset ``to``: in the
    kernel, the GIL given up (``copy_file_range``; the source's mapping writes into the same
    page cache, so bytes not yet synced are copied too), else through the mapping a slice at a
    time."""
    at = start
    try:
        while at < end:
            done = os.copy_file_range(source.fileno(), fd, end - at, at, to + at - start)
            if done <= 0:
                break
            at += done
    except (AttributeError, OSError):  # no such call here, or not between these files
        pass
    mapped = source._ResizableFile__mm
    while at < end:
        chunk = memoryview(mapped[at:min(at + _COPY_STEP, end)])
        while chunk:
            written = os.pwrite(fd, chunk, to + at - start)
            chunk, at = chunk[written:], at + written


def align_to_snapshot(journal_file: str, prev: tuple[int, int], last: tuple[int, int]) -> int:
    """Drop the journal's entries before the snapshot's ``prev`` (index, term), when it holds
    ``prev`` and ``last``; answer how many were dropped.

    pysyncobj compacts in two steps, the dump first and the journal after it. A crash between
    them leaves a dump newer than the journal's start, and pysyncobj, finding the journal not
    starting with the dump's two entries, clears the whole journal: every entry after the
    snapshot, acknowledged ones included, was lost (seen in the crash test: 9 of 3,659). This
    finishes the compaction the crash interrupted instead."""
    journal = _DurableJournal(journal_file)
    try:
        keys = journal._entries.keys()
        for pos in range(len(keys) - 1):
            if keys[pos] == prev and keys[pos + 1] == last:
                if pos:
                    journal.deleteEntriesTo(pos)
                return pos
        return 0
    finally:
        journal._destroy()


def _sync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def journal_factory(durable: bool) -> Iterator[None]:
    """While open, a SyncObj constructed on this thread gets a ``_DurableJournal`` (when
    ``durable`` and a journal file is configured), else a ``_TrimmingJournal`` over the file
    (pysyncobj's own, recovered first), or pysyncobj's in-memory journal without a file.

    pysyncobj has no journal factory option; its syncobj module's ``createJournal`` is
    swapped for the duration of construction (the node's owner thread is the only caller).
    """
    original: Callable[..., Any] = _pso.createJournal

    def create(path: str | None = None) -> Any:
        if path and durable:
            return _DurableJournal(path)
        if path:
            recover_journal(Path(path))
            return _TrimmingJournal(path)
        return original(path)

    _pso.createJournal = create
    try:
        yield
    finally:
        _pso.createJournal = original
