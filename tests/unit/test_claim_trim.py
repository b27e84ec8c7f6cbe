"""A claim that pushes its job past ``history.keep`` adds its record and drops the oldest in one
step (``RunTable.append``, ``ledger._dropped_by``): the state it leaves is, byte for byte, the
state of the two steps it replaces (the record added, then ``ledger.trim``), which replicas of
the release before still take."""

from __future__ import annotations

import random
from typing import Any

import pytest

from raftlog.fsm import ApplyContext
from scheduler import ledger
from scheduler.commands import Claim, ClaimSlots, Command, FinishRuns, PutJob, RegisterNode, StartRuns, encode_command
from scheduler.runtable import RunTable
from scheduler.state import State
from tests.unit.test_run_table import record

SEC = 1_000_000
T0 = 1_767_225_600 * SEC  # 2026-01-01T00:00:00Z


def _stream(seed: int, steps: int = 400) -> list[bytes]:
    """Entries as a leader and two workers would write them for four jobs keeping 1-3 records,
    some retrying their failures: claims of every status, starts, results in any order."""
    rng = random.Random(seed)
    now = T0
    out: list[bytes] = []
    state = State()  # to read what each claim made, as a leader reads its own state
    index = 0

    def put(cmd: Command) -> Any:
        nonlocal index
        index += 1
        raw = encode_command(cmd)
        out.append(raw)
        return state.apply(raw, ApplyContext(index=index))

    for node in ("n1", "n2"):
        put(RegisterNode(at_us=now, node_id=node, raft_addr=f"{node}:1", http_addr=f"{node}:2"))
    jobs = {f"j{i}": i % 3 + 1 for i in range(4)}
    for i, (name, keep) in enumerate(jobs.items()):
        spec: dict[str, Any] = {"name": name, "schedule": "* * * * * *", "executor": "http",
                                "http": {"url": "http://127.0.0.1:9/"}, "history": {"keep": keep}}
        if i % 2:
            spec["retries"] = {"max": 1, "backoff": "1s"}
        put(PutJob(at_us=now, spec=spec))
    slots = dict.fromkeys(jobs, now)
    claimed: list[tuple[str, str]] = []  # (run id, node)
    running: list[tuple[str, str]] = []
    for _ in range(steps):
        now += rng.randrange(1, 3 * SEC)
        roll = rng.random()
        if roll < 0.3:
            claims = []
            for name in rng.sample(sorted(jobs), rng.randrange(1, 3)):
                slots[name] += SEC
                status = rng.choice(("claimed", "claimed", "claimed", "skipped", "missed", "failed"))
                node = rng.choice(("n1", "n2")) if status == "claimed" else None
                claims.append(Claim(job=name, slot_us=slots[name], trigger="schedule", status=status, node=node,
                                    reason=None if status == "claimed" else "a test's decision"))
            retrying = [rid for rid in state.active if (r := state.runs.get(rid)) and r["status"] == "retrying"]
            for rid in rng.sample(retrying, min(len(retrying), rng.randrange(0, 2))):
                prev = state.runs[rid]
                claims.append(Claim(job=prev["job"], slot_us=prev["slot_us"], trigger="retry", node="n1",
                                    attempt=prev["attempt"] + 1, retry_of=rid))
            res = put(ClaimSlots(at_us=now, leader="n1", term=1, claims=tuple(claims)))
            claimed += [(r["id"], r["node"]) for r in res.result["runs"] if r["status"] == "claimed"]
        elif roll < 0.6 and claimed:
            rid, node = claimed.pop(rng.randrange(len(claimed)))
            put(StartRuns(at_us=now, node=node, runs=(rid,), started_us={rid: now}, lease_until_us=now + 30 * SEC))
            running.append((rid, node))
        elif running or claimed:
            pool = running if running and (not claimed or rng.random() < 0.8) else claimed
            rid, node = pool.pop(rng.randrange(len(pool)))
            outcome = rng.choice(("succeeded", "succeeded", "failed"))
            put(FinishRuns(at_us=now, node=node, results=({
                "run_id": rid, "status": outcome, "started_us": now - 1000, "finished_us": now, "exit_code": None,
                "http_status": 200 if outcome == "succeeded" else 500, "output": "", "error": None},)))
    return out


def _replayed(entries: list[bytes]) -> State:
    state = State()
    for i, raw in enumerate(entries, start=1):
        state.apply(raw, ApplyContext(index=i))
    return state


