"""Pure planning: (state, now) -> decisions. No clock, no I/O, no asyncio.

The leader calls these each tick and commits what they return. The state is
read the way the event loop must read it while the raft thread applies:
single lookups of never-mutated records, and ``list(...)`` copies (one C call,
atomic under the GIL) before iterating.

Decisions per job, walking its slots from the last decided one, or from the
instant the job's schedule in force began (``spec_since_us``: its creation or
the last edit of a schedule field, pause and resume included), whichever is
later (invariant 6). An edit never reaches back: slots of the new schedule
before the edit are not run, caught up, skipped or missed.

- a slot due within the claim horizon is claimed ahead (trigger ``schedule``)
  for ``concurrency: allow`` jobs; ``forbid`` and ``replace`` jobs are decided
  only once the slot is due, since whether the previous run is still going
  is only known then;
- a slot older than ``late_grace`` was not dispatched in time (no leader):
  inside the catch-up window it is run (``all``; ``latest``: only the newest)
  or skipped (``none``), beyond the window it is ``missed``;
- a paused job's slots are ``skipped``;
- long stretches (a day of an every-second job) are summarised: the newest
  ``max_records`` slots get a record each, the rest one summary.
"""

from __future__ import annotations

import importlib
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict

from .commands import Claim
from .instants import from_us, us
from .model import Job
from .runs import AWAITING_RETRY, BUSY, RunRecord, StatusName, TriggerName
from .sections import CatchupPolicy, Concurrency, ExecutorKind

__all__ = ["NodeInfo", "PlanConfig", "JobPlan", "Picker", "plan_job", "walk_from_us", "next_slot_us", "upcoming", "due_retries",
           "expired_runs", "dependency_claims", "fire_at_us"]

_ONE_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    tags: dict[str, str]
    allow_shell: bool
    live: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    horizon_us: int = 2_000_000
    late_grace_us: int = 2_000_000
    max_walk: int = 5_000  # slots walked per job per tick; the rest next tick
    max_records: int = 50  # individual missed/skipped records per stretch
    start_deadline_us: int = 10_000_000  # a claim not started this long after its slot is lost
    lease_grace_us: int = 2_000_000


@dataclass(slots=True)
class JobPlan:
    claims: list[Claim] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    next_due_us: int | None = None  # when this job next needs the planner
    # The walk's end, when it ended at the schedule's next slot beyond the horizon (not cut by
    # max_walk): (walked to, that slot or None when the schedule has no more). Once this plan's
    # decisions are applied the job's walk starts at ``walked to``, and its next slot is known
    # to every later leader (``NoteNextSlots``, ``known_next_slot``).
    walk_end: tuple[int, int | None] | None = None


# The leader is picked only when every other fitting node holds this many more attempts
# in flight (claimed ahead or running) than it does. Below that, which at 100 runs/s on
# three nodes is always, the leader claims nothing for itself, so a dead leader takes no
# claimed attempt with it and nothing waits for a lease. Above it the leader takes its
# share: with none at all, 2,000 runs/s on two cores starved the two followers until
# they missed heartbeats (bench/README.md).
LEADER_MARGIN = 300


class Picker:
    """Chooses executor nodes: matching tags, live, shell-capable when needed, not the
    one to avoid (a retry's failed node), least loaded, with the leader handicapped by
    ``spare_margin`` attempts."""

    def __init__(self, nodes: Iterable[NodeInfo], load: dict[str, int], spare: str | None = None,
                 spare_margin: int = LEADER_MARGIN) -> None:
        self._nodes = sorted(nodes, key=lambda n: n.node_id)
        self._load = dict(load)
        self._spare = spare
        self._margin = spare_margin

    def pick(self, job: Job, avoid: str | None = None, count: int = 1) -> tuple[list[str], str | None]:
        want = dict(job.target.tags)
        shell = job.executor is ExecutorKind.SHELL
        fit = [n for n in self._nodes if n.live and all(n.tags.get(k) == v for k, v in want.items())]
        if not fit:
            return [], f"no live node matches target tags {want}" if want else "no live node"
        if shell:
            fit = [n for n in fit if n.allow_shell]
            if not fit:
                return [], "no live node allows shell jobs (start one with --allow-shell)"
        fit.sort(key=lambda n: (n.node_id == avoid, self._load.get(n.node_id, 0) + (self._margin if n.node_id == self._spare else 0),
                                n.node_id))
        chosen = [n.node_id for n in fit[:count]]
        for nid in chosen:
            self._load[nid] = self._load.get(nid, 0) + 1
        return chosen, None


