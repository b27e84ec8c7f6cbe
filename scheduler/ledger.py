"""Run-ledger transitions, called only from ``State.apply`` (deterministic, never raising).

A run record is one attempt of one slot. Records are replaced, never mutated
in place. Statuses (SPEC section 2):

    claimed -> running -> succeeded | failed | timed_out | retrying | dead
    claimed | running -> lost (lease expired / node restarted) -> retried or final
    claimed | running | retrying | lost -> cancelled
    skipped | missed | failed: recorded straight from a claim, never dispatched

Invariant 2 lives in ``_admissible``: a schedule or catch-up slot at or before
the job's last decided slot is refused, so however many leaders propose, each
slot is decided once. A slot at or before ``spec_since_us`` (the instant the
job's schedule in force began: its creation, or the last edit of a schedule
field) is refused too, so no slot of an edited schedule from before the edit
is ever recorded, run or alerted, whatever plan a leader proposes.

Reports are idempotent: a ``StartRuns``, ``RenewLeases`` or ``FinishRuns``
naming an attempt this node holds and that is already in that state or past it
changes nothing and is listed under ``already``; ``stale`` is kept for attempts
the node no longer holds (cancelled, lost, another node's), which the worker
stops. The fencing token is ``index * 65536 + position``: the
log index of the claiming entry and the claim's place in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import alerts
from .commands import (
    CancelRun,
    Claim,
    ClaimSlots,
    DeleteDeadLetter,
    FinishRuns,
    NoteNextSlots,
    Rejected,
    RenewLeases,
    StartRuns,
)
from .model import Policy, stored_depends_on
from .planner import PLAN_EPOCH, next_slot_kept, walk_from_us
from .runs import ACTIVE, AWAITING_RETRY, CLAIM_STATUSES, HELD, SCHEDULED, TERMINAL, LateResult, RunRecord
from .runtable import run_id_of
from .sections import Delivery, DependsOn, DependsOnCondition
from .store import Store

__all__ = [
    "claim", "start", "renew", "finish", "expire", "cancel", "delete_dead", "withdraw_claims", "trim",
    "drop_history", "expire_history", "note_next", "token_of", "run_id_of", "ACTIVE", "TERMINAL", "LOSS_ATTEMPTS",
]

MAX_CLAIMS_PER_ENTRY = 65536
OUTPUT_CAP = 8192
"""Bytes of output kept per run; the executors cap at the same size (a test holds them equal).
Not imported from scheduler.executors, which would pull sockets into the pure state machine."""
LOSS_ATTEMPTS = 5
"""Under at-least-once a lost attempt is retried until this many attempts (or retries.max + 1 if larger)."""


def token_of(index: int, position: int) -> int:
    return index * MAX_CLAIMS_PER_ENTRY + position


# ---- claims ----------------------------------------------------------------


def claim(state: Store, cmd: ClaimSlots, index: int) -> dict[str, Any]:
    created: list[RunRecord] = []
    refused: list[dict[str, Any]] = []
    # Taken before the claims below move last_slot_us: a plan's summary covers slots older
    # than its own claims, in the same entry.
    bad = {i: why for i, s in enumerate(cmd.summaries) if (why := _summary_problem(s)) is not None}
    floors = {s.get("job", ""): _floor(state.jobs.get(s.get("job", ""))) for i, s in enumerate(cmd.summaries)
              if i not in bad}
    fanned: set[tuple[str, Any]] = set()  # target.count > 1: one slot (or request), several nodes, one entry
    for pos, c in enumerate(cmd.claims[:MAX_CLAIMS_PER_ENTRY]):
        why = _admissible(state, c, fanned, cmd.at_us)
        if why is not None:
            refused.append({"job": c.job, "slot_us": c.slot_us, "trigger": c.trigger, "reason": why})
            continue
        token = token_of(index, pos)
        run: RunRecord = {
            "id": run_id_of(token), "job": c.job, "slot_us": c.slot_us, "attempt": c.attempt,
            "trigger": c.trigger, "status": c.status, "node": c.node if c.status == "claimed" else None,
            "claimed_us": cmd.at_us, "started_us": None, "finished_us": None, "lease_us": None,
            "exit_code": None, "http_status": None, "output": "", "error": c.reason,
            "token": token, "term": cmd.term, "leader": cmd.leader, "retry_of": c.retry_of,
            "next": None, "cause": _cause_of(c), "retry_at_us": None, "outcome": None,
            "not_before_us": c.not_before_us,
        }
        _record(state, run, c)
        if c.trigger in SCHEDULED:
            fanned.add((c.job, c.slot_us))
        elif c.trigger == "manual" and c.request_key:
            fanned.add(("manual", c.request_key))
        created.append(run)
    cancelled = [rid for rid in cmd.cancel if _cancel_one(state, rid, cmd.at_us, "replaced by a newer slot")]
    for job in dict.fromkeys(state.runs[rid]["job"] for rid in cancelled):
        trim(state, job)
    summaries = []
    for i, s in enumerate(cmd.summaries):
        if i in bad:
            named = s.get("job")
            refused.append({"job": named if type(named) is str else "", "slot_us": s.get("first_us"),
                            "trigger": "summary", "reason": bad[i]})
            continue
        floor = floors.get(s.get("job", ""))
        since = (state.jobs.get(s.get("job", "")) or {}).get("spec_since_us")
        if floor is not None and (s["first_us"] <= floor or (since is not None and cmd.at_us < since)):
            # A plan made before an edit or another leader's decision: those slots are
            # decided already, or precede the schedule in force. Counting them would be a
            # second decision (or a missed alert for slots the new schedule never had).
            refused.append({"job": s.get("job"), "slot_us": s["first_us"], "trigger": "summary",
                            "reason": "slots already decided or before the job's schedule"})
            continue
        _summarise(state, s, cmd.at_us)
        summaries.append(s)
    _alert_missed(state, created, summaries, cmd.at_us)
    return {"runs": created, "refused": refused, "cancelled": cancelled}


_SUMMARISED = frozenset(("missed", "skipped"))
_I64 = 1 << 63


def _summary_problem(s: dict[str, Any]) -> str | None:
    """Why a plan's summary of slots cannot be recorded, or None. Its count goes into the job's
    record (``missed_total``) and, with its instants and reason, into the job's notes, both of
    which every snapshot packs: a count msgpack cannot hold (``1e30`` made an integer past 64
    bits) made every later snapshot fail. A leader writes none such; refused as a claim is."""
    job, count, first, last, reason = s.get("job"), s.get("count"), s.get("first_us"), s.get("last_us"), s.get("reason")
    if type(job) is not str:
        return "summary: job is not a name"
    if s.get("status") not in _SUMMARISED:
        return f"summary: status {s.get('status')!r} is not missed or skipped"
    if type(count) is not int or not 0 < count < _I64:
        return f"summary: count {count!r} is not a positive 64-bit integer"
    if type(first) is not int or type(last) is not int or not -_I64 <= first <= last < _I64:
        return "summary: first_us and last_us are not 64-bit instants in order"
    if reason is not None and type(reason) is not str:
        return "summary: reason is not text"
    return None


def note_next(state: Store, cmd: NoteNextSlots) -> dict[str, int]:
    """Keep each job's next slot as a leader walked it, if it is still the same job (created
    when the leader's was), at the version it planned, and its walk now starts where the
    leader's ended; anything else the leader planned against no longer holds, and is dropped."""
    kept = 0
    instants: dict[int | None, int | None] = {}  # each slot instant of this entry, one object
    for n in cmd.slots:
        name, version, created = n.get("job"), n.get("version"), n.get("created_us")
        walked, slot, epoch = n.get("from_us"), n.get("slot_us"), n.get("epoch")
        if not isinstance(name, str) or (rec := state.jobs.get(name)) is None or not isinstance(epoch, str):
            continue
        if type(version) is not int or type(created) is not int or type(walked) is not int \
                or not (slot is None or type(slot) is int):
            continue
        walks_from = walk_from_us(rec)
        if rec["version"] != version or rec["created_us"] != created or walks_from != walked:
            continue
        # The record kept holds equal values, but the objects the job's record already holds, one
        # object per slot instant of the entry, and the planner's epoch: the item's own, decoded
        # from the entry for each job, cost ~150 bytes a job (an epoch string and three instants
        # past 2**30), kept as long as the job is.
        record = next_slot_kept(PLAN_EPOCH if epoch == PLAN_EPOCH else epoch, rec["version"], rec["created_us"],
                                walks_from, instants.setdefault(slot, slot))
        if rec.get("next_slot") != record:
            state.jobs[name] = {**rec, "next_slot": record}
            kept += 1
    return {"kept": kept}


