"""The planner: (state, now) -> decisions, with fixed datetimes and a Picker of fake nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.fsm import ApplyContext
from scheduler.commands import ClaimSlots, PutJob, RegisterNode, encode_command
from scheduler.instants import from_us, us
from scheduler.model import Job, parse_job
from scheduler.planner import (
    JobPlan,
    NodeInfo,
    Picker,
    PlanConfig,
    dependency_claims,
    due_retries,
    expired_runs,
    next_slot_us,
    plan_job,
    upcoming,
)
from scheduler.state import Applied, State

CFG = PlanConfig()  # horizon 2s, late grace 2s, 50 records, start deadline 10s, lease grace 2s
SEC = 1_000_000
MIN = 60 * SEC
NOW = datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)


def t(hh: int, mm: int, ss: int = 0, *, day: datetime = NOW) -> int:
    return us(day.replace(hour=hh, minute=mm, second=ss, microsecond=0))


def make_job(name: str = "ping", **over: Any) -> Job:
    doc: dict[str, Any] = {"name": name, "schedule": "* * * * *", "executor": "http",
                           "http": {"url": "https://example.test/hook"}}
    doc.update(over)
    return parse_job({k: v for k, v in doc.items() if v is not None})


def rec(last: int | None, created: int = t(0, 0)) -> dict[str, Any]:
    return {"created_us": created, "last_slot_us": last}


NODES = [
    NodeInfo("n1", {"zone": "a"}, False, True),
    NodeInfo("n2", {"zone": "b"}, True, True),
    NodeInfo("n3", {"zone": "a"}, True, False),  # shell-capable, but down
]


def picker(load: dict[str, int] | None = None, nodes: list[NodeInfo] = NODES) -> Picker:
    return Picker(nodes, load or {})


def plan(job: Job, last: int | None, now: int, active: list[dict[str, Any]] | None = None,
         cfg: PlanConfig = CFG, pick: Picker | None = None, created: int = t(0, 0)) -> JobPlan:
    return plan_job(job, rec(last, created), active or [], now, cfg, pick or picker())


def decided(p: JobPlan) -> list[tuple[str, str, str, str | None]]:
    """(slot HH:MM:SS, trigger, status, node) of each claim."""
    return [(from_us(c.slot_us).strftime("%H:%M:%S"), c.trigger, c.status, c.node) for c in p.claims]


def running(rid: str = "r1", status: str = "running", **kw: Any) -> dict[str, Any]:
    return {"id": rid, "job": "ping", "status": status, "node": "n1", "slot_us": t(11, 59), "attempt": 1,
            "next": None, "retry_at_us": None, "lease_us": None, "claimed_us": t(11, 59), **kw}


# ---- claim ahead ------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "claims", "next_due"), [
    (t(12, 0, 30), [], t(12, 1) - 2 * SEC),                                        # nothing inside the horizon
    (t(12, 0, 57), [], t(12, 1) - 2 * SEC),
    (t(12, 0, 58), [("12:01:00", "schedule", "claimed", "n1")], t(12, 2) - 2 * SEC),  # exactly the horizon
    (t(12, 0, 59), [("12:01:00", "schedule", "claimed", "n1")], t(12, 2) - 2 * SEC),
    (t(12, 1, 0), [("12:01:00", "schedule", "claimed", "n1")], t(12, 2) - 2 * SEC),  # due, not late
    (t(12, 1, 2), [("12:01:00", "schedule", "claimed", "n1")], t(12, 2) - 2 * SEC),  # at the late grace
])
def test_allow_jobs_claim_ahead_within_the_horizon(now: int, claims: list[Any], next_due: int) -> None:
    p = plan(make_job(), t(12, 0), now)
    assert decided(p) == claims
    assert p.next_due_us == next_due and p.summaries == [] and p.cancel == []


@pytest.mark.parametrize("mode", ["forbid", "replace"])
def test_forbid_and_replace_decide_only_when_due(mode: str) -> None:
    job = make_job(concurrency=mode)
    early = plan(job, t(12, 0), t(12, 0, 59), active=[running()])
    assert early.claims == [] and early.cancel == [] and early.next_due_us == t(12, 1)
    idle = plan(job, t(12, 0), t(12, 1))
    assert decided(idle) == [("12:01:00", "schedule", "claimed", "n1")]


def test_forbid_skips_a_due_slot_naming_the_busy_run() -> None:
    p = plan(make_job(concurrency="forbid"), t(12, 0), t(12, 1), active=[running("r7f")])
    assert decided(p) == [("12:01:00", "schedule", "skipped", None)]
    assert p.claims[0].reason == "concurrency forbid: run r7f is still running"
    assert p.cancel == []


@pytest.mark.parametrize("status", ["claimed", "running", "retrying", "lost"])
def test_replace_cancels_the_busy_run_and_claims(status: str) -> None:
    p = plan(make_job(concurrency="replace"), t(12, 0), t(12, 1), active=[running("r7f", status=status)])
    assert p.cancel == ["r7f"]
    assert decided(p) == [("12:01:00", "schedule", "claimed", "n1")]


def test_allow_ignores_busy_runs() -> None:
    p = plan(make_job(), t(12, 0), t(12, 1), active=[running()])
    assert decided(p) == [("12:01:00", "schedule", "claimed", "n1")] and p.cancel == []


# ---- catch-up ---------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "expect"), [
    ("none", [("skipped", "catchup")] * 10),
    ("latest", [("skipped", "catchup")] * 9 + [("claimed", "catchup")]),
    ("all", [("claimed", "catchup")] * 10),
])
def test_catch_up_inside_the_window(policy: str, expect: list[tuple[str, str]]) -> None:
    # Last decided 11:50, now 12:00:30: 11:51 .. 12:00 are all older than the late grace.
    p = plan(make_job(catchup={"policy": policy, "window": "1h"}), t(11, 50), t(12, 0, 30))
    assert [(c.status, c.trigger) for c in p.claims] == expect
    assert [c.slot_us for c in p.claims] == [t(11, m) for m in range(51, 60)] + [t(12, 0)]
    reasons = {c.reason for c in p.claims if c.status == "skipped"}
    assert reasons <= {f"catch-up policy {policy}" if policy == "none" else
                       "catch-up policy latest runs only the newest"}
    # Catch-up runs carry the slot they stand for, not "now".
    assert all(c.slot_us < t(12, 0, 30) for c in p.claims)


def test_slots_beyond_the_window_are_missed() -> None:
    p = plan(make_job(catchup={"policy": "all", "window": "5m"}), t(11, 50), t(12, 0, 30))
    # window start 11:55:30: 11:51 .. 11:55 are beyond it.
    assert [(c.status, c.trigger) for c in p.claims] == [("missed", "catchup")] * 5 + [("claimed", "catchup")] * 5
    assert p.claims[0].reason == "no leader could dispatch it, and it is older than the catch-up window"


def test_a_cluster_stopped_longer_than_the_window() -> None:
    # Every minute, last decided slot 09:00, now 12:00:30, window 1h, catch-up all:
    # 09:01 .. 11:00 (120 slots) missed: 50 records and one summary of 70; 11:01 .. 12:00 (60) claimed.
    job = make_job(catchup={"policy": "all", "window": "1h"})
    p = plan(job, t(9, 0), t(12, 0, 30))
    missed = [c for c in p.claims if c.status == "missed"]
    run = [c for c in p.claims if c.status == "claimed"]
    assert len(run) == 60 and all(c.trigger == "catchup" for c in run)
    assert {c.node for c in run} == {"n1", "n2"}  # spread by load
    assert [c.slot_us for c in run] == [t(11, 0) + k * MIN for k in range(1, 61)]
    assert len(missed) == CFG.max_records == 50
    assert [c.slot_us for c in missed] == [t(11, 0) - k * MIN for k in range(49, -1, -1)]
    assert p.summaries == [{"job": "ping", "status": "missed", "count": 70, "first_us": t(9, 1),
                            "last_us": t(10, 10), "reason": missed[0].reason}]
    assert len(p.claims) == 110 and p.next_due_us == t(12, 1) - 2 * SEC

    # Committed, the ledger accepts every decision and the job is decided up to 12:00.
    s, i = State(), 0
    for cmd in (RegisterNode(at_us=t(12, 0), node_id="n1", raft_addr="a", http_addr="b"),
                RegisterNode(at_us=t(12, 0), node_id="n2", raft_addr="c", http_addr="d"),
                PutJob(at_us=t(8, 0), spec=job.to_doc()),
                ClaimSlots(at_us=t(12, 0, 30), leader="n1", term=1, claims=tuple(p.claims),
                           summaries=tuple(p.summaries))):
        i += 1
        out = s.apply(encode_command(cmd), ApplyContext(index=i))
        assert isinstance(out, Applied), out
    assert len(out.result["runs"]) == 110 and out.result["refused"] == []
    assert s.jobs["ping"]["last_slot_us"] == t(12, 0) and s.jobs["ping"]["missed_total"] == 120


def test_latest_with_many_skipped_slots_summarises_them() -> None:
    p = plan(make_job(catchup={"policy": "latest", "window": "2h"}), t(10, 0), t(12, 0, 30))
    assert [c.status for c in p.claims] == ["skipped"] * 50 + ["claimed"]
    assert p.summaries == [{"job": "ping", "status": "skipped", "count": 69, "first_us": t(10, 1),
                            "last_us": t(11, 9), "reason": "catch-up policy latest runs only the newest"}]


def test_history_keep_below_max_records_bounds_the_records() -> None:
    p = plan(make_job(catchup={"policy": "none"}, history={"keep": 3}), t(11, 50), t(12, 0, 30))
    assert len(p.claims) == 3 and p.summaries[0]["count"] == 7


def test_walk_is_bounded_per_tick() -> None:
    job = make_job(schedule="* * * * * *", catchup={"policy": "none", "window": "1h"})
    p = plan(job, t(10, 0), t(12, 0, 30), cfg=PlanConfig(max_walk=100))
    assert len(p.claims) + sum(s["count"] for s in p.summaries) == 100
    assert p.next_due_us == t(12, 0, 30)  # more to walk next tick
    assert max(c.slot_us for c in p.claims) == t(10, 1, 40)


# ---- paused, starts_at / ends_at -----------------------------------------------------------


def test_paused_jobs_skip_due_slots_and_claim_nothing_ahead() -> None:
    job = make_job(paused=True)
    p = plan(job, t(11, 55), t(12, 0, 59))
    assert [(c.status, c.trigger, c.reason) for c in p.claims] == [("skipped", "schedule", "the job is paused")] * 5
    assert [c.slot_us for c in p.claims] == [t(11, m) for m in range(56, 60)] + [t(12, 0)]
    assert p.next_due_us == t(12, 1)


@pytest.mark.parametrize(("starts", "ends", "slots", "next_due"), [
    ("2026-03-10T11:57:00Z", None, [t(11, 57), t(11, 58), t(11, 59), t(12, 0)], t(12, 1) - 2 * SEC),
    ("2026-03-10T11:56:30Z", None, [t(11, 57), t(11, 58), t(11, 59), t(12, 0)], t(12, 1) - 2 * SEC),
    (None, "2026-03-10T11:58:00Z", [t(11, 56), t(11, 57), t(11, 58)], None),
    ("2026-03-10T11:57:00Z", "2026-03-10T11:57:59Z", [t(11, 57)], None),
    ("2026-03-10T13:00:00Z", None, [], t(13, 0) - 2 * SEC),
])
def test_starts_at_and_ends_at_bound_the_slots(starts: str | None, ends: str | None, slots: list[int],
                                               next_due: int | None) -> None:
    job = make_job(starts_at=starts, ends_at=ends, catchup={"policy": "all"})
    p = plan(job, t(11, 55), t(12, 0, 30))
    assert [c.slot_us for c in p.claims] == slots
    assert p.next_due_us == next_due


def test_a_new_job_starts_after_its_creation() -> None:
    p = plan(make_job(catchup={"policy": "all"}), None, t(12, 0, 30), created=t(11, 58, 30))
    assert [c.slot_us for c in p.claims] == [t(11, 59), t(12, 0)]


def test_every_schedules_are_anchored_to_the_creation() -> None:
    job = make_job(schedule="@every 90s", catchup={"policy": "all"})
    p = plan(job, None, t(12, 0, 30), created=t(11, 56, 10))
    assert [c.slot_us for c in p.claims] == [t(11, 57, 40), t(11, 59, 10)]
    assert next_slot_us(job, t(11, 56, 10), t(11, 59, 10)) == t(12, 0, 40)


@pytest.mark.parametrize("schedule", ["0 3 * * *", "*/7 * * * *", "30 2 * * *", "@every 90s", "@at 2026-03-05T00:00:00Z",
                                      "@manually", "0 0 29 2 *"])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("window", [{}, {"starts_at": "2026-06-01T00:00:00Z"}, {"ends_at": "2026-03-10T00:00:00Z"}])
def test_upcoming_walks_what_next_slot_us_steps(schedule: str, zone: str, window: dict[str, str]) -> None:
    """The job view's next slots (upcoming) are next_slot_us applied again and again."""
    job = make_job(schedule=schedule, timezone=zone, **window)
    anchor, after = t(11, 56, 10), t(12, 0, 30, day=datetime(2026, 3, 1, tzinfo=UTC))
    stepped: list[int] = []
    while len(stepped) < 6 and (s := next_slot_us(job, anchor, stepped[-1] if stepped else after)) is not None:
        stepped.append(s)
    assert [us(x) for x in upcoming(job, anchor, after, 6)] == stepped


