"""Edits apply from their instant, one record per slot (issue 12, bugs 1, 2 and 4).

The state machine and the planner together, committed the way ``scheduler.leader`` does:
plan from the applied state, propose one ``ClaimSlots``.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from scheduler.commands import Claim, ClaimSlots, PauseJob, PutJob
from scheduler.instants import us
from scheduler.planner import NodeInfo, Picker, PlanConfig, plan_job
from scheduler.state import Applied

SEC = 1_000_000
MIN = 60 * SEC
DAY0 = datetime(2026, 3, 10, tzinfo=UTC)


def at(hh: int, mm: int = 0, ss: int = 0) -> int:
    return us(DAY0.replace(hour=hh, minute=mm, second=ss))


def plan(h: Any, name: str, now: int) -> dict[str, Any]:
    """One leader tick for one job: plan from the applied state, commit the decisions."""
    job, rec = h.state.job(name), h.state.jobs[name]
    assert job is not None
    busy = [r for rid in h.state.job_runs[name] if rid in h.state.active and (r := h.state.runs[rid])]
    picker = Picker([NodeInfo("n1", {}, False, True), NodeInfo("n2", {}, False, True)], {})
    p = plan_job(job, rec, busy, now, PlanConfig(), picker)
    out = h.apply(ClaimSlots(at_us=now, leader="n1", term=1, claims=tuple(p.claims), cancel=tuple(p.cancel),
                             summaries=tuple(p.summaries)))
    assert isinstance(out, Applied), out
    result: dict[str, Any] = out.result
    return result


def records(h: Any, name: str) -> Counter[int]:
    """Schedule and catch-up records per slot, as the ledger holds them."""
    return Counter(r["slot_us"] for rid in h.state.job_runs[name]
                   if (r := h.state.runs[rid])["trigger"] in ("schedule", "catchup"))


def test_a_daily_job_edited_at_noon_to_every_five_minutes_records_nothing_before_the_edit(h: Any) -> None:
    h.ok(PutJob(at_us=at(0) - 10 * SEC, spec=h.job_doc("daily", schedule="@daily", alerts={"on": ["missed"]})))
    assert [r["slot_us"] for r in plan(h, "daily", at(0) - SEC)["runs"]] == [at(0)]  # claimed ahead
    assert h.state.jobs["daily"]["last_slot_us"] == at(0)
    h.ok(PutJob(at_us=at(12), spec=h.job_doc("daily", schedule="*/5 * * * *", alerts={"on": ["missed"]})))
    out = plan(h, "daily", at(12, 0, 30))
    assert out["runs"] == [] and h.state.jobs["daily"]["missed_total"] == 0
    assert h.state.alerts == {}
    assert not any(n.get("decision") in ("missed", "skipped") for n in h.state.notes.get("daily", []))
    out = plan(h, "daily", at(12, 5) - SEC)
    assert [(r["slot_us"], r["status"], r["trigger"]) for r in out["runs"]] == [(at(12, 5), "claimed", "schedule")]
    assert records(h, "daily") == Counter({at(0): 1, at(12, 5): 1})
    note = h.state.notes["daily"][-1]
    assert note["decision"] == "changed" and note["at_us"] == at(12)
    assert "'@daily' -> '*/5 * * * *'" in note["reason"]


def test_a_stale_plan_cannot_record_slots_before_the_edit(h: Any) -> None:
    # A leader planned with the old record (before the edit applied) and proposes late: the state refuses.
    h.ok(PutJob(at_us=at(0) - SEC, spec=h.job_doc("daily", schedule="@daily")))
    plan(h, "daily", at(0) - SEC)
    h.ok(PutJob(at_us=at(12), spec=h.job_doc("daily", schedule="*/5 * * * *")))
    out = h.claim(Claim(job="daily", slot_us=at(11, 55), trigger="catchup", status="missed", reason="gap"),
                  summaries=({"job": "daily", "status": "missed", "count": 3, "first_us": at(11, 40),
                              "last_us": at(11, 50), "reason": "gap"},), at_us=at(12, 0, 1))
    assert out["runs"] == [] and len(out["refused"]) == 2
    assert h.state.jobs["daily"]["missed_total"] == 0 and records(h, "daily") == Counter({at(0): 1})


def test_a_plan_made_before_an_edit_and_committed_after_it_is_refused(h: Any) -> None:
    # Every 2 s, then every second: the old plan's 00:00:02, admitted, would hide the new 00:00:01.
    h.put("ping", at_us=at(0), schedule="*/2 * * * * *")
    job, rec = h.state.job("ping"), h.state.jobs["ping"]
    assert job is not None
    picker = Picker([NodeInfo("n1", {}, False, True)], {})
    stale = plan_job(job, rec, [], at(0) + SEC // 2, PlanConfig(), picker)
    assert [c.slot_us for c in stale.claims] == [at(0, 0, 2)]
    h.put("ping", at_us=at(0) + 7 * SEC // 10, schedule="* * * * * *")
    out = h.ok(ClaimSlots(at_us=at(0) + SEC // 2, leader="n1", term=1, claims=stale.claims))
    assert out["runs"] == [] and [r["reason"] for r in out["refused"]] == ["planned before the job's schedule changed"]
    plan(h, "ping", at(0) + 8 * SEC // 10)
    assert records(h, "ping") == Counter({at(0, 0, 1): 1, at(0, 0, 2): 1})


def test_every_schedule_field_edit_starts_the_new_schedule_at_its_instant(h: Any) -> None:
    h.put("ping", at_us=at(0))
    plan(h, "ping", at(0, 1))
    for k, change in enumerate([{"timezone": "Asia/Kolkata"}, {"starts_at": "2026-01-01T00:00:00Z"},
                                {"ends_at": "2027-01-01T00:00:00Z"}, {"schedule": "*/2 * * * *"}]):
        edit = at(1 + k)
        h.put("ping", at_us=edit, **change)
        assert h.state.jobs["ping"]["spec_since_us"] == edit
        plan(h, "ping", edit + 30 * SEC)
        # Nothing between the last plan and the edit was recorded (the job was idle an hour).
        assert all(s <= at(0, 1) or s > edit for s in records(h, "ping")), change
    assert max(records(h, "ping").values()) == 1


def test_a_pause_withdraws_claimed_slots_once_and_never_records_them_again(h: Any) -> None:
    h.put("ping", at_us=at(0))
    plan(h, "ping", at(0, 1) - SEC)  # claims 00:01 ahead
    plan(h, "ping", at(0, 1) + 59 * SEC)  # 00:01 due, 00:02 claimed ahead
    two = next(rid for rid in h.state.job_runs["ping"] if h.state.runs[rid]["slot_us"] == at(0, 2))
    out = h.ok(PauseJob(at_us=at(0, 1, 59) + SEC // 2, name="ping", paused=True))
    assert out["cancelled"] == [two]
    for now in (at(0, 2), at(0, 2, 3), at(0, 3, 3), at(0, 4, 3)):
        plan(h, "ping", now)
    assert records(h, "ping") == Counter({at(0, 1): 1, at(0, 2): 1, at(0, 3): 1, at(0, 4): 1})
    statuses = {h.state.runs[rid]["slot_us"]: h.state.runs[rid]["status"] for rid in h.state.job_runs["ping"]}
    assert statuses == {at(0, 1): "claimed", at(0, 2): "cancelled", at(0, 3): "skipped", at(0, 4): "skipped"}


def test_resume_never_records_a_slot_twice_nor_the_pause_slots_not_yet_decided(h: Any) -> None:
    h.put("ping", at_us=at(0))
    h.ok(PauseJob(at_us=at(0, 0, 30), name="ping", paused=True))
    plan(h, "ping", at(0, 2, 3))  # 00:01 and 00:02 skipped while paused
    h.ok(PauseJob(at_us=at(0, 3, 30), name="ping", paused=False))  # 00:03 fell due paused, not yet decided
    plan(h, "ping", at(0, 3, 31))
    plan(h, "ping", at(0, 4) - SEC)
    assert records(h, "ping") == Counter({at(0, 1): 1, at(0, 2): 1, at(0, 4): 1})
    statuses = [h.state.runs[rid]["status"] for rid in h.state.job_runs["ping"]]
    assert statuses == ["skipped", "skipped", "claimed"]
    assert [n["decision"] for n in h.state.notes["ping"]] == ["paused", "resumed"]


def test_a_dependency_cycle_is_refused_naming_it(h: Any) -> None:
    h.put("a", schedule=None, depends_on={"job": "b"})
    h.put("b", schedule="@hourly")
    h.put("c", schedule=None, depends_on={"job": "a"})
    before = h.semantic()
    out = h.rejected(PutJob(at_us=at(1), spec=h.job_doc("b", schedule=None, depends_on={"job": "c"})))
    assert out.code == "invalid"
    assert out.message == "depends_on.job: would close a dependency cycle b -> c -> a -> b"
    assert h.semantic() == before
    two = h.rejected(PutJob(at_us=at(1), spec=h.job_doc("b", schedule=None, depends_on={"job": "a"})))
    assert two.message.endswith("b -> a -> b")
    assert h.put("d", schedule=None, depends_on={"job": "c"}).result["change"] == "created"  # a chain is fine