def _floor(rec: dict[str, Any] | None) -> int | None:
    """The instant at or before which no schedule or catch-up slot of the job can be decided."""
    if rec is None:
        return None
    last, since = rec["last_slot_us"], rec.get("spec_since_us")
    if last is None:
        return None if since is None else int(since)
    return int(last) if since is None else max(int(last), int(since))


def _alert_missed(state: Store, created: list[RunRecord], summaries: list[dict[str, Any]], at_us: int) -> None:
    """One missed alert per job per decision, however many slots it covers."""
    spans: dict[str, tuple[int, int, int]] = {}
    for run in created:
        if run["status"] == "missed":
            n, lo, hi = spans.get(run["job"], (0, run["slot_us"], run["slot_us"]))
            spans[run["job"]] = (n + 1, min(lo, run["slot_us"]), max(hi, run["slot_us"]))
    for s in summaries:
        if s.get("status") == "missed" and s.get("job") in state.jobs:
            n, lo, hi = spans.get(s["job"], (0, s["first_us"], s["last_us"]))
            spans[s["job"]] = (n + int(s["count"]), min(lo, s["first_us"]), max(hi, s["last_us"]))
    for job, (n, lo, hi) in spans.items():
        alerts.on_missed(state, job, n, lo, hi, at_us)


