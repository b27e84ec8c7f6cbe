"""The replicated state machine: jobs, nodes and the run ledger.

A spec, in the manner of hashicorp/raft's fsm.go: ``apply`` is deterministic
(no clock, no randomness, no environment: times and choices travel inside the
commands), never raises (a malformed or refused command is a ``Rejected``
value, the same on every replica), and records values it never mutates in
place afterwards (every change replaces the record), which is what makes
``snapshot`` a cheap shallow capture that a thread can pack later.

The run transitions themselves live in ``scheduler.ledger``.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
from msgpack import ExtType

from raftlog.codec import CodecError, pack
from raftlog.fsm import ApplyContext, LocalStateLost
from raftlog.heap import release_free_memory

from . import alerts, ledger
from .commands import (
    AlertResults,
    CancelRun,
    ClaimSlots,
    Command,
    DeleteDeadLetter,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    JobPlanning,
    NodeClock,
    Noop,
    NoteNextSlots,
    PauseJob,
    PutJob,
    PutJobs,
    RegisterNode,
    Rejected,
    RenewLeases,
    ReportLost,
    StartRuns,
    decode_command,
)
from .errors import ValidationFailed
from .model import Job, parse_job
from .runtable import Slices
from .store import Store, array_header

__all__ = ["State", "Rejected", "Applied", "SNAPSHOT_VERSION", "SNAPSHOT_VERSIONS"]

log = logging.getLogger("raftcron.state")
SNAPSHOT_VERSION = 4
"""What this build writes. 2: a job document's sections (the map values of the document:
``http``, ``labels``, ``retries``, ...) are each written once per snapshot and referenced by
every job that holds an equal one, and a restore shares them again (``_SharedSections``).
3: run records as the run table keeps them (``scheduler.runtable``: a record that is over as
its packed bytes, which a restore keeps as they are): a ``runs`` section of ``(job, tokens,
values, crc)``, every job in order, and a ``runs_index`` section of ``(tokens, job numbers)``,
and no ``job_runs`` section (the table lists each job's runs itself). 4: the ``runs`` section
holds each job's value as the table does, one ``bytes`` (``(job, value, records kept as
dicts, crc)``, ``RunTable.load_values``), so packing and restoring a job takes a few steps
where version 3 took several a record."""
SNAPSHOT_VERSIONS = (1, 2, 3, 4)
"""What this build restores; ``State(snapshot_version=N)`` writes what a release that reads
only N and before reads (``raftcron agent --snapshot-format N``, for a rolling upgrade from
such a release)."""
_REF = 1  # msgpack ext code, snapshot version 2: a reference into the snapshot's table of sections
_REF_MAX_IMAGE = 4096  # a section packing larger than this is written in place, never tabled
HISTORY_SWEEP_US = 60_000_000
"""How often (in the applied entries' own time) records past their job's ``history.max_age`` go."""
TRIM_AFTER = 32 << 20
"""Bytes of run history moved out of memory after which ``State.idle`` trims the C heap (~4 ms
for a 200 MB heap in-process, off the GIL)."""
_CHUNK = 2000  # records packed per chunk, so a snapshot thread yields the GIL often


@dataclass(frozen=True, slots=True)
class Applied:
    """What an applied command did, handed to the leader loop, workers and alerts."""

    command: Command
    index: int
    result: Any


class State(Store):
    def __init__(self, snapshot_version: int = SNAPSHOT_VERSION) -> None:
        super().__init__()
        if snapshot_version not in SNAPSHOT_VERSIONS:
            raise ValueError(f"snapshot_version: {snapshot_version} is not one of {SNAPSHOT_VERSIONS}")
        self.snapshot_version = snapshot_version  # what snapshot() writes; local, never replicated
        self._offered: dict[bytes, tuple[PutJob | PutJobs, Job | tuple[Job, ...]]] = {}  # see offer()
        self._offer: Job | tuple[Job, ...] | None = None  # the offered parse for the entry being applied
        # Local to this replica, never snapshotted, never read by apply: the leader loop on
        # this node notes a job it cannot plan here (message, job version, instant) so that
        # the job's view on this node shows why its slots are not being decided.
        self.planning_errors: dict[str, dict[str, Any]] = {}
        self.entry_weight = 1  # what the last applied entry counts as toward a snapshot (raftlog.fsm)

    # ---- the entry point ---------------------------------------------------

    def offer(self, raw: bytes, cmd: PutJob | PutJobs, job: Job | tuple[Job, ...]) -> None:
        """This replica's own command and parse for a ``PutJob`` it proposes: ``raw`` is
        ``encode_command(cmd)`` and ``cmd.spec`` is ``job.to_doc()`` (for a ``PutJobs``, a tuple
        of jobs, ``cmd.specs`` their ``to_doc()``s in order). Applying those exact bytes
        here uses them instead of decoding the bytes and parsing the document again. Both are
        pure (``decode_command(encode_command(cmd)) == cmd`` and ``parse_job(job.to_doc()) ==
        job``, tests/unit/test_model.py, test_commands.py), so apply decides the same either
        way; the other replicas decode and parse. The proposer withdraws the offer once its
        proposal ends."""
        self._offered[raw] = (cmd, job)

    def withdraw(self, raw: bytes) -> None:
        self._offered.pop(raw, None)

    def apply(self, raw: bytes, ctx: ApplyContext) -> Applied | Rejected:
        self.entry_weight = 1
        offered = self._offered.pop(raw, None) if self._offered else None
        cmd: Command
        if offered is not None:
            cmd, self._offer = offered
        else:
            self._offer = None
            try:
                cmd = decode_command(raw)
            except CodecError as exc:
                self.applied_index = ctx.index
                return Rejected("invalid", f"entry {ctx.index} refused: {exc}")
            except Exception as exc:  # noqa: BLE001 - malformed fields: same rejection everywhere
                self.applied_index = ctx.index
                return Rejected("invalid", f"entry {ctx.index} refused: {type(exc).__name__}: {exc}")
        self.entry_weight = cmd.weight  # toward the next snapshot (raftlog.fsm)
        try:
            result = self._dispatch(cmd, ctx.index)
        except LocalStateLost:
            raise  # not the same on all replicas: the host takes this node out of raft (raftlog.fsm)
        except Exception as exc:  # noqa: BLE001 - a bug must not wedge the cluster; same on all replicas
            log.exception("apply of %s at %d failed", cmd.TAG, ctx.index)
            result = Rejected("internal", f"{type(exc).__name__}: {exc}")
        self.applied_index = ctx.index
        if isinstance(result, Rejected):
            return result
        if cmd.at_us >= self.history_sweep_us and self.aged_jobs():
            self._sweep_history(cmd.at_us)
        return Applied(cmd, ctx.index, result)

    def idle(self) -> None:
        """Each raft tick, between applies (``raftlog.fsm``): cold run history out of memory,
        where the agent keeps it so (``RunTable.tick``), and once ``TRIM_AFTER`` bytes of it
        have left, the C heap's free pages given back (the values were its blocks; a quiet
        cluster compacts its journal, which also trims, rarely). What the state holds does not
        change."""
        runs = self.runs
        runs.tick()
        if runs.moved_out >= TRIM_AFTER:
            runs.moved_out = 0
            release_free_memory()

    def _sweep_history(self, now_us: int) -> None:
        """At most once a minute of the entries' own time, on every replica at the same entry:
        drop the records older than their job's ``history.max_age`` (``ledger.expire_history``)."""
        self.history_sweep_us = now_us + HISTORY_SWEEP_US
        for name, max_age_us in self.aged_jobs().items():
            try:
                ledger.expire_history(self, name, now_us - max_age_us)
            except LocalStateLost:
                raise  # this replica alone: the host takes it out of raft
            except Exception:  # noqa: BLE001 - same on all replicas; one job's records must not stop the sweep
                log.exception("expiring the history of %s failed", name)

    def _dispatch(self, cmd: Command, index: int) -> Any:
        match cmd:
            case Noop():
                self.last_noop = {"node": cmd.node, "term": cmd.term, "at_us": cmd.at_us, "index": index}
                return None
            case RegisterNode():
                self.nodes[cmd.node_id] = {
                    "node_id": cmd.node_id, "raft_addr": cmd.raft_addr, "http_addr": cmd.http_addr,
                    "tags": dict(cmd.tags), "allow_shell": bool(cmd.allow_shell), "registered_us": cmd.at_us,
                }
                return None
            case PutJob():
                return self._put_job(cmd)
            case PutJobs():
                return self._put_jobs(cmd)
            case DeleteJob():
                return self._delete_job(cmd)
            case PauseJob():
                return self._pause_job(cmd)
            case ClaimSlots():
                return ledger.claim(self, cmd, index)
            case StartRuns():
                return ledger.start(self, cmd)
            case RenewLeases():
                return ledger.renew(self, cmd)
            case FinishRuns():
                return ledger.finish(self, cmd)
            case ExpireRuns():
                return ledger.expire(self, cmd.runs, cmd.at_us, cmd.reason, None, cmd.seen)
            case ReportLost():
                return ledger.expire(self, cmd.runs, cmd.at_us, "its node restarted", cmd.node)
            case CancelRun():
                return ledger.cancel(self, cmd)
            case DeleteDeadLetter():
                return ledger.delete_dead(self, cmd)
            case AlertResults():
                return self._alert_results(cmd)
            case NodeClock():
                return self._node_clock(cmd)
            case NoteNextSlots():
                return ledger.note_next(self, cmd)
            case JobPlanning():
                return self._job_planning(cmd)
        return Rejected("invalid", f"no transition for {cmd.TAG!r}")

    # ---- jobs ----------------------------------------------------------------

    def _put_job(self, cmd: PutJob) -> Any:
        job, self._offer = self._offer, None
        if isinstance(job, Job):
            spec = cmd.spec  # the offer's own to_doc(), as encoded (see offer)
        else:
            try:
                job = parse_job(cmd.spec)
            except ValidationFailed as exc:
                return Rejected("invalid", exc.message)
            spec = job.to_doc()
        old = self.jobs.get(job.name)
        if cmd.expect_version == 0 and old is not None:
            return Rejected("conflict", f"a job named {job.name!r} exists already")
        if cmd.expect_version and (old is None or old["version"] != cmd.expect_version):
            have = "no such job" if old is None else f"version {old['version']}"
            return Rejected("conflict", f"job {job.name!r}: expected version {cmd.expect_version}, found {have}")
        if old is not None and old["spec"] == spec:
            return {"change": "unchanged", "name": job.name, "version": old["version"]}
        if job.depends_on is not None and (cycle := self._cycle(job.name, job.depends_on.job)):
            # Decided here, not at the API, so that two concurrent puts closing a cycle between
            # them are refused the same way on every replica (the second one to apply).
            return Rejected("invalid", f"depends_on.job: would close a dependency cycle {' -> '.join(cycle)}")
        return self._store_job(job, spec, cmd.at_us)

    def _store_job(self, job: Job, spec: dict[str, Any], at_us: int) -> dict[str, Any]:
        """Store a job the caller has checked (parsed, no conflict, no cycle); ``spec`` is ``job.to_doc()``."""
        old = self.jobs.get(job.name)
        if old is not None and old["spec"] == spec:
            return {"change": "unchanged", "name": job.name, "version": old["version"]}
        cancelled: list[str] = []
        if old is None:
            rec = {
                "spec": spec, "version": 1, "created_us": at_us, "updated_us": at_us,
                "last_slot_us": None, "consecutive_failures": 0, "missed_total": 0, "pause_note": None,
                "spec_since_us": at_us,
            }
            self.runs.add_job(job.name)
            change = "created"
        else:
            rec = {**old, "spec": spec, "version": old["version"] + 1, "updated_us": at_us}
            change = "configured"
            moved = [k for k in _SLOT_FIELDS if old["spec"].get(k) != spec.get(k)]
            if moved:
                rec["spec_since_us"] = at_us
        self.jobs[job.name] = rec
        self.spec_changed(job.name, job)
        self.job_stored(job, had_dependency=old is not None and old["spec"].get("depends_on") is not None)
        if old is not None:
            cancelled = self._edited(job.name, old["spec"], spec, at_us, moved)
        return {"change": change, "name": job.name, "version": rec["version"], "cancelled": cancelled}

    def _put_jobs(self, cmd: PutJobs) -> Any:
        """All of a batch or none of it: every check of ``_put_job`` is made for every document
        (against the state as the whole batch would leave it) before the first is stored."""
        offered, self._offer = self._offer, None
        if isinstance(offered, tuple) and len(offered) == len(cmd.specs):
            batch = list(zip(offered, cmd.specs, strict=True))  # the offer's own to_doc()s (see offer)
        else:
            batch = []
            for i, raw in enumerate(cmd.specs):
                try:
                    job = parse_job(raw)
                except ValidationFailed as exc:
                    return Rejected("invalid", "; ".join(f"jobs[{i}].{d['field']}: {d['message']}" for d in exc.details)
                                    or f"jobs[{i}]: {exc.message}")
                batch.append((job, job.to_doc()))
        seen: dict[str, int] = {}
        for i, (job, _) in enumerate(batch):
            if job.name in seen:
                return Rejected("invalid", f"jobs[{i}].name: {job.name!r} is also jobs[{seen[job.name]}]")
            seen[job.name] = i
        if cmd.create_only and (taken := [job.name for job, _ in batch if job.name in self.jobs]):
            shown = ", ".join(repr(n) for n in taken[:20]) + (f" and {len(taken) - 20} more" if len(taken) > 20 else "")
            return Rejected("conflict", f"{len(taken)} job(s) exist already: {shown}")
        upstream = {job.name: job.depends_on.job if job.depends_on is not None else "" for job, _ in batch}
        for i, (job, spec) in enumerate(batch):
            old = self.jobs.get(job.name)
            if old is not None and old["spec"] == spec:
                continue  # unchanged, as _put_job answers before its own cycle check
            if job.depends_on is not None and (cycle := self._cycle(job.name, job.depends_on.job, upstream)):
                return Rejected("invalid", f"jobs[{i}].depends_on.job: would close a dependency cycle "
                                           f"{' -> '.join(cycle)}")
        items = [self._store_job(job, spec, cmd.at_us) for job, spec in batch]
        return {"items": items, "cancelled": [rid for item in items for rid in item.get("cancelled", ())]}

    def _edited(self, name: str, before: dict[str, Any], after: dict[str, Any], at_us: int,
                moved: list[str]) -> list[str]:
        """An edit of a job at ``at_us``: what it does to claims made under the old document.

        Claims stand through an edit that changes neither which slots the job has nor where
        and how they run (a URL, a description, retries: the worker reads the document in
        force when it fires). Otherwise they are withdrawn (``ledger.withdraw_claims``).
        ``moved``: the slot fields that changed."""
        placed = [k for k in _PLACEMENT_FIELDS if before.get(k) != after.get(k)]
        if not (moved or placed):
            ledger.trim(self, name)  # the new document may keep less history
            return []
        cancelled = ledger.withdraw_claims(self, name, at_us, "the job was changed")
        changes = ", ".join(f"{k} {_shown(before.get(k))} -> {_shown(after.get(k))}" for k in moved + placed)
        reason = f"changed: {changes}"
        if moved:
            reason += "; slots after this instant follow the new schedule, none before it is recorded or caught up"
        if cancelled:
            reason += f"; {len(cancelled)} slot(s) claimed under the old document withdrawn (cancelled)"
        self.note(name, {"at_us": at_us, "decision": "changed", "reason": reason})
        return cancelled

    def _cycle(self, name: str, upstream: str, overlay: dict[str, str] | None = None) -> list[str] | None:
        """The dependency path from ``name`` back to itself if it depended on ``upstream``.

        ``overlay``: each job of a batch by name, with its upstream ("" for none), read instead
        of the stored job. Every job names at most one upstream, so this walks one chain, at
        most every job once."""
        path, seen, cur = [name], {name}, upstream
        while cur:
            path.append(cur)
            if cur == name:
                return path
            if cur in seen:
                return None  # a cycle not through this job (only an older state can hold one)
            seen.add(cur)
            if overlay is not None and cur in overlay:
                cur = overlay[cur]
                continue
            up = self.job(cur) if cur in self.jobs else None
            cur = up.depends_on.job if up is not None and up.depends_on is not None else ""
        return None

    def _delete_job(self, cmd: DeleteJob) -> Any:
        if cmd.name not in self.jobs:
            return Rejected("not_found", f"no job named {cmd.name!r}")
        del self.jobs[cmd.name]
        self.spec_changed(cmd.name)
        self.job_deleted(cmd.name)
        removed = ledger.drop_history(self, cmd.name)
        self.notes.pop(cmd.name, None)
        for key in [k for k, d in self.pending_deps.items() if d["job"] == cmd.name]:
            del self.pending_deps[key]
        return {"deleted": cmd.name, "runs": removed}

    def _pause_job(self, cmd: PauseJob) -> Any:
        rec = self.jobs.get(cmd.name)
        if rec is None:
            return Rejected("not_found", f"no job named {cmd.name!r}")
        spec = {**rec["spec"], "paused": cmd.paused}
        changed = spec != rec["spec"]
        self.jobs[cmd.name] = {
            **rec, "spec": spec, "pause_note": cmd.note,
            "version": rec["version"] + (1 if changed else 0),
            "updated_us": cmd.at_us if changed else rec["updated_us"],
            # Pausing and resuming are edits: slots from this instant on follow the new state,
            # and a resumed job never runs, catches up or records the slots of its pause that
            # were not decided while it was paused.
            **({"spec_since_us": cmd.at_us} if changed else {}),
        }
        self.spec_changed(cmd.name)
        verb = "paused" if cmd.paused else "resumed"
        self.note(cmd.name, {"at_us": cmd.at_us, "decision": verb, "reason": cmd.note or f"{verb} by an operator"})
        cancelled = ledger.withdraw_claims(self, cmd.name, cmd.at_us, "the job was paused") if cmd.paused else []
        return {"name": cmd.name, "paused": cmd.paused, "version": self.jobs[cmd.name]["version"], "cancelled": cancelled}

    def _alert_results(self, cmd: AlertResults) -> Any:
        done = []
        for r in cmd.results:
            alert = self.alerts.get(str(r.get("id")))
            if alert is None or alert["status"] != "pending":
                continue  # delivered already (a retried commit), or trimmed
            attempts = alert["attempts"] + 1
            if r.get("ok"):
                new = {**alert, "status": "delivered", "attempts": attempts, "delivered_us": cmd.at_us,
                       "last_error": None}
            elif r.get("skip"):
                new = {**alert, "status": "skipped", "attempts": attempts, "last_error": r.get("error")}
            else:
                backoff = min(2 ** attempts, 300) * 1_000_000
                failed = attempts >= alerts.MAX_ATTEMPTS
                new = {**alert, "status": "failed" if failed else "pending", "attempts": attempts,
                       "last_error": r.get("error"), "next_us": cmd.at_us + backoff}
            self.alerts[alert["id"]] = new
            done.append(new)
        return {"alerts": done}

    def _node_clock(self, cmd: NodeClock) -> Any:
        prev = self.clocks.get(cmd.node)
        was = prev is not None and bool(prev["skewed"])
        changed = was != cmd.skewed
        self.clocks[cmd.node] = {
            "node": cmd.node, "offset_us": cmd.offset_us, "error_us": cmd.error_us, "skewed": cmd.skewed,
            "leader": cmd.leader, "term": cmd.term, "reason": cmd.reason,
            "since_us": cmd.at_us if changed or prev is None else prev["since_us"],
        }
        if changed:
            # One alert per change, whoever proposed it: a repeated entry (a retry, a new
            # leader judging afresh) finds the status recorded already and raises none.
            alerts.raise_cluster_alert(self, "clock_skew" if cmd.skewed else "clock_skew_recovered", cmd.at_us,
                                       node=cmd.node, error=cmd.reason if cmd.skewed else None,
                                       offset_ms=None if cmd.offset_us is None else cmd.offset_us / 1000,
                                       error_ms=None if cmd.error_us is None else cmd.error_us / 1000,
                                       leader=cmd.leader, reason=cmd.reason)
        return {"node": cmd.node, "skewed": cmd.skewed, "changed": changed}

    def _job_planning(self, cmd: JobPlanning) -> Any:
        rec = self.jobs.get(cmd.job)
        if rec is None or rec["version"] != cmd.version:
            # Edited or deleted since the leader tried: the next plan judges the job afresh.
            return Rejected("stale", f"job {cmd.job!r} is no longer at version {cmd.version}")
        prev = rec.get("planning_error")
        # The record is replaced, never changed in place: a snapshot being packed holds it.
        if cmd.error is None:
            if prev is not None:
                self.jobs[cmd.job] = {k: v for k, v in rec.items() if k != "planning_error"}
            return {"job": cmd.job, "changed": prev is not None}
        self.jobs[cmd.job] = {**rec, "planning_error": {"error": cmd.error, "version": cmd.version, "at_us": cmd.at_us}}
        first = prev is None or prev["version"] != cmd.version
        if first:  # one alert per failing version, whichever leader finds it, however often it retries
            alerts.on_unplannable(self, cmd.job, cmd.error, cmd.at_us, node=cmd.leader)
        return {"job": cmd.job, "changed": first}

    # ---- snapshot --------------------------------------------------------------

    def records(self) -> int:
        """What a snapshot packs, counted: jobs and run records (``raftlog.fsm``)."""
        return len(self.jobs) + len(self.runs)

    def snapshot(self) -> Iterator[bytes]:
        """Capture now, pack lazily, in chunks.

        The capture runs on the raft thread, holding the GIL, so it copies only the tables
        (``dict.copy``: no object made per job), never a record: records and each job's notes
        are replaced, never changed in place, so the copies hold them as they are now while
        the state moves on. Listing 100,000 jobs as pairs here, and copying each job's notes,
        took 0.2-0.5 s in-process (the pairs' allocations drove young collections too)."""
        runs = self.runs.capture()
        sections: list[tuple[str, Slices | dict[Any, Any] | Iterator[list[Any]]]] = [
            ("meta", [{"v": self.snapshot_version, "applied_index": self.applied_index, "last_noop": self.last_noop,
                       "alert_seq": self.alert_seq, "history_sweep_us": self.history_sweep_us}]),
            ("jobs", self.jobs.copy()),
            ("nodes", self.nodes.copy()),
            *([("runs", runs.values(_CHUNK) if self.snapshot_version >= 4 else runs.by_job(_CHUNK)),
               ("runs_index", runs.index(8 * _CHUNK))]
              if self.snapshot_version >= 3 else [("runs", runs), ("job_runs", runs.job_lists())]),
            ("active", list(self.active)),
            ("dead", list(self.dead)),
            ("pending_deps", self.pending_deps.copy()),
            ("notes", self.notes.packed()),
            ("alerts", self.alerts.copy()),
            ("clocks", self.clocks.copy()),
        ]
        return _pack_sections(sections, _SharedSections() if self.snapshot_version >= 2 else None)

    def snapshot_bytes(self) -> bytes:
        return b"".join(self.snapshot())

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot of any version in ``SNAPSHOT_VERSIONS``.

        Section by section as the bytes unpack: a chunk's records go into the new maps while
        the next chunk is still packed, so the peak is the bytes and the state, not the bytes,
        every record in lists and the state again."""
        table: list[Any] = []
        chunks = _unpack_sections(data, table)
        first = next(chunks, None)
        meta = first[1][0] if first is not None and first[0] == "meta" and first[1] else {}
        version = meta.get("v") if isinstance(meta, dict) else None
        if version not in SNAPSHOT_VERSIONS:
            raise CodecError(
                f"state snapshot version {version} is not understood (this build reads "
                f"{', '.join(str(v) for v in SNAPSHOT_VERSIONS)})"
            )
        # Into a fresh state, taken over whole at the end: bytes found corrupt half-way leave
        # this state as it was, as when the whole snapshot was unpacked before the first change.
        # A malformed value anywhere (a name that is a list, a chunk item that is no pair, a meta
        # field of the wrong type, a job record missing a field) is refused as corrupt like damaged
        # bytes, whatever Python raised on it. (The types of a job record's fields are not checked.)
        try:
            fresh = State(self.snapshot_version)
            fresh.applied_index = meta["applied_index"]
            fresh.last_noop = meta.get("last_noop") or {}
            fresh.alert_seq = meta.get("alert_seq", 0)
            fresh.history_sweep_us = meta.get("history_sweep_us", 0)  # absent from older snapshots
            for field in ("applied_index", "alert_seq", "history_sweep_us"):
                if type(getattr(fresh, field)) is not int:
                    raise CodecError(f"state snapshot holds a meta {field} that is no integer")
            if type(fresh.last_noop) is not dict:
                raise CodecError("state snapshot holds a meta last_noop that is no map")
            sets: dict[str, dict[str, None]] = {"active": fresh.active, "dead": fresh.dead}
            maps: dict[str, dict[str, Any]] = {
                "nodes": fresh.nodes, "pending_deps": fresh.pending_deps, "alerts": fresh.alerts,
                "clocks": fresh.clocks,  # absent from snapshots older than the section
            }
            ended = False
            listed: list[str] = []  # version 3: the jobs in the order the runs section lists them
            for name, items in chunks:
                if ended:
                    raise CodecError(f"state snapshot goes on after its end (a {name!r} chunk)")
                if name == "end":
                    ended = True
                elif name == "shared":
                    table.extend(items)  # before the first chunk that refers to them
                elif name == "jobs":
                    pairs = _restored_jobs(items)
                    fresh.jobs.update(pairs)
                    for job, _ in pairs:  # the table lists jobs in the order they were created
                        fresh.runs.add_job(job)
                elif name in maps:
                    maps[name].update(items)
                elif name in ("runs", "runs_index"):
                    try:
                        if version < 3:
                            fresh.runs.load(items)
                        elif name == "runs":
                            for item in items:  # each job in order, once (a job split over chunks: at their seam)
                                if isinstance(item, tuple) and item and type(item[0]) is str and (not listed or listed[-1] != item[0]):
                                    listed.append(sys.intern(item[0]))
                            if version >= 4:
                                fresh.runs.load_values(items)
                            else:
                                fresh.runs.load_jobs(items)
                        else:
                            fresh.runs.load_index(items, listed)
                    except (ValueError, TypeError, KeyError, OverflowError) as exc:
                        raise CodecError(f"state snapshot holds a bad run record: {exc}") from exc
                elif name == "job_runs":
                    for job, ids in items:  # derived from the runs: checked, not loaded
                        fresh.runs.add_job(job)
                        if list(ids) != fresh.runs.ids_of(job):
                            raise CodecError(f"state snapshot lists runs of job {job!r} its records do not hold")
                elif name == "notes":
                    try:
                        fresh.notes.load(items)
                    except (ValueError, TypeError, OverflowError) as exc:
                        raise CodecError(f"state snapshot holds bad notes: {exc}") from exc
                elif name in sets:
                    sets[name].update(dict.fromkeys(items))
            if version >= 2 and not ended:
                raise CodecError("state snapshot is cut short: it has no end chunk")
            if version >= 3:
                try:
                    fresh.runs.check()
                except ValueError as exc:
                    raise CodecError(f"state snapshot holds a bad run record: {exc}") from exc
            fresh.reindex()  # and checks each job record
        except CodecError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            raise CodecError(f"state snapshot is malformed: {type(exc).__name__}: {exc}") from exc
        if self.runs.spiller is not None:  # a file of its own: the old table's is dropped with it
            try:
                fresh.runs.spill_to(self.runs.spiller.like())
            except OSError as exc:  # no descriptor or no room for a new file: the history stays in memory
                log.warning("run history kept in memory: no new spill file in %s: %s", self.runs.spiller.directory, exc)
        self.__dict__.update(fresh.__dict__)  # restore discards all previous state


def _restored_jobs(items: list[Any]) -> list[Any]:
    """A snapshot's (name, job record) pairs as this release keeps them, records of the fresh
    state not yet read by anyone:

    - each name one string object, interned as ``parse_job`` interns it: a name decodes twice,
      as the key and as its document's ``name``, and an edit's document brought a third (~60
      bytes a job each, as long as the job lives);
    - no ``failure_alerted`` of False: not alerted is the field's absence (``alerts.on_finished``),
      and a record an earlier release wrote loses it here, so replicas of this release hold the
      same records whether they restored such a snapshot or replayed the entries.

    Anything malformed is passed on as it is, for ``reindex`` to refuse."""
    out = []
    for job, rec in items:
        if type(job) is str:
            job = sys.intern(job)
        if type(rec) is dict:
            spec = rec.get("spec")
            if type(spec) is dict and spec.get("name") == job:
                spec["name"] = job
            if rec.get("failure_alerted") is False:
                del rec["failure_alerted"]
        out.append((job, rec))
    return out


class _SharedSections:
    """Snapshot version 2: the map values of job documents, each distinct one written once.

    100,000 jobs mostly write a handful of distinct ``retries``, ``catchup``, ``target``,
    ``alerts``, ``history`` and ``labels`` sections (often the defaults), and often one
    ``http`` section per endpoint. Version 1 wrote each job's copy and a restore made a copy
    per job (378 MB of state for 100,000 jobs in-process, against 223 MB with the five parsed
    sections shared as an applied state shares them). Here each section is looked up by the
    object (a live state shares them already) and then by its packed bytes (a restored or
    older state may hold equal copies); the first of each goes into the table, sent in a
    ``shared`` chunk before the ``jobs`` chunk that first refers to it, and every job's
    document carries an ext reference (code ``_REF``, the table position in 4 bytes)."""

    def __init__(self) -> None:
        self._by_id: dict[int, ExtType] = {}  # the captured records keep every object alive while packing
        self._by_image: dict[bytes, ExtType] = {}
        self.fresh: list[Any] = []  # tabled since the last chunk was packed

    def record(self, rec: dict[str, Any]) -> dict[str, Any]:
        seen = self._by_id.get  # a section met before, looked up here: most are, and a call each cost a third
        return {**rec, "spec": {k: (seen(id(v)) or self._ref(v)) if type(v) is dict else v for k, v in rec["spec"].items()}}

    def _ref(self, value: dict[str, Any]) -> Any:
        ref = self._by_id.get(id(value))
        if ref is not None:
            return ref
        image: bytes = msgpack.packb(value, use_bin_type=True)
        if len(image) > _REF_MAX_IMAGE:
            return value
        ref = self._by_image.get(image)
        if ref is None:
            ref = ExtType(_REF, len(self._by_image).to_bytes(4, "big"))
            self._by_image[image] = ref
            self.fresh.append(value)
        self._by_id[id(value)] = ref
        return ref


_SLOT_FIELDS = ("schedule", "timezone", "starts_at", "ends_at", "paused")
"""Fields of the job document that decide which slots the job has: an edit of one starts a new
schedule at the edit's instant (``spec_since_us``)."""
_PLACEMENT_FIELDS = ("executor", "target", "concurrency")
"""Fields that decide where, and whether beside another attempt, a claimed slot may run."""