def next_slot_us(job: Job, anchor_us: int, after_us: int) -> int | None:
    """The first slot of ``job`` strictly after ``after_us``, inside starts_at/ends_at."""
    slots = upcoming(job, anchor_us, after_us, 1)
    return us(slots[0]) if slots else None


def upcoming(job: Job, anchor_us: int, after_us: int, count: int) -> list[datetime]:
    """The next ``count`` slots of ``job`` strictly after ``after_us``, inside starts_at/ends_at
    (fewer if the schedule ends first)."""
    after = from_us(after_us)
    if job.starts_at is not None and after < job.starts_at:
        after = job.starts_at - _ONE_US
    anchor, tz = from_us(anchor_us), job.tz
    out: list[datetime] = []
    while len(out) < count:
        slot = job.schedule.next_after(after, tz, anchor)
        if slot is None or (job.ends_at is not None and slot > job.ends_at):
            break
        out.append(slot)
        after = slot
    return out


def decides_ahead(job: Job) -> bool:
    """Slots of this job are claimed a horizon ahead (concurrency forbid / replace and
    paused jobs are decided when due: what is in flight then decides)."""
    return job.concurrency is Concurrency.ALLOW and not job.paused


def _tz_version() -> str:
    """The IANA time zone release this process reads (zoneinfo's first source), or ''."""
    for root in zoneinfo.TZPATH:
        try:
            with open(f"{root}/tzdata.zi", encoding="ascii", errors="replace") as f:
                first = f.readline().split()
            if first[:2] == ["#", "version"] and len(first) > 2:
                return first[2]
        except OSError:
            continue
    try:
        return str(importlib.import_module("tzdata").IANA_VERSION)  # the package zoneinfo falls back on
    except (ImportError, AttributeError):
        return ""


_PLAN_CODE = "1"  # raised with any change to how slots are computed (schedule.py, upcoming)
PLAN_EPOCH = f"{_PLAN_CODE}/{_tz_version()}"
"""What a recorded next slot was computed by: a leader trusts only those of its own epoch, so a
release that computes slots differently, or a node reading another time zone release, plans
the job itself rather than wait for a slot another computation found."""


def known_next_slot(rec: dict[str, Any]) -> tuple[bool, int | None]:
    """(known, slot): the job's next slot as a leader recorded it (``NoteNextSlots``), if that
    record still holds: made for this very job (its creation instant), at its current version,
    from where its walk now starts, by a planner of this node's epoch. Any edit (a new version)
    or decision since (a new start of the walk) voids it."""
    kept = rec.get("next_slot")
    if not isinstance(kept, (list, tuple)) or len(kept) != 5:
        return False, None
    epoch, version, created, walked_to, slot = kept
    if epoch != PLAN_EPOCH or version != rec["version"] or created != rec["created_us"] \
            or walked_to != walk_from_us(rec):
        return False, None
    return True, slot


def next_slot_kept(epoch: str, version: int, created_us: int, from_us: int, slot_us: int | None) -> list[Any]:
    """The form a job's record keeps its next slot in (``next_slot``; ``known_next_slot`` reads it)."""
    return [epoch, version, created_us, from_us, slot_us]


def stored_next_slot(item: dict[str, Any]) -> list[Any]:
    """How a ``NoteNextSlots`` item is kept in the job's record (``next_slot``)."""
    return next_slot_kept(item["epoch"], item["version"], item["created_us"], item["from_us"], item["slot_us"])


def next_slot_record(rec: dict[str, Any], name: str, walked_to: int, slot: int | None) -> dict[str, Any]:
    """The ``NoteNextSlots`` item for a job planned from ``rec`` whose walk ended at ``walked_to``."""
    return {"job": name, "version": rec["version"], "created_us": rec["created_us"], "from_us": walked_to,
            "slot_us": slot, "epoch": PLAN_EPOCH}