@pytest.mark.parametrize("seed", range(6))
def test_a_claim_trimming_in_one_step_leaves_the_state_of_the_two_steps(seed: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _stream(seed)
    calls = {"one_step": 0, "two_steps": 0}
    real_append, real_dropped_by = RunTable.append, ledger._dropped_by

    def counted(self: RunTable, rid: str, run: Any, drop: list[int]) -> bool:
        took = real_append(self, rid, run, drop)
        calls["one_step"] += bool(took and drop)
        return took

    def dropped_by(state: Any, job: str, run: Any) -> list[int] | None:
        found = real_dropped_by(state, job, run)
        calls["two_steps"] += found is None
        return found

    monkeypatch.setattr(RunTable, "append", counted)
    monkeypatch.setattr(ledger, "_dropped_by", dropped_by)
    one_step = _replayed(entries)
    # Claims that trimmed in one step, and claims whose own record was the one trimmed (a
    # skipped slot of a job keeping 1 whose last attempt runs), which take the two steps.
    assert calls["one_step"] > 20 and calls["two_steps"] > 0, calls
    monkeypatch.setattr(ledger, "_dropped_by", lambda state, job, run: None)
    two_steps = _replayed(entries)
    assert one_step.snapshot_bytes() == two_steps.snapshot_bytes()
    assert one_step.runs.items() == two_steps.runs.items()
    assert one_step.runs.status_counts() == two_steps.runs.status_counts()
    assert list(one_step.runs.newest()) == list(two_steps.runs.newest())
    assert one_step.active == two_steps.active and one_step.dead == two_steps.dead


def test_append_is_the_record_added_then_the_dropped_removed() -> None:
    rng = random.Random(7)
    one, two = RunTable(), RunTable()
    token = 1 << 16
    for _ in range(600):
        job = rng.choice(("a", "b", "c"))
        token += rng.randrange(1, 5)
        run = record(token, job=job, status=rng.choice(("claimed", "running", "succeeded", "failed", "skipped")))
        held = one.tokens_of(job).tolist()
        drop = sorted(rng.sample(held, rng.randrange(0, min(len(held), 3) + 1)))
        assert one.append(run["id"], run, drop)
        two[run["id"]] = run
        two.remove(job, drop)
        assert one == two and one.status_counts() == two.status_counts() and one._live == two._live
        assert list(one.newest()) == list(two.newest()) and len(one) == len(two)


def test_append_refuses_what_is_not_a_new_newest_record_and_changes_nothing() -> None:
    table = RunTable()
    for t in (1 << 16, (1 << 16) + 5):
        table[record(t)["id"]] = record(t)
    before = (table.items(), table.status_counts(), dict(table._jobs), len(table))
    older = record((1 << 16) + 3)  # below the job's newest token
    assert not table.append(older["id"], older, [])
    held = record(1 << 16, status="claimed")  # a token the table holds
    assert not table.append(held["id"], held, [])
    newer = record((1 << 16) + 9)
    assert not table.append(newer["id"], newer, [(1 << 16) + 1])  # a token the job does not hold
    assert not table.append(newer["id"], newer, [(1 << 16) + 5, 1 << 16])  # not ascending
    assert not table.append(newer["id"], newer, [1 << 16, 1 << 16])  # twice
    mislabelled = {**newer, "id": "r1"}
    assert not table.append("r1", mislabelled, [])
    assert (table.items(), table.status_counts(), dict(table._jobs), len(table)) == before
    assert table.append(newer["id"], newer, [1 << 16])
    assert table.ids_of("ping") == [record((1 << 16) + 5)["id"], newer["id"]]


def test_a_policy_that_cannot_be_read_fails_the_claim_where_it_always_did(monkeypatch: pytest.MonkeyPatch) -> None:
    # A document whose policy cannot be read (one a newer release stored, say) failed the claim
    # in trim, after its record was added; the release before does that, so this one must too.
    entries = _stream(0, steps=0)
    state = _replayed(entries)

    def unreadable(self: Any, name: str) -> Any:
        raise ValueError("history: a field this release does not know")

    monkeypatch.setattr(type(state), "policy", unreadable)
    claim = ClaimSlots(at_us=T0 + SEC, leader="n1", term=1,
                       claims=(Claim(job="j0", slot_us=T0 + 5 * SEC, trigger="schedule", node="n1"),))
    out = state.apply(encode_command(claim), ApplyContext(index=len(entries) + 1))
    assert getattr(out, "code", None) == "internal" and "a field this release does not know" in out.message
    assert state.runs.count_of("j0") == 1 and state.jobs["j0"]["last_slot_us"] == T0 + 5 * SEC
