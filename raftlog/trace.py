"""Marks on the path of a write through the three agents, for ``bench/write_path.py``.

A sequential PUT takes ~2 ms on this machine where the HTTP round trip alone takes ~0.5 ms;
py-spy samples say where CPU goes, not where one request waits. These marks say that: each
is a tag and the instant it was passed on CLOCK_MONOTONIC, which is one clock for every
process of a machine, so the marks of the three agents line up.

Off unless ``RAFTCRON_TRACE_DIR`` names a directory when the process starts: then each
process appends ``tag nanoseconds`` lines to ``DIR/<pid>.log``, kept in a buffer of 4 MiB and
written when it fills and at exit: a write per mark would put a system call on the path being
measured, and an agent killed with -9 loses only what its buffer held. Off, ``mark`` is a
function that does nothing (~40 ns a call).

The tags, in the order a write passes them (``L`` the leader, ``F`` a follower):

- ``http_in`` / ``http_out`` (L): the PUT handler begins / has its answer;
- ``propose`` / ``proposed`` (L): the command goes to the raft thread / its result is back;
- ``woken`` (L): the raft thread took the wake-up a submit sent it;
- ``send_entries`` (L): the eager AppendEntries to an idle follower;
- ``tx`` / ``rx`` (both): a raft message encoded, about to be handed to the socket / a frame
  read, before it is decoded (every message passes these, keepalives too);
- ``entries_in`` (F): an AppendEntries with entries, decoded;
- ``sync`` / ``synced`` (F): the journal sync before its answer, begun / done;
- ``disk_sync`` / ``disk_synced`` (both): an ``fdatasync`` of the journal, begun / done (on
  the leader, the one at the end of the tick that appended the entry);
- ``ack_in`` (L): a follower's answer (``next_node_idx``), decoded;
- ``apply`` / ``applied`` (both): the state machine applies an entry;
- ``callback`` (L): the submit's callback, on the raft thread;
- ``settled`` (L): that result on the event loop's thread.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import TextIO

__all__ = ["ENV", "mark"]

ENV = "RAFTCRON_TRACE_DIR"


def _open() -> TextIO | None:
    where = os.environ.get(ENV)
    if not where:
        return None
    os.makedirs(where, exist_ok=True)
    out = open(os.path.join(where, f"{os.getpid()}.log"), "a", buffering=4 << 20, encoding="ascii")  # noqa: SIM115 - for the process's life

    def flush() -> None:
        if not out.closed:
            out.flush()

    atexit.register(flush)
    return out


_out = _open()
_lock = threading.Lock()  # the raft thread and the event loop's both mark; a text file is not thread-safe


def _write(tag: str) -> None:
    assert _out is not None
    line = f"{tag} {time.monotonic_ns()}\n"
    with _lock:
        _out.write(line)


def _nothing(tag: str) -> None:
    pass


mark = _write if _out is not None else _nothing
"""``mark(tag)``: note that this process passed ``tag`` now (see the module docstring)."""
