"""Alert rules: which ledger changes raise an alert, decided inside ``apply``.

Alerts are records of the replicated state, created by the same deterministic
transitions that change the ledger, so every replica holds the same pending
alerts. Only the leader delivers them (``scheduler.alert_sender``) and commits
each delivery's outcome; a new leader finds the undelivered ones and sends
them, and none is created twice because its creation is an applied entry.

One alert per state change, not one per run:

- ``failure``: the job's consecutive failures reach ``after_failures`` (once a streak);
- ``recovery``: the first success after an alerted failure streak;
- ``missed``: slots recorded missed by one decision (one alert, with the count);
- ``dead``: an attempt became a dead letter;
- ``late``: an attempt started more than ``late_after`` after its slot;
- ``duration``: a success took over 3x (or under a third of) the median of
  the job's last successful runs (at least 5 of them);
- ``duplicate``: a slot's attempt started although an earlier attempt of the
  same slot had started too (it was lost, maybe while still running), so the
  side effect may have happened twice.

Cluster-level alerts belong to no job (``job`` is None) and go to the agent's
default webhook, whatever any job asks for:

- ``clock_skew``: a node's clock went beyond ``--max-clock-skew`` from the
  leader's (or the leader's from a majority of its followers');
- ``clock_skew_recovered``: it came back within.

``unplannable`` belongs to a job but is raised whatever its ``alerts.on`` says, to its
webhook or else the agent's: the leader cannot plan the job, so none of its slots is decided
(nothing else would tell, as no run fails).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from .model import Policy
from .runs import RunRecord, RunStatus
from .sections import AlertEvent
from .store import Store

__all__ = ["raise_alert", "raise_cluster_alert", "on_unplannable", "on_finished", "on_missed", "on_dead", "on_started", "MAX_KEPT", "MAX_ATTEMPTS"]

MAX_KEPT = 1000  # delivered or given-up alerts kept; pending ones are never dropped
MAX_ATTEMPTS = 8


def _wants(state: Store, job_name: str, event: AlertEvent) -> bool:
    policy = state.policy(job_name)
    return policy is not None and event in policy.alerts.on


def raise_alert(state: Store, event: AlertEvent, run: RunRecord | None, job: str, at_us: int, **extra: Any) -> None:
    if not _wants(state, job, event):
        return
    state.alert_seq += 1
    aid = f"a{state.alert_seq:x}"
    state.alerts[aid] = {
        "id": aid, "event": event, "job": job, "run_id": run["id"] if run else None,
        "slot_us": run["slot_us"] if run else extra.get("first_us"), "run_status": run["status"] if run else None,
        "error": (run["error"] if run else None) or extra.get("error"), "attempt": run["attempt"] if run else None,
        "node": run["node"] if run else None, "created_us": at_us, "status": "pending", "attempts": 0,
        "next_us": at_us, "last_error": None, "delivered_us": None, "extra": extra,
    }
    _trim(state)


def raise_cluster_alert(state: Store, event: str, at_us: int, *, node: str, error: str | None = None,
                        **extra: Any) -> None:
    """An alert about the cluster rather than a job: no job, run or slot; ``node`` is the one concerned."""
    state.alert_seq += 1
    aid = f"a{state.alert_seq:x}"
    state.alerts[aid] = {
        "id": aid, "event": event, "job": None, "run_id": None, "slot_us": None, "run_status": None,
        "error": error, "attempt": None, "node": node, "created_us": at_us, "status": "pending", "attempts": 0,
        "next_us": at_us, "last_error": None, "delivered_us": None, "extra": extra,
    }
    _trim(state)


def on_unplannable(state: Store, job: str, error: str, at_us: int, *, node: str) -> None:
    state.alert_seq += 1
    aid = f"a{state.alert_seq:x}"
    state.alerts[aid] = {
        "id": aid, "event": "unplannable", "job": job, "run_id": None, "slot_us": None, "run_status": None,
        "error": error, "attempt": None, "node": node, "created_us": at_us, "status": "pending", "attempts": 0,
        "next_us": at_us, "last_error": None, "delivered_us": None, "extra": {},
    }
    _trim(state)


def _trim(state: Store) -> None:
    done = [a for a, rec in state.alerts.items() if rec["status"] != "pending"]
    for aid in done[: max(0, len(done) - MAX_KEPT)]:
        del state.alerts[aid]


def on_finished(state: Store, run: RunRecord, rec: dict[str, Any], at_us: int, policy: Policy | None) -> dict[str, Any]:
    """After a finish changed ``run``; returns the job record's alert fields updated. ``rec`` is
    a copy the caller made of the job's record (returned as it is when no alert field changes);
    ``policy``: the job's (``Store.policy``)."""
    if policy is None:
        return rec
    alerted = bool(rec.get("failure_alerted"))
    if run["status"] == "succeeded":
        if alerted:
            raise_alert(state, AlertEvent.RECOVERY, run, run["job"], at_us)
        if AlertEvent.DURATION in policy.alerts.on:  # it reads the job's history: only when asked for
            _duration_check(state, run, at_us)
        if "failure_alerted" in rec:
            # Not alerted is the field's absence. Kept as False it was a record's 11th field, which
            # doubles a dict's table: 464 bytes a job record against 272 (~19 MB at 100,000 jobs).
            # Records written so, and snapshots holding them, lose it at their job's next success.
            return {k: v for k, v in rec.items() if k != "failure_alerted"}
        return rec  # a copy the caller made: the same keys, in the same order, as another would have
    if rec["consecutive_failures"] == policy.alerts.after_failures and not alerted:
        raise_alert(state, AlertEvent.FAILURE, run, run["job"], at_us, consecutive_failures=rec["consecutive_failures"])
        return {**rec, "failure_alerted": True}
    return rec