def _shown(v: Any) -> str:
    return "none" if v is None else repr(v) if isinstance(v, str) else str(v)


def _chunks(items: Slices | dict[Any, Any]) -> Iterator[list[Any]]:
    """A section's chunks of ``_CHUNK`` items (a table's as key, value pairs); one empty
    chunk for an empty section."""
    if isinstance(items, dict):
        pairs = iter(items.items())
        chunk = list(itertools.islice(pairs, _CHUNK))
        yield chunk
        while chunk := list(itertools.islice(pairs, _CHUNK)):
            yield chunk
        return
    for start in range(0, max(len(items), 1), _CHUNK):
        yield items[start : start + _CHUNK]


def _pack_sections(sections: list[tuple[str, Slices | dict[Any, Any] | Iterator[list[Any]]]],
                   shared: _SharedSections | None) -> Iterator[bytes]:
    for name, items in sections:
        if isinstance(items, Iterator):  # a section that chunks itself (the run table's)
            for chunk in items:
                yield pack([name, chunk])
            continue
        for chunk in _chunks(items):
            if name == "notes":
                yield _notes_chunk(chunk)
                continue
            if name == "jobs" and shared is not None:
                chunk = [(job, shared.record(rec)) for job, rec in chunk]
                if shared.fresh:
                    yield pack(["shared", shared.fresh])
                    shared.fresh = []
            yield pack([name, chunk])
    if shared is not None:
        yield pack(["end", []])  # version 2: a snapshot cut at a chunk's end is told from a whole one


