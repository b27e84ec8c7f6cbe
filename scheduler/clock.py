"""The clock seam: wall time, monotonic time and sleeping, injected everywhere.

Production code takes a ``Clock``; tests pass a ``FakeClock`` and move time
with ``advance()``. Nothing patches ``datetime.now`` or freezes time.

Every wait in scheduler code goes through the clock, waits on an event
included (``wait_for``): so a ``FakeClock`` knows which tasks are parked on it,
and ``settle()`` can tell when nothing is left to run before time moves on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

__all__ = ["Clock", "FakeClock", "SystemClock", "TIMER_RESOLUTION"]

TIMER_RESOLUTION = 0.001
"""The shortest timer ``SystemClock`` sets, in seconds. uvloop's timers count whole milliseconds:
one set for less may fire at once, or up to that much early, so a wait for what is left of a
deadline would spin on the loop for its last millisecond. Each wait is checked against the
monotonic clock and set again for what is left, but never for less than this: a wait never ends
early, and at most this much late."""


class Clock(Protocol):
    def now(self) -> datetime:
        """The current wall-clock instant, an aware UTC datetime."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of monotonic time; ``<= 0`` yields to the loop once."""
        ...

    async def wait_for(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Return once ``event`` is set or ``timeout`` seconds of monotonic time have passed
        (``None``: no timeout; ``<= 0``: yield once); True if the event is set on return."""
        ...


class SystemClock:
    """The real clocks of this process."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(max(left, TIMER_RESOLUTION))

    async def wait_for(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            await asyncio.sleep(0)
            return event.is_set()
        if timeout is None:
            await event.wait()
            return True
        deadline = time.monotonic() + timeout
        while not event.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(max(left, TIMER_RESOLUTION)):
                    await event.wait()
            except TimeoutError:
                pass
        return event.is_set()


class FakeClock:
    """A clock that moves only when told to.

    ``advance(seconds)`` moves ``now()`` and ``monotonic()`` together and wakes
    every sleeper whose deadline has been reached. A ``sleep`` returns only
    after an advance past its deadline; ``sleep(0)`` (or less) yields once.
    Use it from one event loop thread; ``advance`` itself does not yield, so
    woken sleepers run at the caller's next ``await``.

    The clock also knows which tasks are parked on it (in ``sleep`` or
    ``wait_for``, their deadline not reached and their event not set):
    ``settle()`` yields to the loop until every other task is, which is the
    moment nothing can happen any more until time moves.
    """

    def __init__(self, start: datetime, *, monotonic_start: float = 0.0) -> None:
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError("FakeClock needs an aware start datetime")
        self._now = start.astimezone(UTC)
        # Integer nanoseconds, so ten advance(0.1) reach a deadline of sleep(1.0).
        self._mono_ns = round(monotonic_start * 1e9)
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        # task -> "is it still parked?"; a task whose wait has ended but which has not
        # run yet answers False, so settle() keeps yielding until it has.
        self._parked: dict[asyncio.Task[Any], Callable[[], bool]] = {}

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono_ns / 1e9

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = self._timer(seconds)
        task = asyncio.current_task()
        if task is not None:
            self._parked[task] = lambda: not fut.done()
        try:
            await fut
        finally:
            # A cancelled sleeper leaves a done future behind; advance() skips it.
            fut.cancel()
            if task is not None:
                self._parked.pop(task, None)

    async def wait_for(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            await asyncio.sleep(0)
            return event.is_set()
        timer = self._timer(timeout) if timeout is not None else None
        waiter = asyncio.get_running_loop().create_task(event.wait(), name="fake-clock-event")

        def parked() -> bool:
            return not event.is_set() and (timer is None or not timer.done())

        task = asyncio.current_task()
        for t in (task, waiter):
            if t is not None:
                self._parked[t] = parked
        try:
            either: list[asyncio.Future[Any]] = [waiter] if timer is None else [waiter, timer]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if timer is not None:
                timer.cancel()
            for t in (task, waiter):
                if t is not None:
                    self._parked.pop(t, None)
        return event.is_set()

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono_ns + round(seconds * 1e9), next(self._seq), fut))
        return fut

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake the sleepers now due."""
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        self._now += timedelta(seconds=seconds)
        self._mono_ns += round(seconds * 1e9)
        self._wake_due()

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._mono_ns:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def advance_to(self, instant: datetime) -> None:
        """Advance until ``now()`` is ``instant`` (which must not be in the past)."""
        self.advance((instant - self._now).total_seconds())

    async def settle(self, *, bound: int = 10_000) -> None:
        """Yield to the loop until every other task of it is parked on this clock.

        Fails after ``bound`` turns, naming the tasks still busy: one waiting on
        anything but this clock (a socket, a real timer) never counts as parked.
        """
        me = asyncio.current_task()
        for _ in range(bound):
            await asyncio.sleep(0)
            busy = [t for t in asyncio.all_tasks() if t is not me and not t.done() and not self._is_parked(t)]
            if not busy:
                return
        raise AssertionError(f"after {bound} turns of the loop, tasks not (yet) waiting on this clock: "
                             f"{[t.get_name() for t in busy]}")

    def _is_parked(self, task: asyncio.Task[Any]) -> bool:
        parked = self._parked.get(task)
        return parked is not None and parked()

    async def run_for(self, seconds: float) -> None:
        """Let ``seconds`` pass the way real time would: settle, then advance to the next
        deadline, settle again, and so on, ending settled at exactly ``seconds`` later."""
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        end = self._mono_ns + round(seconds * 1e9)
        await self.settle()
        while (due := self._next_ns()) is not None and due <= end:
            self._step_ns(due - self._mono_ns)
            await self.settle()
        self._step_ns(end - self._mono_ns)
        await self.settle()

    def _step_ns(self, ns: int) -> None:
        self._now += timedelta(microseconds=ns / 1000)
        self._mono_ns += ns
        self._wake_due()

    def _next_ns(self) -> int | None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting (lets a test wait until a task has gone to sleep)."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def next_deadline(self) -> float | None:
        """The monotonic deadline of the earliest waiting sleep, if any."""
        due = self._next_ns()
        return due / 1e9 if due is not None else None
