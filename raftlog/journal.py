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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pysyncobj.journal as _journal_module
import pysyncobj.syncobj as _pso
from pysyncobj.journal import FileJournal, MetaStorer, ResizableFile

from .heap import release_free_memory
from .recovery import journal_header, recover_journal
from .trace import mark

__all__ = ["_DurableJournal", "_DurableMeta", "_SizedFile", "align_to_snapshot", "journal_factory"]

_log = logging.getLogger("raftcron.raft")

# The journal grows by at most this much at a time (pysyncobj doubles it), so a disk with the
# API's floor of free space (``space.MIN_FREE``) can always take the next growth.
_GROW_STEP = 1 << 20
_RECORD_OVERHEAD = 4 + 16 + 4  # size, idx and term, size
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
        # The journal was just read through the mapping. Pages written at the start and not yet
        # synced (a new file's header, a torn tail cut off) are dirty: unmapping keeps them too.
        self._drop_synced_pages(0)

    def add(self, command: bytes, idx: int, term: int) -> None:
        # Space first: an ENOSPC raised here leaves the journal as it was (pysyncobj drops the
        # command; its submitter times out as outcome unknown), never half a record.
        self._rc_file.reserve(self._FileJournal__currentOffset + _RECORD_OVERHEAD + len(command))
        super().add(command, idx, term)
        if self.defer:
            self._rc_dirty = True
        else:
            self._fdatasync()

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
        """A conflicting suffix cut off (a follower's log against a new leader's): the records
        after it are written again from where it began, through pages mapped in afresh."""
        super().deleteEntriesFrom(entryFrom)
        self._rc_dropped = min(self._rc_dropped, int(self._FileJournal__currentOffset))

    def clear(self) -> None:
        """Every entry dropped (pysyncobj, loading a snapshot the journal does not follow: at the
        start, or a follower sent the leader's snapshot); written again from the start."""
        super().clear()
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
        kept = list(self._FileJournal__journal[entryTo:])  # type: ignore[has-type]
        path = self._rc_path
        side = path + ".partial"
        body = bytearray()
        for command, idx, term in kept:
            record = struct.pack("<QQ", idx, term) + _journal_module.to_bytes(command)
            size = struct.pack("<I", len(record))
            body += size + record + size
        end = len(journal_header(0)) + len(body)
        with open(side, "wb") as f:
            f.write(journal_header(end))
            f.write(body)
            f.flush()
            os.fdatasync(f.fileno())  # a new file: its length is synced with its data
        os.replace(side, path)
        _sync_dir(path)
        old = self._rc_file
        old._ResizableFile__mm.close()
        old._ResizableFile__f.close()
        self._rc_file = self._FileJournal__journalFile = _SizedFile(path)
        self._FileJournal__journal = kept
        self._FileJournal__currentOffset = end
        self._rc_dirty = False
        self._rc_dropped = 0  # written through the file, not the new mapping: none of it mapped in
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
        keys = [(int(idx), int(term)) for _, idx, term in (journal[k] for k in range(len(journal)))]
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
