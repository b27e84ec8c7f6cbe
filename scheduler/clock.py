"""The clock seam: wall time, monotonic time and sleeping, injected everywhere.

Production code takes a ``Clock``; tests pass a ``FakeClock`` and move time
with ``advance()``. Nothing patches ``datetime.now`` or freezes time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "FakeClock", "SystemClock"]


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


class SystemClock:
    """The real clocks of this process."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to.

    ``advance(seconds)`` moves ``now()`` and ``monotonic()`` together and wakes
    every sleeper whose deadline has been reached. A ``sleep`` returns only
    after an advance past its deadline; ``sleep(0)`` (or less) yields once.
    Use it from one event loop thread; ``advance`` itself does not yield, so
    woken sleepers run at the caller's next ``await``.
    """

    def __init__(self, start: datetime, *, monotonic_start: float = 0.0) -> None:
        if start.tzinfo is None or start.utcoffset() is None:
            raise ValueError("FakeClock needs an aware start datetime")
        self._now = start.astimezone(UTC)
        # Integer nanoseconds, so ten advance(0.1) reach a deadline of sleep(1.0).
        self._mono_ns = round(monotonic_start * 1e9)
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono_ns / 1e9

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deadline = self._mono_ns + round(seconds * 1e9)
        heapq.heappush(self._sleepers, (deadline, next(self._seq), fut))
        # A cancelled sleeper leaves a done future behind; advance() skips it.
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake the sleepers now due."""
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        self._now += timedelta(seconds=seconds)
        self._mono_ns += round(seconds * 1e9)
        while self._sleepers and self._sleepers[0][0] <= self._mono_ns:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def advance_to(self, instant: datetime) -> None:
        """Advance until ``now()`` is ``instant`` (which must not be in the past)."""
        self.advance((instant - self._now).total_seconds())

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting (lets a test wait until a task has gone to sleep)."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def next_deadline(self) -> float | None:
        """The monotonic deadline of the earliest waiting sleep, if any."""
        live = [d for d, _, fut in self._sleepers if not fut.done()]
        return min(live) / 1e9 if live else None
