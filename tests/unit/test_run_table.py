"""The run table (``Store.runs``): records packed once over read back as they were stored, the
table answers as a dict of records would, and a million records fit in memory."""

from __future__ import annotations

import gc
import random
import sys
import threading
import tracemalloc
from typing import Any, cast

import pytest

from raftlog.codec import CodecError
from raftlog.fsm import ApplyContext
from scheduler.commands import Claim, ClaimSlots, FinishRuns, PutJobs, RegisterNode, StartRuns, encode_command
from scheduler.runs import RUN_STATUSES, RunRecord
from scheduler.runtable import _EMPTY, FIELDS, RunTable, _crc, _crc_value, pack, run_id_of, token_of_id, unpack
from scheduler.state import SNAPSHOT_VERSION, State
from tests.unit.conftest import SEC, T0


def record(token: int, job: str = "ping", status: str = "succeeded", **over: Any) -> RunRecord:
    slot = T0 + (token % 1000) * SEC
    run: dict[str, Any] = {
        "id": run_id_of(token), "job": job, "slot_us": slot, "attempt": 1, "trigger": "schedule",
        "status": status, "node": "n1", "claimed_us": slot - 2 * SEC, "started_us": slot + 1000,
        "finished_us": slot + 50_000, "lease_us": None, "exit_code": None, "http_status": 200, "output": "",
        "error": None, "token": token, "term": 3, "leader": "n2", "retry_of": None, "next": None, "cause": None,
        "retry_at_us": None, "outcome": None, "not_before_us": None,
    }
    run.update(over)
    return cast(RunRecord, run)


VARIANTS: list[dict[str, Any]] = [
    {},
    {"status": "failed", "exit_code": 2, "http_status": None, "output": "boom\n" * 40, "error": "exit status 2"},
    {"status": "dead", "outcome": "failed", "retry_of": run_id_of(7), "attempt": 3, "trigger": "retry"},
    {"status": "retrying", "retry_at_us": T0 + 99 * SEC, "outcome": "timed_out", "next": run_id_of(99)},
    {"status": "lost", "lease_us": T0 - 5, "started_us": None, "finished_us": None},
    {"status": "skipped", "node": None, "started_us": None, "finished_us": None, "http_status": None,
     "error": "concurrency forbid"},
    {"status": "missed", "trigger": "catchup", "not_before_us": T0 + 3},
    {"status": "cancelled", "trigger": "manual", "cause": "req-1", "error": "replaced by a newer slot"},
    {"status": "succeeded", "trigger": "dependency", "cause": run_id_of(5)},
    {"status": "succeeded", "outcome": "something-new", "trigger": "replay", "retry_of": "not-an-id"},
    {"status": "dead", "dead_deleted": True},
    {"status": "failed", "late_result": {"status": "succeeded", "finished_us": T0}},
    {"status": "failed", "late_result": {"status": None, "finished_us": None}, "dead_deleted": True},
    {"status": "dead", "retry_of": "r" + "f" * 20, "next": "r" + "8" + "0" * 15},  # ids past 63 bits stay text
]


@pytest.mark.parametrize("over", VARIANTS, ids=[str(sorted(v)) for v in VARIANTS])
def test_a_record_that_is_over_packs_small_and_reads_back_equal_with_its_keys_in_order(over: dict[str, Any]) -> None:
    run = record(0x1_0000_0003, **over)
    data = pack(run)
    assert data is not None
    back = unpack("ping", 0x1_0000_0003, data)
    assert back == run and list(back) == list(run)
    if not over:
        assert len(data) <= 64, len(data)  # a plain success: ~1,130 bytes as a dict


def test_extra_keys_keep_the_order_they_were_added_in() -> None:
    a = {**record(5, status="dead"), "dead_deleted": True, "late_result": {"status": "failed", "finished_us": 1}}
    b = {**record(5, status="dead"), "late_result": {"status": "failed", "finished_us": 1}, "dead_deleted": True}
    for run in (a, b):
        data = pack(cast(RunRecord, run))
        assert data is not None
        assert list(unpack("ping", 5, data)) == list(run)


@pytest.mark.parametrize("why", ["claimed", "running", "keys in another order", "a key missing", "an instant not an int",
                                 "an id not of its token", "an int where an id goes", "an int outcome",
                                 "an unknown status", "an int msgpack cannot hold"])
