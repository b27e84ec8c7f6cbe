"""The state machine's job transitions and its snapshots (restore, round trip, replay determinism)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from raftlog.codec import CodecError, pack
from raftlog.fsm import ApplyContext
from scheduler.commands import (
    CancelRun,
    Claim,
    ClaimSlots,
    Command,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    Noop,
    PauseJob,
    PutJob,
    RegisterNode,
    Rejected,
    RenewLeases,
    ReportLost,
    StartRuns,
    encode_command,
)
from scheduler.instants import us
from scheduler.state import SNAPSHOT_VERSION, Applied, State

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
MIN = 60_000_000
SEC = 1_000_000


def slot(n: int) -> int:
    return T0 + n * MIN


# ---- PutJob ----------------------------------------------------------------------------


def test_put_job_created_configured_unchanged_and_versions(h: Any) -> None:
    first = h.put("ping", at_us=T0).result
    assert first == {"change": "created", "name": "ping", "version": 1, "cancelled": []}
    rec = h.state.jobs["ping"]
    assert rec["version"] == 1 and rec["created_us"] == T0 and rec["updated_us"] == T0
    assert rec["last_slot_us"] is None and h.state.job_runs["ping"] == []
    # The stored spec is the canonical document: defaults filled in.
    assert rec["spec"]["timezone"] == "UTC" and rec["spec"]["concurrency"] == "allow"

    same = h.put("ping", at_us=T0 + SEC).result
    assert same == {"change": "unchanged", "name": "ping", "version": 1}
    assert h.state.jobs["ping"]["updated_us"] == T0

    changed = h.put("ping", at_us=T0 + 2 * SEC, description="now documented").result
    assert changed["change"] == "configured" and changed["version"] == 2
    rec = h.state.jobs["ping"]
    assert rec["created_us"] == T0 and rec["updated_us"] == T0 + 2 * SEC
    assert rec["spec"]["description"] == "now documented"
    assert h.state.job("ping").description == "now documented"  # the parsed cache follows


def test_put_job_equivalent_documents_are_unchanged(h: Any) -> None:
    h.put("ping", schedule="@hourly")
    # Another spelling of the same canonical job: no new version.
    out = h.put("ping", schedule="@HOURLY", timezone="UTC", retries={"max": 0}).result
    assert out["change"] == "unchanged" and out["version"] == 1


@pytest.mark.parametrize(("existing", "expect", "code", "fragment"), [
    (True, 0, "conflict", "a job named 'ping' exists already"),
    (True, 2, "conflict", "expected version 2, found version 1"),
    (False, 1, "conflict", "expected version 1, found no such job"),
])
def test_put_job_expect_version_conflicts(h: Any, existing: bool, expect: int, code: str, fragment: str) -> None:
    if existing:
        h.put("ping")
    before = h.semantic()
    out = h.rejected(PutJob(at_us=T0 + SEC, spec=h.job_doc("ping", description="x"), expect_version=expect))
    assert out.code == code and fragment in out.message
    assert h.semantic() == before


def test_put_job_expect_version_matching_succeeds(h: Any) -> None:
    assert h.put("ping", expect_version=0).result["change"] == "created"
    out = h.put("ping", expect_version=1, description="v2").result
    assert out["change"] == "configured" and out["version"] == 2


def test_put_job_invalid_spec_is_rejected_naming_fields(h: Any) -> None:
    before = h.semantic()
    out = h.rejected(PutJob(at_us=T0, spec={"name": "Bad Name", "schedule": "61 * * * *", "executor": "http"}))
    assert out.code == "invalid"
    assert "name" in out.message and "schedule" in out.message and "http" in out.message
    assert h.semantic() == before


def test_an_edit_that_moves_no_slot_keeps_the_claims(h: Any) -> None:
    h.put("ping")
    future = h.claim_one("ping", slot(2))
    out = h.put("ping", at_us=slot(1) + SEC, description="changed", http={"url": "https://example.test/v2"}).result
    assert out["change"] == "configured" and out["cancelled"] == []
    assert h.run(future["id"])["status"] == "claimed" and future["id"] in h.state.active
    assert h.state.jobs["ping"]["spec_since_us"] == T0  # the schedule in force did not change


def test_a_schedule_edit_withdraws_future_claims_once_and_starts_the_new_schedule_at_the_edit(h: Any) -> None:
    h.put("ping")
    started = h.claim_one("ping", slot(1))
    h.start("n1", started["id"], at_us=slot(1))
    future = h.claim_one("ping", slot(2))
    at = slot(1) + SEC
    out = h.put("ping", at_us=at, schedule="*/2 * * * *").result
    assert out["cancelled"] == [future["id"]]
    assert h.run(future["id"])["status"] == "cancelled"
    assert h.run(future["id"])["error"] == "the job was changed"
    assert h.run(started["id"])["status"] == "running"
    assert future["id"] not in h.state.active and started["id"] in h.state.active
    rec = h.state.jobs["ping"]
    assert rec["spec_since_us"] == at and rec["last_slot_us"] == slot(2)
    # The withdrawn slot stays its one record: the new schedule's slot 2 is not decided again.
    assert h.claim(Claim(job="ping", slot_us=slot(2), trigger="schedule", node="n1"), at_us=at)["runs"] == []
    assert h.claim_one("ping", slot(4), at_us=at)["status"] == "claimed"
    note = h.state.notes["ping"][-1]
    assert note["at_us"] == at and note["decision"] == "changed"
    assert "schedule '* * * * *' -> '*/2 * * * *'" in note["reason"] and "1 slot(s)" in note["reason"]


# ---- DeleteJob -------------------------------------------------------------------------


def test_delete_job_removes_it_and_its_history(h: Any) -> None:
    h.put("ping", retries={"max": 1, "backoff": "1s"})
    h.put("other")
    a = h.claim_one("ping", slot(1))
    b = h.claim_one("ping", slot(2))
    keep = h.claim_one("other", slot(1))
    h.start("n1", a["id"], at_us=slot(1))
    h.finish("n1", a["id"], "failed", slot(1) + SEC)  # retrying: active
    out = h.ok(DeleteJob(at_us=slot(3), name="ping"))
    assert out == {"deleted": "ping", "runs": 2}
    assert "ping" not in h.state.jobs and "ping" not in h.state.job_runs and "ping" not in h.state.notes
    assert h.state.job("ping") is None
    for rid in (a["id"], b["id"]):
        assert rid not in h.state.runs and rid not in h.state.active
    assert keep["id"] in h.state.runs and keep["id"] in h.state.active


def test_delete_job_drops_dead_letters_and_pending_dependencies(h: Any) -> None:
    h.put("up", retries={"max": 1, "backoff": "1s"})
    h.put("down", schedule=None, depends_on={"job": "up", "on": "failure"})
    r1 = h.claim_one("up", slot(1))
    h.finish("n1", r1["id"], "failed", slot(1) + SEC)
    r2 = h.claim_one("up", slot(1), trigger="retry", attempt=2, retry_of=r1["id"])
    h.finish("n1", r2["id"], "failed", slot(1) + 20 * SEC)
    assert r2["id"] in h.state.dead
    assert list(h.state.pending_deps) == [f"down|{r2['id']}"]
    h.ok(DeleteJob(at_us=slot(2), name="down"))
    assert h.state.pending_deps == {}
    h.ok(DeleteJob(at_us=slot(2), name="up"))
    assert h.state.dead == {} and h.state.runs == {}


def test_delete_unknown_job_is_not_found(h: Any) -> None:
    out = h.rejected(DeleteJob(at_us=T0, name="ghost"))
    assert out.code == "not_found" and "'ghost'" in out.message


def test_recreated_job_starts_fresh(h: Any) -> None:
    h.put("ping")
    h.claim_one("ping", slot(5))
    h.ok(DeleteJob(at_us=slot(6), name="ping"))
    out = h.put("ping", at_us=slot(7)).result
    assert out["change"] == "created" and out["version"] == 1
    assert h.state.jobs["ping"]["last_slot_us"] is None and h.state.job_runs["ping"] == []


# ---- PauseJob --------------------------------------------------------------------------


def test_pause_sets_spec_note_and_cancels_future_unstarted_claims(h: Any) -> None:
    h.put("ping")
    running = h.claim_one("ping", slot(1))
    h.start("n1", running["id"], at_us=slot(1))
    future1 = h.claim_one("ping", slot(2))
    future2 = h.claim_one("ping", slot(3), node="n2")
    manual = h.claim_one("ping", slot(4), trigger="manual", request_key="req-1")  # not a schedule claim: kept
    at = slot(1) + 30 * SEC
    out = h.ok(PauseJob(at_us=at, name="ping", paused=True, note="db maintenance"))
    assert out == {"name": "ping", "paused": True, "version": 2, "cancelled": [future1["id"], future2["id"]]}
    rec = h.state.jobs["ping"]
    assert rec["spec"]["paused"] is True and rec["pause_note"] == "db maintenance" and rec["updated_us"] == at
    assert h.state.job("ping").paused is True
    assert h.run(running["id"])["status"] == "running"
    assert h.run(manual["id"])["status"] == "claimed"
    for f in (future1, future2):
        r = h.run(f["id"])
        assert r["status"] == "cancelled" and r["error"] == "the job was paused" and r["finished_us"] == at
    assert h.state.notes["ping"][-1] == {"at_us": at, "decision": "paused", "reason": "db maintenance"}


def test_pause_twice_keeps_the_version_and_resume_clears_the_note(h: Any) -> None:
    h.put("ping")
    h.ok(PauseJob(at_us=T0 + 1, name="ping", paused=True, note="n"))
    again = h.ok(PauseJob(at_us=T0 + 2, name="ping", paused=True))
    assert again["version"] == 2 and h.state.jobs["ping"]["updated_us"] == T0 + 1
    resumed = h.ok(PauseJob(at_us=T0 + 3, name="ping", paused=False))
    assert resumed == {"name": "ping", "paused": False, "version": 3, "cancelled": []}
    assert h.state.jobs["ping"]["pause_note"] is None and h.state.job("ping").paused is False
    assert h.state.notes["ping"][-1]["decision"] == "resumed"
    assert h.state.notes["ping"][-1]["reason"] == "resumed by an operator"


def test_pause_unknown_job_is_not_found(h: Any) -> None:
    out = h.rejected(PauseJob(at_us=T0, name="ghost", paused=True))
    assert out.code == "not_found" and "'ghost'" in out.message


def test_reset_keeps_slots_already_decided_beyond_the_change(h: Any) -> None:
    # Invariant 2 across a pause: a slot that was decided (and not voided by the pause) stays decided,
    # even when the proposer's clock puts the pause before it (a worker with a fast clock started it).
    h.put("ping")
    run = h.claim_one("ping", slot(2))
    h.start("n1", run["id"], at_us=slot(2))
    failed = h.claim(Claim(job="ping", slot_us=slot(3), trigger="schedule", status="failed", reason="no live node"))
    assert failed["runs"][0]["status"] == "failed"
    h.ok(PauseJob(at_us=slot(1), name="ping", paused=True))
    assert h.run(run["id"])["status"] == "running"
    out = h.claim(Claim(job="ping", slot_us=slot(2), trigger="schedule", node="n2"),
                  Claim(job="ping", slot_us=slot(3), trigger="schedule", node="n2"))
    assert out["runs"] == [] and [r["reason"] for r in out["refused"]] == ["slot already decided"] * 2


def test_withdrawal_keeps_a_decided_slot_even_when_the_new_spec_trims_it_away(h: Any) -> None:
    h.put("ping", history={"keep": 3})
    h.claim(Claim(job="ping", slot_us=slot(3), trigger="schedule", status="failed", reason="no live node"))
    h.claim_one("ping", slot(4))
    h.claim_one("ping", slot(5))
    out = h.put("ping", at_us=slot(1), history={"keep": 1}, timezone="Europe/Paris").result
    assert len(out["cancelled"]) == 2
    assert h.state.jobs["ping"]["last_slot_us"] == slot(5)
    assert len(h.state.job_runs["ping"]) == 1  # the new keep applies at once
    for n in (3, 4, 5):
        assert h.claim(Claim(job="ping", slot_us=slot(n), trigger="schedule", node="n1"), at_us=slot(1))["runs"] == []
    assert len(h.claim(Claim(job="ping", slot_us=slot(6), trigger="schedule", node="n1"), at_us=slot(1))["runs"]) == 1


def test_other_transitions(h: Any) -> None:
    assert h.ok(Noop(at_us=T0, node="n1", term=4)) is None
    assert h.state.last_noop == {"node": "n1", "term": 4, "at_us": T0, "index": h.index}
    h.ok(RegisterNode(at_us=T0 + 1, node_id="n1", raft_addr="x:1", http_addr="x:2", tags={"z": "a"},
                      allow_shell=True))
    assert h.state.nodes["n1"] == {"node_id": "n1", "raft_addr": "x:1", "http_addr": "x:2", "tags": {"z": "a"},
                                   "allow_shell": True, "registered_us": T0 + 1}


# ---- snapshots ---------------------------------------------------------------------------


def _busy_log() -> list[Command]:
    """A log touching every kind of record: jobs, nodes, runs of every status, dead letters, notes, deps."""
    doc = {"schedule": "* * * * *", "executor": "http", "http": {"url": "https://example.test/"}}
    cmds: list[Command] = [
        Noop(at_us=T0, node="n1", term=1),
        RegisterNode(at_us=T0, node_id="n1", raft_addr="a:1", http_addr="a:2", tags={"zone": "a"}),
        RegisterNode(at_us=T0, node_id="n2", raft_addr="b:1", http_addr="b:2", allow_shell=True),
        PutJob(at_us=T0, spec={**doc, "name": "up", "retries": {"max": 1, "backoff": "5s", "factor": 1.5},
                               "labels": {"team": "x"}}),
        PutJob(at_us=T0, spec={"name": "down", "executor": "shell", "shell": {"command": ["/bin/true"]},
                               "depends_on": {"job": "up", "on": "any"}}),
        PutJob(at_us=T0, spec={**doc, "name": "solo", "delivery": "at-most-once", "history": {"keep": 3}}),
        ClaimSlots(at_us=slot(1), leader="n1", term=1, claims=(
            Claim(job="up", slot_us=slot(1), trigger="schedule", node="n1"),
            Claim(job="solo", slot_us=slot(1), trigger="schedule", node="n2"),
            Claim(job="solo", slot_us=slot(2), trigger="schedule", status="skipped", reason="policy"),
        ), summaries=({"job": "solo", "status": "missed", "count": 3, "first_us": T0, "last_us": T0 + 1,
                       "reason": "gap"},)),
    ]
    # Run ids are r{index*65536+pos:x}: the claim entry above is index 7.
    up1, solo1 = f"r{7 * 65536:x}", f"r{7 * 65536 + 1:x}"
    cmds += [
        StartRuns(at_us=slot(1), node="n1", runs=(up1,), started_us={up1: slot(1)}, lease_until_us=slot(1) + 5 * SEC),
        StartRuns(at_us=slot(1), node="n2", runs=(solo1,), started_us={solo1: slot(1)}, lease_until_us=slot(1) + SEC),
        RenewLeases(at_us=slot(1) + SEC, node="n1", runs=(up1,), lease_until_us=slot(1) + 9 * SEC),
        FinishRuns(at_us=slot(1) + 2 * SEC, node="n1", results=({
            "run_id": up1, "status": "failed", "started_us": slot(1), "finished_us": slot(1) + 2 * SEC,
            "exit_code": None, "http_status": 503, "output": "busy\u00e9", "error": "status 503"},)),
        ExpireRuns(at_us=slot(1) + 9 * SEC, leader="n1", term=1, runs=(solo1,)),
        ClaimSlots(at_us=slot(1) + 10 * SEC, leader="n1", term=1, claims=(
            Claim(job="up", slot_us=slot(1), trigger="retry", attempt=2, retry_of=up1, node="n2"),)),
    ]
    up2 = f"r{13 * 65536:x}"
    cmds += [
        FinishRuns(at_us=slot(1) + 11 * SEC, node="n2", results=({
            "run_id": up2, "status": "timed_out", "started_us": slot(1) + 10 * SEC,
            "finished_us": slot(1) + 11 * SEC, "exit_code": None, "http_status": None, "output": "", "error": "t"},)),
        FinishRuns(at_us=slot(1) + 12 * SEC, node="n2", results=({  # late, for the lost run
            "run_id": solo1, "status": "succeeded", "finished_us": slot(1) + 12 * SEC},)),
        PauseJob(at_us=slot(2), name="solo", paused=True, note="quiet"),
        ReportLost(at_us=slot(2), node="n9", runs=()),
        CancelRun(at_us=slot(2), run_id="r-none"),  # rejected: still a log entry
        b"\x00garbage",  # type: ignore[list-item]
    ]
    return cmds


def _feed(state: State, log: list[Any]) -> list[Any]:
    out = []
    for i, cmd in enumerate(log, start=1):
        raw = cmd if isinstance(cmd, bytes) else encode_command(cmd)
        out.append(state.apply(raw, ApplyContext(index=i)))
    return out


def test_busy_log_reaches_the_states_it_is_meant_to() -> None:
    s = State()
    results = _feed(s, _busy_log())
    assert sum(isinstance(r, Rejected) for r in results) == 2
    assert sorted(r["status"] for r in s.runs.values()) == ["dead", "lost", "retrying", "skipped"]
    assert s.dead and s.pending_deps and s.notes["solo"]
    assert any("late_result" in r for r in s.runs.values())


def test_snapshot_round_trip_is_byte_identical_and_restores_every_attribute() -> None:
    s = State()
    _feed(s, _busy_log())
    data = s.snapshot_bytes()
    fresh = State()
    fresh.restore(data)
    assert fresh.snapshot_bytes() == data
    for attr in ("jobs", "nodes", "runs", "job_runs", "active", "dead", "pending_deps", "notes", "applied_index",
                 "last_noop"):
        assert getattr(fresh, attr) == getattr(s, attr), attr
        if isinstance(getattr(s, attr), dict):
            assert list(getattr(fresh, attr)) == list(getattr(s, attr)), f"{attr}: order differs"
    assert vars_of(fresh) == vars_of(s)
    # And it goes on identically: the restored copy applies the next entry the same way.
    nxt = encode_command(PutJob(at_us=slot(5), spec={"name": "late", "schedule": "@hourly", "executor": "http",
                                                     "http": {"url": "https://example.test/"}}))
    i = s.applied_index + 1
    assert s.apply(nxt, ApplyContext(index=i)) == fresh.apply(nxt, ApplyContext(index=i))
    assert s.snapshot_bytes() == fresh.snapshot_bytes()


def vars_of(s: State) -> dict[str, Any]:
    return {k: v for k, v in vars(s).items() if k not in ("_parsed", "_policies", "_dependents", "_aged", "_names", "entry_weight")}  # derived caches


def test_snapshot_is_chunked_and_restores_across_chunks() -> None:
    s = State()
    s.apply(encode_command(RegisterNode(at_us=T0, node_id="n1", raft_addr="a", http_addr="b")), ApplyContext(1))
    s.apply(encode_command(PutJob(at_us=T0, spec={"name": "many", "schedule": "* * * * * *", "executor": "http",
                                                  "http": {"url": "https://x.test/"}, "history": {"keep": 5000}})),
            ApplyContext(2))
    claims = tuple(Claim(job="many", slot_us=T0 + (k + 1) * SEC, trigger="schedule", node="n1") for k in range(4500))
    s.apply(encode_command(ClaimSlots(at_us=T0, leader="n1", term=1, claims=claims)), ApplyContext(3))
    chunks = list(s.snapshot())
    assert len(chunks) > 3
    fresh = State()
    fresh.restore(b"".join(chunks))
    assert len(fresh.runs) == 4500 and fresh.snapshot_bytes() == s.snapshot_bytes()


def test_snapshot_is_captured_when_taken() -> None:
    s = State()
    _feed(s, _busy_log()[:6])
    it = s.snapshot()
    before = State()
    before.restore(s.snapshot_bytes())
    s.apply(encode_command(DeleteJob(at_us=slot(9), name="up")), ApplyContext(99))
    late = State()
    late.restore(b"".join(it))  # consumed after apply ran again
    assert late.snapshot_bytes() == before.snapshot_bytes()


def test_replay_of_the_same_log_gives_byte_equal_snapshots() -> None:
    a, b = State(), State()
    ra, rb = _feed(a, _busy_log()), _feed(b, _busy_log())
    assert ra == rb
    assert a.snapshot_bytes() == b.snapshot_bytes()


def test_restore_discards_previous_state() -> None:
    small = State()
    _feed(small, _busy_log()[:3])
    data = small.snapshot_bytes()
    big = State()
    _feed(big, _busy_log())
    big.job("up")  # warm the parsed cache
    big.restore(data)
    assert big.jobs == {} and big.runs == {} and big.dead == {} and big.notes == {} and big.pending_deps == {}
    assert big.job("up") is None
    assert big.applied_index == 3 and big.snapshot_bytes() == data


def test_snapshot_of_another_version_is_refused_clearly() -> None:
    s = State()
    _feed(s, _busy_log()[:4])
    before = s.snapshot_bytes()
    newer = pack(["meta", [{"v": SNAPSHOT_VERSION + 1, "applied_index": 9, "last_noop": {}}]])
    with pytest.raises(CodecError) as info:
        s.restore(newer)
    assert f"version {SNAPSHOT_VERSION + 1} is not understood" in str(info.value)
    assert "this build reads 1, 2" in str(info.value)
    assert s.snapshot_bytes() == before  # a refused snapshot leaves the state alone


@pytest.mark.parametrize("data", [b"", b"\xc1garbage", pack(["jobs", []])])
def test_corrupt_or_metaless_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(CodecError):
        State().restore(data)


def test_apply_never_raises_and_applied_index_follows(h: Any) -> None:
    for raw in (b"", b"\xff" * 10, encode_command(CancelRun(at_us=T0, run_id="nope"))):
        out = h.apply(raw)
        assert isinstance(out, Rejected)
        assert h.state.applied_index == h.index
    out = h.apply(Noop(at_us=T0))
    assert isinstance(out, Applied) and out.index == h.index


def test_the_proposers_own_parse_is_used_and_decides_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """State.offer: the node that proposed a PutJob applies it without parsing the document
    again; its state (snapshot bytes, the parsed job, the answer) equals a replica's that parsed."""
    import scheduler.state as state_module
    from scheduler.model import parse_job

    parses: list[str] = []
    real = state_module.parse_job
    monkeypatch.setattr(state_module, "parse_job", lambda doc: (parses.append(doc["name"]), real(doc))[1])
    doc = {"name": "nightly", "schedule": "0 3 * * *", "executor": "http", "timezone": "Europe/Berlin",
           "http": {"url": "http://127.0.0.1:9/x", "headers": {"B": "2", "A": "1"}}, "retries": {"max": 2}}
    proposer, replica = State(), State()
    for n, version_doc in enumerate([doc, {**doc, "description": "changed"}]):
        job = parse_job(version_doc, name="nightly")
        cmd = PutJob(at_us=T0 + n * SEC, spec=job.to_doc(), expect_version=None)
        raw = encode_command(cmd)
        proposer.offer(raw, cmd, job)
        ctx = ApplyContext(index=n + 1, replay=False)
        mine, theirs = proposer.apply(raw, ctx), replica.apply(raw, ctx)
        proposer.withdraw(raw)
        assert isinstance(mine, Applied) and isinstance(theirs, Applied) and mine.result == theirs.result
        assert proposer.job("nightly") == replica.job("nightly")
    assert parses == ["nightly", "nightly"]  # the replica's two; none by the proposer
    assert proposer.snapshot_bytes() == replica.snapshot_bytes()
    # Bytes it did not offer (or offered and withdrew) are parsed as on any replica.
    other = parse_job({**doc, "name": "other"})
    raw = encode_command(PutJob(at_us=T0 + 5 * SEC, spec=other.to_doc(), expect_version=None))
    proposer.apply(raw, ApplyContext(index=3, replay=False))
    assert parses[-1] == "other"