def walk_from_us(rec: dict[str, Any]) -> int:
    """The instant after which the job's next undecided slot lies: its last decided slot or
    the start of its schedule in force, whichever is later (records from before
    ``spec_since_us`` existed count from their creation)."""
    since = rec.get("spec_since_us")
    start = int(rec["created_us"] if since is None else since)
    last = rec["last_slot_us"]
    return start if last is None else max(int(last), start)


def plan_job(job: Job, rec: dict[str, Any], active: list[RunRecord], now_us: int,
             cfg: PlanConfig, picker: Picker) -> JobPlan:
    """``active``: the job's attempts in flight; only forbid and replace read them."""
    plan = JobPlan()
    decide_ahead = decides_ahead(job)
    limit = now_us + (cfg.horizon_us if decide_ahead else 0)
    anchor = rec["created_us"]
    last = walk_from_us(rec)
    slots: list[int] = []
    cursor = last
    while len(slots) < cfg.max_walk:
        s = next_slot_us(job, anchor, cursor)
        if s is None or s > limit:
            plan.next_due_us = None if s is None else (s - cfg.horizon_us if decide_ahead else s)
            plan.walk_end = (cursor, s)
            break
        slots.append(s)
        cursor = s
    else:
        plan.next_due_us = now_us  # more to walk next tick
    if not slots:
        return plan
    late = [s for s in slots if s < now_us - cfg.late_grace_us]
    timely = slots[len(late):]
    if job.paused:
        _record(plan, job, slots, "skipped", "schedule", "the job is paused", cfg)
        return plan
    window_start = now_us - int(job.catchup.window * 1_000_000)
    beyond = [s for s in late if s < window_start]
    within = late[len(beyond):]
    _record(plan, job, beyond, "missed", "catchup",
            "no leader could dispatch it, and it is older than the catch-up window", cfg)
    policy = job.catchup.policy
    if policy is CatchupPolicy.ALL:
        run_late = within
    elif policy is CatchupPolicy.LATEST:
        run_late = within[-1:]
        _record(plan, job, within[:-1], "skipped", "catchup", "catch-up policy latest runs only the newest", cfg)
    else:
        run_late = []
        _record(plan, job, within, "skipped", "catchup", "catch-up policy none", cfg)
    busy: list[RunRecord | _ThisTick] = [r for r in active if r["status"] in BUSY]
    due: list[tuple[int, TriggerName]] = [(s, "catchup") for s in run_late] + [(s, "schedule") for s in timely]
    if job.concurrency is Concurrency.REPLACE and len(due) > 1:
        # Several slots due at once would replace each other in the same instant: run the newest.
        for s, trigger in due[:-1]:
            plan.claims.append(Claim(job=job.name, slot_us=s, trigger=trigger, status="skipped",
                                     reason="concurrency replace: a newer slot due at the same time replaces it"))
        due = due[-1:]
    for s, trigger in due:
        _dispatch(plan, job, s, trigger, busy, picker)
    return plan


def _dispatch(plan: JobPlan, job: Job, slot: int, trigger: TriggerName, busy: list[RunRecord | _ThisTick],
              picker: Picker) -> None:
    mode = job.concurrency
    if busy and mode is Concurrency.FORBID:
        plan.claims.append(Claim(job=job.name, slot_us=slot, trigger=trigger, status="skipped",
                                 reason=f"concurrency forbid: run {busy[0]['id']} is still {busy[0]['status']}"))
        return
    if busy and mode is Concurrency.REPLACE:
        plan.cancel.extend(r["id"] for r in busy if r["id"] not in plan.cancel and r["id"] != _THIS_TICK)
    nodes, why = picker.pick(job, count=job.target.count)
    if not nodes:
        plan.claims.append(Claim(job=job.name, slot_us=slot, trigger=trigger, status="failed", reason=why))
        return
    for n in nodes:
        plan.claims.append(Claim(job=job.name, slot_us=slot, trigger=trigger, node=n))
    if mode is not Concurrency.ALLOW:
        busy.append({"id": _THIS_TICK, "status": "claimed"})