def test_a_record_packing_would_not_give_back_is_kept_as_it_is(why: str) -> None:
    run: dict[str, Any] = dict(record(9))
    if why in ("claimed", "running"):
        run["status"] = why
    elif why == "keys in another order":
        run = {"job": run.pop("job"), **run}
    elif why == "a key missing":
        del run["outcome"]
    elif why == "an instant not an int":
        run["finished_us"] = 1.5
    elif why == "an id not of its token":
        run["id"] = "r0a"
    elif why == "an int where an id goes":
        run["retry_of"] = 12
    elif why == "an int outcome":
        run["outcome"] = 3
    elif why == "an int msgpack cannot hold":
        run["finished_us"] = run["slot_us"] + (1 << 64)  # a node's report is not range-checked
    else:
        run["status"] = "paused"
    assert pack(cast(RunRecord, run)) is None
    table = RunTable()
    if why != "an id not of its token":
        table[run["id"]] = cast(RunRecord, run)
        assert table[run["id"]] is run  # held as the dict itself


def test_run_ids_and_tokens() -> None:
    assert token_of_id(run_id_of(0x2a0001)) == 0x2a0001
    for bad in ("", "r", "r0", "r01", "R1", "rz", "x1", "r1 ", "r-1"):
        assert token_of_id(bad) is None, bad
    assert RunTable().get("nonsense") is None and "r1" not in RunTable()


def test_the_table_answers_as_a_dict_of_records_would_through_random_changes() -> None:
    rng = random.Random(20261203)
    table = RunTable()
    model: dict[str, RunRecord] = {}
    jobs = [f"j{i}" for i in range(12)]
    for job in jobs[:6]:
        table.add_job(job)  # listed, with no runs yet
    token = 1 << 16
    for step in range(6000):
        op = rng.random()
        if op < 0.45 or not model:
            token += rng.randint(1, 3)
            job = rng.choice(jobs)
            run = record(token, job=job, status=rng.choice(RUN_STATUSES),
                         cause=rng.choice([None, None, f"key-{token}"]))
            table[run["id"]] = run
            model[run["id"]] = run
        elif op < 0.7:
            rid = rng.choice(list(model))
            new = cast(RunRecord, {**model[rid], "status": rng.choice(RUN_STATUSES), "output": f"o{step}"})
            table[rid] = new
            model[rid] = new
        elif op < 0.97:
            rid = rng.choice(list(model))
            assert table.discard(rid)
            del model[rid]
            assert not table.discard(rid)
        else:
            job = rng.choice(jobs)
            dropped = table.drop_job(job)
            assert dropped == [rid for rid, r in model.items() if r["job"] == job]
            model = {rid: r for rid, r in model.items() if r["job"] != job}
            if rng.random() < 0.5:
                table.add_job(job)
        if step % 97 == 0 or step > 5900:
            _agrees(table, model, jobs, rng)
    assert table._holes < len(table._index.owners)  # the index was compacted on the way
    # A job without runs, never given any or left without, holds the one shared empty value.
    assert all(table._jobs[job] is _EMPTY for job in table._jobs if not table.count_of(job))


def _agrees(table: RunTable, model: dict[str, RunRecord], jobs: list[str], rng: random.Random) -> None:
    ordered = sorted(model, key=lambda rid: model[rid]["token"])
    assert len(table) == len(model) and list(table) == ordered
    assert table._live == {rid: r for rid, r in model.items() if pack(r) is None}  # the in-flight ones, by id
    assert table.items() == [(rid, model[rid]) for rid in ordered]
    for rid in ordered:
        assert table.get(rid) == model[rid] and rid in table
    for job in jobs:
        listed = [rid for rid in ordered if model[rid]["job"] == job]
        assert (table.ids_of(job) or []) == listed and table.count_of(job) == len(listed)
        assert table.records_of(job) == [model[rid] for rid in listed]
        assert list(table.newest_of(job)) == [model[rid] for rid in reversed(listed)]
        some = frozenset(rng.sample(RUN_STATUSES, 3))
        assert list(table.newest_of(job, statuses=some, caused=True)) == [
            model[rid] for rid in reversed(listed) if model[rid]["status"] in some and model[rid]["cause"] is not None]
    counts: dict[str, int] = {}
    for r in model.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    assert table.status_counts() == counts
    if ordered:
        cut = model[rng.choice(ordered)]["token"]
        assert list(table.newest(cut)) == [rid for rid in reversed(ordered) if model[rid]["token"] < cut]
    assert list(table.newest()) == list(reversed(ordered))


