"""raftlog.bridge.Bridge: a submit is settled by the raft thread's callback, or by its deadline."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from raftlog.bridge import Bridge, NotCommitted, UnknownOutcome
from raftlog.node import FAIL_REASON


class FakeNode:
    """Keeps each submit's callback; the test decides when (and from which thread) it runs."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def submit(self, payload: bytes, callback: Any) -> None:
        self.callbacks.append(callback)


def bridge() -> tuple[Bridge, FakeNode]:
    node = FakeNode()
    return Bridge(node, asyncio.get_running_loop()), node  # type: ignore[arg-type]


async def test_the_callback_from_another_thread_settles_the_submit() -> None:
    b, node = bridge()
    task = asyncio.ensure_future(b.submit(b"x", timeout=10))
    await asyncio.sleep(0)
    threading.Thread(target=node.callbacks[0], args=("applied", FAIL_REASON.SUCCESS)).start()
    assert await asyncio.wait_for(task, 5) == "applied"
    await swept(b)


@pytest.mark.parametrize(("reason", "error"), [(FAIL_REASON.MISSING_LEADER, NotCommitted),
                                               (FAIL_REASON.LEADER_CHANGED, UnknownOutcome)])
async def test_a_fail_reason_becomes_its_typed_error(reason: int, error: type[Exception]) -> None:
    b, node = bridge()
    task = asyncio.ensure_future(b.submit(b"x", timeout=10))
    await asyncio.sleep(0)
    node.callbacks[0](None, reason)
    with pytest.raises(error):
        await asyncio.wait_for(task, 5)


async def test_no_callback_by_the_deadline_is_an_unknown_outcome_and_a_late_one_is_harmless() -> None:
    b, node = bridge()
    started = asyncio.get_running_loop().time()
    with pytest.raises(UnknownOutcome, match="within 0.05s") as caught:
        await b.submit(b"x", timeout=0.05)
    assert caught.value.reason == "TIMEOUT"
    assert asyncio.get_running_loop().time() - started >= 0.05
    node.callbacks[0]("late", FAIL_REASON.SUCCESS)  # the raft thread answers after all
    await asyncio.sleep(0.01)  # the relayed settle runs, finds the future done, does nothing


async def test_cancelling_the_waiter_cancels_the_submit() -> None:
    b, node = bridge()
    task = asyncio.ensure_future(b.submit(b"x", timeout=30))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await swept(b)
    node.callbacks[0]("late", FAIL_REASON.SUCCESS)
    await asyncio.sleep(0.01)


async def test_many_submits_each_fail_at_their_own_deadline() -> None:
    b, node = bridge()
    loop = asyncio.get_running_loop()
    started = loop.time()
    short = [asyncio.ensure_future(b.submit(b"s", timeout=0.15)) for _ in range(50)]
    long = [asyncio.ensure_future(b.submit(b"l", timeout=5)) for _ in range(50)]
    done, _ = await asyncio.wait(short, timeout=5)
    assert len(done) == 50 and all(isinstance(t.exception(), UnknownOutcome) for t in short)
    assert 0.15 <= loop.time() - started < 3
    assert not any(t.done() for t in long)
    for cb in node.callbacks[50:]:
        cb("ok", FAIL_REASON.SUCCESS)
    assert await asyncio.gather(*long) == ["ok"] * 50
    await swept(b)


async def swept(b: Bridge) -> None:
    """Once nothing waits, the next sweep forgets every entry and stops its timer."""
    deadlines = b._deadlines
    for _ in range(100):
        if not deadlines._items and deadlines._timer is None:
            return
        await asyncio.sleep(deadlines.TICK / 2)
    raise AssertionError(f"{len(deadlines._items)} entries still kept, timer {deadlines._timer}")