def _admissible(state: Store, c: Claim, fanned: set[tuple[str, Any]], planned_us: int) -> str | None:
    rec = state.jobs.get(c.job)
    if rec is None:
        return "no such job"
    if c.status not in CLAIM_STATUSES:
        return f"a claim cannot record status {c.status!r}"
    if c.status == "claimed" and c.node not in state.nodes:
        return f"unknown node {c.node!r}"
    if c.trigger in SCHEDULED:
        last = rec["last_slot_us"]
        if last is not None and c.slot_us <= last and (c.job, c.slot_us) not in fanned:
            return "slot already decided"
        since = rec.get("spec_since_us")
        if since is not None and c.slot_us <= since:
            return "slot before the job's schedule in force (created or changed after it)"
        if since is not None and planned_us < since:
            # Planned from the job's previous schedule, committed after the edit: its slots
            # after the edit are the old schedule's, and deciding one would hide the new
            # schedule's slots before it. The next plan, from the new schedule, decides them.
            return "planned before the job's schedule changed"
        return None
    if c.trigger in ("retry", "replay"):
        prev = state.runs.get(c.retry_of or "")
        if prev is None or prev["job"] != c.job or prev["next"] is not None or prev["slot_us"] != c.slot_us:
            return "not the current attempt of its slot"
        if c.trigger == "retry" and (prev["status"] not in AWAITING_RETRY or prev["id"] not in state.active):
            return f"run {prev['id']} is {prev['status']}, not awaiting a retry"
        if c.trigger == "replay" and prev["id"] not in state.dead:
            return f"run {prev['id']} is not a dead letter"
        return None
    if c.trigger == "manual":
        if not c.request_key:
            return "a manual run needs a request key"
        if ("manual", c.request_key) in fanned:
            return None  # target.count > 1: the same request fanned out in this entry
        if any(r["cause"] == c.request_key for r in state.runs.newest_of(c.job, caused=True)):
            return "this manual request was already recorded"
        return None
    if c.trigger == "dependency":
        if f"{c.job}|{c.upstream}" not in state.pending_deps:
            return "no pending dependency trigger"
        return None
    return f"unknown trigger {c.trigger!r}"


