"""submit(bytes) -> awaitable result, without ever blocking the event loop.

pysyncobj calls back on its raft thread; the callback only schedules the
future's completion on the loop (through a ``Relay``). Every submit has a
deadline: a callback can be stranded (a snapshot install skipped the entry, a
leader vanished), and then the outcome is unknown, which is why every command
we submit is idempotent.

Errors:
    SubmitError              base; ``reason`` is the pysyncobj fail reason name
    ├── NotCommitted         certainly not applied (no leader, queue full, discarded): safe to retry
    └── UnknownOutcome       may or may not be applied (leader changed, timed out): retry is safe
                             only because commands are idempotent
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .node import FAIL_REASON
from .trace import mark

__all__ = ["Bridge", "Proposer", "Relay", "SubmitError", "NotCommitted", "UnknownOutcome"]

Callback = Callable[[Any, int], None]

log = logging.getLogger("raftcron.bridge")

_NAMES = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
_NOT_COMMITTED = {FAIL_REASON.MISSING_LEADER, FAIL_REASON.QUEUE_FULL, FAIL_REASON.DISCARDED, FAIL_REASON.REQUEST_DENIED}


class SubmitError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NotCommitted(SubmitError):
    pass


class UnknownOutcome(SubmitError):
    pass


def _error_for(code: int) -> SubmitError:
    name = _NAMES.get(code, f"REASON_{code}")
    if code in _NOT_COMMITTED:
        return NotCommitted(name, f"not committed: {name.lower().replace('_', ' ')}")
    return UnknownOutcome(name, f"outcome unknown: {name.lower().replace('_', ' ')}")


DRAIN_BUDGET = 0.01
"""Seconds of calls one turn of the loop runs before it lets the loop go on to what else is
ready (a request come in, a socket to read) and takes the rest at its next turn. A drain that
ran every call queued, and every call the raft thread posted while it ran, held the loop that
long: the entries of a busy raft thread (a claim or a result of a thousand runs each) kept the
API's answers waiting behind them."""


class Relay:
    """Calls from any thread run on the event loop, in the order posted, one wake-up per batch.

    ``call_soon_threadsafe`` writes to the loop's wake-up pipe on every call; the raft
    thread hands over one call per applied entry and one per settled submit, hundreds to
    thousands a second under load, and each was a system call and a wake-up. Here a call
    is queued, and the loop is woken only when no drain is already pending.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._pending = False
        self.peak = 0
        """The most calls ever queued at once: how far the loop fell behind the raft thread (each
        queued applied entry keeps its result, and what it refers to, alive until taken)."""

    @property
    def queued(self) -> int:
        """Calls posted and not yet taken by the loop."""
        return len(self._calls)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        self._calls.append((fn, args))
        depth = len(self._calls)
        if depth > self.peak:
            self.peak = depth
        if not self._pending:
            self._pending = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

    def _drain(self) -> None:
        # Cleared before taking calls: a call queued after this line either is taken by
        # this drain or finds no drain pending and schedules the next one.
        self._pending = False
        calls = self._calls
        until = time.perf_counter() + DRAIN_BUDGET
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one failing call must not strand the ones after it
                log.exception("call from the raft thread failed: %r", fn)
            if calls and time.perf_counter() > until:
                # The rest at the loop's next turn, still in order: a drain the raft thread
                # schedules meanwhile (it saw none pending) takes from the same queue.
                self._pending = True
                self._loop.call_soon(self._drain)
                return


class Proposer(Protocol):
    """What the bridge needs of a raft node (``RaftNode``, or an in-memory replica in tests).

    Each call returns at once; ``callback(result, fail_reason)`` runs later, once, on any thread.
    """

    def submit(self, payload: bytes, callback: Callback) -> None: ...

    def add_member(self, raft_addr: str, callback: Callback) -> None: ...

    def remove_member(self, raft_addr: str, callback: Callback) -> None: ...


class Bridge:
    def __init__(self, node: Proposer, loop: asyncio.AbstractEventLoop, relay: Relay | None = None) -> None:
        self._node = node
        self._loop = loop
        self._relay = relay or Relay(loop)
        self._deadlines = _Deadlines(loop)

    def _future(self) -> tuple[asyncio.Future[Any], Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()

        def settle(result: Any, err: int) -> None:
            mark("settled")
            if fut.done():
                return
            if err == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            else:
                fut.set_exception(_error_for(err))

        def callback(result: Any, err: int) -> None:  # raft thread
            mark("callback")
            self._relay.post(settle, result, err)

        return fut, callback

    async def submit(self, payload: bytes, timeout: float = 5.0) -> Any:
        fut, callback = self._future()
        self._node.submit(payload, callback)
        return await self._wait(fut, timeout)

    async def add_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        fut, callback = self._future()
        self._node.add_member(raft_addr, callback)
        await self._wait(fut, timeout)

    async def remove_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        fut, callback = self._future()
        self._node.remove_member(raft_addr, callback)
        await self._wait(fut, timeout)

    async def _wait(self, fut: asyncio.Future[Any], timeout: float) -> Any:
        self._deadlines.add(fut, timeout)
        return await fut


class _Deadlines:
    """What ``asyncio.wait_for`` does for each submit, done by one sweep for all of them.

    wait_for costs a waiter future and a timer per call; each timer is pushed on the loop's
    heap with Python-level comparisons, cancelled, and later cleared by a rebuild of that
    heap, on the path of every write. Here a submit is one list entry, and a sweep every ``TICK`` seconds
    while any is pending fails the overdue ones with ``UnknownOutcome`` (at most ``TICK``
    late) and forgets the settled. Cancelling the awaiting task cancels its future, as
    with wait_for; a late result then finds it done.
    """

    TICK = 0.1

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[tuple[float, float, asyncio.Future[Any]]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, fut: asyncio.Future[Any], timeout: float) -> None:
        self._items.append((self._loop.time() + timeout, timeout, fut))
        if self._timer is None:
            self._timer = self._loop.call_later(self.TICK, self._sweep)

    def _sweep(self) -> None:
        try:
            now = self._loop.time()
            pending = []
            for item in self._items:
                deadline, timeout, fut = item
                if fut.done():
                    continue
                if deadline <= now:
                    fut.set_exception(UnknownOutcome("TIMEOUT", f"outcome unknown: no commit confirmed within {timeout}s"))
                    continue
                pending.append(item)
            self._items = pending
        finally:  # were anything to raise above, the next sweep still comes and sees every entry
            self._timer = self._loop.call_later(self.TICK, self._sweep) if self._items else None