# ---- targets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("over", "load", "nodes", "reason"), [
    ({}, {}, ["n1"], None),
    ({}, {"n1": 2}, ["n2"], None),  # least loaded
    ({"target": {"tags": {"zone": "b"}}}, {}, ["n2"], None),
    ({"target": {"count": 2}}, {}, ["n1", "n2"], None),
    ({"target": {"count": 5}}, {}, ["n1", "n2"], None),  # as many as there are
    ({"target": {"tags": {"zone": "c"}}}, {}, [], "no live node matches target tags {'zone': 'c'}"),
    ({"executor": "shell", "http": None, "shell": {"command": ["/bin/true"]}}, {}, ["n2"], None),
    ({"executor": "shell", "http": None, "shell": {"command": "true"}, "target": {"tags": {"zone": "a"}}}, {}, [],
     "no live node allows shell jobs (start one with --allow-shell)"),
])
def test_target_selection(over: dict[str, Any], load: dict[str, int], nodes: list[str], reason: str | None) -> None:
    p = plan(make_job(**over), t(12, 0), t(12, 1), pick=picker(load))
    if nodes:
        assert [(c.slot_us, c.status, c.node) for c in p.claims] == [(t(12, 1), "claimed", n) for n in nodes]
    else:
        assert [(c.status, c.node, c.reason) for c in p.claims] == [("failed", None, reason)]


