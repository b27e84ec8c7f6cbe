"""raftlog.heap: a restore runs with the collector paused and freezes what it built; a slow full
collection freezes what survived it, and a fast one does not."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from raftlog.heap import FreezeAfterSlowCollections, quiet_restore


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
