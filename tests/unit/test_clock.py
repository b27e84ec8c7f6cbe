"""SystemClock and FakeClock: time moves only when a test says so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
import uvloop

from scheduler.clock import Clock, FakeClock, SystemClock

START = datetime(2026, 3, 29, 0, 59, 30, tzinfo=UTC)


async def until(condition: Callable[[], bool], what: str, rounds: int = 100) -> None:
    """Yield to the loop until ``condition`` holds; fail naming ``what`` after ``rounds`` turns."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"timed out waiting for {what}")


async def settle(rounds: int = 10) -> None:
    """Give every ready task a few turns (no time passes on a FakeClock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_both_clocks_satisfy_the_protocol() -> None:
    clocks: list[Clock] = [SystemClock(), FakeClock(START)]
    assert all(c.now().tzinfo is not None for c in clocks)


def test_system_clock_is_aware_utc_and_monotonic() -> None:
    clock = SystemClock()
    now = clock.now()
    assert now.utcoffset() == timedelta(0)
    assert abs((now - datetime.now(UTC)).total_seconds()) < 60
    a, b = clock.monotonic(), clock.monotonic()
    assert b >= a


async def test_system_clock_sleep_zero_and_negative_return() -> None:
    clock = SystemClock()
    await asyncio.wait_for(clock.sleep(0), timeout=5)
    await asyncio.wait_for(clock.sleep(-1), timeout=5)


def test_fake_clock_needs_an_aware_start_and_keeps_utc() -> None:
    with pytest.raises(ValueError, match="aware"):
        FakeClock(datetime(2026, 1, 1))
    berlin = timezone(timedelta(hours=1))
    clock = FakeClock(datetime(2026, 1, 1, 1, 0, tzinfo=berlin))
    assert clock.now() == datetime(2026, 1, 1, tzinfo=UTC)
    assert clock.now().tzinfo is UTC


def test_advance_moves_now_and_monotonic_together() -> None:
    clock = FakeClock(START, monotonic_start=100.0)
    assert clock.monotonic() == 100.0
    clock.advance(90.5)
    assert clock.now() == START + timedelta(seconds=90.5)
    assert clock.monotonic() == 190.5
    clock.advance_to(START + timedelta(hours=1))
    assert clock.now() == START + timedelta(hours=1)
    assert clock.monotonic() == 3700.0


def test_time_does_not_move_by_itself_or_backwards() -> None:
    clock = FakeClock(START)
    assert (clock.now(), clock.monotonic()) == (START, 0.0)
    assert (clock.now(), clock.monotonic()) == (START, 0.0)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="forward"):
        clock.advance_to(START - timedelta(seconds=1))


async def test_sleep_returns_only_once_advanced_past_its_deadline() -> None:
    clock = FakeClock(START)
    task = asyncio.create_task(clock.sleep(5))
    await until(lambda: clock.sleepers == 1, "the task to go to sleep")
    assert clock.next_deadline() == 5.0
    clock.advance(4.999)
    await settle()
    assert not task.done()
    clock.advance(0.001)
    await until(task.done, "the sleeper to wake at its deadline")
    assert clock.sleepers == 0 and clock.next_deadline() is None


async def test_sleep_zero_yields_once_without_advancing() -> None:
    clock = FakeClock(START)
    order: list[str] = []

    async def sleeper() -> None:
        order.append("before")
        await clock.sleep(0)
        order.append("after")

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    assert order == ["before"]  # the sleep gave the loop back once
    await until(task.done, "sleep(0) to return")
    assert order == ["before", "after"] and clock.sleepers == 0
    await asyncio.wait_for(clock.sleep(-3), timeout=5)


async def test_advance_wakes_only_the_sleepers_now_due_in_deadline_order() -> None:
    clock = FakeClock(START)
    woke: list[int] = []

    async def sleeper(seconds: int) -> None:
        await clock.sleep(seconds)
        woke.append(seconds)

    tasks = [asyncio.create_task(sleeper(s)) for s in (30, 10, 20)]
    await until(lambda: clock.sleepers == 3, "three sleepers")
    clock.advance(25)
    await until(lambda: len(woke) == 2, "the 10s and 20s sleepers")
    await settle()
    assert woke == [10, 20]
    clock.advance(5)
    await until(lambda: len(woke) == 3, "the 30s sleeper")
    assert woke == [10, 20, 30]
    await asyncio.gather(*tasks)


async def test_many_small_advances_reach_a_deadline() -> None:
    clock = FakeClock(START)
    task = asyncio.create_task(clock.sleep(1.0))
    await until(lambda: clock.sleepers == 1, "the sleeper")
    for _ in range(10):
        clock.advance(0.1)  # float steps must not fall short of 1.0
    await until(task.done, "ten 0.1s advances to wake a 1s sleep")


async def test_a_cancelled_sleeper_is_forgotten() -> None:
    clock = FakeClock(START)
    task = asyncio.create_task(clock.sleep(10))
    await until(lambda: clock.sleepers == 1, "the sleeper")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.sleepers == 0 and clock.next_deadline() is None
    clock.advance(60)  # waking a cancelled sleep must not raise
    await settle()


async def test_a_sleep_started_after_an_advance_counts_from_then() -> None:
    clock = FakeClock(START)
    clock.advance(100)
    task = asyncio.create_task(clock.sleep(10))
    await until(lambda: clock.sleepers == 1, "the sleeper")
    assert clock.next_deadline() == 110.0
    clock.advance(9)
    await settle()
    assert not task.done()
    clock.advance(1)
    await until(task.done, "the sleeper")


async def test_system_clock_wait_for_answers_whether_the_event_came() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    assert await asyncio.wait_for(clock.wait_for(event, 0.01), timeout=5) is False
    assert await asyncio.wait_for(clock.wait_for(event, 0), timeout=5) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await asyncio.wait_for(clock.wait_for(event, None), timeout=5) is True
    assert await asyncio.wait_for(clock.wait_for(event, 0), timeout=5) is True


async def test_fake_wait_for_ends_on_the_event_before_its_timeout() -> None:
    clock = FakeClock(START)
    event = asyncio.Event()
    task = asyncio.create_task(clock.wait_for(event, 30))
    await clock.settle()
    assert not task.done() and clock.next_deadline() == 30.0
    event.set()
    await until(task.done, "the event to end the wait")
    assert task.result() is True and clock.monotonic() == 0.0
    assert clock.sleepers == 0  # its timeout is forgotten


async def test_fake_wait_for_times_out_only_when_time_is_advanced() -> None:
    clock = FakeClock(START)
    event = asyncio.Event()
    task = asyncio.create_task(clock.wait_for(event, 2))
    await clock.settle()
    clock.advance(1.999)
    await clock.settle()
    assert not task.done()
    clock.advance(0.001)
    await until(task.done, "the timeout")
    assert task.result() is False
    forever = asyncio.create_task(clock.wait_for(event, None))
    await clock.settle()
    clock.advance(3600)
    await clock.settle()
    assert not forever.done() and clock.next_deadline() is None  # no timeout: only the event ends it
    event.set()
    await until(forever.done, "the event")
    assert forever.result() is True


async def test_settle_returns_once_every_task_waits_on_the_clock() -> None:
    clock = FakeClock(START)
    event = asyncio.Event()
    steps: list[str] = []

    async def worker() -> None:
        for name in "abc":  # several turns of the loop, then parked on the clock
            await asyncio.sleep(0)
            steps.append(name)
        await clock.wait_for(event, None)
        steps.append("woken")
        await clock.sleep(1)
        steps.append("slept")

    task = asyncio.create_task(worker())
    await clock.settle()
    assert steps == ["a", "b", "c"]
    event.set()
    await clock.settle()
    assert steps == ["a", "b", "c", "woken"]
    clock.advance(1)
    await clock.settle()
    assert steps[-1] == "slept" and task.done()


async def test_settle_fails_naming_a_task_that_waits_on_something_else() -> None:
    clock = FakeClock(START)
    never = asyncio.Event()
    task = asyncio.create_task(never.wait(), name="waits-on-an-event-directly")
    try:
        with pytest.raises(AssertionError, match="waits-on-an-event-directly"):
            await clock.settle(bound=50)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_run_for_visits_every_deadline_in_order_and_ends_on_time() -> None:
    clock = FakeClock(START)
    seen: list[float] = []

    async def ticker(every: float) -> None:
        while True:
            await clock.sleep(every)
            seen.append(round(clock.monotonic(), 6))

    tasks = [asyncio.create_task(ticker(0.3)), asyncio.create_task(ticker(0.5))]
    try:
        await clock.run_for(1.2)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert seen == [0.3, 0.5, 0.6, 0.9, 1.0, 1.2]
    assert clock.monotonic() == 1.2 and clock.now() == START + timedelta(seconds=1.2)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_system_clock_never_wakes_early_and_does_not_spin(loop: str) -> None:
    """uvloop's timers count whole milliseconds: ``asyncio.sleep(0.0004)`` there may return at
    once, or a sleep end up to a millisecond early, so a wait for what was left of a deadline
    spun (24,066 turns in 50 ms, measured) and woke early. On both loops now: never before the
    deadline, and no more turns than milliseconds."""
    factory = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}[loop]
    clock = SystemClock()

    async def run() -> tuple[list[float], int, list[float]]:
        early = []
        for seconds in (0.0001, 0.0004, 0.0009, 0.0015, 0.0042, 0.011) * 5:
            t0 = time.monotonic()
            await clock.sleep(seconds)
            if time.monotonic() - t0 < seconds:
                early.append(seconds)
        turns, end = 0, time.monotonic() + 0.05
        while (left := end - time.monotonic()) > 0:
            await clock.sleep(min(left, 0.0004))
            turns += 1
        event = asyncio.Event()
        waited_early = []
        for seconds in (0.0003, 0.0008, 0.0031):
            t0 = time.monotonic()
            assert not await clock.wait_for(event, seconds)
            if time.monotonic() - t0 < seconds:
                waited_early.append(seconds)
        return early, turns, waited_early

    with asyncio.Runner(loop_factory=factory) as runner:
        early, turns, waited_early = runner.run(run())
    assert early == [] and waited_early == []
    assert turns <= 60  # one a millisecond at most, with room for a late wake or two
