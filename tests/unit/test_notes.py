"""Explain notes (``Store.notes``): kept packed, read as the dicts they were, snapshotted as every
version wrote them."""

from __future__ import annotations

import gc
import tracemalloc

import msgpack
import pytest

from raftlog.codec import CodecError, pack
from raftlog.fsm import ApplyContext
from scheduler.commands import PauseJob, PutJobs, encode_command
from scheduler.state import State
from tests.unit.conftest import T0
from tests.unit.test_snapshot_format import _iter_chunks, fed, templated

JOBS = 50


def _paused_and_resumed(state: State, rounds: int, start: int) -> int:
    """Every job of ``templated(JOBS)`` paused and resumed ``rounds`` times; the next index."""
    index = start
    for k in range(rounds):
        for i in range(JOBS):
            index += 1
            cmd = PauseJob(at_us=T0 + index, name=f"t-{i:05d}", paused=k % 2 == 0,
                           note=None if i % 3 else f"maintenance window {k}")
            state.apply(encode_command(cmd), ApplyContext(index=index))
    return index


def test_a_note_costs_a_fraction_of_what_its_dict_did() -> None:
    """As a dict, its instant and its reason, a pause note held ~300 bytes (measured in-process:
    319 bytes of RSS a note over 400,000 notes); a job keeps up to 200. Packed, ~70."""
    state = fed([PutJobs(at_us=T0, specs=templated(JOBS))])
    index = _paused_and_resumed(state, 2, 1)  # the tuples are there before the measure
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _paused_and_resumed(state, 40, index)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_note = held / (40 * JOBS)
    assert per_note < 120, f"{per_note:.0f} bytes a note"
    assert len(state.notes[f"t-{JOBS - 1:05d}"]) == 42


def test_notes_read_back_as_they_were_noted_and_snapshot_as_maps() -> None:
    state = State()
    first = {"at_us": T0, "decision": "missed", "count": 70, "first_us": T0 - 70, "last_us": T0 - 1,
             "reason": "the cluster had no leader"}
    second = {"at_us": T0 + 1, "decision": "paused", "reason": "paused by an operator"}
    state.note("a", first)
    state.note("a", second)
    state.note("b", {"at_us": T0 + 2, "decision": "changed", "reason": "changed: schedule '@hourly' -> '@daily'"})
    assert state.notes["a"] == (first, second)
    assert list(state.notes["a"][0]) == list(first)  # the keys in the order they were noted
    assert state.notes.get("a") == (first, second) and state.notes.get("zz") is None and state.notes.get("zz", ()) == ()
    assert "a" in state.notes and "zz" not in state.notes and len(state.notes) == 2 and sorted(state.notes) == ["a", "b"]
    assert state.notes == {"a": [first, second], "b": [state.notes["b"][0]]}
    # The snapshot's notes chunk is the one packing the dicts makes: the same bytes for every version.
    chunks = [c for c in state.snapshot() if msgpack.unpackb(c, raw=False, strict_map_key=False)[0] == "notes"]
    assert chunks == [pack(["notes", [("a", [first, second]), ("b", list(state.notes["b"]))]])]
    assert state.notes.pop("a") == (first, second) and "a" not in state.notes and state.notes.pop("a", 7) == 7


@pytest.mark.parametrize("count", [0, 1, 15, 16, 200])
def test_a_restored_state_holds_the_same_notes_and_snapshots_the_same_bytes(count: int) -> None:
    state = fed([PutJobs(at_us=T0, specs=templated(JOBS))])
    for k in range(count):
        state.note("t-00001", {"at_us": T0 + k, "decision": "skipped", "count": k + 1, "first_us": T0,
                               "last_us": T0 + k, "reason": "forbid: the previous run was still running"})
    whole = state.snapshot_bytes()
    notes = next(items for name, items in _iter_chunks(whole) if name == "notes")
    assert notes == ([["t-00001", [dict(n) for n in state.notes["t-00001"]]]] if count else [])
    back = State()
    back.restore(whole)
    assert back.notes == state.notes
    assert back.snapshot_bytes() == whole


def test_notes_keep_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.store as store_module

    monkeypatch.setattr(store_module, "NOTES_KEPT", 3)
    notes = store_module.Notes()
    for i in range(5):
        notes.add("a", {"at_us": i, "decision": "paused", "reason": str(i)})
    assert [n["at_us"] for n in notes["a"]] == [2, 3, 4]


def test_a_snapshot_note_that_is_no_map_is_refused_as_corrupt() -> None:
    """Taken as it came before (a tuple holding a number), to fail in ``explain`` later."""
    source = fed([PutJobs(at_us=T0, specs=templated(5))])
    source.note("t-00000", {"at_us": T0, "decision": "paused", "reason": "x"})
    chunks = _iter_chunks(source.snapshot_bytes())
    section = {name: items for name, items in chunks}
    section["notes"][0][1].append(5)
    target = State()
    with pytest.raises(CodecError, match="notes"):
        target.restore(b"".join(pack(c) for c in chunks))
    assert len(target.notes) == 0 and not target.jobs