def test_a_reader_between_the_steps_of_a_change_reads_the_job_as_before_or_after_it() -> None:
    # A record kept as a dict goes into ``_live`` before its job's value names it and leaves
    # after: a reader on another thread may run between the two steps (the GIL switches between
    # any two bytecodes) and must read each job either without the change or with it.
    table = RunTable()
    done = [record(t) for t in (1 << 16, (1 << 16) + 1)]
    for run in done:
        table[run["id"]] = run
    claimed = record((1 << 16) + 2, status="claimed")
    table._live[claimed["id"]] = claimed  # the first step of adding it, alone
    assert table.records_of("ping") == done and list(table.newest_of("ping")) == done[::-1]
    assert table.ids_of("ping") == [r["id"] for r in done] and table.count_of("ping") == 2
    table[claimed["id"]] = claimed  # both steps
    assert table.records_of("ping") == [*done, claimed] and table.status_counts() == {"succeeded": 2, "claimed": 1}
    # Ending it: its job's value holds it packed first, then ``_live`` lets go; in between, a
    # reader by id reads the dict and a reader by job the packed form: each the record as it
    # was, or as it is.
    ended = record((1 << 16) + 2)
    before = table._jobs["ping"]
    table[ended["id"]] = ended
    assert table._jobs["ping"] is not before and ended["id"] not in table._live
    table._live[ended["id"]] = claimed  # as it was between the two steps
    assert table.get(ended["id"]) == claimed and table.records_of("ping") == [*done, ended]
    del table._live[ended["id"]]
    # Removing one: its job's value goes first, then ``_live``; a job read between has it not.
    running = record((1 << 16) + 3, status="running")
    table[running["id"]] = running
    gone = table._jobs["ping"]
    assert table.discard(running["id"]) and running["id"] not in table._live
    table._jobs["ping"], kept = gone, table._jobs["ping"]  # the old value, read by a reader that took it before
    assert table.records_of("ping") == [*done, ended]  # the record left _live: not read, not None
    table._jobs["ping"] = kept
    assert table.status_counts() == {"succeeded": 3} and len(table) == 3


def test_a_reader_on_another_thread_never_sees_a_record_under_another_id() -> None:
    table = RunTable()
    kept = [record(t, job=f"k{t % 7}") for t in range(1 << 16, (1 << 16) + 300)]
    for run in kept:
        table[run["id"]] = run
    stop = threading.Event()
    seen: list[str] = []

    def read() -> None:
        while not stop.is_set():
            for run in kept:
                got = table.get(run["id"])
                if got != run:
                    seen.append(f"{run['id']}: {got}")
            list(table.newest())

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        token = 1 << 20
        for k in range(20_000):  # bounded: records added and removed beside the kept ones
            token += 1
            run = record(token, job=f"c{k % 13}", status="succeeded" if k % 2 else "claimed")
            table[run["id"]] = run
            if k % 3:
                table.discard(run["id"])
    finally:
        stop.set()
        reader.join(timeout=60)
        sys.setswitchinterval(switch)
    assert not reader.is_alive() and seen == []


def _filled(jobs: int, keep: int) -> State:
    s = State()
    index = 0

    def apply(cmd: Any) -> Any:
        nonlocal index
        index += 1
        return s.apply(encode_command(cmd), ApplyContext(index=index))

    apply(RegisterNode(at_us=T0, node_id="n1", raft_addr="a", http_addr="b"))
    names = [f"job-{i:05d}" for i in range(jobs)]
    apply(PutJobs(at_us=T0, specs=tuple({"name": n, "schedule": "* * * * *", "executor": "http",
                                         "http": {"url": "http://127.0.0.1:9/"}, "history": {"keep": keep}}
                                        for n in names)))
    for k in range(1, keep + 1):
        slot = T0 + k * 60 * SEC
        out = apply(ClaimSlots(at_us=slot - 2 * SEC, leader="n1", term=1, claims=tuple(
            Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in names)))
        ids = tuple(r["id"] for r in out.result["runs"])
        apply(StartRuns(at_us=slot, node="n1", runs=ids, started_us={r: slot + 1000 for r in ids},
                        lease_until_us=slot + 30 * SEC))
        apply(FinishRuns(at_us=slot + 50_000, node="n1", results=tuple(
            {"run_id": r, "status": "succeeded", "started_us": slot + 1000, "finished_us": slot + 50_000,
             "exit_code": None, "http_status": 200, "output": "", "error": None} for r in ids)))
    return s


