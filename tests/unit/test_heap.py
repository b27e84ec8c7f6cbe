"""raftlog.heap: a restore runs with the collector paused and freezes what it built; a slow full
collection freezes what survived it, and a fast one does not; while a state grows, no young
collection walks more than a few youngest generations' worth of objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from raftlog.heap import THRESHOLDS, FreezeAfterSlowCollections, quiet_restore, tune_collector


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_restore_runs_without_collections_and_freezes_what_it_built() -> None:
    seen: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with quiet_restore():
            built = [{"spec": {"n": i}} for i in range(50_000)]  # many more than the collector's thresholds
            assert not gc.isenabled()
    finally:
        gc.callbacks.remove(count)
    assert gc.isenabled()
    assert seen == []
    assert gc.get_freeze_count() >= len(built)


def test_a_restore_that_raises_still_enables_the_collector() -> None:
    with pytest.raises(ValueError), quiet_restore():
        raise ValueError("a corrupt snapshot")
    assert gc.isenabled()


def test_a_full_collection_over_budget_freezes_what_survived_it() -> None:
    keep = [[i] for i in range(20_000)]
    pacer = FreezeAfterSlowCollections(budget=0.0)  # every full collection counts as slow
    pacer.install()
    try:
        gc.collect(1)
        assert pacer.freezes == 0  # a young collection is never a reason
        gc.collect()
    finally:
        pacer.uninstall()
    assert pacer.freezes == 1 and pacer.slowest > 0
    assert gc.get_freeze_count() >= len(keep)
    assert pacer not in gc.callbacks


def test_a_fast_full_collection_freezes_nothing() -> None:
    pacer = FreezeAfterSlowCollections(budget=60.0)
    pacer.install()
    pacer.install()  # installing twice hooks once
    try:
        assert gc.callbacks.count(pacer) == 1
        gc.collect()
    finally:
        pacer.uninstall()
    assert pacer.freezes == 0 and gc.get_freeze_count() == 0


def test_while_a_state_grows_no_young_collection_walks_more_than_a_few_youngest_ones() -> None:
    """A bulk load keeps nearly all it allocates. With (10,000, 50, 50) a middle collection
    walked the survivors of 50 youngest ones, ~500,000 objects, in one pause (60-290 ms of
    GIL measured in an agent loading 100,000 jobs, the API's answers waiting behind it)."""
    walked: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 1:
            walked.append(len(gc.get_objects(0)) + len(gc.get_objects(1)))

    before = gc.get_threshold()
    tune_collector()
    gc.callbacks.append(count)
    try:
        kept = [[i] for i in range(700_000)]  # every one survives, as a loaded job's objects do
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)
    youngest, middle, _ = THRESHOLDS
    assert len(walked) >= 5, walked  # the load did make middle collections
    assert max(walked) <= youngest * (middle + 2) + 5_000, max(walked)  # 520,059 with (10,000, 50, 50)
    assert len(kept) == 700_000
