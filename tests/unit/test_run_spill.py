"""The run table with its cold values kept in a spill file (``scheduler.spill``): it answers as
the table with everything in memory does, a snapshot is the same bytes, a snapshot being packed
reads what it captured whatever the table does next, and memory is what it frees."""

from __future__ import annotations

import errno
import gc
import os
import random
import time
import tracemalloc
import weakref
from pathlib import Path
from typing import Any, cast

import pytest

from raftlog.fsm import ApplyContext, LocalStateLost
from scheduler import runtable
from scheduler import spill as spill_module
from scheduler.commands import Claim, ClaimSlots, FinishRuns, PutJobs, RegisterNode, StartRuns, encode_command
from scheduler.runs import RUN_STATUSES, RunRecord
from scheduler.runtable import _EMPTY, RunTable, _bytes
from scheduler.spill import Spilled, Spiller, SpillFile
from scheduler.state import State
from tests.unit.conftest import T0
from tests.unit.test_run_table import _agrees, record

MIN = 60_000_000


@pytest.fixture(autouse=True)
def _small_values_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtable, "SPILL_MIN", 0)  # a few records a job are enough to take every path


def _spilled_jobs(table: RunTable) -> list[str]:
    return [job for job, v in table._jobs.items() if isinstance(v, Spilled)]


def test_a_table_spilling_answers_as_a_dict_of_records_would_through_random_changes(tmp_path: Path) -> None:
    rng = random.Random(20261207)
    table, plain = RunTable(), RunTable()
    spiller = Spiller(tmp_path, rotate_at=4096)  # files left often: values move between them
    table.spill_to(spiller)
    model: dict[str, RunRecord] = {}
    jobs = [f"j{i}" for i in range(12)]
    for job in jobs[:6]:
        table.add_job(job)
        plain.add_job(job)
    token = 1 << 16
    files: set[int] = set()
    spilled_seen = 0
    for step in range(4000):
        op = rng.random()
        if op < 0.4 or not model:
            token += rng.randint(1, 3)
            run = record(token, job=rng.choice(jobs), status=rng.choice(RUN_STATUSES),
                         cause=rng.choice([None, None, f"key-{token}"]))
            table[run["id"]] = plain[run["id"]] = model[run["id"]] = run
        elif op < 0.6:
            rid = rng.choice(list(model))
            new = cast(RunRecord, {**model[rid], "status": rng.choice(RUN_STATUSES), "output": f"o{step}"})
            table[rid] = plain[rid] = model[rid] = new
        elif op < 0.75:
            rid = rng.choice(list(model))
            assert table.discard(rid) and plain.discard(rid)
            del model[rid]
        elif op < 0.77:
            job = rng.choice(jobs)
            assert table.drop_job(job) == plain.drop_job(job)
            model = {rid: r for rid, r in model.items() if r["job"] != job}
            table.add_job(job)
            plain.add_job(job)
        else:
            table.sweep(rng.randint(1, 8), everything=rng.random() < 0.3)
            files.add(id(spiller.current))
        spilled_seen = max(spilled_seen, len(_spilled_jobs(table)))
        if step % 97 == 0 or step > 3950:
            _agrees(table, model, jobs, rng)
            assert {j: _bytes(v) for j, v in table._jobs.items()} == plain._jobs  # byte for byte
            # The file's count of bytes still named is those of the values it holds.
            named = sum(v.size for v in table._jobs.values() if isinstance(v, Spilled) and v.file is spiller.current)
            assert spiller.current.live == named
            refs = [v for v in table._jobs.values() if isinstance(v, Spilled)]
            assert table.spilled() == (len(refs), sum(v.size for v in refs))
    assert spilled_seen >= 6 and len(files) > 2  # values were kept out of memory, in several files
    assert all(table._jobs[job] is _EMPTY for job in table._jobs if not table.count_of(job))