def test_ended_records_cost_a_fraction_of_a_dict_each() -> None:
    # 20,000 ended records of 2,000 jobs, made before the allocator is traced, stored as the
    # ledger stores them: what the table then holds for them, against ~1,130 bytes for each
    # dict the release before held (every key and value of it).
    records = [record((1 << 16) + k, job=f"job-{k % 2000:05d}") for k in range(20_000)]
    names = [r["job"] for r in records[:2000]]
    gc.collect()
    tracemalloc.start()
    try:
        table = RunTable()
        for name in names:
            table.add_job(name)
        for run in records:
            table[run["id"]] = run
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(table) == 20_000 and table.get(records[-1]["id"]) == records[-1]
    # ~82 here: ~50 the packed bytes, 12 its token and length in its job's value, 16 the index;
    # ~144 when each record was a bytes object in a list beside an array of tokens.
    assert held / 20_000 < 110, held / 20_000


@pytest.mark.parametrize("version", [3, 4])
def test_versions_3_and_4_keep_packed_records_as_they_are(version: int) -> None:
    s = _filled(50, 4)
    s.snapshot_version = version
    data = s.snapshot_bytes()
    s.snapshot_version = 2
    v2 = s.snapshot_bytes()
    assert len(data) < 0.6 * len(v2), (len(data), len(v2))
    back = State(snapshot_version=version)
    back.restore(data)
    assert back.snapshot_bytes() == data and back.runs == s.runs and back.job_runs == s.job_runs
    assert not back.runs._live  # every record ended: none kept as a dict
    assert back.runs._jobs == s.runs._jobs  # each job's value byte for byte as the applies made it
    from_v2 = State(snapshot_version=version)
    from_v2.restore(v2)
    assert from_v2.snapshot_bytes() == data


@pytest.mark.parametrize("damage", ["unknown status code", "a job listed twice", "neither packed nor a record",
                                    "a record under another token", "not a job name", "tokens and runs disagree",
                                    "an index naming no job", "an index missing a run", "an index out of order",
                                    "a flipped bit", "a packed claim", "a record under another id",
                                    "a token past 64 bits", "a run under two jobs", "a job's name changed",
                                    "a live record changed"])