def _cause_of(c: Claim) -> str | None:
    """What the run records as its ``cause``: the upstream run of a dependency claim, else the
    request key (a replayed entry written before the split decodes to the same, commands.py)."""
    return c.upstream if c.trigger == "dependency" else c.request_key


def _record(state: Store, run: RunRecord, c: Claim) -> None:
    rid, job = run["id"], run["job"]
    drop = None if c.retry_of else _dropped_by(state, job, run)
    # Listed under its job, in token order; the history it pushes out goes in the same step.
    trimmed = drop is not None and state.runs.append(rid, run, drop)
    if not trimmed:
        state.runs[rid] = run
    rec = state.jobs[job]
    if c.trigger in SCHEDULED:
        # max: a fan-out listed out of order ([s1, s2, s1]) must not move the job back to s1.
        last = rec["last_slot_us"]
        rec = {**rec, "last_slot_us": c.slot_us if last is None else max(last, c.slot_us)}
    if c.retry_of:
        prev = state.runs[c.retry_of]
        state.runs[c.retry_of] = {**prev, "next": rid}
        state.active.pop(c.retry_of, None)
        state.dead.pop(c.retry_of, None)
    if c.trigger == "dependency":
        state.pending_deps.pop(f"{c.job}|{c.upstream}", None)
    if run["status"] == "claimed":
        state.active[rid] = None
    elif run["status"] == "failed":
        rec = {**rec, "consecutive_failures": rec["consecutive_failures"] + 1}
    elif run["status"] == "missed":
        rec = {**rec, "missed_total": rec["missed_total"] + 1}  # summaries add their count
    state.put_record(job, rec)
    if not trimmed:
        trim(state, job)


def _dropped_by(state: Store, job: str, run: RunRecord) -> list[int] | None:
    """The tokens ``trim`` removes once the new record ``run`` is added (and, claimed, made an
    attempt in flight), read before it is: the oldest records beyond the job's ``history.keep``,
    attempts in flight and dead letters passed over. None when the new record would be one of
    them, or the job's policy cannot be read (``_record`` then adds it and trims as two steps,
    raising where it always did)."""
    try:
        keep = _keep(state.policy(job))
    except Exception:  # noqa: BLE001 - a document its policy cannot be read from: trim raises, after the record
        return None
    excess = state.runs.count_of(job) + 1 - keep
    if excess <= 0:
        return []
    doomed = _oldest_ended(state, job, excess)
    # Short of the excess, the walk would reach the new record: passed over if claimed (in flight).
    return doomed if len(doomed) == excess or run["status"] == "claimed" else None


def _summarise(state: Store, s: dict[str, Any], at_us: int) -> None:
    rec = state.jobs.get(s.get("job", ""))
    if rec is None:
        return
    last = rec["last_slot_us"]
    new_last = s["last_us"] if last is None else max(last, s["last_us"])
    missed = int(s["count"]) if s.get("status") == "missed" else 0
    state.jobs[s["job"]] = {**rec, "last_slot_us": new_last, "missed_total": rec["missed_total"] + missed}
    state.note(s["job"], {"at_us": at_us, "decision": s.get("status", "skipped"), "count": int(s["count"]),
                          "first_us": s["first_us"], "last_us": s["last_us"], "reason": s.get("reason")})


# ---- attempts --------------------------------------------------------------


def start(state: Store, cmd: StartRuns) -> dict[str, Any]:
    started, stale, already = [], [], []
    for rid in cmd.runs:
        run = state.runs.get(rid)
        if run is not None and run["node"] == cmd.node and run["status"] != "claimed" and _past_start(run):
            already.append(rid)  # a retried report whose first copy committed: carry on
            continue
        if run is None or run["status"] != "claimed" or run["node"] != cmd.node:
            stale.append(rid)
            continue
        new: RunRecord = {**run, "status": "running", "started_us": cmd.started_us.get(rid, cmd.at_us),
                          "lease_us": cmd.lease_until_us}
        state.runs[rid] = new
        alerts.on_started(state, new, cmd.at_us)
        started.append(rid)
    return {"started": started, "stale": stale, "already": already}