def _apply_rounds(s: State, names: list[str], rounds: int, index: int = 0, keep: int = 3, sweep: bool = True) -> int:
    def apply(cmd: Any) -> Any:
        nonlocal index
        index += 1
        return s.apply(encode_command(cmd), ApplyContext(index=index))

    if index == 0:
        apply(RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"))
        apply(PutJobs(at_us=T0, specs=tuple(
            {"name": n, "schedule": "* * * * *", "executor": "http", "http": {"url": "http://127.0.0.1:9/"},
             "history": {"keep": keep}} for n in names)))
    first = len(s.runs) // max(len(names), 1) + 1
    for k in range(first, first + rounds):
        slot = T0 + k * MIN
        out = apply(ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=tuple(
            Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in names)))
        ids = tuple(r["id"] for r in out.result["runs"])
        apply(StartRuns(at_us=slot + 1000, node="n1", runs=ids, started_us={r: slot + 1000 for r in ids},
                        lease_until_us=slot + 30_000_000))
        if k % 2:  # every other round is left running: records kept as dicts beside packed ones
            apply(FinishRuns(at_us=slot + 50_000, node="n1", results=tuple(
                {"run_id": r, "status": "succeeded", "started_us": slot + 1000, "finished_us": slot + 50_000,
                 "exit_code": None, "http_status": 200, "output": "ok", "error": None} for r in ids)))
        if sweep:
            s.runs.sweep(len(names), everything=True)  # between entries, as the tick does on its own
    return index


def test_a_state_spilling_applies_snapshots_and_restores_as_one_in_memory(tmp_path: Path) -> None:
    names = [f"job-{i:03d}" for i in range(60)]
    spilling, plain = State(), State()
    (tmp_path / "a").mkdir()
    spilling.runs.spill_to(Spiller(tmp_path / "a", rotate_at=1 << 14))
    at = _apply_rounds(spilling, names, 7)
    assert _apply_rounds(plain, names, 7) == at
    assert len(_spilled_jobs(spilling.runs)) == len(names)  # every job's value out of memory
    data = spilling.snapshot_bytes()
    assert data == plain.snapshot_bytes()
    assert [spilling.runs.records_of(n) for n in names] == [plain.runs.records_of(n) for n in names]

    (tmp_path / "b").mkdir()
    back = State()
    before = Spiller(tmp_path / "b")
    back.runs.spill_to(before)
    back.restore(data)
    assert back.runs.spiller is not None and back.runs.spiller is not before  # a file of its own
    assert back.snapshot_bytes() == data and back.runs == plain.runs
    assert _spilled_jobs(back.runs) == []  # restored into memory; the sweep moves them
    back.runs.sweep(len(names))
    assert len(_spilled_jobs(back.runs)) == len(names)
    # Replaying entries after a restore (the journal behind the snapshot) agrees too.
    _apply_rounds(back, names, 2, index=at)
    _apply_rounds(plain, names, 2, index=at)
    assert back.snapshot_bytes() == plain.snapshot_bytes()


def test_a_capture_packs_what_it_took_after_the_table_left_its_file(tmp_path: Path) -> None:
    names = [f"job-{i:03d}" for i in range(40)]
    s = State()
    spiller = Spiller(tmp_path, rotate_at=1024)
    s.runs.spill_to(spiller)
    at = _apply_rounds(s, names, 4)
    expected = s.snapshot_bytes()
    chunks = s.snapshot()  # captured now, packed below
    first = spiller.current
    _apply_rounds(s, names, 6, index=at)  # every value made again and moved on; files left behind
    s.runs.sweep(len(names))
    s.runs.sweep(len(names))
    assert spiller.current is not first and not any(
        v.file is first for v in s.runs._jobs.values() if isinstance(v, Spilled))
    assert b"".join(chunks) == expected  # read from the file it left, kept open by the capture
    left = weakref.ref(first)
    del chunks, first
    gc.collect()
    assert left() is None  # closed (``SpillFile.__del__``) once nothing refers to it any more