_THIS_TICK = "(claimed in this decision)"


class _ThisTick(TypedDict):
    """A slot claimed earlier in the same decision, busy for forbid / replace like a record."""

    id: str
    status: StatusName


def _record(plan: JobPlan, job: Job, slots: list[int], status: StatusName, trigger: TriggerName, reason: str,
            cfg: PlanConfig) -> None:
    if not slots:
        return
    keep = min(cfg.max_records, job.history.keep)
    older, recent = slots[:-keep] if len(slots) > keep else [], slots[-keep:]
    if older:
        plan.summaries.append({"job": job.name, "status": status, "count": len(older),
                               "first_us": older[0], "last_us": older[-1], "reason": reason})
    for s in recent:
        plan.claims.append(Claim(job=job.name, slot_us=s, trigger=trigger, status=status, reason=reason))


def due_retries(runs: list[RunRecord], jobs: dict[str, Job], now_us: int, picker: Picker,
                horizon_us: int = 0, *, limit: int | None = None) -> list[Claim]:
    """Attempts waiting for a retry (failed with retries left, or lost under at-least-once).

    Like slots, retries are claimed up to ``horizon_us`` ahead and fired by the
    worker at their backoff instant (``not_before_us``). At most ``limit`` claims (the
    first in ``runs``' order); the rest are due again at the next call.
    """
    claims: list[Claim] = []
    for run in runs:
        if limit is not None and len(claims) >= limit:
            break
        if run["status"] not in AWAITING_RETRY or run["next"] is not None:
            continue
        if run["retry_at_us"] is None or run["retry_at_us"] > now_us + horizon_us:
            continue
        job = jobs.get(run["job"])
        if job is None:
            continue
        nodes, why = picker.pick(job, avoid=run["node"])
        base: dict[str, Any] = dict(job=run["job"], slot_us=run["slot_us"], trigger="retry",
                                    attempt=run["attempt"] + 1, retry_of=run["id"],
                                    not_before_us=max(run["retry_at_us"], run["slot_us"]))
        if nodes:
            claims.append(Claim(node=nodes[0], **base))
        else:
            claims.append(Claim(status="failed", reason=why, **base))
    return claims


def expired_runs(runs: list[RunRecord], now_us: int, cfg: PlanConfig,
                 live: set[str] | None = None) -> list[str]:
    """Invariant 4: a lease lapsed by the leader's clock plus a grace, or a claim never started.

    A claim whose node the leader cannot reach is given up once its instant is a grace
    past, not a whole start deadline: the slots a dead leader had claimed ahead for
    itself are retried within seconds. (A node the leader cannot reach cannot commit
    its start or renew a lease either, so nothing it does is waited for.)
    """
    out = []
    for run in runs:
        if run["status"] == "running" and run["lease_us"] is not None:
            if run["lease_us"] + cfg.lease_grace_us < now_us:
                out.append(run["id"])
        elif run["status"] == "claimed":
            # From the claim, not the slot: a retry, catch-up or replay stands for an old slot and
            # would otherwise be expired before its worker could report the start.
            due = max(fire_at_us(run), run["claimed_us"])
            unreachable = live is not None and run["node"] not in live
            if due + (cfg.lease_grace_us if unreachable else cfg.start_deadline_us) < now_us:
                out.append(run["id"])
    return out


def fire_at_us(run: RunRecord) -> int:
    """When a claimed attempt is due to start: its slot, or its retry's backoff instant."""
    return int(max(run["slot_us"], run.get("not_before_us") or 0))


def dependency_claims(pending: list[dict[str, Any]], jobs: dict[str, Job], picker: Picker) -> list[Claim]:
    claims = []
    for dep in pending:
        job = jobs.get(dep["job"])
        if job is None:
            continue
        base = dict(job=dep["job"], slot_us=dep["slot_us"], trigger="dependency", upstream=dep["upstream"])
        if job.paused:
            claims.append(Claim(status="skipped", reason="the job is paused", **base))
            continue
        nodes, why = picker.pick(job)
        if nodes:
            claims.append(Claim(node=nodes[0], **base))
        else:
            claims.append(Claim(status="failed", reason=why, **base))
    return claims