def _past_start(run: RunRecord) -> bool:
    """Running, or ended by its own node's result: the attempt its node holds went past a start.
    (A lost or cancelled attempt has no outcome: the ledger took it away.)"""
    return run["status"] == "running" or run["outcome"] is not None


def renew(state: Store, cmd: RenewLeases) -> dict[str, Any]:
    stale, already = [], []
    for rid in cmd.runs:
        run = state.runs.get(rid)
        if run is None or run["node"] != cmd.node:
            stale.append(rid)
        elif run["status"] == "running":
            if (run["lease_us"] or 0) < cmd.lease_until_us:
                state.runs[rid] = {**run, "lease_us": cmd.lease_until_us}
        elif run["status"] == "claimed" or run["outcome"] is not None:
            # Not started in the ledger yet (its start is on the way; the start deadline
            # still guards it) or ended by its own result: nothing to renew, nothing to stop.
            already.append(rid)
        else:
            stale.append(rid)
    return {"stale": stale, "already": already}


def finish(state: Store, cmd: FinishRuns) -> dict[str, Any]:
    finished, stale, already = [], [], []
    for r in cmd.results:
        rid = r.get("run_id", "")
        run = state.runs.get(rid)
        if run is None:
            stale.append(rid)
            continue
        if run["node"] == cmd.node and run["finished_us"] == r.get("finished_us") and run["outcome"] == r.get("status"):
            already.append(rid)  # the same result resubmitted after an unknown outcome: already recorded
            continue
        if run["status"] not in HELD or run["node"] != cmd.node:
            # Principle 5: a late result is recorded but decides nothing.
            late: LateResult = {"status": r.get("status"), "finished_us": r.get("finished_us")}
            state.runs[rid] = {**run, "late_result": late}
            stale.append(rid)
            continue
        finished.append(_finish_one(state, run, r, cmd.at_us))
    return {"finished": finished, "stale": stale, "already": already}


def _finish_one(state: Store, run: RunRecord, r: dict[str, Any], at_us: int) -> RunRecord:
    policy = state.policy(run["job"])
    rec = state.jobs[run["job"]]
    outcome = str(r.get("status"))
    started = run["started_us"] or r.get("started_us") or run["claimed_us"]
    finished = int(r.get("finished_us") or started)
    new: RunRecord = {
        **run, "started_us": started, "finished_us": finished, "exit_code": r.get("exit_code"),
        "http_status": r.get("http_status"), "output": _cap(r.get("output") or ""), "error": r.get("error"),
        "outcome": outcome, "lease_us": None,
    }
    if run["status"] == "claimed" and r.get("started_us") is not None:
        alerts.on_started(state, new, at_us)  # finished before its start was reported
    failures = rec["consecutive_failures"]
    if outcome == "succeeded":
        new["status"], failures = "succeeded", 0
    else:
        failures += 1
        retries = policy.retries if policy is not None else None
        if retries is not None and run["attempt"] <= retries.max:
            delay = retries.delay(run["attempt"])
            new["status"], new["retry_at_us"] = "retrying", finished + int(delay * 1_000_000)
        elif retries is not None and retries.max > 0:
            new["status"] = "dead"
            state.dead[run["id"]] = None
        else:
            new["status"] = "timed_out" if outcome == "timed_out" else "failed"
    state.runs[run["id"]] = new
    if new["status"] != "retrying":
        state.active.pop(run["id"], None)
        _trigger_dependents(state, new)
    rec = alerts.on_finished(state, new, {**rec, "consecutive_failures": failures}, at_us, policy)
    if new["status"] == "dead":
        alerts.on_dead(state, new, at_us)
    state.put_record(run["job"], rec)
    trim(state, run["job"], _keep(policy))  # an attempt that ended no longer holds history open
    return new