def test_no_live_node_records_the_slot_failed() -> None:
    down = [NodeInfo("n1", {}, True, False)]
    p = plan(make_job(), t(12, 0), t(12, 1), pick=picker(nodes=down))
    assert [(c.status, c.reason, c.trigger) for c in p.claims] == [("failed", "no live node", "schedule")]


def test_picker_spreads_load_within_a_tick() -> None:
    pick = picker()
    a, b = make_job("a"), make_job("b")
    assert pick.pick(a) == (["n1"], None)
    assert pick.pick(b) == (["n2"], None)
    assert pick.pick(a, avoid="n1") == (["n2"], None)


def test_the_leader_runs_nothing_until_the_others_hold_a_margin_more() -> None:
    nodes = [NodeInfo(n, {}, True, True) for n in ("n1", "n2", "n3")]
    job = make_job()
    # n1 leads: its picks go to n2 and n3 while they are within the margin of it
    pick = Picker(nodes, {}, spare="n1", spare_margin=2)
    assert [pick.pick(job)[0] for _ in range(6)] == [["n2"], ["n3"], ["n2"], ["n3"], ["n1"], ["n2"]]
    # a retry still avoids its failed node first, and takes the leader over it
    pick = Picker(nodes, {"n2": 0, "n3": 50}, spare="n1", spare_margin=2)
    assert pick.pick(job, avoid="n2") == (["n1"], None)
    # the leader is the only node that fits: it runs the job
    only = [NodeInfo("n1", {}, True, True), NodeInfo("n2", {}, True, False)]
    assert Picker(only, {}, spare="n1").pick(job) == (["n1"], None)
    # fan-out to every node includes the leader
    assert Picker(nodes, {}, spare="n1").pick(job, count=3)[0] == ["n2", "n3", "n1"]