def test_values_made_lately_stay_in_memory_until_they_are_cold(tmp_path: Path) -> None:
    s = State()
    s.runs.spill_to(Spiller(tmp_path))
    names = [f"job-{i:03d}" for i in range(10)]
    _apply_rounds(s, names, 3, keep=10, sweep=False)
    table = s.runs
    t = time.monotonic()
    table.sweep(len(names), now=t + runtable.COLD_AFTER + 1)  # every value made before t: cold by then
    assert len(_spilled_jobs(table)) == len(names)
    table._now = t + 100
    table[table.ids_of("job-003")[-1]] = {**table.records_of("job-003")[-1], "output": "x" * 300}
    table.sweep(len(names), now=t + 100 + runtable.COLD_AFTER / 2)
    assert _spilled_jobs(table) == [n for n in names if n != "job-003"]  # made lately: kept
    table.sweep(len(names), now=t + 100 + runtable.COLD_AFTER)
    assert len(_spilled_jobs(table)) == len(names)  # and out once cold
    assert table._recent == {}


def test_a_spill_file_that_cannot_be_written_leaves_the_values_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    s, plain = State(), State()
    spiller = Spiller(tmp_path)
    s.runs.spill_to(spiller)
    names = [f"job-{i:03d}" for i in range(20)]

    def full(self: SpillFile, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SpillFile, "append", full)
    _apply_rounds(s, names, 3)
    _apply_rounds(plain, names, 3)
    assert spiller.failed and _spilled_jobs(s.runs) == []
    assert s.snapshot_bytes() == plain.snapshot_bytes()
    assert "run history kept in memory from now on" in caplog.text


def test_the_spill_file_has_no_name_and_goes_with_the_process(tmp_path: Path) -> None:
    spiller = Spiller(tmp_path)
    spiller.store([(b"x" * 1000, 1)])
    assert os.listdir(tmp_path) == []  # nothing left behind by a crash or a restart


def test_a_spilled_value_frees_its_memory(tmp_path: Path) -> None:
    s = State()
    s.runs.spill_to(Spiller(tmp_path))
    names = [f"job-{i:04d}" for i in range(500)]
    tracemalloc.start()  # before the values are made: a block is counted out only if it was counted in
    try:
        _apply_rounds(s, names, 10, keep=10, sweep=False)
        held = sum(len(v) for v in s.runs._jobs.values() if type(v) is bytes)
        assert held > 500 * 5 * 30  # five records packed a job (the other five left running, kept as dicts)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        s.runs.sweep(len(names), everything=True)
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    count, size = s.runs.spilled()
    assert count == len(names) and size == held
    # Each value's bytes left memory; a ``Spilled`` (and its ints) took its place.
    assert freed > held - count * 160, (freed, held)