def _depends_on(state: Store, name: str) -> DependsOn | None:
    """``name``'s ``depends_on``, read from its stored document alone: after a restore nothing
    is parsed, and the first finished run of each upstream parsed every one of its dependents
    whole."""
    rec = state.jobs.get(name)
    return None if rec is None else stored_depends_on(rec["spec"], name)


def _trigger_dependents(state: Store, run: RunRecord) -> None:
    ok = run["status"] == "succeeded"
    for name in state.dependents_of(run["job"]):
        dep = _depends_on(state, name)
        if dep is None or dep.job != run["job"]:
            continue
        if dep.on is DependsOnCondition.ANY or (dep.on is DependsOnCondition.SUCCESS) == ok:
            state.pending_deps[f"{name}|{run['id']}"] = {"job": name, "upstream": run["id"], "slot_us": run["slot_us"]}


def expire(state: Store, run_ids: tuple[str, ...], at_us: int, reason: str, node: str | None,
           seen: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Take the attempts away from their nodes: retried (at-least-once, attempts left) or ended.

    ``seen`` (``ExpireRuns.seen``): the lease the leader saw lapse per run, 0 for a claim not
    started. A run whose lease is now later was started or renewed after the leader looked,
    by a node that is running it: it is kept (``kept``)."""
    lost: list[RunRecord] = []
    kept: list[str] = []
    for rid in run_ids:
        run = state.runs.get(rid)
        if run is None or run["status"] not in HELD or (node is not None and run["node"] != node):
            continue
        if seen and rid in seen and run["status"] == "running" and (run["lease_us"] or 0) > seen[rid]:
            kept.append(rid)
            continue
        policy = state.policy(run["job"])
        new: RunRecord = {**run, "status": "lost", "error": reason, "finished_us": at_us, "lease_us": None}
        at_least_once = policy is not None and policy.delivery is Delivery.AT_LEAST_ONCE
        limit = max(LOSS_ATTEMPTS, (policy.retries.max + 1) if policy is not None else 1)
        if at_least_once and run["attempt"] < limit:
            new["retry_at_us"] = at_us
        else:
            state.active.pop(rid, None)
            if at_least_once:
                new["status"] = "dead"
                new["error"] = f"{reason}; gave up after {run['attempt']} attempts"
                state.dead[rid] = None
        state.runs[rid] = new
        if rid not in state.active:
            _final_loss(state, new, at_us)
        trim(state, run["job"])
        lost.append(new)
    return {"lost": lost, "kept": kept}


def _final_loss(state: Store, run: RunRecord, at_us: int) -> None:
    """A loss nobody retries ends the slot as a failure: counted, alerted, dependents told."""
    rec = state.jobs.get(run["job"])
    if rec is None:
        return
    rec = {**rec, "consecutive_failures": rec["consecutive_failures"] + 1}
    state.put_record(run["job"], alerts.on_finished(state, run, rec, at_us, state.policy(run["job"])))
    if run["status"] == "dead":
        alerts.on_dead(state, run, at_us)
    _trigger_dependents(state, run)


def cancel(state: Store, cmd: CancelRun) -> Any:
    run = state.runs.get(cmd.run_id)
    if run is None:
        return Rejected("not_found", f"no run with id {cmd.run_id!r}")
    if not _cancel_one(state, cmd.run_id, cmd.at_us, cmd.reason):
        return Rejected("conflict", f"run {cmd.run_id} is {run['status']}; only claimed, running or retrying runs can be cancelled")
    new = state.runs[cmd.run_id]
    trim(state, new["job"])
    return {"cancelled": new}


def _cancel_one(state: Store, rid: str, at_us: int, reason: str) -> bool:
    run = state.runs.get(rid)
    if run is None or rid not in state.active:
        return False
    state.active.pop(rid, None)
    state.runs[rid] = {**run, "status": "cancelled", "error": reason, "finished_us": at_us, "lease_us": None}
    return True  # the caller trims history once it no longer needs the record


def delete_dead(state: Store, cmd: DeleteDeadLetter) -> Any:
    if cmd.run_id not in state.dead:
        return Rejected("not_found", f"no dead letter with id {cmd.run_id!r}")
    del state.dead[cmd.run_id]
    state.runs[cmd.run_id] = {**state.runs[cmd.run_id], "dead_deleted": True}
    trim(state, state.runs[cmd.run_id]["job"])
    return {"deleted": cmd.run_id}


def withdraw_claims(state: Store, job: str, at_us: int, reason: str) -> list[str]:
    """A job whose schedule, pause state or placement changed at ``at_us``: its schedule and
    catch-up attempts claimed ahead for slots after ``at_us`` and not started are withdrawn
    (recorded ``cancelled`` with ``reason``). Returns their ids.

    Withdrawn, not handed to the new spec: each stays its slot's one record, and the job's
    last decided slot is never lowered, so neither the new spec nor a later resume decides
    that slot again (invariant 2). The cost is that an edit inside the claim horizon (a few
    seconds) of a slot the new spec also has leaves that slot cancelled rather than run.
    Attempts already started, and slots recorded failed or skipped, stand as decided.
    """
    cancelled = [
        rid for rid in list(state.job_runs.get(job, ()))  # this job's history only, never every run
        if rid in state.active and (run := state.runs[rid])["status"] == "claimed"
        and run["trigger"] in SCHEDULED and run["slot_us"] > at_us
        and _cancel_one(state, rid, at_us, reason)
    ]
    trim(state, job)  # the new spec may keep less history
    return cancelled


def drop_history(state: Store, job: str) -> int:
    ids = state.runs.drop_job(job)
    for rid in ids:
        state.active.pop(rid, None)
        state.dead.pop(rid, None)
    return len(ids)


def expire_history(state: Store, job_name: str, cutoff_us: int) -> int:
    """Drop the job's oldest records whose attempt ended before ``cutoff_us`` (``history.max_age``).

    Oldest first, up to the first record that ended at or after the cutoff: a sweep costs
    the records it drops, not the job's whole history. Attempts in flight and dead letters
    are kept (and passed over) whatever their age. Returns how many records went."""
    doomed: list[int] = []
    for token in state.runs.tokens_of(job_name):
        rid = run_id_of(token)
        if rid in state.active or rid in state.dead:
            continue
        run = state.runs.get(rid)
        if run is not None and _ended_us(run) >= cutoff_us:
            break
        doomed.append(token)
    return state.runs.remove(job_name, doomed)  # in one step, however many


def _ended_us(run: RunRecord) -> int:
    """When an attempt ended; a slot decided without running ended when it was decided."""
    finished = run["finished_us"]
    return finished if finished is not None else run["claimed_us"]


def trim(state: Store, job_name: str, keep: int | None = None) -> None:
    """Principle 7: history per job is bounded; live attempts and dead letters are kept.
    ``keep``: the job's ``history.keep`` when the caller has read it (``_keep``)."""
    if keep is None:
        keep = _keep(state.policy(job_name))
    excess = state.runs.count_of(job_name) - keep
    if excess > 0:
        state.runs.remove(job_name, _oldest_ended(state, job_name, excess))  # in one step


def _oldest_ended(state: Store, job: str, most: int) -> list[int]:
    """Up to ``most`` of the job's tokens, oldest first, live attempts and dead letters passed over:
    what ``trim`` removes."""
    doomed: list[int] = []
    active, dead = state.active, state.dead
    for token in state.runs.tokens_of(job):
        if len(doomed) >= most:
            break
        rid = run_id_of(token)
        if rid not in active and rid not in dead:
            doomed.append(token)
    return doomed


def _keep(policy: Policy | None) -> int:
    """How many records a job keeps (``history.keep``; 100 for a job that is gone)."""
    return policy.keep if policy is not None else 100


def _cap(text: str) -> str:
    raw = text.encode("utf-8", "replace")
    if len(raw) <= OUTPUT_CAP:
        return text
    return raw[-OUTPUT_CAP:].decode("utf-8", "ignore")
