"""What a crash can leave in the data directory, put right before pysyncobj reads it.

A record the journal was appending when the power went may be torn: pysyncobj's header names
the end of the last record, and a crash can keep the header's page but not all of the record's
(or zero-filled space past a grown file's end). pysyncobj then fails to start
(``struct.error``) or reads garbage as commands. Nothing in a torn record was acknowledged: a
record is synced before the AppendEntries answer or the leader's count that acknowledges it,
so the torn tail is cut off, logged, and the node starts with what was synced.

Also: a journal shorter than its header (created, never synced) starts empty, and side files of
an interrupted snapshot or meta write (``*.partial``, ``*.tmp``) are removed.

The journal's layout (pysyncobj 0.3.17 ``journal.py``): a 40-byte header (name, version,
format, the offset just past the last record), then records ``size | idx, term, command |
size`` with ``size`` a little-endian u32 counting ``idx, term, command``.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from pysyncobj.journal import APP_NAME, FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET

__all__ = ["Recovered", "journal_header", "recover_journal", "remove_partial_files"]

log = logging.getLogger("raftcron.raft")
_MIN_RECORD = 16  # idx and term, an empty command


@dataclass(frozen=True, slots=True)
class Recovered:
    records: int  # records kept
    end: int  # offset just past the last kept record
    dropped: int  # bytes of the torn tail cut off (0: the journal was whole)
    reset: bool = False  # the file held no valid header and now holds an empty journal


def journal_header(end: int) -> bytes:
    """pysyncobj's journal header naming ``end`` as the offset just past the last record."""
    from pysyncobj.journal import JOURNAL_FORMAT_VERSION, NAME_SIZE, VERSION_SIZE
    from pysyncobj.version import VERSION

    version = VERSION.encode()
    head: bytes = (APP_NAME + b"\0" * (NAME_SIZE - len(APP_NAME)) + version + b"\0" * (VERSION_SIZE - len(version))
            + struct.pack("<II", JOURNAL_FORMAT_VERSION, end))
    return head


def _sync_write(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _valid_end(raw: bytes, last: int) -> tuple[int, int]:
    """Walk the records up to ``last``; answer (records, end of the last whole one)."""
    limit = min(last, len(raw))
    offset, count, prev_idx, prev_term = FIRST_RECORD_OFFSET, 0, -1, -1
    while offset + 4 <= limit:
        (size,) = struct.unpack_from("<I", raw, offset)
        end = offset + 4 + size + 4
        if size < _MIN_RECORD or end > limit:
            break
        (trailer,) = struct.unpack_from("<I", raw, end - 4)
        idx, term = struct.unpack_from("<QQ", raw, offset + 4)
        if trailer != size or (prev_idx >= 0 and (idx != prev_idx + 1 or term < prev_term)):
            break
        offset, count, prev_idx, prev_term = end, count + 1, idx, term
    return count, offset


def recover_journal(path: Path) -> Recovered | None:
    """Make the journal at ``path`` one pysyncobj can open, cutting off a torn last record.

    None when there is no file. Raises ``ValueError`` for a file that is not a pysyncobj
    journal at all (a wrong path must not be clobbered).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < FIRST_RECORD_OFFSET or not raw[:FIRST_RECORD_OFFSET].strip(b"\0"):
        # Created but never synced (empty, or grown with zeros): no record was acknowledged.
        _sync_write(path, 0, journal_header(FIRST_RECORD_OFFSET))
        log.warning("journal %s held no header (%d bytes): starting it empty", path, len(raw))
        return Recovered(records=0, end=FIRST_RECORD_OFFSET, dropped=0, reset=True)
    if not raw.startswith(APP_NAME):
        raise ValueError(f"{path} is not a raft journal (its header does not start with {APP_NAME!r})")
    (last,) = struct.unpack_from("<I", raw, LAST_RECORD_OFFSET_OFFSET)
    records, end = _valid_end(raw, last)
    if end == last:
        return Recovered(records=records, end=end, dropped=0)
    _sync_write(path, LAST_RECORD_OFFSET_OFFSET, struct.pack("<I", end))
    log.warning("journal %s: torn tail cut off at offset %d (%d records kept, %d bytes dropped; the header "
                "named offset %d): a crash interrupted an append that was never acknowledged",
                path, end, records, last - end, last)
    return Recovered(records=records, end=end, dropped=last - end)


def remove_partial_files(data_dir: Path) -> list[Path]:
    """Remove the side files of writes a crash interrupted (a snapshot's ``.partial``, the
    meta file's ``.tmp``): each is renamed into place only once whole and synced, so a side
    file left behind is never the newest copy. Answers what was removed."""
    removed = []
    for side in sorted([*data_dir.glob("raft.*.partial"), *data_dir.glob("raft.*.tmp")]):
        try:
            side.unlink()
        except FileNotFoundError:
            continue
        removed.append(side)
        log.warning("removed %s, left by an interrupted write", side)
    return removed
