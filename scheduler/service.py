"""The write path shared by the API and the agent: propose a command, wait for
its commit, translate what came back into the error tree.

Every command is idempotent (jobs by name and content, claims by slot or
request key, cancels by run id), so when Raft answers "outcome unknown" the
same command is proposed again; a refusal that only says "that already
happened" after such a retry is answered as the success it was.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from raftlog import NotCommitted, UnknownOutcome
from raftlog.trace import mark

from .base import Committer, RaftPort
from .clock import Clock
from .commands import (
    CancelRun,
    Claim,
    ClaimSlots,
    Command,
    DeleteDeadLetter,
    DeleteJob,
    PauseJob,
    PutJob,
    PutJobs,
    Rejected,
    encode_command,
)
from .errors import (
    Conflict,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    RaftcronError,
    Unavailable,
    ValidationFailed,
)
from .instants import us
from .jobrules import check_body_pattern
from .model import Job
from .planner import NodeInfo, Picker
from .runs import RunRecord, TriggerName
from .state import Applied, State

__all__ = ["Service"]

log = logging.getLogger("raftcron.service")

_ONE_FIELD = re.compile(r"([a-z_]+(?:\.[a-z_]+|\[\d+\])*): ([^;]+)", re.DOTALL)


def _invalid(message: str) -> ValidationFailed:
    """The state machine words a refusal about one field as ValidationFailed does ("path: why"):
    keep the field in the details, as the API's own validation would."""
    m = _ONE_FIELD.fullmatch(message)
    if m is None:
        return ValidationFailed([{"field": "", "message": message}], message)
    return ValidationFailed([{"field": m.group(1), "message": m.group(2)}], message)


_REJECTIONS: dict[str, Callable[[str], RaftcronError]] = {
    "not_found": NotFound,
    "conflict": Conflict,
    "invalid": _invalid,
}


ENTRY_LIMIT = 63 * 1024
"""Bytes a batch's entry may take. pysyncobj sends an entry of appendEntriesBatchSizeBytes (64 KiB)
or more in chunks and misjudges the last one: measured, a 400 KB batch replicated but logged five
"pickle data was truncated" tracebacks on each follower (PYSYNCOBJ.md: keep commands small). Typical
documents compress ~65-fold (1,000 take 7 KB), so the cap is met by documents that do not compress."""


def _encode_batch(at_us: int, jobs: tuple[Job, ...], create_only: bool) -> tuple[PutJobs, bytes]:
    cmd = PutJobs(at_us=at_us, specs=tuple(job.to_doc() for job in jobs), create_only=create_only)
    return cmd, encode_command(cmd)