# ---- retries, expiries, dependencies ------------------------------------------------------------


def _waiting(rid: str, status: str, retry_at: int | None, node: str = "n1", **kw: Any) -> dict[str, Any]:
    return running(rid, status=status, retry_at_us=retry_at, node=node, finished_us=t(11, 59, 30), **kw)


def test_due_retries_prefer_another_node() -> None:
    jobs = {"ping": make_job(retries={"max": 3})}
    runs = [
        _waiting("r1", "retrying", t(12, 0, 30)),             # due now, ran on n1 -> n2
        _waiting("r2", "lost", t(12, 0), node="n2"),          # lost, due -> n1
        _waiting("r3", "retrying", t(12, 0, 31)),             # not yet due
        _waiting("r4", "retrying", t(12, 0), next="r9"),      # already retried
        _waiting("r5", "lost", None),                          # at-most-once: final
        _waiting("r6", "running", None),
        {**_waiting("r7", "retrying", t(12, 0)), "job": "ghost"},
    ]
    claims = due_retries(runs, jobs, t(12, 0, 30), picker())
    assert [(c.retry_of, c.node, c.attempt, c.trigger, c.slot_us, c.status) for c in claims] == [
        ("r1", "n2", 2, "retry", t(11, 59), "claimed"),
        ("r2", "n1", 2, "retry", t(11, 59), "claimed"),
    ]