def test_a_damaged_version_3_run_is_refused_and_leaves_the_state_alone(damage: str) -> None:
    import msgpack

    from raftlog.codec import pack as pack_chunk
    s = _filled(5, 2)
    s.snapshot_version = 3
    slot = T0 + 10 * 60 * SEC  # and one attempt in flight, a record kept as a dict
    s.apply(encode_command(ClaimSlots(at_us=slot - 2 * SEC, leader="n1", term=1, claims=(
        Claim(job="job-00003", slot_us=slot, trigger="schedule", node="n1"),))), ApplyContext(s.applied_index + 1))
    assert s.runs._live
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=msgpack.ExtType, max_buffer_size=0)
    unpacker.feed(s.snapshot_bytes())
    chunks = list(unpacker)
    runs = next(c for c in chunks if c[0] == "runs")[1]
    index = next(c for c in chunks if c[0] == "runs_index")[1]
    job, raw, values, crc = runs[0]
    if damage == "unknown status code":
        values[0] = bytes((200,)) + values[0][1:]
        runs[0] = [job, raw, values, _crc(job, raw, values)]
    elif damage == "a job listed twice":
        runs.append(runs[0])
    elif damage == "neither packed nor a record":
        values[1] = "text"
    elif damage == "a job's name changed":
        runs[0] = [job[:-1] + "x", raw, values, crc]
    elif damage == "a live record changed":
        live = next(r for r in runs if any(type(v) is dict for v in r[2]))
        k = next(k for k, v in enumerate(live[2]) if type(v) is dict)
        live[2][k] = {**live[2][k], "node": "n9"}
    elif damage == "a flipped bit":
        values[1] = values[1][:-1] + bytes((values[1][-1] ^ 4,))
    elif damage == "a packed claim":
        values[0] = bytes((RUN_STATUSES.index("claimed"),)) + values[0][1:]
        runs[0] = [job, raw, values, _crc(job, raw, values)]
    elif damage == "a record under another id":
        token = int.from_bytes(raw[:8], "little")
        values[0] = {**unpack(job, token, values[0]), "status": "running", "id": run_id_of(token + 1)}
    elif damage == "a token past 64 bits":
        index[0] = [index[0][0][:-8] + b"\xff" * 8, index[0][1]]
    elif damage == "a run under two jobs":
        job2, raw2, values2, _ = runs[1]
        raw2 = raw[:8] + raw2[8:]
        runs[1] = [job2, raw2, values2, _crc(job2, raw2, values2)]
    elif damage == "a record under another token":
        token = int.from_bytes(raw[:8], "little")
        values[0] = {**unpack(job, token, values[0]), "token": token + 1}
    elif damage == "not a job name":
        runs[0] = [7, raw, values, crc]
    elif damage == "tokens and runs disagree":
        runs[0] = [job, raw[:8], values, crc]
    elif damage == "an index naming no job":
        toks, ords = index[0]
        index[0] = [toks, ords[:-4] + (99).to_bytes(4, "little")]
    elif damage == "an index missing a run":
        toks, ords = index[0]
        index[0] = [toks[:-8], ords[:-4]]
    else:
        toks, ords = index[0]
        index[0] = [toks[8:16] + toks[:8] + toks[16:], ords[4:8] + ords[:4] + ords[8:]]
    target = _filled(3, 1)
    before = target.snapshot_bytes()
    with pytest.raises(CodecError, match="bad run record"):
        target.restore(b"".join(pack_chunk(c) for c in chunks))
    assert target.snapshot_bytes() == before


@pytest.mark.parametrize("version", [3, 4])
def test_a_job_with_more_runs_than_a_chunk_is_split_and_joined_again(version: int) -> None:
    """Version 3 splits such a job over chunks and a restore joins it again; version 4 lists
    each job whole, one value."""
    s = _filled(2, 1)
    s.snapshot_version = version
    table = RunTable()
    for name in s.jobs:  # the jobs the snapshot lists first (with no runs here)
        table.add_job(name)
    for k in range(4500):
        table[run_id_of((1 << 16) + k)] = record((1 << 16) + k, job="many")
    table[run_id_of(1 << 20)] = record(1 << 20, job="other", status="running")
    s.runs = table
    data = s.snapshot_bytes()
    listed = [item[0] for c in _chunks(data) if c[0] == "runs" for item in c[1]]
    assert listed.count("many") == (3 if version == 3 else 1)
    back = State(snapshot_version=version)
    back.restore(data)
    assert back.runs == table and back.snapshot_bytes() == data and back.runs._jobs == table._jobs
    assert back.runs._live == table._live and back.runs.status_counts() == table.status_counts()


@pytest.mark.parametrize("version", [3, 4])
def test_a_job_holding_packed_records_and_one_in_flight_restores_to_the_value_the_applies_made(version: int) -> None:
    """A restore takes a job's value whole when all its records are packed (version 3: joined
    from them; 4: as listed), and lays the value out record by record when one is kept as a
    dict: both give the bytes the applies gave."""
    s = _filled(5, 2)
    s.snapshot_version = version
    slot = T0 + 10 * 60 * SEC
    s.apply(encode_command(ClaimSlots(at_us=slot - 2 * SEC, leader="n1", term=1, claims=(
        Claim(job="job-00003", slot_us=slot, trigger="schedule", node="n1"),))), ApplyContext(s.applied_index + 1))
    assert len(s.runs._live) == 1
    back = State()
    back.restore(s.snapshot_bytes())
    assert back.runs._jobs == s.runs._jobs and back.runs._live == s.runs._live
    assert back.runs.status_counts() == s.runs.status_counts() and len(back.runs) == len(s.runs) == 10


