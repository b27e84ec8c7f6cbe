"""Where the run table keeps the values of jobs whose history has not changed for a while.

An agent's run history is most of its memory once it has run a while: 100,000 jobs keeping ten
runs each hold ~150 MB of packed records, and the heap around them churns as each job's value is
made again at every claim, start and result. Most of those values are cold: an hourly job's
value changes three times around its slot, then not for an hour. ``RunTable`` (``scheduler.runtable``)
moves a cold value here and keeps a ``Spilled`` (where it lies) in its place; a reader reads
it back through a read-only mapping of the file (``SpillFile``).

The file is the agent's own scratch space, never its state: it is created unnamed
(``O_TMPFILE``) in the data directory, so a crash or a restart leaves nothing behind, and the
replicated state (snapshots and the journal) never refers to it. The pages reads touch are given
back to the page cache at each slice of the sweep (``SpillFile.forget``), so they do not stay in
the agent's resident memory.

Values are appended, never written over: a reader (the event loop, a snapshot being packed on
its own thread) that took a ``Spilled`` reads the bytes it names whatever the raft thread has
written since. A file whose values have mostly been replaced is left behind for a new one
(``Spiller.rotate``); it is closed when nothing refers to it any more (the last ``Spilled`` of
it, or a snapshot's capture holding them, gone).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from pathlib import Path

from raftlog.fsm import LocalStateLost

__all__ = ["SpillFile", "Spilled", "Spiller"]

log = logging.getLogger("raftcron.runs")


CAPACITY_MIN = 64 << 20
"""The least a file is made to hold (sparse: the disk holds only what is written)."""


class SpillFile:
    """One unnamed, append-only file of a fixed ``capacity``, appended with ``pwrite`` (the raft
    thread) and read, from any thread, through a read-only shared mapping of all of it.

    Not with ``pread``: a system call gives the GIL up and must win it back, and with another
    thread busy that cost ~0.4 ms a read here (0.7 us alone): a claim of 1,000 jobs, or a
    snapshot reading 100,000 values, would wait seconds to minutes on the event loop. A slice of
    the mapping keeps the GIL; its pages are in the page cache. The pages a read touches count
    in the process's resident memory (file-backed) until ``forget`` gives them back to the page
    cache (``madvise``, at each slice of the sweep: ~5-7 us, without giving the GIL up); a page the kernel cannot read back from disk kills the process
    (``SIGBUS``), whose restart rebuilds the state from its snapshot and journal."""

    def __init__(self, directory: Path, capacity: int = CAPACITY_MIN) -> None:
        self.fd = -1
        self.map: mmap.mmap | None = None
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(directory, flags | os.O_TMPFILE, 0o600)
        except (AttributeError, OSError):  # a file system without O_TMPFILE: a name unlinked at once
            path = directory / f".runs-spill-{os.getpid()}-{threading.get_ident()}-{id(self)}"
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.unlink(path)
            except OSError:
                os.close(fd)
                raise
            self.fd = fd
        try:
            os.ftruncate(self.fd, capacity)
            self.map = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):
            self.close()
            raise
        self.capacity = capacity
        self.end = 0  # bytes appended
        self.live = 0  # bytes of values still named by the table

    def fits(self, size: int) -> bool:
        return self.end + size <= self.capacity

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end (the caller has checked that it ``fits``); where it begins."""
        at = self.end
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], at + done)
        self.end = at + len(data)
        self.live += len(data)
        return at

    def read(self, at: int, size: int) -> bytes:
        """The bytes appended at ``at``; ``LocalStateLost`` when they cannot be read back whole
        (the table has no other copy of them)."""
        try:
            data = self.map[at:at + size]  # type: ignore[index]
        except (TypeError, ValueError) as exc:  # no mapping, or one closed
            raise LocalStateLost(f"reading {size} bytes of run history back from its spill file failed: {exc}") from exc
        if len(data) != size:
            raise LocalStateLost(f"the run history's spill file gave {len(data)} bytes where {size} were written")
        return data

    def forget(self) -> None:
        """Give the pages reads touched back to the page cache: no longer this process's memory."""
        if self.map is not None:
            try:
                self.map.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        mapped, self.map = self.map, None
        if mapped is not None:
            mapped.close()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class Spilled:
    """A job's value as kept in a ``SpillFile``: where, how long, and its count of records (read
    often, so kept here rather than read back)."""

    __slots__ = ("file", "at", "size", "count")

    def __init__(self, file: SpillFile, at: int, size: int, count: int) -> None:
        self.file, self.at, self.size, self.count = file, at, size, count

    def read(self) -> bytes:
        return self.file.read(self.at, self.size)


class Spiller:
    """The table's current file, and when to leave it for a new one.

    ``rotate_at``: a file is left once it holds more than this many bytes of which more than
    half are values no longer named (replaced or dropped); the values it still holds move to
    the new file as the table's sweep meets them. ``min_free``: the free bytes the data
    directory keeps (the agent's ``--min-free``, which its journal needs): nothing is appended
    that would leave less, and the values stay in memory meanwhile."""

    def __init__(self, directory: Path, rotate_at: int = 64 << 20, min_free: int = 0) -> None:
        self.directory = directory
        self.rotate_at = rotate_at
        self.min_free = min_free
        self.failed = False  # an append failed: values stay in memory from then on
        self.short = False  # the last append was held back by min_free (logged once each time it starts)
        self.values = 0  # values the table keeps here now, in any of its files
        self.bytes = 0  # and their bytes
        self.current = self._new_file()

    def like(self) -> Spiller:
        """A spiller of its own (a new file) with the same settings: for a table made afresh."""
        return Spiller(self.directory, self.rotate_at, self.min_free)

    def store(self, values: list[tuple[bytes, int]]) -> list[Spilled] | None:
        """Append each (value, count) and answer where each lies; None, having kept nothing,
        when the file cannot be written (logged once; spilling stops)."""
        if self.failed or not values:
            return None
        data = b"".join(v for v, _ in values)
        if self.min_free and self._free() - len(data) < self.min_free:
            if not self.short:
                log.warning("run history kept in memory while %s has under %d bytes free", self.directory, self.min_free)
            self.short = True
            return None
        self.short = False
        try:
            if not self.current.fits(len(data)):  # full: a new file, with room for what moves to it
                self.current = self._new_file(len(data))
            file = self.current
            at = file.append(data)
        except OSError as exc:
            self.failed = True
            log.warning("run history kept in memory from now on: writing its spill file in %s failed: %s",
                        self.directory, exc)
            return None
        out = []
        for value, count in values:
            out.append(Spilled(file, at, len(value), count))
            at += len(value)
        self.values += len(out)
        self.bytes += file.end - out[0].at
        return out

    def _free(self) -> int:
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize

    def released(self, ref: Spilled) -> None:
        """``ref``'s value is no longer named by the table."""
        ref.file.live -= ref.size
        self.values -= 1
        self.bytes -= ref.size

    def _new_file(self, adding: int = 0) -> SpillFile:
        """A file with room for twice what the table keeps out of memory now and ``adding``."""
        return SpillFile(self.directory, max(CAPACITY_MIN, 2 * (self.bytes + adding)))

    def rotate(self) -> bool:
        """At each round of the sweep: the current file left for a new one when it is mostly
        values no longer named."""
        file = self.current
        if file.end <= self.rotate_at or file.live * 2 > file.end:
            return False
        try:
            self.current = self._new_file()
        except OSError as exc:
            log.warning("could not start a new spill file in %s: %s", self.directory, exc)
            return False
        return True
