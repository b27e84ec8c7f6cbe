"""What the run ledger and the alert rules read of a job (``model.Policy``), without parsing it.

After a restart a replica restores its snapshot and replays the journal behind it: claims,
starts, finishes and expiries of tens of thousands of jobs. Each of those used to parse its
job's document whole the first time it touched the job (the parsed cache starts empty after a
restore), and that was 30 % of the replay. The ledger now reads ``Store.policy``: the history
kept, the retries, the delivery and the alerts, read from the stored document alone.
"""

from __future__ import annotations

from typing import Any

import pytest

import scheduler.store as store_module
from raftlog.fsm import ApplyContext
from scheduler.commands import (
    Claim,
    ClaimSlots,
    ExpireRuns,
    FinishRuns,
    PutJobs,
    RegisterNode,
    StartRuns,
    encode_command,
)
from scheduler.errors import ValidationFailed
from scheduler.model import Policy, parse_job, parse_policy
from scheduler.state import State

T0 = 1_800_000_000_000_000
MIN = 60_000_000

DOCS: list[dict[str, Any]] = [
    {"name": "plain", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://x.test/"}},
    {"name": "retried", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://x.test/"},
     "retries": {"max": 2, "backoff": "5s"}, "history": {"keep": 3}},
    {"name": "once", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://x.test/"},
     "delivery": "at-most-once", "history": {"keep": 2, "max_age": "1h"}},
    {"name": "alerted", "schedule": "* * * * *", "executor": "shell", "shell": {"command": "true"},
     "alerts": {"on": ["failure", "late"], "after_failures": 2, "late_after": "10s"}, "history": {"keep": 4}},
]


@pytest.mark.parametrize("doc", DOCS, ids=[d["name"] for d in DOCS])
def test_a_documents_policy_is_what_parsing_it_whole_gives(doc: dict[str, Any]) -> None:
    job = parse_job(doc)
    assert parse_policy(doc) == Policy.of(job)
    assert parse_policy(job.to_doc()) == Policy.of(job)  # the stored (canonical) form too
    assert parse_policy(doc) is job.policy  # one shared value, made when the job was parsed


def test_jobs_writing_the_same_sections_share_one_policy() -> None:
    a = parse_policy({**DOCS[1], "name": "a"})
    b = parse_policy({**DOCS[1], "name": "b", "schedule": "@hourly"})
    assert a is b


@pytest.mark.parametrize(("patch", "field"), [
    ({"history": {"keep": 0}}, "history.keep"),
    ({"retries": {"max": -1}}, "retries.max"),
    ({"delivery": "sometimes"}, "delivery"),
    ({"alerts": {"after_failures": "two"}}, "alerts.after_failures"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_policy_field_is_refused_by_name_as_parsing_refuses_it(patch: dict[str, Any], field: str) -> None:
    doc = {**DOCS[0], **patch}
    with pytest.raises(ValidationFailed) as whole:
        parse_job(doc)
    with pytest.raises(ValidationFailed) as policy:
        parse_policy(doc)
    assert field in [p["field"] for p in whole.value.details]
    assert [p["field"] for p in policy.value.details] == [field]


def _apply(state: State, cmd: Any, index: list[int]) -> Any:
    index[0] += 1
    return state.apply(encode_command(cmd), ApplyContext(index=index[0])).result


def _round(state: State, k: int, index: list[int]) -> None:
    """One slot of every job claimed and started; then ``plain`` and ``once`` succeed,
    ``retried`` and ``alerted`` fail (a retry and a failure alert), and a late start raises
    ``late``; in every third round ``once``'s lease lapses instead (an expiry)."""
    slot = T0 + k * MIN
    names = [d["name"] for d in DOCS]
    out = _apply(state, ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=tuple(
        Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in names)), index)
    ids = {r["job"]: r["id"] for r in out["runs"]}
    started = {rid: slot + (20_000_000 if job == "alerted" else 1000) for job, rid in ids.items()}
    _apply(state, StartRuns(at_us=slot + 21_000_000, node="n1", runs=tuple(ids.values()), started_us=started,
                            lease_until_us=slot + 60_000_000), index)
    expire = k % 3 == 0
    results = tuple(
        {"run_id": rid, "status": "succeeded" if job in ("plain", "once") else "failed",
         "started_us": started[rid], "finished_us": slot + 30_000_000, "exit_code": None, "http_status": 200,
         "output": "", "error": None}
        for job, rid in ids.items() if not (expire and job == "once"))
    _apply(state, FinishRuns(at_us=slot + 30_000_000, node="n1", results=results), index)
    if expire:
        _apply(state, ExpireRuns(at_us=slot + 61_000_000, leader="n1", term=1, runs=(ids["once"],),
                                 seen={ids["once"]: slot + 60_000_000}), index)


def test_a_replay_after_a_restore_parses_no_job_whole_and_ends_where_the_live_state_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    live, index = State(), [0]
    _apply(live, RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"), index)
    _apply(live, PutJobs(at_us=T0, specs=tuple(DOCS)), index)
    for k in range(1, 5):
        _round(live, k, index)
    restored = State()
    restored.restore(live.snapshot_bytes())

    parsed: list[Any] = []

    def counting(doc: Any, **kw: Any) -> Any:
        parsed.append(doc["name"])
        return parse_job(doc, **kw)

    monkeypatch.setattr(store_module, "parse_job", counting)
    at = index[0]
    for k in range(5, 11):  # the journal behind the snapshot, replayed
        _round(restored, k, index)
    assert parsed == []
    assert restored.alerts and any(r["status"] == "retrying" for r in restored.runs.values())
    assert any(r["status"] == "lost" for r in restored.runs.values())

    index[0] = at
    for k in range(5, 11):  # the same entries on the replica that never restarted
        _round(live, k, index)
    assert restored.snapshot_bytes() == live.snapshot_bytes()
    assert restored.job("retried") == live.job("retried")  # parsing on demand still works


def test_a_parse_that_loses_a_race_with_an_edit_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # The event loop parses a job (a view, the planner) while the raft thread stores an edit of
    # it: the parse of the old document finishes last and is written into the cache last. Read
    # after that, the job and its policy must be the edited ones, as on every other replica.
    state, index = State(), [0]
    _apply(state, PutJobs(at_us=T0, specs=(DOCS[1],)), index)  # keeps 3
    state.spec_changed("retried")  # nothing parsed yet, as after a restore
    edited = {**DOCS[1], "history": {"keep": 7}}

    def preempted(doc: Any, **kw: Any) -> Any:
        parsed = parse_job(doc, **kw)
        monkeypatch.setattr(store_module, "parse_job", parse_job)
        _apply(state, PutJobs(at_us=T0 + 1, specs=(edited,)), index)  # the raft thread, mid-parse
        return parsed

    monkeypatch.setattr(store_module, "parse_job", preempted)
    assert state.job("retried").history.keep == 3  # the caller's own answer: the document it read
    assert state.jobs["retried"]["spec"]["history"]["keep"] == 7
    job = state.job("retried")
    assert job is not None and job.history.keep == 7
    assert state.policy("retried") == Policy.of(job)


def test_a_replay_after_a_restore_reads_each_combination_of_sections_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 jobs from one template with three retry policies and two delivery modes: six
    # combinations. After a restore each job's policy used to be parsed from its document
    # the first time the ledger met the job (300 parses); jobs sharing sections share one.
    import scheduler.model as model_module

    docs = tuple({"name": f"t-{i:03d}", "schedule": "* * * * *", "executor": "http",
                  "http": {"url": "https://x.test/"}, "retries": {"max": i % 3}, "history": {"keep": 2},
                  "delivery": "at-most-once" if i % 2 else "at-least-once"} for i in range(300))
    live, index = State(), [0]
    _apply(live, RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"), index)
    _apply(live, PutJobs(at_us=T0, specs=docs), index)
    restored = State()
    restored.restore(live.snapshot_bytes())
    getattr(model_module, "_STORED", {}).clear()  # what earlier tests left
    parses: list[str] = []

    def counting(doc: Any) -> Policy:
        parses.append(doc["name"])
        return parse_policy(doc)

    monkeypatch.setattr(model_module, "parse_policy", counting)
    monkeypatch.setattr(store_module, "parse_policy", counting, raising=False)  # where it was called before
    names = [d["name"] for d in docs]
    for k in (1, 2):
        slot = T0 + k * MIN
        out = _apply(restored, ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=tuple(
            Claim(job=n, slot_us=slot, trigger="schedule", node="n1") for n in names)), index)
        ids = tuple(r["id"] for r in out["runs"])
        _apply(restored, FinishRuns(at_us=slot + 50_000, node="n1", results=tuple(
            {"run_id": r, "status": "failed", "started_us": slot + 1000, "finished_us": slot + 50_000,
             "exit_code": None, "http_status": 500, "output": "", "error": "boom"} for r in ids)), index)
    assert len(parses) <= 6, f"{len(parses)} policies parsed for 300 jobs of 6 combinations"
    for d in docs:  # each job still reads its own
        assert restored.policy(d["name"]) == Policy.of(parse_job(d))
    assert sum(r["status"] == "retrying" for r in restored.runs.values()) > 0  # the retries were read


def test_a_stored_policy_follows_each_of_the_four_sections() -> None:
    from scheduler.model import stored_policy

    base = parse_job(DOCS[1]).to_doc()
    assert stored_policy(base) == parse_policy(base)
    for patch in ({"retries": {"max": 5, "backoff": "1s", "factor": 2.0, "max_backoff": "1m"}},
                  {"history": {"keep": 9, "max_age": None}}, {"delivery": "at-most-once"},
                  {"alerts": {**base["alerts"], "after_failures": 7}}):
        edited = {**base, **patch}  # the other sections are the very same objects
        assert stored_policy(edited) == parse_policy(edited) != parse_policy(base)
        assert stored_policy(base) == parse_policy(base)


def test_a_replay_after_a_restore_triggers_dependents_without_parsing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    up = {"name": "up", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://x.test/"}}
    docs = (up, *({"name": f"down-{on}", "executor": "http", "http": {"url": "https://x.test/"},
                   "depends_on": {"job": "up", "on": on}} for on in ("success", "failure", "any")))
    live, index = State(), [0]
    _apply(live, RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:1", http_addr="127.0.0.1:2"), index)
    _apply(live, PutJobs(at_us=T0, specs=docs), index)
    restored = State()
    restored.restore(live.snapshot_bytes())
    at = index[0]
    parsed: list[str] = []

    def counting(doc: Any, **kw: Any) -> Any:
        parsed.append(doc["name"])
        return parse_job(doc, **kw)

    for state in (restored, live):
        index[0] = at
        # counted on the restored replica only (the live one parsed every job when it stored it)
        monkeypatch.setattr(store_module, "parse_job", counting if state is restored else parse_job)
        for k, status in ((1, "succeeded"), (2, "failed")):
            slot = T0 + k * MIN
            out = _apply(state, ClaimSlots(at_us=slot - 2_000_000, leader="n1", term=1, claims=(
                Claim(job="up", slot_us=slot, trigger="schedule", node="n1"),)), index)
            rid = out["runs"][0]["id"]
            _apply(state, FinishRuns(at_us=slot + 50_000, node="n1", results=(
                {"run_id": rid, "status": status, "started_us": slot + 1000, "finished_us": slot + 50_000,
                 "exit_code": None, "http_status": 200 if status == "succeeded" else 500, "output": "",
                 "error": None},)), index)
        if state is restored:
            assert parsed == []
    assert sorted(d["job"] for d in restored.pending_deps.values()) == [
        "down-any", "down-any", "down-failure", "down-success"]
    assert restored.pending_deps == live.pending_deps


def test_a_stored_policy_refuses_an_unknown_field_however_warm_its_cache() -> None:
    from scheduler.model import stored_policy

    base = parse_job(DOCS[2]).to_doc()
    assert stored_policy(base) == parse_policy(base)  # the sections' entry is made
    odd = {**base, "colour": "red"}  # the very same sections
    with pytest.raises(ValidationFailed) as refused:
        stored_policy(odd)
    assert [p["field"] for p in refused.value.details] == ["colour"]
