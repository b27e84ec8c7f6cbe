"""Keeping Python's cyclic garbage collector off a large, long-lived replicated state.

A state of 100,000 jobs is ~1.7 million container objects. Each full collection walks
every one of them (measured: ~1.9 s holding the GIL), although almost none ever
becomes cyclic garbage: records are replaced, and refcounting frees what they held.
Three measures keep those walks short:

- ``quiet_restore``: a snapshot is restored with the collector paused (the unpacked
  records are acyclic, so nothing is collectable meanwhile; restoring 100,000 jobs took
  7.0 s with it running and 2.0 s without) and what it built is frozen at once
  (``gc.freeze``: moved to the permanent generation, never walked again).
- ``FreezeAfterSlowCollections``: when a full collection takes longer than ``budget``,
  what survived it is frozen right after, so the next full collection walks only what
  was made since. Just after a full collection is the moment when the least garbage is
  alive; an object frozen while alive and later dropped is still freed by refcounting,
  and only a reference cycle that dies after being frozen is never reclaimed (counted
  in ``frozen_objects``; the agent's metrics show it).
- ``tune_collector``: thresholds that keep each young collection small. While a state
  grows (a bulk load), nearly everything allocated survives, and the middle generation
  collects the survivors of as many youngest collections as its threshold says, all in one
  pause.

And one for the C heap, which holds what is too large for Python's own allocator (each job's
run records are one value of 1-2 KB, made anew at each claim, start and result):
``release_free_memory`` hands its free pages back to the system after a compaction and a
restore, when the most memory has just been freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FreezeAfterSlowCollections", "THRESHOLDS", "quiet_restore", "release_free_memory", "tune_collector"]

log = logging.getLogger("raftcron.heap")

THRESHOLDS = (10_000, 5, 500)
"""The collector's thresholds in an agent: (allocations, youngest collections, middle ones).

- Youngest, 10,000 (Python's default is 700): the job store and the ledger are many small
  long-lived dicts, and every applied entry allocates more. With the default the collector
  kept walking them, ~25 us per job write with 20,000 jobs (~7 us with 10,000).
- Middle, 5: with 50 (the value before), a middle collection walked the survivors of 50
  youngest ones, up to 500,000 objects in one pause. Measured with 3 agents during a bulk
  load of 100,000 jobs, those pauses took 60-290 ms holding the GIL, and the API's health
  answers waited behind them. With 5, each walks at most ~70,000. Every object still passes
  through the middle generation once, so the work is the same, in smaller pauses.
- Full, 500: a full collection still comes after 2,500 youngest ones, as with (10,000, 50,
  50). (Python also waits until the objects that are new since the last full collection
  number a quarter of those it kept; see FreezeAfterSlowCollections for what follows a slow
  one.)"""


def tune_collector() -> None:
    """Set ``THRESHOLDS`` and freeze what is loaded so far (modules, never garbage): an
    agent calls this once, at start."""
    gc.set_threshold(*THRESHOLDS)
    gc.freeze()


@contextlib.contextmanager
def quiet_restore() -> Iterator[None]:
    """Run a restore with the collector paused, then freeze what it built; then hand back the
    pages the restore's buffers held (the snapshot file read whole, its unpacked chunks)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.freeze()
        release_free_memory()


def _find_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)  # the C library the interpreter runs on
    except (OSError, TypeError):  # TypeError: where a library cannot be opened by no name
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc's; absent from musl and macOS
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _find_trim()


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim``, in every arena); False
    where the C library has none.

    The C heap never gives back a free page that has a live block above it. A snapshot holds
    every job's run records as they were while it is written, and the raft thread meanwhile
    replaces each job's value at its next claim, start or result: the new values land above the
    old, and when the snapshot lets the old go they leave holes that stay resident. In-process
    (50,000 jobs, a snapshot held over a round of changes) the call took RSS from 211 to 166 MB
    in 4 ms; in the agents of a million-record run it changed nothing measurable, their memory
    being live objects. The call releases the GIL (``ctypes``)."""
    trim = _TRIM
    if trim is None:
        return False
    trim(0)
    return True


class FreezeAfterSlowCollections:
    """A ``gc.callbacks`` hook: after a full collection slower than ``budget`` seconds, freeze."""

    def __init__(self, budget: float = 0.05) -> None:
        self.budget = budget
        self.freezes = 0
        self.slowest = 0.0
        self._started: float | None = None

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took = time.perf_counter() - self._started
        self._started = None
        self.slowest = max(self.slowest, took)
        if took > self.budget:
            gc.freeze()
            self.freezes += 1
            log.info("a full collection took %.0f ms; %d objects now frozen", took * 1000, gc.get_freeze_count())

    @staticmethod
    def frozen_objects() -> int:
        return gc.get_freeze_count()
