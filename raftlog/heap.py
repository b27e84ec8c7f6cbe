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

And two for the C heap, which holds what is too large for Python's own allocator (each job's
run records are one value of 1-2 KB, made anew at each claim, start and result):
``hold_mmap_threshold`` keeps the large blocks that come and go (a snapshot's chunks, batches
of entries) out of the heap, and ``release_free_memory`` hands the heap's free pages back to
the system after a compaction and a restore, when the most memory has just been freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "FreezeAfterSlowCollections", "MMAP_THRESHOLD", "THRESHOLDS", "hold_mmap_threshold", "quiet_restore",
    "release_free_memory", "tune_collector",
]

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


def _libc_function(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """A glibc function of the C library the interpreter runs on, or None where there is none."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: where a library cannot be opened by no name
        return None
    function = getattr(libc, name, None)  # malloc_trim and mallopt are glibc's; absent from musl and macOS
    if function is None:
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_TRIM = _libc_function("malloc_trim", [ctypes.c_size_t])
_MALLOPT = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h

MMAP_THRESHOLD = 1024 * 1024
"""The mmap threshold an agent holds: glibc maps blocks of this size or more (when its free
lists cannot serve them) with pages of their own, which go back to the system when freed.

glibc starts at 128 KiB, but each time a mapped block is freed it raises the threshold to that
block's size (up to 32 MiB). An agent frees such blocks all the time: a snapshot's packed chunks,
pysyncobj's pickled batches of entries, a large entry's bytes. After the first of them, the later
ones are carved from the heap instead, among the values the raft thread makes meanwhile (dicts and
values too large for Python's own allocator, such as a job's run records at ``keep`` 10, replaced
at every claim, start and result), and when they are freed they leave holes that stay resident
until the next ``malloc_trim``. In-process, 100,000 jobs x 4 records filled with snapshots packed
on a thread as an agent takes them (``bench.history --snapshots``), the threshold held took the
RSS per record from 147-182 to 110-115 bytes. At 128 KiB every buffer the packing grows was mapped
and faulted in afresh, which cost more time than it saved memory over 1 MiB (bench/README, item
73). By the time an agent holds it, its imports have already raised the threshold; holding it
sets it back to this value and keeps it there. glibc's trim threshold, which rose with it, is
left as it is."""


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


def hold_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Keep glibc's mmap threshold at ``threshold`` bytes (see ``MMAP_THRESHOLD``): an agent
    calls this once, at start. False where the C library has no ``mallopt`` or refused, and
    where the environment sets the threshold (``MALLOC_MMAP_THRESHOLD_``, or
    ``glibc.malloc.mmap_threshold`` in ``GLIBC_TUNABLES``): an operator's own tuning stands."""
    if _MALLOPT is None or "MALLOC_MMAP_THRESHOLD_" in os.environ \
            or "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return _MALLOPT(_M_MMAP_THRESHOLD, threshold) == 1


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