def _notes_chunk(chunk: list[tuple[str, bytes]]) -> bytes:
    """``pack(["notes", chunk])`` with each job's notes as the maps they were, made from their
    packed forms (``Notes``) without unpacking them: the same bytes, every version alike."""
    name = msgpack.Packer(use_bin_type=True).pack  # this thread's own: the raft thread packs notes too
    return b"".join([array_header(2), pack("notes"), array_header(len(chunk)),
                     *(part for job, notes in chunk for part in (b"\x92", name(job), notes))])


def _unpack_sections(data: bytes, table: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    """The snapshot's chunks in order; ``table`` is the caller's list of shared sections (version
    2), which it extends at each ``shared`` chunk before asking for the next."""

    seen: dict[bytes, Any] = {}  # references met before: 100,000 jobs make ~700,000 of a few

    def section(code: int, data: bytes) -> Any:
        value = seen.get(data)
        if value is not None and code == _REF:
            return value
        if code != _REF or len(data) != 4:
            raise CodecError(f"state snapshot holds an unknown extension (code {code}, {len(data)} bytes)")
        i = int.from_bytes(data, "big")
        if i >= len(table):
            raise CodecError(f"state snapshot refers to shared section {i} before it is written")
        value = seen[data] = table[i]
        return value

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0, ext_hook=section)
    unpacker.feed(data)
    end = 0  # where the last whole chunk ended (tell() also counts the headers of one cut short)
    try:
        for item in unpacker:
            end = unpacker.tell()
            name, items = item
            yield name, [tuple(x) if isinstance(x, list) and name in _PAIRS else x for x in items]
    except (msgpack.UnpackException, ValueError, TypeError) as exc:  # TypeError: a map keyed by a list
        raise CodecError(f"state snapshot is corrupt: {exc}") from exc
    if end != len(data):
        # The unpacker waits for the rest of a chunk cut short: without this, a restore would
        # take a snapshot missing its last records as whole.
        raise CodecError(f"state snapshot is cut short: {len(data) - end} bytes of an unfinished chunk")


_PAIRS = {"jobs", "nodes", "runs", "job_runs", "pending_deps", "notes", "alerts", "clocks"}