def _in_flight(jobs: int, keep: int) -> State:
    """``_filled``, and one attempt in flight (a record kept as a dict) in a job holding packed ones."""
    s = _filled(jobs, keep)
    slot = T0 + 10 * 60 * SEC
    s.apply(encode_command(ClaimSlots(at_us=slot - 2 * SEC, leader="n1", term=1, claims=(
        Claim(job="job-00003", slot_us=slot, trigger="schedule", node="n1"),))), ApplyContext(s.applied_index + 1))
    assert len(s.runs._live) == 1
    return s


def _chunks(data: bytes) -> list[Any]:
    import msgpack
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=msgpack.ExtType, max_buffer_size=0)
    unpacker.feed(data)
    return list(unpacker)


def test_version_4_holds_each_jobs_value_whole_and_restores_it_as_version_3_does() -> None:
    """Version 4 lists a job's value as the table holds it, and the records it holds by id
    beside it; a restore gives the state a version-3 snapshot restores to."""
    assert SNAPSHOT_VERSION == 4
    s = _in_flight(12, 3)
    data = s.snapshot_bytes()
    runs = next(c for c in _chunks(data) if c[0] == "runs")[1]
    assert len(runs) == 12 and all(type(value) is bytes for _, value, _, _ in runs)
    assert [whole for job, _, whole, _ in runs if job == "job-00003"] == [list(s.runs._live.values())]
    if sys.byteorder == "little":
        assert {job: value for job, value, _, _ in runs} == s.runs._jobs  # the values as the table holds them
    back = State()
    back.restore(data)
    s.snapshot_version = 3
    from_v3 = State()
    from_v3.restore(s.snapshot_bytes())
    for restored in (back, from_v3):
        assert restored.runs._jobs == s.runs._jobs and restored.runs._live == s.runs._live
        assert restored.runs == s.runs and restored.runs.status_counts() == s.runs.status_counts()
    for version in (3, 4):
        s.snapshot_version = back.snapshot_version = from_v3.snapshot_version = version
        assert back.snapshot_bytes() == s.snapshot_bytes() == from_v3.snapshot_bytes()


@pytest.mark.skipif(sys.byteorder != "little", reason="a value is kept as listed on little-endian machines only")
def test_version_4_packs_a_job_as_one_value_and_keeps_it_on_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.runtable as runtable
    s = _in_flight(200, 4)
    data = s.snapshot_bytes()
    s.snapshot_version = 3
    v3 = s.snapshot_bytes()
    assert abs(len(data) - len(v3)) < 0.05 * len(v3), (len(data), len(v3))  # 4 bytes of length for msgpack's 2
    laid_out: list[int] = []
    layout = runtable._layout
    monkeypatch.setattr(runtable, "_layout", lambda tokens, values: laid_out.append(len(values)) or layout(tokens, values))
    back = State()
    back.restore(data)
    # Kept as listed, not made again, except the one job holding a record kept as a dict.
    assert laid_out == [len(s.runs.ids_of("job-00003"))]
    assert back.runs._jobs == s.runs._jobs
    s.snapshot_version = 4
    assert back.snapshot_bytes() == data