_SUCCEEDED = frozenset({RunStatus.SUCCEEDED.value})


def _duration_check(state: Store, run: RunRecord, at_us: int) -> None:
    if run["started_us"] is None or run["finished_us"] is None:
        return
    took = run["finished_us"] - run["started_us"]
    past = []
    for r in state.runs.newest_of(run["job"], statuses=_SUCCEEDED):
        if (r["id"] == run["id"] or r["status"] != "succeeded" or r["started_us"] is None
                or r["finished_us"] is None):  # a success always has both; the check is for mypy
            continue
        past.append(r["finished_us"] - r["started_us"])
        if len(past) == 20:
            break
    if len(past) < 5:
        return
    typical = median(past)
    if typical > 0 and (took > 3 * typical or took * 3 < typical) and abs(took - typical) > 1_000_000:
        raise_alert(state, AlertEvent.DURATION, run, run["job"], at_us, duration_ms=took // 1000,
                    typical_ms=int(typical) // 1000)


def on_missed(state: Store, job: str, count: int, first_us: int, last_us: int, at_us: int) -> None:
    raise_alert(state, AlertEvent.MISSED, None, job, at_us, count=count, first_us=first_us, last_us=last_us,
                error=f"{count} slot(s) missed while no leader could dispatch")


def on_dead(state: Store, run: RunRecord, at_us: int) -> None:
    raise_alert(state, AlertEvent.DEAD, run, run["job"], at_us)


def on_started(state: Store, run: RunRecord, at_us: int) -> None:
    policy = state.policy(run["job"])
    if policy is None or run["started_us"] is None:
        return
    late = run["started_us"] - run["slot_us"]
    if late > policy.alerts.late_after * 1_000_000:
        raise_alert(state, AlertEvent.LATE, run, run["job"], at_us, late_ms=late // 1000)
    prev_id = run["retry_of"]
    while prev_id:
        prev = state.runs.get(prev_id)
        if prev is None:
            break
        if prev["started_us"] is not None and prev["status"] in ("lost", "dead"):
            raise_alert(state, AlertEvent.DUPLICATE, run, run["job"], at_us, earlier_run=prev_id)
            break
        prev_id = prev["retry_of"]