class Service:
    def __init__(self, state: State, node: RaftPort, bridge: Committer, clock: Clock, node_id: str,
                 *, commit_timeout: float = 5.0, cluster_now_us: Callable[[], int] | None = None) -> None:
        """``cluster_now_us``: this node's reading of the cluster's time (``ClusterTime.now_us``),
        which stamps what an operator asks for; without it, this node's wall clock."""
        self.state = state
        self.node = node
        self.bridge = bridge
        self.clock = clock
        self.node_id = node_id
        self.commit_timeout = commit_timeout
        self._cluster_now_us = cluster_now_us

    def now_us(self) -> int:
        """This node's wall clock (the leader's own planning reads it, less any recorded lead)."""
        return us(self.clock.now())

    def cluster_now_us(self) -> int:
        """The cluster's time as this node reads it. Operator commands carry it: an edit applies
        from its instant by the leader's clock, so one sent through a node 2 h behind does not start
        the new schedule 2 h early (recording the slots between as missed), and a manual run through
        a node ahead is not held until the cluster reaches its clock."""
        return self._cluster_now_us() if self._cluster_now_us is not None else self.now_us()

    # ---- proposing -------------------------------------------------------------

    async def propose(self, cmd: Command, *, attempts: int = 3, timeout: float | None = None,
                      parsed: Job | tuple[Job, ...] | None = None, raw: bytes | None = None) -> tuple[Any, bool]:
        """Commit ``cmd``; returns (result, retried_after_unknown_outcome). ``parsed``: the job
        a ``PutJob`` carries (the jobs of a ``PutJobs``), already parsed here (State.offer);
        ``raw``: ``encode_command(cmd)`` when the caller has it."""
        raw = encode_command(cmd) if raw is None else raw
        if parsed is not None:
            assert isinstance(cmd, (PutJob, PutJobs))
            self.state.offer(raw, cmd, parsed)
        try:
            return await self._propose(raw, attempts, timeout)
        finally:
            if parsed is not None:
                self.state.withdraw(raw)

    async def _propose(self, raw: bytes, attempts: int, timeout: float | None) -> tuple[Any, bool]:
        retried = False
        for attempt in range(attempts):
            try:
                mark("propose")
                result = await self.bridge.submit(raw, timeout or self.commit_timeout)
                mark("proposed")
                break
            except NotCommitted as exc:
                if attempt == attempts - 1:
                    raise Unavailable(f"no leader can commit right now ({exc}); retry shortly") from exc
                await self._await_leader(2.0)
            except UnknownOutcome as exc:
                if attempt == attempts - 1:
                    raise OutcomeUnknown(f"the write may or may not be committed ({exc}); it is safe to repeat") from exc
                retried = True
                await self._await_leader(2.0)
        if isinstance(result, Rejected):
            return result, retried
        if isinstance(result, Applied):
            return result.result, retried
        raise RaftcronError("the state machine could not apply the command; see the agent log")

    async def add_member(self, raft_addr: str) -> None:
        await self._membership(self.bridge.add_member(raft_addr))

    async def remove_member(self, raft_addr: str) -> None:
        await self._membership(self.bridge.remove_member(raft_addr))

    @staticmethod
    async def _membership(change: Any) -> None:
        try:
            await change
        except NotCommitted as exc:
            raise Unavailable(f"membership change not committed ({exc}); retry on the leader shortly") from exc
        except UnknownOutcome as exc:
            raise OutcomeUnknown(f"membership change unconfirmed ({exc}); check GET /v1/cluster") from exc

    async def _await_leader(self, bound: float) -> None:
        deadline = self.clock.monotonic() + bound
        while self.node.leader() is None and self.clock.monotonic() < deadline:
            await self.clock.sleep(0.05)

    @staticmethod
    def _raise(rej: Rejected) -> None:
        make = _REJECTIONS.get(rej.code)
        raise (make(rej.message) if make else RaftcronError(rej.message))

    # ---- jobs -------------------------------------------------------------------

    async def put_job(self, job: Job, *, create_only: bool = False, at_us: int | None = None) -> dict[str, Any]:
        """``at_us``: the edit's instant (``cluster_now_us``), when the caller read it already."""
        # Checked here, not in parse_job: a job stored before RE2 matched expect_body must
        # still parse in apply, while a new one must not hold a pattern the executor refuses.
        if job.http is not None and job.http.expect_body is not None:
            if problem := check_body_pattern(job.http.expect_body):
                raise ValidationFailed([{"field": "http.expect_body", "message": problem}])
        cmd = PutJob(at_us=self.cluster_now_us() if at_us is None else at_us, spec=job.to_doc(),
                     expect_version=0 if create_only else None)
        result, retried = await self.propose(cmd, parsed=job)
        if isinstance(result, Rejected):
            rec = self.state.jobs.get(job.name)
            if retried and result.code == "conflict" and rec is not None and rec["spec"] == cmd.spec:
                return {"change": "created", "name": job.name, "version": rec["version"]}
            self._raise(result)
        return dict(result)

    async def put_jobs(self, jobs: tuple[Job, ...], *, create_only: bool = False) -> dict[str, Any]:
        """Create or replace every job of a batch in one entry, or none (``PutJobs``)."""
        problems = [
            {"field": f"jobs[{i}].http.expect_body", "message": problem, "job": job.name}
            for i, job in enumerate(jobs)
            if job.http is not None and job.http.expect_body is not None
            and (problem := check_body_pattern(job.http.expect_body))
        ]
        if problems:
            raise ValidationFailed(problems)
        at_us = self.cluster_now_us()
        # Documents and encoding of a batch take ~0.1 ms a job: off the event loop (see api/routes/batch.py).
        cmd, raw = await asyncio.to_thread(_encode_batch, at_us, jobs, create_only)
        if len(raw) > ENTRY_LIMIT:
            raise PayloadTooLarge(
                f"the batch's {len(jobs)} documents make a {len(raw)}-byte entry, over the {ENTRY_LIMIT} bytes one "
                "replicated entry may take: send fewer documents per batch",
                [{"field": "jobs", "message": f"entry of {len(raw)} bytes over {ENTRY_LIMIT}; split the batch"}])
        result, retried = await self.propose(cmd, parsed=jobs, raw=raw)
        if isinstance(result, Rejected):
            stored = [self.state.jobs.get(job.name) for job in jobs]
            if retried and result.code == "conflict" and all(
                    rec is not None and rec["spec"] == spec for rec, spec in zip(stored, cmd.specs, strict=True)):
                # Our own first attempt committed before the answer was lost.
                return {"items": [{"change": "created", "name": job.name, "version": rec["version"]}
                                  for job, rec in zip(jobs, stored, strict=True) if rec is not None], "cancelled": []}
            if result.code == "conflict":
                taken = [{"field": f"jobs[{i}].name", "message": f"a job named {job.name!r} exists already",
                          "job": job.name} for i, job in enumerate(jobs) if job.name in self.state.jobs]
                raise Conflict(result.message, taken)
            self._raise(result)
        return dict(result)

    async def delete_job(self, name: str) -> None:
        result, retried = await self.propose(DeleteJob(at_us=self.cluster_now_us(), name=name))
        if isinstance(result, Rejected) and not (retried and result.code == "not_found"):
            self._raise(result)

    async def pause(self, name: str, paused: bool, note: str | None) -> None:
        result, _ = await self.propose(PauseJob(at_us=self.cluster_now_us(), name=name, paused=paused, note=note))
        if isinstance(result, Rejected):
            self._raise(result)

    # ---- runs ---------------------------------------------------------------------

    def picker(self, live: set[str], active: list[RunRecord] | None = None) -> Picker:
        """Nodes as the planner sees them; ``active`` saves re-reading the ledger when the caller has it."""
        nodes = [
            NodeInfo(n["node_id"], dict(n["tags"]), bool(n["allow_shell"]), n["node_id"] in live)
            for n in list(self.state.nodes.values())
        ]
        if active is None:
            active = self.state.active_runs()
        load: dict[str, int] = {}
        for run in active:
            if run["node"]:
                load[run["node"]] = load.get(run["node"], 0) + 1
        leader = self.node.leader()
        spare = next((n["node_id"] for n in list(self.state.nodes.values()) if n["raft_addr"] == leader), None)
        return Picker(nodes, load, spare)

    async def run_now(self, name: str, live: set[str], *, trigger: TriggerName = "manual",
                      retry_of: str | None = None) -> str:
        job = self.state.job(name)
        if job is None:
            raise NotFound(f"no job named {name!r}")
        key = uuid.uuid4().hex
        now = self.cluster_now_us()
        slot = now if retry_of is None else self.state.runs[retry_of]["slot_us"]
        attempt = 1 if retry_of is None else self.state.runs[retry_of]["attempt"] + 1
        nodes, why = self.picker(live).pick(job, count=job.target.count)
        base = Claim(job=name, slot_us=slot, trigger=trigger, request_key=key, retry_of=retry_of, attempt=attempt)
        claims = tuple(replace(base, node=n) for n in nodes) or (replace(base, status="failed", reason=why),)
        cmd = ClaimSlots(at_us=now, leader=f"api:{self.node_id}", term=self.node.status().term, claims=claims)
        result, _ = await self.propose(cmd)
        if isinstance(result, Rejected):
            self._raise(result)
        runs = result["runs"]
        if not runs:
            found = [r for r in self._job_runs(name) if r["cause"] == key]
            if found:
                return str(found[0]["id"])
            raise Conflict(result["refused"][0]["reason"] if result["refused"] else "the run was refused")
        return str(runs[0]["id"])

    def _job_runs(self, name: str) -> list[RunRecord]:
        """The job's runs that name a cause (manual runs among them), oldest first."""
        return list(reversed(list(self.state.runs.newest_of(name, caused=True))))

    async def cancel(self, run_id: str) -> RunRecord:
        result, retried = await self.propose(CancelRun(at_us=self.cluster_now_us(), run_id=run_id))
        if isinstance(result, Rejected):
            run = self.state.runs.get(run_id)
            if retried and run is not None and run["status"] == "cancelled":
                return run.copy()
            self._raise(result)
        cancelled: RunRecord = result["cancelled"]
        return cancelled.copy()

    async def replay(self, run_id: str, live: set[str]) -> str:
        run = self.state.runs.get(run_id)
        if run is None or run_id not in self.state.dead:
            raise NotFound(f"no dead letter with id {run_id!r}")
        return await self.run_now(run["job"], live, trigger="replay", retry_of=run_id)

    async def delete_dead(self, run_id: str) -> None:
        result, retried = await self.propose(DeleteDeadLetter(at_us=self.cluster_now_us(), run_id=run_id))
        if isinstance(result, Rejected) and not (retried and result.code == "not_found"):
            self._raise(result)
