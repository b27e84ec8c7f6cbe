"""raftlog.bridge.Relay: calls from the raft thread reach the loop in order, woken once per batch."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from raftlog.bridge import DRAIN_BUDGET, Relay


async def test_calls_from_another_thread_run_in_order_with_few_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    wakes: list[Any] = []
    real = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda fn, *a: (wakes.append(fn), real(fn, *a))[1])
    relay = Relay(loop)
    seen: list[int] = []
    done = asyncio.Event()
    n = 5000

    def note(i: int) -> None:
        seen.append(i)
        if i == n - 1:
            done.set()

    producer = threading.Thread(target=lambda: [relay.post(note, i) for i in range(n)])
    producer.start()
    await asyncio.wait_for(done.wait(), 10)
    producer.join()
    assert seen == list(range(n))
    assert 1 <= len(wakes) < n  # batches, not one wake-up per call


async def test_a_failing_call_does_not_strand_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    relay = Relay(asyncio.get_running_loop())
    seen: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    relay.post(seen.append, "a")
    relay.post(boom)
    relay.post(seen.append, "b")
    for _ in range(100):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert seen == ["a", "b"]
    assert "boom" in caplog.text


def test_posting_to_a_closed_loop_is_ignored() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    Relay(loop).post(print, "never")  # no raise: nobody waits any more


async def test_the_backlog_and_its_peak_are_counted() -> None:
    relay = Relay(asyncio.get_running_loop())
    seen: list[int] = []
    for i in range(7):  # posted from the loop's own thread: nothing is taken until it yields
        relay.post(seen.append, i)
    assert (relay.queued, relay.peak) == (7, 7)
    for _ in range(100):
        if len(seen) == 7:
            break
        await asyncio.sleep(0.01)
    assert seen == list(range(7))
    relay.post(seen.append, 7)
    assert (relay.queued, relay.peak) == (1, 7)  # the peak is the most ever queued at once


async def test_a_long_backlog_is_taken_over_several_turns_of_the_loop() -> None:
    """A drain ran every queued call in one go, and the loop (the API's requests) waited for all
    of them; now it lets the loop turn once ``DRAIN_BUDGET`` is spent, and goes on after."""
    loop = asyncio.get_running_loop()
    relay = Relay(loop)
    seen: list[int] = []
    at_turn: list[int] = []

    def slow(i: int) -> None:
        time.sleep(DRAIN_BUDGET / 2)  # at least that long: two or three of these spend a budget
        seen.append(i)

    for i in range(10):
        relay.post(slow, i)
    loop.call_soon(lambda: at_turn.append(len(seen)))  # ready after the drain the posts scheduled
    for _ in range(200):
        if len(seen) == 10:
            break
        await asyncio.sleep(0.01)
    assert seen == list(range(10))
    assert at_turn and at_turn[0] < 10, at_turn