def _damaged_v4(damage: str) -> bytes:
    from raftlog.codec import pack as pack_chunk
    s = _in_flight(5, 2)
    chunks = _chunks(s.snapshot_bytes())
    assert chunks[0][1][0]["v"] == 4
    runs = next(c for c in chunks if c[0] == "runs")[1]
    index = next(c for c in chunks if c[0] == "runs_index")[1]
    k = next(i for i, r in enumerate(runs) if r[2])  # the job with a record kept as a dict
    job, value, whole, crc = runs[k]
    n = int.from_bytes(value[:8], "little")
    data_at = 8 + 12 * n

    def put(i: int, job: str, value: bytes, whole: list[Any]) -> None:
        runs[i] = [job, value, whole, _crc_value(job, value, whole)]  # a checksum that matches the damage

    if damage == "a flipped bit":
        runs[k] = [job, value[:-1] + bytes((value[-1] ^ 4,)), whole, crc]
    elif damage == "a job's name changed":
        runs[k] = [job[:-1] + "x", value, whole, crc]
    elif damage == "a count past the value":
        put(k, job, (n + 1000).to_bytes(8, "little") + value[8:], whole)
    elif damage == "tokens out of order":
        put(k, job, value[:8] + value[16:24] + value[8:16] + value[24:], whole)
    elif damage == "lengths that miss the data":
        put(k, job, value + b"\x00", whole)
    elif damage == "an unknown status code":
        put(k, job, value[:data_at] + bytes((200,)) + value[data_at + 1:], whole)
    elif damage == "a packed claim":
        put(k, job, value[:data_at] + bytes((RUN_STATUSES.index("claimed"),)) + value[data_at + 1:], whole)
    elif damage == "a record kept whole left out":
        put(k, job, value, [])
    elif damage == "a record kept whole under another token":
        put(k, job, value, [{**whole[0], "token": whole[0]["token"] + 1}])
    elif damage == "not a record":
        put(k, job, value, ["text"])
    elif damage == "bytes kept whole":
        put(k, job, value, [b"\x05\x00\x90"])  # would be taken as packed, its status never counted
    elif damage == "a negative token":
        put(k, job, value[:8] + (-5).to_bytes(8, "little", signed=True) + value[16:], whole)
    elif damage == "a run packed short":
        lens_at = 8 + 8 * n
        first = int.from_bytes(value[lens_at:lens_at + 4], "little")
        assert first >= 3
        put(k, job, value[:lens_at] + (2).to_bytes(4, "little") + value[lens_at + 4:data_at + 2]
            + value[data_at + first:], whole)
    elif damage == "a job listed twice":
        runs.append(runs[k])
    elif damage == "not a value":
        runs[k] = [job, "text", whole, crc]
    elif damage == "a run under two jobs":
        j = next(i for i, r in enumerate(runs) if i != k and int.from_bytes(r[1][:8], "little"))
        other, ovalue = runs[j][0], runs[j][1]
        put(j, other, ovalue[:16] + value[8:16] + ovalue[24:], runs[j][2])  # its second token: k's first
    else:
        toks, ords = index[0]
        index[0] = [toks[:-8], ords[:-4]]
    return b"".join(pack_chunk(c) for c in chunks)


@pytest.mark.parametrize(("damage", "refusal"), [
    ("a flipped bit", "fail their checksum"), ("a job's name changed", "fail their checksum"),
    ("a count past the value", "lists 1002 runs in a value of"), ("tokens out of order", "lists its runs out of order"),
    ("a negative token", "lists its runs out of order"),
    ("lengths that miss the data", "bytes of runs where its lengths say"),
    ("an unknown status code", "packed with an unknown status"), ("a packed claim", "packed with an unknown status"),
    ("a run packed short", "holds a run packed short"),
    ("a record kept whole left out", "lists 0 records kept whole for 1 places"),
    ("a record kept whole under another token", "is neither packed nor its record"),
    ("not a record", "is neither packed nor its record"), ("bytes kept whole", "is neither packed nor its record"),
    ("a job listed twice", "is listed twice"), ("not a value", "listed as str, str, list, int"),
    ("a run under two jobs", "does not list the runs of job 'job-00000'"),
    ("an index missing a run", "the run index lists 9 runs for 10 records")])
def test_a_damaged_version_4_run_is_refused_and_leaves_the_state_alone(damage: str, refusal: str) -> None:
    bad = _damaged_v4(damage)
    target = _filled(3, 1)
    before = target.snapshot_bytes()
    with pytest.raises(CodecError, match="bad run record") as refused:
        target.restore(bad)
    assert refusal in str(refused.value)
    assert target.snapshot_bytes() == before


def test_jobs_without_runs_are_chunked_as_records_are() -> None:
    """Every job is listed in a version 3 snapshot, with runs or not; 100,000 without any once
    went in one chunk (2.1 MB, packed in one call holding the GIL for 32 ms)."""
    table = RunTable()
    for k in range(5000):
        table.add_job(f"job-{k:05d}")
    table[run_id_of(1 << 16)] = record(1 << 16, job="job-00003")
    chunks = list(table.capture().by_job(2000))
    assert [len(c) for c in chunks] == [2000, 2000, 1000]
    assert [item[0] for c in chunks for item in c] == [f"job-{k:05d}" for k in range(5000)]
    s = _filled(0, 1)
    s.runs = table
    back = State()
    back.restore(s.snapshot_bytes())
    assert back.runs == table and back.runs.count_of("job-00003") == 1 and back.snapshot_bytes() == s.snapshot_bytes()


def test_field_order_is_the_ledgers() -> None:
    assert tuple(record(1)) == FIELDS
