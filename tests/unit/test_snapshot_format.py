"""Snapshot version 2 (job document sections written once and shared again on restore), version
3 (run records as the run table packs them), the snapshots of earlier releases, and
restore-then-apply against a replay of the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from raftlog.codec import CodecError, pack
from raftlog.fsm import ApplyContext
from scheduler.commands import Command, NodeClock, PutJob, PutJobs, encode_command
from scheduler.state import SNAPSHOT_VERSION, State
from tests.unit.conftest import T0, slot
from tests.unit.test_state import _busy_log, vars_of

V1_FIXTURE = Path(__file__).parent / "data" / "state-snapshot-v1.bin"
"""Written by the release before version 2 (commit 2b494c7) from ``upgrade_log()``, by
``python tests/unit/data/make_v1_snapshot.py`` run in a checkout of that commit."""
V2_FIXTURE = Path(__file__).parent / "data" / "state-snapshot-v2.bin"
"""Written likewise by the release before version 3 (commit a2dc95a), whose default was 2:
``python tests/unit/data/make_v1_snapshot.py tests/unit/data/state-snapshot-v2.bin``."""
V3_FIXTURE = Path(__file__).parent / "data" / "state-snapshot-v3.bin"
"""Written likewise by the release before version 4 (commit ec87d1b), whose default was 3."""


def templated(n: int, first: int = 0) -> tuple[dict[str, Any], ...]:
    """Jobs made from one template: one endpoint, ten label sets, three retry policies."""
    return tuple(
        {"name": f"t-{i:05d}", "schedule": f"{i % 60} * * * *", "executor": "http",
         "http": {"url": "https://hooks.example.test/run", "headers": {"X-Team": f"t{i % 10}"}},
         "labels": {"team": f"t{i % 10}"}, "retries": {"max": i % 3}}
        for i in range(first, first + n)
    )


def upgrade_log() -> list[Command | bytes]:
    """Every kind of record (``_busy_log``), a clock judgement and a batch of templated jobs."""
    return [
        *_busy_log(),
        NodeClock(at_us=slot(3), node="n2", offset_us=4_000_000, error_us=20_000, skewed=True, leader="n1",
                  term=1, reason="4 s ahead"),
        PutJobs(at_us=slot(3), specs=templated(300)),
        PutJob(at_us=slot(4), spec={"name": "t-00007", "schedule": "@hourly", "executor": "http",
                                    "http": {"url": "https://other.example.test/"}}),
    ]


def fed(log: list[Command | bytes], version: int = SNAPSHOT_VERSION, start: int = 1) -> State:
    s = State(snapshot_version=version)
    for i, cmd in enumerate(log, start=start):
        s.apply(cmd if isinstance(cmd, bytes) else encode_command(cmd), ApplyContext(index=i))
    return s


@pytest.mark.parametrize("fixture", [V1_FIXTURE, V2_FIXTURE, V3_FIXTURE], ids=["version 1", "version 2", "version 3"])
def test_a_snapshot_of_an_earlier_release_restores_to_the_state_this_release_builds(fixture: Path) -> None:
    old = fixture.read_bytes()
    assert _iter_chunks(old)[0][1][0]["v"] == [V1_FIXTURE, V2_FIXTURE, V3_FIXTURE].index(fixture) + 1
    restored = State()
    restored.restore(old)
    built = fed(upgrade_log())
    assert vars_of(restored) == vars_of(built)
    assert restored.snapshot_bytes() == built.snapshot_bytes()
    # And it goes on as a node that applied the log: the next entry lands the same on both.
    nxt = encode_command(PutJobs(at_us=slot(5), specs=templated(20, first=290)))
    i = built.applied_index + 1
    assert restored.apply(nxt, ApplyContext(index=i)) == built.apply(nxt, ApplyContext(index=i))
    assert restored.snapshot_bytes() == built.snapshot_bytes()


def test_version_1_is_still_written_byte_for_byte_as_the_earlier_release_wrote_it() -> None:
    # What `raftcron agent --snapshot-format 1` writes during a rolling upgrade: nodes of the
    # earlier release read it, so it must be their format exactly.
    assert fed(upgrade_log(), version=1).snapshot_bytes() == V1_FIXTURE.read_bytes()


def test_version_2_is_still_written_byte_for_byte_as_the_earlier_release_wrote_it() -> None:
    assert fed(upgrade_log(), version=2).snapshot_bytes() == V2_FIXTURE.read_bytes()


def test_version_3_is_still_written_byte_for_byte_as_the_earlier_release_wrote_it() -> None:
    assert fed(upgrade_log(), version=3).snapshot_bytes() == V3_FIXTURE.read_bytes()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_restore_then_the_rest_of_the_log_equals_a_replay_of_the_whole_log(version: int) -> None:
    log = upgrade_log()
    whole = fed(log, version)
    for cut in range(0, len(log) + 1, 3):
        head = fed(log[:cut], version)
        node = State(snapshot_version=version)
        node.restore(head.snapshot_bytes())
        for i, cmd in enumerate(log[cut:], start=cut + 1):
            node.apply(cmd if isinstance(cmd, bytes) else encode_command(cmd), ApplyContext(index=i))
        assert node.snapshot_bytes() == whole.snapshot_bytes(), f"cut after entry {cut}"
        assert vars_of(node) == vars_of(whole), f"cut after entry {cut}"


def test_version_2_writes_each_section_once_and_a_restore_shares_it_again() -> None:
    s = fed([PutJobs(at_us=T0, specs=templated(1000))], version=2)
    v2 = s.snapshot_bytes()
    s.snapshot_version = 1
    v1 = s.snapshot_bytes()
    assert len(v2) < 0.75 * len(v1), (len(v2), len(v1))
    for data in (v1, v2):
        back = State(snapshot_version=2)
        back.restore(data)
        assert back.jobs == s.jobs and list(back.jobs) == list(s.jobs)
        sections = {(k, id(v)) for rec in back.jobs.values() for k, v in rec["spec"].items() if isinstance(v, dict)}
        if data is v2:
            # One object per distinct section: 10 http and labels sets, 3 retries, one of the rest.
            by_key: dict[str, int] = {}
            for k, _ in sections:
                by_key[k] = by_key.get(k, 0) + 1
            assert by_key == {"http": 10, "labels": 10, "retries": 3, "catchup": 1, "target": 1, "alerts": 1,
                              "history": 1}
        else:
            assert len(sections) == 7 * 1000  # a version-1 restore copies every job's sections
        assert back.snapshot_bytes() == v2  # whichever it came from, it writes version 2


def test_a_section_too_large_to_table_is_written_in_place() -> None:
    big = {"name": "big", "schedule": "@daily", "executor": "http",
           "http": {"url": "https://x.test/", "body": "x" * 6000}}
    s = fed([PutJob(at_us=T0, spec=big), PutJob(at_us=T0, spec={**big, "name": "big2"})])
    back = State()
    back.restore(s.snapshot_bytes())
    assert back.jobs == s.jobs
    assert back.jobs["big"]["spec"]["http"] is not back.jobs["big2"]["spec"]["http"]
    assert back.snapshot_bytes() == s.snapshot_bytes()


def _refused_leaving_the_state_alone(data: bytes) -> None:
    target = fed(upgrade_log())
    before = target.snapshot_bytes()
    with pytest.raises(CodecError):
        target.restore(data)
    assert target.snapshot_bytes() == before
    assert vars_of(target) == vars_of(fed(upgrade_log()))


def _iter_chunks(data: bytes) -> list[Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=msgpack.ExtType, max_buffer_size=0)
    unpacker.feed(data)
    return list(unpacker)


@pytest.mark.parametrize("damage", ["reference before its section", "unknown extension", "cut short",
                                    "cut at a chunk's end", "version 1 cut short", "chunk after the end"])
def test_a_damaged_version_2_snapshot_is_refused_and_leaves_the_state_alone(damage: str) -> None:
    source = fed([PutJobs(at_us=T0, specs=templated(50))])
    chunks = _iter_chunks(source.snapshot_bytes())
    names = [c[0] for c in chunks]
    assert names[:3] == ["meta", "shared", "jobs"]
    if damage == "reference before its section":
        data = b"".join(pack(c) for i, c in enumerate(chunks) if i != 1)
    elif damage == "unknown extension":
        jobs = chunks[2]
        name, rec = jobs[1][0]
        rec["spec"]["http"] = msgpack.ExtType(9, b"\x00\x00\x00\x00")
        data = b"".join(pack(c) for c in chunks)
    elif damage == "cut short":
        data = source.snapshot_bytes()[:-7]
    elif damage == "cut at a chunk's end":
        data = b"".join(pack(c) for c in chunks[:-1])
    elif damage == "chunk after the end":
        data = b"".join(pack(c) for c in [*chunks, ["nodes", []]])
    else:
        source.snapshot_version = 1
        whole = source.snapshot_bytes()
        data = whole[: whole.rindex(b"\xa6alerts") + 3]  # inside the name of the last chunk but one
    _refused_leaving_the_state_alone(data)


def _malformed(damage: str, chunks: list[Any]) -> list[Any]:
    """Well-formed msgpack holding what no release writes."""
    section = {name: items for name, items in chunks}
    jobs = section["jobs"]
    if damage == "a job named by a list":
        jobs[0][0] = ["t-00000"]
    elif damage == "a job listed with three values":
        jobs[0].append(1)
    elif damage == "meta without the applied index":
        del section["meta"][0]["applied_index"]
    elif damage == "a counter that is text":
        section["meta"][0]["alert_seq"] = "many"
    elif damage == "a counter that is infinite":
        section["meta"][0]["history_sweep_us"] = float("inf")
    elif damage == "an applied index that is text":
        section["meta"][0]["applied_index"] = "12"
    elif damage == "a last barrier that is a number":
        section["meta"][0]["last_noop"] = 5
    elif damage == "a dead letter that is a map":
        section["dead"].append({"id": "r1"})
    elif damage == "a job's notes that are a number":
        section["notes"].append(["t-00000", 5])
    elif damage == "a job record that is a number":
        jobs[0][1] = 5
    elif damage == "a job record without its document":
        del jobs[0][1]["spec"]
    elif damage == "a job record without its version":
        del jobs[0][1]["version"]
    return chunks


@pytest.mark.parametrize("damage", ["a job named by a list", "a job listed with three values",
                                    "meta without the applied index", "a counter that is text",
                                    "a counter that is infinite", "an applied index that is text",
                                    "a last barrier that is a number",
                                    "a dead letter that is a map", "a job's notes that are a number",
                                    "a job record that is a number", "a job record without its document",
                                    "a job record without its version", "a map keyed by a list"])
def test_a_malformed_snapshot_is_refused_as_corrupt_and_leaves_the_state_alone(damage: str) -> None:
    """Found in review: such values raised Python's own TypeError, ValueError or KeyError out of
    the restore (not ``CodecError``), and a job record without its document was taken, to fail
    later in whatever read it."""
    source = fed([PutJobs(at_us=T0, specs=templated(5))])
    chunks = _iter_chunks(source.snapshot_bytes())
    if damage == "a map keyed by a list":  # msgpack allows it; no Python dict can hold it
        raw = msgpack.packb(["alerts", [[{(1, 2): 3}, {}]]], use_bin_type=True)  # the tuple goes out as an array
        data = b"".join(pack(c) for c in chunks[:-1]) + raw + pack(chunks[-1])
    else:
        data = b"".join(pack(c) for c in _malformed(damage, chunks))
    _refused_leaving_the_state_alone(data)


def test_restored_documents_stay_equal_to_what_the_api_stored_after_an_edit() -> None:
    # Shared sections are never changed in place: editing one job after a restore leaves every
    # other job that shared its sections as it was.
    s = fed([PutJobs(at_us=T0, specs=templated(30))])
    back = State()
    back.restore(s.snapshot_bytes())
    before = {name: rec["spec"] for name, rec in back.jobs.items() if name != "t-00000"}
    edited = {**templated(1)[0], "http": {"url": "https://elsewhere.test/", "headers": {"X-Team": "t0"}},
              "labels": {"team": "zz"}, "retries": {"max": 2}}
    _feed_one(back, PutJob(at_us=slot(1), spec=edited), back.applied_index + 1)
    assert back.jobs["t-00000"]["spec"]["http"]["url"] == "https://elsewhere.test/"
    assert {name: rec["spec"] for name, rec in back.jobs.items() if name != "t-00000"} == before
    assert back.jobs["t-00010"]["spec"]["http"]["url"] == "https://hooks.example.test/run"


def _feed_one(s: State, cmd: Command, index: int) -> None:
    s.apply(encode_command(cmd), ApplyContext(index=index))


def test_an_unknown_snapshot_version_in_the_constructor_is_refused() -> None:
    with pytest.raises(ValueError, match="snapshot_version"):
        State(snapshot_version=5)
