"""The full-dump file pysyncobj compacts its journal into, in our own format.

Layout: ``RCSNAP1\\n``, a 4-byte big-endian header length, a msgpack header
``{"v", "last", "prev", "cluster"}`` (pysyncobj's bookkeeping: the last two
applied entries and the member addresses), then the state machine's snapshot
bytes to the end of the file.

pysyncobj calls the serializer on its raft thread. We capture the state's view
there (cheap: the state hands back an iterator over a frozen view) and write
it on a thread of our own, reporting progress through ``check``. The file is
written to a side name, fsynced, renamed over the dump and the directory
fsynced, so a crash leaves either the old dump or the new one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Iterator
from typing import Any

from pysyncobj.config import SERIALIZER_STATE

from .codec import CodecError, pack, unpack
from .fsm import StateMachine

__all__ = ["SnapshotWriter", "check_snapshot", "read_snapshot", "write_snapshot", "MAGIC"]

log = logging.getLogger("raftcron.raft")
MAGIC = b"RCSNAP1\n"
_VERSION = 1


def _entry(e: Any) -> list[Any]:
    command, idx, term = e
    return [bytes(command), int(idx), int(term)]


def write_snapshot(path: str, chunks: Iterator[bytes], header: dict[str, Any], fsync: bool) -> None:
    side = path + ".partial"
    head = pack({"v": _VERSION, **header})
    try:
        with open(side, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack(">I", len(head)))
            f.write(head)
            for chunk in chunks:
                f.write(chunk)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        # A full disk (or anything else) mid-write: the half-written side file would keep
        # holding the very space the next attempt needs.
        with contextlib.suppress(OSError):
            os.unlink(side)
        raise
    os.replace(side, path)
    if fsync:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _header(path: str, raw: bytes) -> tuple[dict[str, Any], int]:
    if not raw.startswith(MAGIC):
        raise CodecError(f"{path}: not a raftcron snapshot (bad magic)")
    if len(raw) < len(MAGIC) + 4:
        raise CodecError(f"{path}: cut short inside its header")
    (hlen,) = struct.unpack(">I", raw[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if len(raw) < start + hlen:
        raise CodecError(f"{path}: cut short inside its header")
    header = unpack(raw[start : start + hlen])
    if not isinstance(header, dict) or header.get("v") != _VERSION:
        raise CodecError(f"{path}: snapshot header version {header.get('v') if isinstance(header, dict) else '?'} "
                         f"is not understood (this build reads version {_VERSION})")
    return header, start + hlen


def check_snapshot(path: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Raise ``CodecError`` unless the file starts with a whole snapshot header this build reads
    (reads the header only); answer its (index, term) of ``prev`` and ``last``."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + 4)
        if len(head) == len(MAGIC) + 4 and head.startswith(MAGIC):
            head += f.read(struct.unpack(">I", head[len(MAGIC) :])[0])
    header, _ = _header(path, head)
    try:
        prev, last = header["prev"], header["last"]
        return (int(prev[1]), int(prev[2])), (int(last[1]), int(last[2]))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CodecError(f"{path}: snapshot header without its last entries") from exc


def read_snapshot(path: str) -> tuple[bytes, tuple[Any, ...], tuple[Any, ...], list[str]]:
    with open(path, "rb") as f:
        raw = f.read()
    header, body = _header(path, raw)
    last = tuple(header["last"])
    prev = tuple(header["prev"])
    return raw[body:], last, prev, list(header["cluster"])


class SnapshotWriter:
    """pysyncobj's ``serializer`` / ``serializeChecker`` pair, asynchronous."""

    def __init__(self, fsm: StateMachine, fsync: bool) -> None:
        self._fsm = fsm
        self._fsync = fsync
        self._lock = threading.Lock()
        self._state = SERIALIZER_STATE.NOT_SERIALIZING
        self._thread: threading.Thread | None = None
        self._pending_index = 0
        self.last_index = 0
        self.started = 0  # snapshots begun (their state captured)

    def start(self, tmp_path: str, data: Any) -> None:
        """Called on the raft thread; must return quickly and never raise."""
        try:
            last, prev, cluster = data
            chunks = self._fsm.snapshot()  # the view is taken now, consistent with `last`
            header = {"last": _entry(last), "prev": _entry(prev), "cluster": sorted(str(n.id if hasattr(n, "id") else n) for n in cluster)}
            path = tmp_path[: -len(".tmp")] if tmp_path.endswith(".tmp") else tmp_path
        except Exception:  # noqa: BLE001 - never raise into pysyncobj
            log.exception("could not capture a snapshot")
            with self._lock:
                self._state = SERIALIZER_STATE.FAILED
            return
        with self._lock:
            self._state = SERIALIZER_STATE.SERIALIZING
            self._pending_index = int(last[1])
            self.started += 1
        self._thread = threading.Thread(
            target=self._write, args=(path, chunks, header), name="raftlog-snapshot", daemon=True
        )
        self._thread.start()

    def _write(self, path: str, chunks: Iterator[bytes], header: dict[str, Any]) -> None:
        try:
            write_snapshot(path, chunks, header, self._fsync)
            outcome = SERIALIZER_STATE.SUCCESS
        except Exception:  # noqa: BLE001
            log.exception("writing the snapshot %s failed; the journal is kept", path)
            outcome = SERIALIZER_STATE.FAILED
        with self._lock:
            self._state = outcome
            if outcome == SERIALIZER_STATE.SUCCESS:
                self.last_index = self._pending_index
                log.info("snapshot written at index %d", self.last_index)

    def check(self) -> int:
        with self._lock:
            state = self._state
            if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
                self._state = SERIALIZER_STATE.NOT_SERIALIZING
            return state  # type: ignore[no-any-return]

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