def test_idle_trims_the_heap_once_enough_history_left_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.state as state_module

    trims: list[int] = []
    monkeypatch.setattr(state_module, "release_free_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(state_module, "TRIM_AFTER", 4096)
    s = State()
    s.runs.spill_to(Spiller(tmp_path))
    names = [f"job-{i:03d}" for i in range(60)]
    _apply_rounds(s, names, 4, keep=10, sweep=False)
    s.runs._recent = dict.fromkeys(s.runs._recent, time.monotonic() + 3600)  # made "later": none cold yet
    s.idle()
    assert trims == [] and s.runs.spilled() == (0, 0)
    s.runs._recent.clear()  # as if COLD_AFTER had passed
    s.runs._swept = 0.0
    s.idle()
    assert s.runs.spilled()[1] >= 4096 and trims == [1] and s.runs.moved_out == 0
    s.runs._swept = 0.0
    s.idle()
    assert trims == [1]  # nothing more moved: no second trim


class _Unreadable:
    """A file's mapping as a closed one answers."""

    def __getitem__(self, part: slice) -> bytes:
        raise ValueError("mmap closed or invalid")


def test_a_value_that_cannot_be_read_back_is_lost_state_not_a_rejection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = State()
    s.runs.spill_to(Spiller(tmp_path))
    names = [f"job-{i:03d}" for i in range(5)]
    at = _apply_rounds(s, names, 3)
    assert len(_spilled_jobs(s.runs)) == len(names)
    monkeypatch.setattr(s.runs.spiller.current, "map", _Unreadable())  # type: ignore[union-attr]
    with pytest.raises(LocalStateLost):  # the others apply it: this replica must not answer Rejected
        _apply_rounds(s, names, 1, index=at)


def test_a_drop_whose_read_fails_leaves_the_table_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = State()
    spiller = Spiller(tmp_path)
    s.runs.spill_to(spiller)
    names = [f"job-{i:03d}" for i in range(5)]
    _apply_rounds(s, names, 3)
    before = (len(s.runs), s.runs.ids_of("job-002"), spiller.values, spiller.bytes)
    with monkeypatch.context() as m:
        m.setattr(spiller.current, "map", _Unreadable())
        with pytest.raises(LocalStateLost):
            s.runs.drop_job("job-002")
    assert (len(s.runs), s.runs.ids_of("job-002"), spiller.values, spiller.bytes) == before
    assert s.runs.drop_job("job-002") and s.runs.ids_of("job-002") is None


def test_a_restore_without_a_new_spill_file_keeps_the_history_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    names = [f"job-{i:03d}" for i in range(5)]
    plain = State()
    _apply_rounds(plain, names, 3)
    s = State()
    s.runs.spill_to(Spiller(tmp_path))

    def no_descriptor(self: Spiller) -> Spiller:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(Spiller, "like", no_descriptor)
    s.restore(plain.snapshot_bytes())  # restored, not refused
    assert s.runs.spiller is None and s.runs == plain.runs
    assert "run history kept in memory: no new spill file" in caplog.text


def test_nothing_is_spilled_that_would_leave_the_disk_under_its_floor(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    spiller = Spiller(tmp_path, min_free=free + (1 << 30))
    s = State()
    s.runs.spill_to(spiller)
    names = [f"job-{i:03d}" for i in range(5)]
    _apply_rounds(s, names, 3)
    assert _spilled_jobs(s.runs) == [] and not spiller.failed and spiller.short  # held back, not given up
    assert caplog.text.count("kept in memory while") == 1  # once, however many sweeps
    spiller.min_free = 0  # room again: the next sweep moves them
    s.runs.sweep(len(names), everything=True)
    assert len(_spilled_jobs(s.runs)) == len(names) and not spiller.short


def test_reads_go_through_the_mapping_not_a_system_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A system call gives the GIL up and must win it back: ~0.4 ms a read with another thread
    # busy, against 0.7 us alone (bench/README, item 102). Reads must not make one.
    spiller = Spiller(tmp_path)
    refs = spiller.store([(b"a" * 700, 1), (b"b" * 300, 2)])
    assert refs is not None

    def no_call(*args: Any) -> bytes:
        raise AssertionError("a read made a system call")

    monkeypatch.setattr(spill_module.os, "pread", no_call)
    monkeypatch.setattr(spill_module.os, "read", no_call)
    assert [r.read() for r in refs] == [b"a" * 700, b"b" * 300]
    spiller.current.forget()  # the pages given back to the page cache: read again, the same
    assert [r.read() for r in refs] == [b"a" * 700, b"b" * 300]


def test_a_full_file_is_left_for_a_larger_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill_module, "CAPACITY_MIN", 4096)
    spiller = Spiller(tmp_path)
    first = spiller.store([(b"x" * 3000, 1)])
    second = spiller.store([(b"y" * 3000, 1)])
    assert first is not None and second is not None
    assert first[0].file is not second[0].file and second[0].file is spiller.current
    assert spiller.current.capacity >= 2 * 6000  # room for what is kept, twice
    assert (first[0].read(), second[0].read()) == (b"x" * 3000, b"y" * 3000)
    assert (spiller.values, spiller.bytes) == (2, 6000)


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_each_slice_of_the_sweep_gives_back_the_pages_reads_touched(tmp_path: Path) -> None:
    spiller = Spiller(tmp_path)
    refs = spiller.store([(bytes([i % 251]) * 1024, 1) for i in range(20_000)])  # 20 MB
    assert refs is not None
    table = RunTable()
    table.spill_to(spiller)
    table.sweep(1)
    before = _rss_file_kb()
    assert all(r.read()[0] == i % 251 for i, r in enumerate(refs))
    touched = _rss_file_kb()
    assert touched - before > 15_000  # the pages the reads mapped in, counted as this process's
    table.sweep(1)  # no job to move: the slice gives the pages back all the same
    assert touched - _rss_file_kb() > 15_000