def test_due_retries_are_claimed_ahead_to_fire_at_their_backoff_instant() -> None:
    jobs = {"ping": make_job(retries={"max": 3})}
    runs = [_waiting("r1", "retrying", t(12, 0, 31)), _waiting("r2", "retrying", t(12, 0, 33))]
    claims = due_retries(runs, jobs, t(12, 0, 30), picker(), horizon_us=2 * SEC)
    assert [(c.retry_of, c.not_before_us, c.slot_us) for c in claims] == [("r1", t(12, 0, 31), t(11, 59))]
    # Its start deadline runs from that instant, not from the old slot.
    claimed = running("r1", status="claimed", slot_us=t(11, 59), claimed_us=t(12, 0, 30),
                      not_before_us=t(12, 0, 31))
    assert expired_runs([claimed], t(12, 0, 41), CFG) == []
    assert expired_runs([claimed], t(12, 0, 41) + 1, CFG) == ["r1"]


def test_due_retry_stays_on_the_same_node_when_it_is_the_only_one() -> None:
    claims = due_retries([_waiting("r1", "retrying", t(12, 0))], {"ping": make_job()}, t(12, 0, 30),
                         picker(nodes=[NodeInfo("n1", {}, False, True)]))
    assert [c.node for c in claims] == ["n1"]


def test_due_retry_without_a_node_is_recorded_failed() -> None:
    claims = due_retries([_waiting("r1", "retrying", t(12, 0))], {"ping": make_job()}, t(12, 0, 30),
                         picker(nodes=[]))
    assert [(c.status, c.reason, c.retry_of, c.attempt) for c in claims] == [("failed", "no live node", "r1", 2)]


@pytest.mark.parametrize(("run", "expired"), [
    (running(lease_us=t(12, 0, 28)), False),                      # lapsed by less than the grace
    (running(lease_us=t(12, 0, 28) - 1), True),                   # lease + grace < now
    (running(lease_us=None), False),
    (running(status="claimed", slot_us=t(12, 0, 20)), False),     # start deadline is slot + 10s
    (running(status="claimed", slot_us=t(12, 0, 20) - 1, claimed_us=t(12, 0, 19)), True),
    (running(status="claimed", slot_us=t(12, 5)), False),         # claimed ahead
    # A retry or catch-up claim stands for an old slot: its deadline runs from when it was claimed.
    (running(status="claimed", slot_us=t(11, 0), claimed_us=t(12, 0, 29)), False),
    (running(status="claimed", slot_us=t(11, 0), claimed_us=t(12, 0, 20) - 1), True),
    (running(status="retrying", lease_us=None), False),
    (running(status="lost", lease_us=None), False),
])
def test_expired_runs(run: dict[str, Any], expired: bool) -> None:
    assert expired_runs([run], t(12, 0, 30), CFG) == (["r1"] if expired else [])


