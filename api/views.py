"""Ledger and job records rendered as the JSON SPEC promises (RFC 3339 UTC times)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from scheduler.instants import format_instant
from scheduler.ledger import MAX_CLAIMS_PER_ENTRY
from scheduler.planner import upcoming, walk_from_us
from scheduler.redaction import mask_spec
from scheduler.runs import RunRecord
from scheduler.state import State

__all__ = ["iso", "job_view", "run_view", "explain_view", "next_slots"]


def iso(v: int | None) -> str | None:
    """Integer microseconds since the epoch as ``format_instant`` writes them (straight from
    the integer: a few views of this per write)."""
    return None if v is None else (_NAIVE_EPOCH + timedelta(microseconds=v)).isoformat() + "Z"


_NAIVE_EPOCH = datetime(1970, 1, 1)


def run_view(run: RunRecord, *, output: bool = True) -> dict[str, Any]:
    started, finished = run["started_us"], run["finished_us"]
    view = {
        "id": run["id"], "job": run["job"], "slot": iso(run["slot_us"]), "attempt": run["attempt"],
        "trigger": run["trigger"], "status": run["status"], "node": run["node"],
        "claimed_at": iso(run["claimed_us"]), "started_at": iso(started), "finished_at": iso(finished),
        "duration_ms": (finished - started) // 1000 if started is not None and finished is not None else None,
        "exit_code": run["exit_code"], "http_status": run["http_status"], "error": run["error"],
        "fencing_token": run["token"], "outcome": run.get("outcome"), "retry_of": run["retry_of"],
        "retried_by": run["next"], "retry_at": iso(run.get("retry_at_us")),
        "lease_expires_at": iso(run.get("lease_us")), "claimed_by": {"leader": run["leader"], "term": run["term"]},
    }
    if output:
        view["output"] = run["output"]
    if run.get("late_result"):
        lr = run["late_result"]
        view["late_result"] = {"status": lr.get("status"), "finished_at": iso(lr.get("finished_us"))}
    return view


def next_slots(state: State, name: str, now_us: int, count: int = 5) -> list[datetime]:
    job, rec = state.job(name), state.jobs.get(name)
    if job is None or rec is None or job.paused:
        return []
    return upcoming(job, rec["created_us"], max(now_us, walk_from_us(rec)), count)


def job_view(state: State, name: str, now_us: int, *, masked: bool = False) -> dict[str, Any] | None:
    """The job and its status. A job whose next slots cannot be computed (or that this node's
    leader loop could not plan) is still shown, with ``error`` saying why: one broken job
    must not make the list of all jobs fail. ``masked``: for a read-only caller, job secrets
    replaced by ``***`` (scheduler/redaction.py)."""
    rec = state.jobs.get(name)
    if rec is None:
        return None
    last = next(state.runs.newest_of(name), None)
    error = None
    try:
        slots = [format_instant(s) for s in next_slots(state, name, now_us)]
    except Exception as exc:  # noqa: BLE001 - shown in the view instead of failing the request
        slots, error = [], f"the next slots cannot be computed: {type(exc).__name__}: {exc}"
    planning = state.planning_errors.get(name) or rec.get("planning_error")  # this node's loop's, or the leader's
    if planning is not None and planning["version"] == rec["version"]:  # an edit may have fixed it
        error = planning["error"]
    view = {
        "name": name, "spec": mask_spec(rec["spec"]) if masked else rec["spec"], "version": rec["version"],
        "created_at": iso(rec["created_us"]), "updated_at": iso(rec["updated_us"]),
        "status": {
            "paused": bool(rec["spec"].get("paused")), "pause_note": rec.get("pause_note"),
            "last_run": run_view(last, output=False) if last else None,
            "next_slots": slots,
            "consecutive_failures": rec["consecutive_failures"],
            "missed_total": rec["missed_total"], "last_decided_slot": iso(rec["last_slot_us"]),
        },
    }
    if error is not None:
        view["error"] = error
    return view


def _decision(run: RunRecord) -> tuple[str, str]:
    st, trig = run["status"], run["trigger"]
    by = f"leader {run['leader']} in term {run['term']}"
    if st in ("skipped", "missed"):
        return st, f"{run['error']} (decided by {by})"
    if st == "failed" and run["node"] is None:
        return "failed", f"not dispatched: {run['error']} (decided by {by})"
    what = {"retry": f"retry of {run['retry_of']}", "replay": f"replay of dead letter {run['retry_of']}",
            "catchup": "catch-up run", "dependency": f"triggered by upstream run {run['cause']}",
            "manual": "run by hand"}.get(trig, "scheduled run")
    reason = f"{what}, claimed by {by} for node {run['node']}, attempt {run['attempt']}: now {st}"
    if st in ("lost", "retrying", "failed", "timed_out", "cancelled", "dead") and run["error"]:
        reason += f" ({run['error']})"
    if run["next"]:
        reason += f"; retried as {run['next']}"
    return ("claimed" if trig != "retry" else "retried"), reason


def explain_view(state: State, name: str, since_us: int | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for run in state.runs.records_of(name):
        if since_us is not None and run["slot_us"] < since_us:
            continue
        rid = run["id"]
        decision, reason = _decision(run)
        items.append({"slot": iso(run["slot_us"]), "decision": decision, "status": run["status"], "reason": reason,
                      "run_id": rid, "term": run["term"], "leader": run["leader"], "at": iso(run["claimed_us"]),
                      "entry_index": run["token"] // MAX_CLAIMS_PER_ENTRY, "_key": run["slot_us"]})
    for n in list(state.notes.get(name) or []):
        key = n.get("first_us", n["at_us"])
        if since_us is not None and n.get("last_us", n["at_us"]) < since_us:
            continue
        if "count" in n:
            reason = (f"{n['count']} slots from {iso(n['first_us'])} to {iso(n['last_us'])}: {n.get('reason')}")
            slot = iso(n["first_us"])
        else:
            reason, slot = str(n.get("reason")), None
        items.append({"slot": slot, "decision": n["decision"], "status": n["decision"], "reason": reason,
                      "run_id": None, "term": None, "leader": None, "at": iso(n["at_us"]), "entry_index": None,
                      "_key": key})
    items.sort(key=lambda i: i.pop("_key"), reverse=True)
    return items
