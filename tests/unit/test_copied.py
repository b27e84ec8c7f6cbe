"""``copied``: what the event loop iterates of a dict the raft thread changes."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler.store import copied


@pytest.fixture
def changed_by_a_collection() -> Iterator[Callable[[dict[str, int]], None]]:
    """A collection whose callback changes the dict, as the raft thread may while a callback
    (Python code) runs; collections made frequent."""
    target: list[dict[str, int]] = []

    def change(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and target:
            target[0][f"new-{len(target[0])}"] = 0

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    gc.callbacks.append(change)
    try:
        yield lambda d: target.append(d)
    finally:
        gc.callbacks.remove(change)
        gc.set_threshold(*threshold)


def test_listing_the_pairs_can_fail_midway_and_a_copy_does_not(
        changed_by_a_collection: Callable[[dict[str, int]], None]) -> None:
    jobs = {f"job-{i}": i for i in range(20_000)}
    changed_by_a_collection(jobs)
    with pytest.raises(RuntimeError, match="dictionary changed size during iteration"):
        list(jobs.items())  # what the leader's first scan did
    before = len(jobs)
    snapshot = copied(jobs)
    assert len(snapshot) in (before, before + 1)
    assert all(snapshot[k] == v for k, v in snapshot.items())