def test_dependency_claims() -> None:
    jobs = {"down": make_job("down", schedule=None, depends_on={"job": "up"}),
            "quiet": make_job("quiet", schedule=None, depends_on={"job": "up"}, paused=True),
            "picky": make_job("picky", schedule=None, depends_on={"job": "up"}, target={"tags": {"zone": "z"}})}
    pending = [{"job": "down", "upstream": "r1", "slot_us": t(11, 0)},
               {"job": "quiet", "upstream": "r1", "slot_us": t(11, 0)},
               {"job": "picky", "upstream": "r1", "slot_us": t(11, 0)},
               {"job": "gone", "upstream": "r1", "slot_us": t(11, 0)}]
    claims = dependency_claims(pending, jobs, picker())
    assert [(c.job, c.trigger, c.status, c.node, c.upstream, c.slot_us) for c in claims] == [
        ("down", "dependency", "claimed", "n1", "r1", t(11, 0)),
        ("quiet", "dependency", "skipped", None, "r1", t(11, 0)),
        ("picky", "dependency", "failed", None, "r1", t(11, 0)),
    ]
    assert claims[1].reason == "the job is paused"


# ---- daylight saving time ----------------------------------------------------------------------


@pytest.mark.parametrize(("day", "after", "expect"), [
    # Spring forward: 02:30 CET does not exist; it runs once at 03:00 CEST = 01:00 UTC.
    (datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 3, 28, 22, 0, tzinfo=UTC),
     [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]),
    # Fall back: 02:30 occurs twice; it runs once, at the first (CEST) = 00:30 UTC.
    (datetime(2026, 10, 25, tzinfo=UTC), datetime(2026, 10, 24, 22, 0, tzinfo=UTC),
     [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]),
    # An ordinary day in between: 02:30 CEST = 00:30 UTC.
    (datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 5, 31, 22, 0, tzinfo=UTC),
     [datetime(2026, 6, 1, 0, 30, tzinfo=UTC)]),
])
def test_dst_days_in_berlin_walked_by_plan_job(day: datetime, after: datetime, expect: list[datetime]) -> None:
    job = make_job(schedule="30 2 * * *", timezone="Europe/Berlin", catchup={"policy": "all", "window": "1d"})
    now = us(after + timedelta(hours=24))  # the whole local day has passed, all inside the window
    p = plan(job, us(after), now, created=us(after) - 1)
    assert [from_us(c.slot_us) for c in p.claims] == expect
    assert all(c.status == "claimed" and c.trigger == "catchup" for c in p.claims)
    # And walked live, tick by tick, the slot is claimed once, 2s ahead.
    last, found = us(after), []
    for k in range(0, 24 * 3600, 60):
        q = plan(job, last, us(after) + k * SEC)
        found += [c.slot_us for c in q.claims]
        if q.claims:
            last = q.claims[-1].slot_us
    assert [from_us(s) for s in found] == expect


def test_replace_with_several_due_slots_runs_only_the_newest() -> None:
    job = make_job(concurrency="replace", catchup={"policy": "all", "window": "1h"})
    p = plan(job, t(12, 0), t(12, 5), active=[running("r7f")])
    assert decided(p)[-1] == ("12:05:00", "schedule", "claimed", "n1")
    assert [d[2] for d in decided(p)[:-1]] == ["skipped"] * 4
    assert all("replaces it" in (c.reason or "") for c in p.claims[:-1])
    assert p.cancel == ["r7f"], "only real runs are cancelled"


def test_claims_of_an_unreachable_node_are_given_up_after_the_grace() -> None:
    cfg = PlanConfig()
    claim = running("rc1", status="claimed", node="n2", slot_us=t(12, 0), claimed_us=t(11, 59, 58))
    just_after = t(12, 0) + cfg.lease_grace_us + 1
    assert expired_runs([claim], just_after, cfg, live={"n1"}) == ["rc1"]
    assert expired_runs([claim], just_after, cfg, live={"n1", "n2"}) == [], "a reachable node gets the deadline"
    assert expired_runs([claim], just_after, cfg) == []


@settings(max_examples=300, deadline=None)
@given(v=st.integers(min_value=-(10**15), max_value=253_402_300_799_999_999))  # 1938 .. 9999-12-31
def test_microsecond_instants_convert_exactly_both_ways(v: int) -> None:
    from api.views import iso
    from scheduler.instants import format_instant

    t = from_us(v)
    assert us(t) == v
    assert us(t.astimezone(timezone(timedelta(hours=-7)))) == v  # any offset: the same instant
    assert iso(v) == format_instant(t)
