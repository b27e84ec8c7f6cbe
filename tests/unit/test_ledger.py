"""The run ledger, one table per transition (SPEC section 2, DESIGN invariants 2, 4, 5, 7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.commands import (
    CancelRun,
    Claim,
    DeleteDeadLetter,
    ExpireRuns,
    FinishRuns,
    PauseJob,
    RenewLeases,
    ReportLost,
)
from scheduler.instants import us
from scheduler.ledger import LOSS_ATTEMPTS, OUTPUT_CAP, run_id_of, token_of

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
MIN = 60_000_000
SEC = 1_000_000


def slot(n: int) -> int:
    return T0 + n * MIN


def sched(job: str, n: int, node: str | None = "n1", **kw: Any) -> Claim:
    return Claim(job=job, slot_us=slot(n), trigger=kw.pop("trigger", "schedule"), node=node, **kw)


# ---- claim: invariant 2 --------------------------------------------------------------------


@pytest.mark.parametrize(("decided", "trigger", "proposed", "admitted"), [
    (None, "schedule", 1, True),
    (3, "schedule", 2, False),  # before the last decided slot
    (3, "schedule", 3, False),  # at it
    (3, "schedule", 4, True),   # after it
    (3, "catchup", 3, False),
    (3, "catchup", 4, True),
    (3, "catchup", 2, False),
])
def test_claim_refuses_slots_at_or_before_the_last_decided(h: Any, decided: int | None, trigger: str,
                                                           proposed: int, admitted: bool) -> None:
    h.put("ping")
    if decided is not None:
        h.claim_one("ping", slot(decided))
    out = h.claim(sched("ping", proposed, trigger=trigger))
    assert len(out["runs"]) == int(admitted)
    if admitted:
        assert out["runs"][0]["trigger"] == trigger and out["runs"][0]["status"] == "claimed"
        assert h.state.jobs["ping"]["last_slot_us"] == slot(proposed)
    else:
        assert out["refused"] == [{"job": "ping", "slot_us": slot(proposed), "trigger": trigger,
                                   "reason": "slot already decided"}]
        assert h.state.jobs["ping"]["last_slot_us"] == slot(decided)


def test_two_leaders_proposing_the_same_slot_decide_it_once(h: Any) -> None:
    h.put("ping")
    first = h.claim(sched("ping", 1, node="n1"), leader="n1", term=1)
    second = h.claim(sched("ping", 1, node="n2"), leader="n2", term=2)
    assert len(first["runs"]) == 1 and first["runs"][0]["leader"] == "n1" and first["runs"][0]["term"] == 1
    assert second["runs"] == [] and second["refused"][0]["reason"] == "slot already decided"
    assert [h.run(r)["node"] for r in h.state.job_runs["ping"]] == ["n1"]


def test_recorded_decisions_also_decide_the_slot(h: Any) -> None:
    h.put("ping")
    out = h.claim(Claim(job="ping", slot_us=slot(1), trigger="schedule", status="skipped", reason="forbid"),
                  Claim(job="ping", slot_us=slot(2), trigger="catchup", status="missed", reason="gap"),
                  Claim(job="ping", slot_us=slot(3), trigger="schedule", status="failed", reason="no live node"))
    assert [r["status"] for r in out["runs"]] == ["skipped", "missed", "failed"]
    assert all(r["node"] is None and r["id"] not in h.state.active for r in out["runs"])
    assert [r["error"] for r in out["runs"]] == ["forbid", "gap", "no live node"]
    rec = h.state.jobs["ping"]
    assert rec["last_slot_us"] == slot(3) and rec["consecutive_failures"] == 1 and rec["missed_total"] == 1
    assert h.claim(sched("ping", 2), sched("ping", 3))["runs"] == []


@pytest.mark.parametrize(("claim", "reason"), [
    (Claim(job="ghost", slot_us=T0, trigger="schedule", node="n1"), "no such job"),
    (Claim(job="ping", slot_us=T0 + MIN, trigger="schedule", node="n9"), "unknown node 'n9'"),
    (Claim(job="ping", slot_us=T0 + MIN, trigger="schedule", node=None), "unknown node None"),
    (Claim(job="ping", slot_us=T0 + MIN, trigger="cron", node="n1"), "unknown trigger 'cron'"),
    (Claim(job="ping", slot_us=T0, trigger="dependency", node="n1", upstream="r1"), "no pending dependency trigger"),
    (Claim(job="ping", slot_us=T0, trigger="retry", node="n1", attempt=2, retry_of="r404"),
     "not the current attempt of its slot"),
    (Claim(job="ping", slot_us=T0, trigger="replay", node="n1", attempt=2, retry_of="r404"),
     "not the current attempt of its slot"),
])
def test_claim_refusals_name_the_reason(h: Any, claim: Claim, reason: str) -> None:
    h.put("ping")
    before = h.semantic()
    out = h.claim(claim)
    assert out["runs"] == [] and out["refused"][0]["reason"] == reason
    assert h.semantic() == before


def test_fencing_tokens_come_from_index_and_position_and_strictly_increase(h: Any) -> None:
    h.put("ping")
    h.put("pong")
    tokens: list[int] = []
    for n in range(1, 4):
        # The repeat of (ping, n) in the same entry is a fan-out: admitted.
        out = h.claim(sched("ping", n), sched("pong", n, node="n2"), sched("ping", n))
        idx = h.index
        assert [r["token"] for r in out["runs"]] == [token_of(idx, 0), token_of(idx, 1), token_of(idx, 2)]
        assert [r["id"] for r in out["runs"]] == [run_id_of(t) for t in (token_of(idx, p) for p in range(3))]
        tokens += [r["token"] for r in out["runs"]]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert token_of(5, 3) == 5 * 65536 + 3 and run_id_of(token_of(5, 3)) == "r50003"


def test_a_refused_claim_keeps_its_position(h: Any) -> None:
    h.put("ping")
    h.claim_one("ping", slot(5))
    out = h.claim(sched("ping", 4), sched("ping", 6))
    assert out["runs"][0]["token"] == token_of(h.index, 1)


def test_fan_out_claims_one_slot_on_several_nodes_in_one_entry(h: Any) -> None:
    h.put("ping", target={"count": 2})
    out = h.claim(sched("ping", 1, node="n1"), sched("ping", 1, node="n2"))
    assert [(r["slot_us"], r["node"]) for r in out["runs"]] == [(slot(1), "n1"), (slot(1), "n2")]
    assert all(r["id"] in h.state.active for r in out["runs"])
    again = h.claim(sched("ping", 1, node="n1"))
    assert again["runs"] == [] and again["refused"][0]["reason"] == "slot already decided"


def test_fan_out_out_of_order_never_moves_the_last_slot_back(h: Any) -> None:
    # An entry [1, 2, 1] (a fan-out listed out of order) must leave slot 2 decided.
    h.put("ping", target={"count": 2})
    out = h.claim(sched("ping", 1), sched("ping", 2), sched("ping", 1, node="n2"))
    assert len(out["runs"]) == 3
    assert h.state.jobs["ping"]["last_slot_us"] == slot(2)
    assert h.claim(sched("ping", 2, node="n2"))["runs"] == []


def test_claim_cancels_replaced_runs(h: Any) -> None:
    h.put("ping", concurrency="replace")
    old = h.claim_one("ping", slot(1))
    h.start("n1", old["id"], at_us=slot(1))
    out = h.claim(sched("ping", 2), at_us=slot(2), cancel=(old["id"], "r-unknown"))
    assert out["cancelled"] == [old["id"]]
    r = h.run(old["id"])
    assert r["status"] == "cancelled" and r["error"] == "replaced by a newer slot" and r["finished_us"] == slot(2)
    assert old["id"] not in h.state.active


def test_summaries_advance_the_job_and_are_counted(h: Any) -> None:
    h.put("ping")
    s = {"job": "ping", "status": "missed", "count": 70, "first_us": slot(1), "last_us": slot(70), "reason": "gap"}
    out = h.claim(sched("ping", 71, status="missed", node=None, reason="gap", trigger="catchup"), summaries=(s,))
    assert len(out["runs"]) == 1
    rec = h.state.jobs["ping"]
    assert rec["last_slot_us"] == slot(71)  # the summary (older) does not move it back
    assert rec["missed_total"] == 71  # 70 summarised + 1 recorded
    assert h.state.notes["ping"][-1] == {"at_us": T0, "decision": "missed", "count": 70, "first_us": slot(1),
                                         "last_us": slot(70), "reason": "gap"}
    assert h.claim(sched("ping", 50, trigger="catchup"))["runs"] == []
    # A summary for an unknown job is ignored.
    h.claim(summaries=({**s, "job": "ghost"},))
    assert "ghost" not in h.state.notes


@pytest.mark.parametrize(("change", "why"), [
    ({"count": 1e30}, "count"), ({"count": 2**64 - 1}, "count"), ({"count": "many"}, "count"), ({"count": 0}, "count"),
    ({"first_us": T0 + 10, "last_us": T0}, "instants"), ({"last_us": 2**64 - 1}, "instants"), ({"first_us": None}, "instants"),
    ({"status": "succeeded"}, "status"), ({"job": 5}, "job"), ({"reason": 5}, "reason"),
])
def test_a_summary_that_no_snapshot_could_hold_is_refused_and_changes_nothing(h: Any, change: dict[str, Any],
                                                                               why: str) -> None:
    """Before, a count of 1e30 became an integer past 64 bits in the job's record and notes, and
    every later snapshot failed to pack."""
    h.put("ping")
    record = h.state.jobs["ping"]
    s = {"job": "ping", "status": "missed", "count": 70, "first_us": T0 - 70, "last_us": T0 - 1, "reason": "gap",
         **change}
    out = h.claim(summaries=(s,))
    assert [r["trigger"] for r in out["refused"]] == ["summary"] and why in out["refused"][0]["reason"]
    assert type(out["refused"][0]["job"]) is str
    assert h.state.jobs["ping"] == record and "ping" not in h.state.notes
    assert h.state.snapshot_bytes()  # packs


@pytest.mark.parametrize(("first", "second", "admitted"), [
    ("req-1", "req-1", False),
    ("req-1", "req-2", True),
])
def test_manual_claims_are_deduplicated_by_request_key(h: Any, first: str, second: str, admitted: bool) -> None:
    h.put("ping", schedule="@manually")
    h.claim_one("ping", T0, trigger="manual", request_key=first)
    out = h.claim(Claim(job="ping", slot_us=T0 + 1, trigger="manual", node="n1", request_key=second))
    assert len(out["runs"]) == int(admitted)
    if not admitted:
        assert out["refused"][0]["reason"] == "this manual request was already recorded"


# ---- start / renew --------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "node", "verdict"), [
    ("claimed", "n1", "started"),
    ("claimed", "n2", "stale"),  # fenced: another node's claim
    ("running", "n1", "already"),  # a retried start whose first copy committed: carry on
    ("running", "n2", "stale"),
    ("succeeded", "n1", "already"),  # its result committed first (a short run)
    ("cancelled", "n1", "stale"),
    ("lost", "n1", "stale"),  # the lease lapsed: the ledger took the attempt away
    (None, "n1", "stale"),  # unknown run
])
def test_start(h: Any, status: str | None, node: str, verdict: str) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    rid = run["id"] if status is not None else "r-none"
    if status == "running":
        h.start("n1", rid, at_us=slot(1))
    elif status == "succeeded":
        h.finish("n1", rid, "succeeded", slot(1) + SEC // 2, started_us=slot(1))
    elif status == "lost":
        h.ok(ExpireRuns(at_us=slot(1) + 30 * SEC, leader="n1", term=1, runs=(rid,), reason="lease expired"))
    elif status == "cancelled":
        h.ok(CancelRun(at_us=slot(1), run_id=rid))
    before = h.run(run["id"])
    out = h.start(node, rid, at_us=slot(1) + SEC, lease_until_us=slot(1) + 6 * SEC)
    assert out == {"started": [], "stale": [], "already": [], verdict: [rid]}
    if verdict == "started":
        r = h.run(rid)
        assert r["status"] == "running" and r["started_us"] == slot(1) + SEC and r["lease_us"] == slot(1) + 6 * SEC
    else:
        assert h.run(run["id"]) == before


def test_start_without_a_start_time_uses_the_entry_time(h: Any) -> None:
    from scheduler.commands import StartRuns
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    h.ok(StartRuns(at_us=slot(1) + 7, node="n1", runs=(run["id"],), started_us={}, lease_until_us=slot(2)))
    assert h.run(run["id"])["started_us"] == slot(1) + 7


@pytest.mark.parametrize(("node", "until", "expect_lease", "stale"), [
    ("n1", 9, 9, False),
    ("n1", 3, 5, False),  # a lease never moves back (an old renewal committed late)
    ("n2", 9, 5, True),   # not this node's attempt
])
def test_renew(h: Any, node: str, until: int, expect_lease: int, stale: bool) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    h.start("n1", run["id"], at_us=slot(1), lease_until_us=slot(1) + 5 * SEC)
    out = h.ok(RenewLeases(at_us=slot(1) + SEC, node=node, runs=(run["id"],), lease_until_us=slot(1) + until * SEC))
    assert out == {"stale": [run["id"]] if stale else [], "already": []}
    assert h.run(run["id"])["lease_us"] == slot(1) + expect_lease * SEC


def test_renew_of_a_claim_not_started_or_finished_is_a_no_op_and_of_a_lost_one_stale(h: Any) -> None:
    h.put("ping")
    claimed = h.claim_one("ping", slot(1))
    done = h.claim_one("ping", slot(2))
    h.finish("n1", done["id"], "succeeded", slot(2) + SEC, started_us=slot(2))
    lost = h.claim_one("ping", slot(3))
    h.start("n1", lost["id"], at_us=slot(3))
    h.ok(ExpireRuns(at_us=slot(4), leader="n1", term=1, runs=(lost["id"],), reason="lease expired"))
    before = [h.run(r) for r in (claimed["id"], done["id"], lost["id"])]
    out = h.ok(RenewLeases(at_us=slot(4), node="n1", runs=(claimed["id"], done["id"], lost["id"], "r-none"),
                           lease_until_us=slot(5)))
    assert out == {"stale": [lost["id"], "r-none"], "already": [claimed["id"], done["id"]]}
    assert [h.run(r) for r in (claimed["id"], done["id"], lost["id"])] == before


# ---- finish ---------------------------------------------------------------------------------


@pytest.mark.parametrize("started", [False, True], ids=["from-claimed", "from-running"])
@pytest.mark.parametrize(("outcome", "final"), [
    ("succeeded", "succeeded"), ("failed", "failed"), ("timed_out", "timed_out"), ("weird", "failed"),
])
def test_finish_without_retries(h: Any, started: bool, outcome: str, final: str) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    if started:
        h.start("n1", run["id"], at_us=slot(1))
    out = h.finish("n1", run["id"], outcome, slot(1) + 3 * SEC, started_us=slot(1) + SEC, exit_code=3,
                   output="hello", error=None if outcome == "succeeded" else "boom")
    assert out["stale"] == [] and len(out["finished"]) == 1
    r = h.run(run["id"])
    assert r == out["finished"][0]
    assert r["status"] == final and r["outcome"] == outcome
    assert r["started_us"] == (slot(1) if started else slot(1) + SEC)
    assert r["finished_us"] == slot(1) + 3 * SEC and r["lease_us"] is None
    assert r["exit_code"] == 3 and r["output"] == "hello" and r["retry_at_us"] is None
    assert run["id"] not in h.state.active and run["id"] not in h.state.dead
    assert h.state.jobs["ping"]["consecutive_failures"] == (0 if final == "succeeded" else 1)


def test_success_resets_consecutive_failures(h: Any) -> None:
    h.put("ping")
    for n, outcome, expect in [(1, "failed", 1), (2, "timed_out", 2), (3, "succeeded", 0), (4, "failed", 1)]:
        run = h.claim_one("ping", slot(n))
        h.finish("n1", run["id"], outcome, slot(n) + SEC)
        assert h.state.jobs["ping"]["consecutive_failures"] == expect


@pytest.mark.parametrize("how", ["lost", "cancelled", "other-node"])
def test_a_late_result_is_recorded_and_decides_nothing(h: Any, how: str) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    h.start("n1", run["id"], at_us=slot(1))
    if how == "lost":
        h.ok(ExpireRuns(at_us=slot(1) + 9 * SEC, leader="n1", term=1, runs=(run["id"],)))
    elif how == "cancelled":
        h.ok(CancelRun(at_us=slot(1) + 9 * SEC, run_id=run["id"]))
    before = dict(h.run(run["id"]))
    rec_before = h.state.jobs["ping"]
    node = "n2" if how == "other-node" else "n1"
    out = h.finish(node, run["id"], "succeeded", slot(1) + 10 * SEC)
    assert out == {"finished": [], "stale": [run["id"]], "already": []}
    after = h.run(run["id"])
    assert after["late_result"] == {"status": "succeeded", "finished_us": slot(1) + 10 * SEC}
    assert {k: v for k, v in after.items() if k != "late_result"} == before
    assert h.state.jobs["ping"] == rec_before
    assert h.state.pending_deps == {}


def test_the_identical_result_resubmitted_is_a_no_op(h: Any) -> None:
    h.put("ping", retries={"max": 1})
    for n, outcome in [(1, "succeeded"), (2, "failed")]:  # final, and retrying
        run = h.claim_one("ping", slot(n))
        h.start("n1", run["id"], at_us=slot(n))
        h.finish("n1", run["id"], outcome, slot(n) + SEC, output="x")
        before = h.semantic()
        out = h.finish("n1", run["id"], outcome, slot(n) + SEC, output="x")
        assert out == {"finished": [], "stale": [], "already": [run["id"]]}
        assert h.semantic() == before


def test_finish_of_an_unknown_run_is_stale(h: Any) -> None:
    out = h.ok(FinishRuns(at_us=T0, node="n1", results=({"run_id": "r-none", "status": "succeeded"},)))
    assert out == {"finished": [], "stale": ["r-none"], "already": []}


def test_output_is_capped_keeping_the_tail(h: Any) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    text = "head" + "x" * (OUTPUT_CAP * 2) + "€tail"  # a multi-byte character near the end
    h.finish("n1", run["id"], "succeeded", slot(1) + SEC, output=text)
    kept = h.run(run["id"])["output"]
    assert len(kept.encode()) <= OUTPUT_CAP and kept.endswith("€tail") and not kept.startswith("head")
    run2 = h.claim_one("ping", slot(2))
    exact = "é" * (OUTPUT_CAP // 2)
    h.finish("n1", run2["id"], "succeeded", slot(2) + SEC, output=exact)
    assert h.run(run2["id"])["output"] == exact
    # Cutting inside a multi-byte character drops the broken half, never decodes garbage.
    run3 = h.claim_one("ping", slot(3))
    h.finish("n1", run3["id"], "succeeded", slot(3) + SEC, output="é" * OUTPUT_CAP)
    assert h.run(run3["id"])["output"] == "é" * (OUTPUT_CAP // 2)


# ---- retries, dead letters, replay ------------------------------------------------------------


@pytest.mark.parametrize(("retries", "delays_s"), [
    ({"max": 3, "backoff": "10s", "factor": 2, "max_backoff": "5m"}, [10, 20, 40]),
    ({"max": 4, "backoff": "10s", "factor": 3, "max_backoff": "1m"}, [10, 30, 60, 60]),
    ({"max": 2, "backoff": "5s", "factor": 1, "max_backoff": "5s"}, [5, 5]),
    ({"max": 2, "backoff": "4s", "factor": 1.5}, [4, 6]),
])
def test_retries_back_off_then_exhaust_into_a_dead_letter(h: Any, retries: dict[str, Any],
                                                          delays_s: list[int]) -> None:
    h.put("ping", retries=retries)
    prev = h.claim_one("ping", slot(1))
    finished = slot(1) + SEC
    for attempt, delay in enumerate(delays_s, start=1):
        h.start(prev["node"], prev["id"], at_us=finished - SEC // 2)
        h.finish(prev["node"], prev["id"], "failed", finished)
        r = h.run(prev["id"])
        # retry_at = finished + min(backoff * factor^(attempt-1), max_backoff)
        assert r["status"] == "retrying" and r["retry_at_us"] == finished + delay * SEC
        assert prev["id"] in h.state.active and h.state.pending_deps == {}
        nxt = h.claim_one("ping", slot(1), node="n2" if attempt % 2 else "n1", trigger="retry",
                          attempt=attempt + 1, retry_of=prev["id"], at_us=r["retry_at_us"])
        assert nxt["slot_us"] == slot(1) and nxt["attempt"] == attempt + 1 and nxt["retry_of"] == prev["id"]
        assert h.run(prev["id"])["next"] == nxt["id"] and prev["id"] not in h.state.active
        prev, finished = nxt, r["retry_at_us"] + SEC
    h.finish(prev["node"], prev["id"], "timed_out", finished)
    last = h.run(prev["id"])
    assert last["status"] == "dead" and last["outcome"] == "timed_out" and last["retry_at_us"] is None
    assert list(h.state.dead) == [prev["id"]] and prev["id"] not in h.state.active
    assert h.state.jobs["ping"]["consecutive_failures"] == len(delays_s) + 1


@pytest.mark.parametrize(("status", "reason"), [
    ("retrying", None),
    ("succeeded", "is succeeded, not awaiting a retry"),
    ("dead", "is dead, not awaiting a retry"),
    ("already-retried", "not the current attempt of its slot"),
    ("other-slot", "not the current attempt of its slot"),
])
def test_retry_claim_admissibility(h: Any, status: str, reason: str | None) -> None:
    h.put("ping", retries={"max": 1})
    run = h.claim_one("ping", slot(1))
    outcome = "succeeded" if status == "succeeded" else "failed"
    if status == "dead":
        # retries.max 1: attempt 1 fails (retrying), attempt 2 fails (dead).
        h.finish("n1", run["id"], "failed", slot(1) + SEC)
        run = h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=run["id"])
    h.finish("n1", run["id"], outcome, slot(1) + 2 * SEC)
    if status == "already-retried":
        h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=run["id"])
    slot_us = slot(2) if status == "other-slot" else slot(1)
    out = h.claim(Claim(job="ping", slot_us=slot_us, trigger="retry", node="n2", attempt=2, retry_of=run["id"]))
    if reason is None:
        assert len(out["runs"]) == 1
    else:
        assert out["runs"] == [] and reason in out["refused"][0]["reason"]


def test_replay_of_a_dead_letter_then_delete(h: Any) -> None:
    h.put("ping", retries={"max": 1, "backoff": "1s"})
    first = h.claim_one("ping", slot(1))
    h.finish("n1", first["id"], "failed", slot(1) + SEC)
    second = h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=first["id"])
    h.finish("n1", second["id"], "failed", slot(1) + 3 * SEC)
    assert list(h.state.dead) == [second["id"]]
    # Replay: a new attempt of the same slot; the dead letter leaves the list.
    replay = h.claim_one("ping", slot(1), node="n2", trigger="replay", attempt=3, retry_of=second["id"],
                         at_us=slot(5))
    assert replay["trigger"] == "replay" and replay["slot_us"] == slot(1) and replay["id"] in h.state.active
    assert h.state.dead == {} and h.run(second["id"])["next"] == replay["id"]
    again = h.claim(Claim(job="ping", slot_us=slot(1), trigger="replay", node="n2", attempt=3,
                          retry_of=second["id"]))
    assert again["runs"] == [] and again["refused"][0]["reason"] == "not the current attempt of its slot"
    # The replay dies too; then the dead letter is deleted.
    h.finish("n2", replay["id"], "failed", slot(5) + SEC)
    assert h.run(replay["id"])["status"] == "dead" and list(h.state.dead) == [replay["id"]]
    assert h.ok(DeleteDeadLetter(at_us=slot(6), run_id=replay["id"])) == {"deleted": replay["id"]}
    assert h.state.dead == {} and h.run(replay["id"])["dead_deleted"] is True
    out = h.rejected(DeleteDeadLetter(at_us=slot(6), run_id=replay["id"]))
    assert out.code == "not_found" and replay["id"] in out.message


def test_replay_of_a_run_that_is_not_dead_is_refused(h: Any) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    h.finish("n1", run["id"], "failed", slot(1) + SEC)
    out = h.claim(Claim(job="ping", slot_us=slot(1), trigger="replay", node="n1", attempt=2, retry_of=run["id"]))
    assert out["refused"][0]["reason"] == f"run {run['id']} is not a dead letter"


def test_a_failed_job_without_retries_is_no_dead_letter(h: Any) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    h.finish("n1", run["id"], "failed", slot(1) + SEC)
    assert h.run(run["id"])["status"] == "failed" and h.state.dead == {}


# ---- expiry and lost attempts -------------------------------------------------------------------


@pytest.mark.parametrize(("delivery", "started", "status", "retry_at", "active"), [
    ("at-least-once", True, "lost", True, True),
    ("at-least-once", False, "lost", True, True),
    ("at-most-once", True, "lost", False, False),
    ("at-most-once", False, "lost", False, False),
])
def test_expire(h: Any, delivery: str, started: bool, status: str, retry_at: bool, active: bool) -> None:
    h.put("ping", delivery=delivery)
    run = h.claim_one("ping", slot(1))
    if started:
        h.start("n1", run["id"], at_us=slot(1))
    at = slot(1) + 20 * SEC
    out = h.ok(ExpireRuns(at_us=at, leader="n1", term=2, runs=(run["id"], "r-none"), reason="lease expired"))
    r = h.run(run["id"])
    assert out == {"lost": [r], "kept": []}
    assert r["status"] == status and r["error"] == "lease expired" and r["finished_us"] == at
    assert r["lease_us"] is None
    assert r["retry_at_us"] == (at if retry_at else None)
    assert (run["id"] in h.state.active) is active and h.state.dead == {}
    # A lost attempt is not expired twice.
    assert h.ok(ExpireRuns(at_us=at + SEC, leader="n1", term=2, runs=(run["id"],))) == {"lost": [], "kept": []}


@pytest.mark.parametrize("status", ["succeeded", "cancelled", "skipped"])
def test_expire_ignores_attempts_that_are_not_live(h: Any, status: str) -> None:
    h.put("ping")
    if status == "skipped":
        rid = h.claim(Claim(job="ping", slot_us=slot(1), trigger="schedule", status="skipped"))["runs"][0]["id"]
    else:
        rid = h.claim_one("ping", slot(1))["id"]
        if status == "succeeded":
            h.finish("n1", rid, "succeeded", slot(1) + SEC)
        else:
            h.ok(CancelRun(at_us=slot(1), run_id=rid))
    before = h.semantic()
    assert h.ok(ExpireRuns(at_us=slot(2), leader="n1", term=1, runs=(rid,))) == {"lost": [], "kept": []}
    assert h.semantic() == before


@pytest.mark.parametrize(("seen_as", "since", "kept"), [
    ("claimed", "started", True),   # its start committed between the leader's look and the expiry
    ("running", "renewed", True),   # a renewal did
    ("claimed", "nothing", False),  # as the leader saw it: taken
    ("running", "nothing", False),
    ("unnamed", "started", False),  # not in ``seen`` (a leader of an earlier release): taken, as before
])
def test_an_expiry_keeps_an_attempt_started_or_renewed_after_the_leader_looked(
        h: Any, seen_as: str, since: str, kept: bool) -> None:
    """The leader decides an expiry from the state it scanned; the node's start or renewal can
    commit before that decision does. Taking the attempt away then would retry the slot on
    another node while this one runs it: the slot run twice."""
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    rid = run["id"]
    if seen_as == "running":
        h.start("n1", rid, at_us=slot(1), lease_until_us=slot(1) + 5 * SEC)
    seen = {} if seen_as == "unnamed" else {rid: 0 if seen_as == "claimed" else slot(1) + 5 * SEC}
    if since == "started":
        h.start("n1", rid, at_us=slot(1) + 9 * SEC, lease_until_us=slot(1) + 14 * SEC)
    elif since == "renewed":
        h.ok(RenewLeases(at_us=slot(1) + 9 * SEC, node="n1", runs=(rid,), lease_until_us=slot(1) + 14 * SEC))
    before = h.run(rid)
    out = h.ok(ExpireRuns(at_us=slot(1) + 10 * SEC, leader="n1", term=1, runs=(rid,), seen=seen))
    if kept:
        assert out == {"lost": [], "kept": [rid]}
        assert h.run(rid) == before and before["status"] == "running" and rid in h.state.active
        assert h.ok(FinishRuns(at_us=slot(2), node="n1", results=(
            {"run_id": rid, "status": "succeeded", "started_us": slot(1) + 9 * SEC, "finished_us": slot(2),
             "exit_code": None, "http_status": 200, "output": "", "error": None},)))["finished"]
        assert h.run(rid)["status"] == "succeeded" and h.state.active == {}  # nothing left to retry
    else:
        assert out == {"lost": [h.run(rid)], "kept": []}
        assert h.run(rid)["status"] == "lost" and h.run(rid)["retry_at_us"] == slot(1) + 10 * SEC


def test_at_least_once_gives_up_after_the_loss_attempts(h: Any) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(1))
    for attempt in range(1, LOSS_ATTEMPTS + 1):
        assert run["attempt"] == attempt
        h.ok(ExpireRuns(at_us=slot(1) + attempt * SEC, leader="n1", term=1, runs=(run["id"],)))
        if attempt < LOSS_ATTEMPTS:
            assert h.run(run["id"])["status"] == "lost" and run["id"] in h.state.active
            run = h.claim_one("ping", slot(1), trigger="retry", attempt=attempt + 1, retry_of=run["id"])
    r = h.run(run["id"])
    assert r["status"] == "dead" and "gave up after 5 attempts" in r["error"]
    assert list(h.state.dead) == [run["id"]] and run["id"] not in h.state.active


def test_retries_max_raises_the_loss_limit(h: Any) -> None:
    h.put("ping", retries={"max": LOSS_ATTEMPTS + 2})
    run = h.claim_one("ping", slot(1), attempt=LOSS_ATTEMPTS + 2)
    h.ok(ExpireRuns(at_us=slot(2), leader="n1", term=1, runs=(run["id"],)))
    assert h.run(run["id"])["status"] == "lost" and run["id"] in h.state.active
    run2 = h.claim_one("ping", slot(1), trigger="retry", attempt=LOSS_ATTEMPTS + 3, retry_of=run["id"])
    h.ok(ExpireRuns(at_us=slot(3), leader="n1", term=1, runs=(run2["id"],)))
    assert h.run(run2["id"])["status"] == "dead"


def test_report_lost_touches_only_the_reporting_nodes_runs(h: Any) -> None:
    h.put("ping", target={"count": 2})
    out = h.claim(sched("ping", 1, node="n1"), sched("ping", 1, node="n2"))
    mine, theirs = out["runs"][0]["id"], out["runs"][1]["id"]
    h.start("n1", mine, at_us=slot(1))
    h.start("n2", theirs, at_us=slot(1))
    lost = h.ok(ReportLost(at_us=slot(1) + SEC, node="n1", runs=(mine, theirs)))
    assert [r["id"] for r in lost["lost"]] == [mine]
    assert h.run(mine)["status"] == "lost" and h.run(mine)["error"] == "its node restarted"
    assert h.run(theirs)["status"] == "running"


# ---- cancel ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "ok"), [
    ("claimed", True), ("running", True), ("retrying", True), ("lost", True),
    ("succeeded", False), ("failed", False), ("cancelled", False), ("skipped", False), ("dead", False),
])
def test_cancel(h: Any, status: str, ok: bool) -> None:
    h.put("ping", retries={"max": 1 if status in ("retrying", "dead") else 0})
    if status == "skipped":
        rid = h.claim(Claim(job="ping", slot_us=slot(1), trigger="schedule", status="skipped"))["runs"][0]["id"]
    else:
        rid = h.claim_one("ping", slot(1))["id"]
    if status != "claimed" and status != "skipped":
        h.start("n1", rid, at_us=slot(1))
    if status in ("succeeded", "failed", "retrying"):
        h.finish("n1", rid, "succeeded" if status == "succeeded" else "failed", slot(1) + SEC)
    elif status == "lost":
        h.ok(ExpireRuns(at_us=slot(1) + SEC, leader="n1", term=1, runs=(rid,)))
    elif status == "cancelled":
        h.ok(CancelRun(at_us=slot(1), run_id=rid))
    elif status == "dead":
        h.finish("n1", rid, "failed", slot(1) + SEC)
        rid = h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=rid)["id"]
        h.finish("n1", rid, "failed", slot(1) + 2 * SEC)
    assert h.run(rid)["status"] == status
    before = h.semantic()
    out = h.apply(CancelRun(at_us=slot(2), run_id=rid, reason="operator said so"))
    if ok:
        r = h.run(rid)
        assert out.result == {"cancelled": r}
        assert r["status"] == "cancelled" and r["error"] == "operator said so" and r["finished_us"] == slot(2)
        assert rid not in h.state.active
    else:
        assert out.code == "conflict" and f"is {status}" in out.message
        assert h.semantic() == before


def test_cancel_unknown_run_is_not_found(h: Any) -> None:
    out = h.rejected(CancelRun(at_us=T0, run_id="r-none"))
    assert out.code == "not_found" and "'r-none'" in out.message


# ---- dependencies ----------------------------------------------------------------------------


@pytest.mark.parametrize(("on", "outcome", "triggers"), [
    ("success", "succeeded", True), ("success", "failed", False),
    ("failure", "succeeded", False), ("failure", "failed", True), ("failure", "timed_out", True),
    ("any", "succeeded", True), ("any", "failed", True),
])
def test_dependency_triggers(h: Any, on: str, outcome: str, triggers: bool) -> None:
    h.put("up")
    h.put("down", schedule=None, depends_on={"job": "up", "on": on})
    h.put("bystander")
    run = h.claim_one("up", slot(1))
    h.finish("n1", run["id"], outcome, slot(1) + SEC)
    key = f"down|{run['id']}"
    if triggers:
        assert h.state.pending_deps == {key: {"job": "down", "upstream": run["id"], "slot_us": slot(1)}}
    else:
        assert h.state.pending_deps == {}


def test_dependency_claim_consumes_the_trigger_once(h: Any) -> None:
    h.put("up")
    h.put("down", schedule=None, depends_on={"job": "up"})
    run = h.claim_one("up", slot(1))
    h.finish("n1", run["id"], "succeeded", slot(1) + SEC)
    dep = Claim(job="down", slot_us=slot(1), trigger="dependency", node="n2", upstream=run["id"])
    out = h.claim(dep, dep)  # the same trigger twice, even in one entry: decided once
    assert len(out["runs"]) == 1 and out["refused"][0]["reason"] == "no pending dependency trigger"
    assert out["runs"][0]["cause"] == run["id"] and h.state.pending_deps == {}
    assert h.claim(dep)["runs"] == []


def test_a_retrying_upstream_triggers_nothing_until_it_ends(h: Any) -> None:
    h.put("up", retries={"max": 1})
    h.put("down", schedule=None, depends_on={"job": "up", "on": "failure"})
    run = h.claim_one("up", slot(1))
    h.finish("n1", run["id"], "failed", slot(1) + SEC)
    assert h.state.pending_deps == {}
    retry = h.claim_one("up", slot(1), trigger="retry", attempt=2, retry_of=run["id"])
    h.finish("n1", retry["id"], "failed", slot(1) + 20 * SEC)
    assert list(h.state.pending_deps) == [f"down|{retry['id']}"]


# ---- history trimming -----------------------------------------------------------------------


def test_history_keep_trims_oldest_but_keeps_active_runs_and_dead_letters(h: Any) -> None:
    h.put("ping", history={"keep": 3}, retries={"max": 0})
    h.put("dl", history={"keep": 2}, retries={"max": 1, "backoff": "1s"})
    live = h.claim_one("ping", slot(1))  # stays claimed: active
    done = []
    for n in range(2, 7):
        r = h.claim_one("ping", slot(n))
        h.finish("n1", r["id"], "succeeded", slot(n) + SEC)
        done.append(r["id"])
    ids = h.state.job_runs["ping"]
    assert ids == [live["id"], *done[-2:]]
    assert all(rid in h.state.runs for rid in ids) and all(rid not in h.state.runs for rid in done[:-2])
    # Dead letters survive trimming until replayed or deleted.
    first = h.claim_one("dl", slot(1))
    h.finish("n1", first["id"], "failed", slot(1) + SEC)
    dead = h.claim_one("dl", slot(1), trigger="retry", attempt=2, retry_of=first["id"])
    h.finish("n1", dead["id"], "failed", slot(1) + 2 * SEC)
    for n in range(2, 6):
        r = h.claim_one("dl", slot(n))
        h.finish("n1", r["id"], "succeeded", slot(n) + SEC)
    assert dead["id"] in h.state.dead and h.state.job_runs["dl"][0] == dead["id"]
    assert len(h.state.job_runs["dl"]) == 2 and first["id"] not in h.state.runs
    # Deleted, it is plain history: the next run trims it.
    h.ok(DeleteDeadLetter(at_us=slot(9), run_id=dead["id"]))
    assert dead["id"] in h.state.runs and h.state.runs[dead["id"]]["dead_deleted"] is True
    h.claim_one("dl", slot(10))
    assert dead["id"] not in h.state.runs and dead["id"] not in h.state.job_runs["dl"]


def test_history_stays_within_keep_once_runs_end(h: Any) -> None:
    # keep + (active + dead) bounds history at every step, also after the active runs end.
    h.put("ping", history={"keep": 2})
    runs = [h.claim_one("ping", slot(n)) for n in range(1, 5)]
    assert len(h.state.job_runs["ping"]) == 4  # all four active
    for r in runs:
        h.finish("n1", r["id"], "succeeded", slot(9))
        ids = h.state.job_runs["ping"]
        live = sum(1 for rid in ids if rid in h.state.active or rid in h.state.dead)
        assert len(ids) <= 2 + live


def test_pause_note_is_kept_per_job_and_bounded(h: Any) -> None:
    h.put("ping")
    for k in range(205):
        h.ok(PauseJob(at_us=T0 + k, name="ping", paused=k % 2 == 0))
    notes = h.state.notes["ping"]
    assert len(notes) == 200 and notes[-1]["at_us"] == T0 + 204


def test_lowering_history_keep_trims_at_once(h: Any) -> None:
    h.put("ping")
    done = []
    for n in range(1, 6):
        r = h.claim_one("ping", slot(n))
        h.finish("n1", r["id"], "succeeded", slot(n) + SEC)
        done.append(r["id"])
    h.put("ping", at_us=slot(6), history={"keep": 2})
    assert h.state.job_runs["ping"] == done[-2:]
    assert all(rid not in h.state.runs for rid in done[:-2])


def test_cancelling_a_run_that_history_then_trims_still_answers_it(h: Any) -> None:
    h.put("ping", history={"keep": 2})
    first, *_ = [h.claim_one("ping", slot(n)) for n in range(1, 4)]  # three live attempts, keep 2
    out = h.ok(CancelRun(at_us=slot(1), run_id=first["id"]))
    assert out["cancelled"]["id"] == first["id"] and out["cancelled"]["status"] == "cancelled"
    assert first["id"] not in h.state.runs and len(h.state.job_runs["ping"]) == 2
    second = h.state.job_runs["ping"][0]
    replaced = h.claim(sched("ping", 4), cancel=(second,))
    assert replaced["cancelled"] == [second] and second not in h.state.runs


def test_manual_fan_out_runs_one_request_on_several_nodes(h: Any) -> None:
    h.put("ping", schedule="@manually", target={"count": 2})
    out = h.claim(Claim(job="ping", slot_us=T0, trigger="manual", node="n1", request_key="req-9"),
                  Claim(job="ping", slot_us=T0, trigger="manual", node="n2", request_key="req-9"))
    assert [r["node"] for r in out["runs"]] == ["n1", "n2"]
    again = h.claim(Claim(job="ping", slot_us=T0, trigger="manual", node="n1", request_key="req-9"))
    assert again["runs"] == [] and again["refused"][0]["reason"] == "this manual request was already recorded"


def test_a_manual_claim_without_a_request_key_is_refused(h: Any) -> None:
    h.put("ping")
    h.claim_one("ping", slot(1))  # a scheduled run has no cause either
    out = h.claim(Claim(job="ping", slot_us=T0, trigger="manual", node="n1"))
    assert out["refused"][0]["reason"] == "a manual run needs a request key"


def test_a_claim_cannot_record_any_status(h: Any) -> None:
    h.put("ping")
    out = h.claim(Claim(job="ping", slot_us=slot(1), trigger="schedule", status="dead"))
    assert out["runs"] == [] and "cannot record status 'dead'" in out["refused"][0]["reason"]
    assert h.state.dead == {}


@pytest.mark.parametrize("delivery", ["at-most-once", "at-least-once"])
def test_a_final_loss_counts_as_a_failure_and_tells_dependents(h: Any, delivery: str) -> None:
    h.put("extract", delivery=delivery, alerts={"on": ["failure"]})
    h.put("load", schedule=None, depends_on={"job": "extract", "on": "failure"})
    run = h.claim_one("extract", slot(1))
    at = slot(1) + 20 * SEC
    for attempt in range(1, 6 if delivery == "at-least-once" else 2):
        h.ok(ExpireRuns(at_us=at, leader="n1", term=2, runs=(run["id"],)))
        lost = h.run(run["id"])
        if lost["id"] not in h.state.active:
            break
        run = h.claim_one("extract", slot(1), trigger="retry", attempt=attempt + 1, retry_of=run["id"], at_us=at)
    final = h.run(run["id"])
    assert final["status"] == ("lost" if delivery == "at-most-once" else "dead")
    assert h.state.jobs["extract"]["consecutive_failures"] == 1
    assert [d["job"] for d in h.state.pending_deps.values()] == ["load"]
    assert [a["event"] for a in h.state.alerts.values()] == ["failure"]


@pytest.mark.parametrize(("late_by", "alerted"), [(90 * SEC, True), (10 * SEC, False)])
def test_a_run_finished_before_its_start_was_reported_still_raises_its_late_alert(
        h: Any, late_by: int, alerted: bool) -> None:
    # The worker skips StartRuns for an attempt that ended within one report batch; the
    # start it would have carried comes with the result, and so does the "late" check.
    h.put("ping", alerts={"on": ["late"], "late_after": "1m"})
    run = h.claim_one("ping", slot(1))
    h.finish("n1", run["id"], "succeeded", slot(1) + late_by + SEC, started_us=slot(1) + late_by)
    assert h.run(run["id"])["started_us"] == slot(1) + late_by
    events = [(a["event"], a["run_id"]) for a in h.state.alerts.values()]
    assert events == ([("late", run["id"])] if alerted else [])


# ---- next slots a leader walked to (NoteNextSlots) ----------------------------------------


def _note(h: Any, **over: Any) -> dict[str, Any]:
    from scheduler.commands import NoteNextSlots
    from scheduler.planner import PLAN_EPOCH
    rec = h.state.jobs["ping"]
    item = {"job": "ping", "version": rec["version"], "created_us": rec["created_us"], "from_us": slot(1),
            "slot_us": slot(2), "epoch": PLAN_EPOCH, **over}
    result: dict[str, Any] = h.ok(NoteNextSlots(at_us=T0, leader="n1", term=1, slots=(item,)))
    return result


def test_a_next_slot_is_kept_only_for_the_same_job_version_and_walk_start(h: Any) -> None:
    from scheduler.planner import known_next_slot
    h.put("ping", schedule="* * * * *")
    version = h.state.jobs["ping"]["version"]
    h.claim_one("ping", slot(1))
    assert _note(h) == {"kept": 1}
    assert known_next_slot(h.state.jobs["ping"]) == (True, slot(2))
    assert _note(h) == {"kept": 0}  # the same again changes nothing
    for over in ({"from_us": slot(0)}, {"version": version + 1}, {"created_us": T0 - 1},
                 {"version": True}, {"slot_us": "x"}, {"epoch": None}, {"job": 7}):
        assert _note(h, **{"slot_us": slot(5), **over}) == {"kept": 0}, over
    assert known_next_slot(h.state.jobs["ping"]) == (True, slot(2))
    _note(h, slot_us=slot(3), epoch="another planner")  # kept, but no leader of this epoch trusts it
    assert known_next_slot(h.state.jobs["ping"]) == (False, None)
    _note(h)
    h.claim_one("ping", slot(2))  # a later decision voids it without touching it
    assert known_next_slot(h.state.jobs["ping"]) == (False, None)
    _note(h, from_us=slot(2), slot_us=slot(3))
    assert known_next_slot(h.state.jobs["ping"]) == (True, slot(3))
    h.put("ping", schedule="*/2 * * * *", at_us=slot(2) - SEC)  # an edit voids it too (a new version)
    assert known_next_slot(h.state.jobs["ping"]) == (False, None)


def test_next_slots_are_an_entry_of_their_own_not_a_field_of_the_claims(h: Any) -> None:
    from dataclasses import fields

    from scheduler.commands import ClaimSlots
    # A node of an older release refuses an entry with a field or tag it does not know: the
    # claims must never carry them, or such a node would refuse decisions, not just a hint.
    assert {f.name for f in fields(ClaimSlots)} == {"at_us", "leader", "term", "claims", "cancel", "summaries"}
