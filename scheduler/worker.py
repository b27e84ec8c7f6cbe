"""The worker: runs on every node, executes the claims addressed to it.

The log is the dispatch bus: a ``ClaimSlots`` entry naming this node, applied
while this process is live, is a dispatch. The worker fires it at the slot
instant by the cluster's clock, the leader's, translated through this node's
estimate of it (claims come ahead of time; see ``scheduler.skew``), checking
its applied state at that instant (a pause, edit or delete may have cancelled
it). Every time it reports is in the cluster's time too. It
then reports, in batches, ``StartRuns`` (taking a lease; skipped for an
attempt that finished before its start was sent), ``RenewLeases`` and
``FinishRuns``; a result is kept and resubmitted until its commit is
acknowledged (invariant 5), through any number of leader changes.

Entries replayed from this node's own journal at start-up are never acted on;
instead, once caught up, the worker reports the attempts it held before it
died as lost, so the leader can retry them at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from raftlog import ClockEstimate

from .clock import Clock
from .commands import (
    EXPIRE_SEEN,
    CancelRun,
    ClaimSlots,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    PauseJob,
    PutJob,
    PutJobs,
    RenewLeases,
    ReportLost,
    StartRuns,
)
from .errors import RaftcronError
from .executors.base import Attempt, Executor, Outcome, OutcomeStatus
from .instants import from_us, us
from .ledger import MAX_CLAIMS_PER_ENTRY
from .planner import fire_at_us
from .redaction import scrub_urls
from .runs import HELD, RunRecord
from .service import Service
from .skew import ClusterTime, estimated_lead_us, leader_lead_us, not_before_local_us
from .state import Applied

__all__ = ["Worker"]

log = logging.getLogger("raftcron.worker")
BATCH = 300  # starts per StartRuns entry, results per FinishRuns entry
STARTS_IN_FLIGHT = 4
"""StartRuns entries one flush proposes at once. A burst's late attempts (see LATE_LIMIT) run
only once their starts commit: one entry awaited at a time, at the few hundred milliseconds a
commit takes on a busy cluster, thousands of them waited for the leader's start deadline and
were taken back."""
ESTIMATE_POLL = 0.05  # seconds between looks for an estimate of the leader's clock while none is known
LAUNCH_SLICE = 500  # attempts of one wave launched between two turns of the event loop
LATE_LIMIT = 2.0
"""Seconds past both its instant and its claim (by the cluster's clock) within which an attempt
may start at once (at most half a lease). Later, it is reserved: reported started, and run only
once the ledger has recorded that start for this node (``_take_reserved``), which it does only
while the claim is still this node's; where the leader does not yet name in its expiries what
it saw (``ExpireRuns.seen``, ``commands.EXPIRE_SEEN``), it is declined instead, counted lost
by the leader and retried.

The leader counts a claim that was not started lost a grace after the later of the two and
claims the slot again elsewhere; a worker that started it after that would run the slot twice.
Three ways to get there: a process stopped (SIGSTOP) or starved through the instant wakes up
and fires; a node cut off from the leader applies, once healed, a claim committed just before
the cut, whose instant passed meanwhile (seen in the fault suite: an isolated follower fired a
slot 11 s late, after the leader had retried it); a burst larger than the node launches in
the limit (100,000 slots due at one instant). From the claim too: a catch-up claim stands for
an old slot and is on time when it fires at once."""


class Worker:
    def __init__(self, service: Service, clock: Clock, executors: dict[str, Executor], *,
                 lease: float = 5.0, flush_interval: float = 0.02, max_skew: float = 0.5,
                 cluster: ClusterTime | None = None) -> None:
        self.svc = service
        self.state = service.state
        self.me = service.node_id
        self.clock = clock
        # The executors take their ``now`` from the same ClusterTime (the agent builds one for both).
        self.cluster = cluster if cluster is not None else ClusterTime(
            clock, service.node.clock_offset_to_leader,
            lambda: leader_lead_us(self.state.clocks, self.state.nodes, service.node.leader())[0])
        self.max_skew = max_skew
        self.skewed = False  # this node's own clock beyond max_skew from the leader's (see _clock_ok)
        self.executors = executors
        self.lease = lease
        self.flush_interval = flush_interval
        self._tasks: dict[str, asyncio.Task[None]] = {}  # started attempts, by run id
        self._waves: dict[int, dict[str, RunRecord]] = {}  # instant (us) -> attempts waiting for it
        self._wave_tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, int] = {}  # run id -> the instant of its wave
        # Late attempts waiting for their start to commit (see LATE_LIMIT): run id -> (the
        # attempt, when its start was asked for).
        self._reserved: dict[str, tuple[Attempt, int]] = {}
        self._running: set[str] = set()
        self._starts: dict[str, int] = {}
        self._results: dict[str, dict[str, Any]] = {}
        self._kick = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._stopping = False  # stop() began: nothing more is scheduled or launched
        self.fired = 0
        self.declined = 0  # claimed attempts not started: no leader contact, no trusted clock, or too late (see _wave)
        self.reserved = 0  # late attempts whose start was asked of the ledger before they ran (see LATE_LIMIT)
        # Observers (metrics): called on the event loop, must not raise or block.
        self.on_start: Callable[[str, float], None] | None = None  # (job, lateness seconds)
        self.on_finish: Callable[[str, str, float], None] | None = None  # (job, status, duration seconds)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._flusher = loop.create_task(self._flush_loop(), name="worker-reports")
        self._renewer = loop.create_task(self._renew_loop(), name="worker-leases")

    async def stop(self) -> None:
        # First, so a claim or a start that commits while the attempts are being cancelled
        # does not schedule or launch one after them (it would run with nothing to report it).
        self._stopping = True
        tasks = [*self._wave_tasks, *self._tasks.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in (self._flusher, self._renewer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # ---- reacting to applied entries (event-loop thread) --------------------------

    def on_applied(self, applied: Applied, replay: bool) -> None:
        cmd, result = applied.command, applied.result
        if isinstance(cmd, ClaimSlots):
            if not replay:
                for run in result["runs"]:
                    if run["status"] == "claimed" and run["node"] == self.me:
                        self._schedule(run)
            self._stop_attempts(result["cancelled"], "replaced")
        elif isinstance(cmd, (PutJob, PutJobs, PauseJob)):
            self._stop_attempts(result.get("cancelled", ()), "job changed")
        elif isinstance(cmd, DeleteJob):
            self._stop_attempts([*self._waiting_of(cmd.name),
                                 *(rid for rid, t in self._tasks.items() if t.get_name().startswith(f"{cmd.name}@"))],
                                "job deleted")
        elif isinstance(cmd, CancelRun):
            self._stop_attempts([cmd.run_id], "cancelled")
        elif isinstance(cmd, (StartRuns, RenewLeases)) and cmd.node == self.me:
            if self._reserved and isinstance(cmd, StartRuns):
                self._take_reserved(result)
            self._stop_attempts(result["stale"], "fenced: the ledger no longer gives this node the attempt")
        elif isinstance(cmd, ExpireRuns):
            self._stop_attempts([r["id"] for r in result["lost"] if r["node"] == self.me], "lease expired")

    def _schedule(self, run: RunRecord) -> None:
        """Add a claimed attempt to the wave of its instant: attempts due at the same instant
        (an hourly burst) wait on one timer and pass the instant's checks together."""
        rid = run["id"]
        if self._stopping or rid in self._tasks or rid in self._waiting or rid in self._reserved:
            return
        due = fire_at_us(run)
        wave = self._waves.get(due)
        if wave is None:
            # A wave is its own dict: one for the same instant may be opened while an earlier one
            # is still launching (a retry or catch-up of the same slot), and each task owns its own.
            wave = self._waves[due] = {}
            task = asyncio.get_running_loop().create_task(self._wave(due, wave), name=f"wave@{due}")
            self._wave_tasks.add(task)
            task.add_done_callback(functools.partial(self._wave_done, due, wave))
        wave[rid] = run
        self._waiting[rid] = due

    def _wave_done(self, due: int, wave: dict[str, RunRecord], task: asyncio.Task[None]) -> None:
        self._wave_tasks.discard(task)
        if self._waves.get(due) is wave:  # only when the wave was cancelled before its instant
            del self._waves[due]
            for rid in wave:
                self._waiting.pop(rid, None)

    def _forget(self, rid: str, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(rid, None)

    def _waiting_of(self, job: str) -> list[str]:
        return [*(rid for rid, due in self._waiting.items() if self._waves[due][rid]["job"] == job),
                *(rid for rid, (attempt, _) in self._reserved.items() if attempt.job == job)]

    def _stop_attempts(self, run_ids: Any, why: str) -> None:
        """Stop these attempts wherever they are: waiting for their instant, or running."""
        for rid in run_ids:
            due = self._waiting.pop(rid, None)
            if due is not None:
                del self._waves[due][rid]
                log.info("stopping attempt %s before its instant: %s", rid, why)
                continue
            if self._reserved.pop(rid, None) is not None:
                self._starts.pop(rid, None)
                self.declined += 1
                log.info("stopping attempt %s before its start was committed: %s", rid, why)
                continue
            task = self._tasks.get(rid)
            if task is not None and not task.done():
                log.info("stopping attempt %s: %s", rid, why)
                task.cancel()

    # ---- one wave: the attempts due at one instant -------------------------------------

    async def _wave(self, due: int, wave: dict[str, RunRecord]) -> None:
        late = await self._reach_instant(due)
        if self._waves.get(due) is wave:
            del self._waves[due]
        for rid in wave:
            self._waiting.pop(rid, None)
        if late is None:
            self.declined += len(wave)  # logged by _reach_instant
            return
        silent = self.svc.node.leader_contact_age()
        reserve = self.svc.node.leader_uses(EXPIRE_SEEN)  # see LATE_LIMIT; read once a slice
        cut_off: list[RunRecord] = []
        late_ones: list[RunRecord] = []
        reserved: list[RunRecord] = []
        # The cluster's time at the wave's start and the monotonic clock from there: one
        # estimate for the wave (and one per slice) instead of one per attempt.
        base_us, base_mono = self.cluster.now_us(), self.clock.monotonic()
        late_mono = base_mono - late  # when, on the monotonic clock, the instant was reached
        limit = min(self.lease / 2, LATE_LIMIT)
        runs = list(wave.values())
        for i, run in enumerate(runs):
            if i and i % LAUNCH_SLICE == 0:
                # Thousands due at once are launched a slice at a time, the loop served between
                # slices (the requests already launched, the API). Each slice is judged again by
                # the newest estimate: one that moved the instant later (a new leader's first
                # sample) sends the rest back to wait for it, never early.
                await asyncio.sleep(0)
                silent = self.svc.node.leader_contact_age()
                reserve = self.svc.node.leader_uses(EXPIRE_SEEN)
                past, _, ready = self._past_instant(due)
                if not ready:
                    for rest in runs[i:]:
                        self._schedule(rest)
                    break
                late_mono = self.clock.monotonic() - past
            try:
                outcome = self._take_up(run, due, base_us, base_mono, late_mono, limit, silent, reserve)
            except Exception as exc:  # noqa: BLE001 - one attempt's fault must not drop the rest of the wave
                if run["id"] not in self._tasks:  # not launched: nothing to report or renew
                    self._starts.pop(run["id"], None)
                    self._running.discard(run["id"])
                self.declined += 1
                log.error("not starting %s run %s: %s: %s", run["job"], run["id"], type(exc).__name__, exc)
                continue
            if outcome == "cut off":
                cut_off.append(run)
            elif outcome == "late":
                late_ones.append(run)
            elif outcome == "reserved":
                reserved.append(run)
        if cut_off:
            self.declined += len(cut_off)
            log.warning("not starting %d attempt(s) due at %s (%s): no word from a leader for %.1fs; the leader "
                        "will count them lost", len(cut_off), from_us(due).isoformat(), _some(cut_off), silent)
        if late_ones:
            self.declined += len(late_ones)
            log.warning("not starting %d attempt(s) due at %s (%s): more than %gs past their instant and their claim "
                        "(this node stalled or busy); the leader will count them lost", len(late_ones),
                        from_us(due).isoformat(), _some(late_ones), limit)
        if reserved:
            self.reserved += len(reserved)
            log.warning("%d attempt(s) due at %s (%s) came up more than %gs past their instant and their claim "
                        "(this node stalled or busy): each runs once its start is committed, unless the leader "
                        "took it back meanwhile", len(reserved), from_us(due).isoformat(), _some(reserved), limit)
        self._kick.set()

    def _take_up(self, run: RunRecord, due: int, base_us: int, base_mono: float, late_mono: float, limit: float,
                 silent: float, reserve: bool) -> str:
        """One attempt of a wave whose instant has come: launched, reserved, late, cut off or skipped."""
        rid = run["id"]
        current = self.state.runs.get(rid)
        job = self.state.job(run["job"])
        rec = self.state.jobs.get(run["job"])
        if current is None or current["status"] != "claimed" or job is None or rec is None:
            return "skipped"  # cancelled, lost or deleted while waiting for its instant
        if silent > self.lease / 2:
            # Cut off from the leader (a partition, or this node stalled): the leader counts
            # this node's attempts lost once it has been unreachable for a lease and claims
            # them again elsewhere, so starting now would most likely run the slot twice.
            # Left unstarted, the attempt is lost and retried (a job with delivery
            # at-most-once is not retried).
            return "cut off"
        kind = str(job.executor)
        attempt = Attempt(
            job=run["job"], run_id=rid, slot=from_us(run["slot_us"]), attempt=run["attempt"],
            fencing_token=run["token"], executor=kind, spec=dict(rec["spec"].get(kind) or {}),
            timeout=float(job.timeout),
        )
        mono = self.clock.monotonic()
        # Never stamped before its instant (a reading carried forward, see ClusterTime.now).
        started = max(base_us + int((mono - base_mono) * 1e6), due)
        if mono - late_mono - max(0, run["claimed_us"] - due) / 1e6 > limit:
            # See LATE_LIMIT: started only once the ledger has recorded the start for this node.
            if not reserve:
                return "late"
            self._reserved[rid] = (attempt, started)
            self._starts[rid] = started
            return "reserved"
        self._launch(attempt, started)
        return "launched"

    def _take_reserved(self, result: dict[str, Any]) -> None:
        """Run the reserved attempts whose start the ledger recorded for this node.

        ``result``: a committed ``StartRuns``'s. Its ``started`` and ``already`` runs are this
        node's in the log's order, after anything the leader did to them before (had it taken
        one back, that one would be ``stale``); an expiry the leader decided before the start
        committed names the claim it saw and keeps a started attempt (``ExpireRuns.seen``).
        Two more checks, since it is late: the leader still names what it saw (a new leader may
        not yet), and the lease the start took has a third of it left by the cluster's clock
        (else the leader may be about to count it lapsed). An attempt that fails them is not
        run; its lease lapses and the leader retries the slot."""
        if self._stopping:
            return
        uses = self.svc.node.leader_uses(EXPIRE_SEEN)
        now = self.cluster.now_us()
        short: list[str] = []
        for rid in (*result.get("started", ()), *result.get("already", ())):
            held = self._reserved.pop(rid, None)
            if held is None:
                continue
            run = self.state.runs.get(rid)
            if (not uses or run is None or run["status"] != "running" or run["node"] != self.me
                    or (run["lease_us"] or 0) - now < self.lease / 3 * 1e6):
                short.append(rid)
                continue
            attempt, started = held
            self._launch(attempt, started, reported=True)  # renewed from here on, as any
        if short:
            self.declined += len(short)
            log.warning("not running %d late attempt(s) (%s): their start committed too late in their lease, or "
                        "the leader does not name what it saw in expiries", len(short), ", ".join(short[:5]))

    def _launch(self, attempt: Attempt, started: int, *, reported: bool = False) -> None:
        """Start an attempt's executor; its start goes into the next report unless ``reported``
        (a reserved attempt, whose start is committed)."""
        rid = attempt.run_id
        task = asyncio.get_running_loop().create_task(self._run(attempt, started), name=f"{attempt.job}@{rid}")
        self._tasks[rid] = task
        task.add_done_callback(functools.partial(self._forget, rid))
        if not reported:
            self._starts[rid] = started
        self._running.add(rid)
        self.fired += 1
        try:
            if self.on_start is not None:
                at = self.cluster.now_us() if reported else started
                self.on_start(attempt.job, (at - us(attempt.slot)) / 1e6)
        except Exception as exc:  # noqa: BLE001 - an observer's fault is not the attempt's
            log.error("start observer raised on run %s: %s: %s", rid, type(exc).__name__, exc)
        if log.isEnabledFor(logging.INFO):
            log.info("started %s attempt %d of slot %s (run %s)", attempt.job, attempt.attempt,
                     attempt.slot.isoformat(), rid)

    async def _run(self, attempt: Attempt, started: int) -> None:
        rid, kind = attempt.run_id, attempt.executor
        try:
            outcome = await self.executors[kind].run(attempt)
        except asyncio.CancelledError:
            self._running.discard(rid)
            self._starts.pop(rid, None)
            raise
        except Exception as exc:  # noqa: BLE001 - an executor bug is the attempt's failure, not the worker's
            # Its message may quote a URL whole (a token in the query): scrubbed where it is kept
            # and logged; the traceback only at debug level.
            error = scrub_urls(f"executor error: {type(exc).__name__}: {exc}")
            log.error("executor %s raised on run %s: %s", kind, rid, error)
            log.debug("executor %s traceback", kind, exc_info=exc)
            now = self.cluster.now()
            outcome = Outcome(status=OutcomeStatus.FAILED, started_at=from_us(started), finished_at=now, error=error)
        self._running.discard(rid)
        self._results[rid] = _result(rid, outcome)
        if self.on_finish is not None:
            self.on_finish(attempt.job, outcome.status.value, outcome.duration_ms / 1000)
        if log.isEnabledFor(logging.INFO):
            log.info("finished %s run %s: %s%s", attempt.job, rid, outcome.status.value,
                     f" ({outcome.error})" if outcome.error else "")
        self._kick.set()

    async def _reach_instant(self, due: int) -> float | None:
        """Wait until the leader's clock has certainly reached the instant ``due``, with
        this node's clock trusted; then how far past it (seconds) this node is by the
        cluster's clock, or None (the wave's attempts declined) if that did not come in time.

        The sleep is on the monotonic clock, its length computed from the wall clock and
        the newest estimate; after each wake the instant is computed again, since the
        estimate may have moved meanwhile: no attempt starts before its instant by the
        newest estimate.

        Without an estimate (no leader known, or a new one not sampled yet) nothing tells
        when the instant is, and with this node's clock beyond ``max_skew`` it must not
        start (see ``_clock_ok``). Rather than guess by this node's own clock (the early
        firing this guards against), wait for that to change, but, once the instant is
        past by the last estimate seen, no longer than the leader-contact rule in
        ``_wave`` tolerates (half a lease): a new leader's first sample, or the record
        of a leader's clock stepping ahead (see ``leader_lead_us``), arrives well within
        that; past it the leader is about to count this node's attempts lost and retry
        them elsewhere, so the attempts are declined, as for a node cut off from the leader.
        """
        waiting_since: float | None = None
        while True:
            past, est, ready = self._past_instant(due)
            if past < 0:
                await self.clock.sleep(-past if est is not None else min(-past, ESTIMATE_POLL))
                continue
            if ready:
                return past
            now = self.clock.monotonic()
            if waiting_since is None:
                waiting_since = now
            elif now - waiting_since > self.lease / 2:
                why = "no estimate of the leader's clock" if est is None else "this node's clock skewed"
                runs = list(self._waves.get(due, {}).values())
                log.warning("not starting %d attempt(s) due at %s (%s): %s for %.1fs; the leader will count them "
                            "lost", len(runs), from_us(due).isoformat(), _some(runs), why, now - waiting_since)
                return None
            await self.clock.sleep(ESTIMATE_POLL)

    def _past_instant(self, due: int) -> tuple[float, ClockEstimate | None, bool]:
        """Seconds this node is past the instant ``due`` by the newest estimate (negative:
        before it), that estimate (None if none), and whether an attempt may start: the
        instant reached, an estimate known and this node's clock trusted (``_clock_ok``)."""
        est = self.cluster.estimate()
        leader = self.svc.node.leader()
        lead, lead_error = leader_lead_us(self.state.clocks, self.state.nodes, leader)
        if not lead and leader is not None:
            # Not recorded (yet): a newly elected leader far from the others commits its lead
            # only after its barrier, while the slots the previous leader claimed fire now.
            # This node's own estimates of the members' clocks tell the same lead.
            followers = len(self.svc.node.status().partners)  # the cluster less the leader
            lead, lead_error = estimated_lead_us(self.svc.node.member_clocks(), leader, self.max_skew, followers)
        basis = est or self.cluster.last
        local_due = due if basis is None else not_before_local_us(due, basis)
        # A leader that recorded its own clock far from most of its followers' (NodeClock on
        # itself, see scheduler.skew.ClockGuard) plans by their median clock, and so do the
        # workers: ahead, the attempt is held back by the lead; behind, it is not held for
        # the slow clock (SkewWatch.planning_now_us).
        local_due += lead + lead_error if lead else 0
        past = (us(self.clock.now()) - local_due) / 1e6
        return past, est, past >= 0 and est is not None and self._clock_ok(est, lead)

    def _clock_ok(self, est: ClockEstimate, lead_us: int) -> bool:
        """Whether this node's clock is near enough the cluster's to start an attempt.

        The leader gives a skewed node no new attempts; this covers the ones claimed before
        it noticed, and a leader that cannot judge this node (it sees no estimate). Judged
        against the leader's clock, or against its followers' median when the leader
        recorded its own clock as the far one (then this node, if it is that leader, is the
        skewed one). Logged once per change, not per attempt.
        """
        offset = est.offset - lead_us / 1e6
        skewed = abs(offset) > self.max_skew
        if skewed != self.skewed:
            self.skewed = skewed
            if skewed:
                log.warning("this node's clock is %+.3fs (±%.3fs) from the cluster's, beyond --max-clock-skew "
                            "%gs: starting no attempts until it is back within", offset, est.error, self.max_skew)
            else:
                log.warning("this node's clock is back within --max-clock-skew %gs of the cluster's: "
                            "starting attempts again", self.max_skew)
        return not skewed

    # ---- batched reports -------------------------------------------------------------

    async def _flush_loop(self) -> None:
        backoff = self.flush_interval
        while True:
            await self.clock.wait_for(self._kick, None)
            self._kick.clear()
            await self.clock.sleep(self.flush_interval)  # gather a batch
            try:
                await self._flush_starts()
                await self._flush_results()
                backoff = self.flush_interval
                if self._starts:
                    # More than one entry's worth: the rest go next period, results in between.
                    # (Left waiting for another attempt's kick, starts of long attempts went
                    # unreported until the leader counted the claims lost and ran them again.)
                    self._kick.set()
            except RaftcronError as exc:
                log.warning("reports not committed yet (%s); retrying", exc)
                # Floored: a flush interval of 0 (gather nothing) must not retry in a tight loop.
                backoff = min(max(backoff * 2, 0.01), 1.0)
                await self.clock.sleep(backoff)
                self._kick.set()

    async def _renew_loop(self) -> None:
        """Leases are renewed on their own schedule: a report stuck waiting for a commit
        must not hold renewals back until the leader gives the attempts up."""
        every = self.lease / 3
        while True:
            await self.clock.sleep(every)
            try:
                await self._renew()
            except RaftcronError as exc:
                log.warning("lease renewal not committed (%s); next try in %.1fs", exc, every)

    async def _flush_starts(self) -> None:
        # An attempt that already finished is not reported started: its result carries
        # the start, and the ledger takes it from "claimed" straight to its outcome.
        # One entry fewer on every replica for each run shorter than a batch period.
        for rid in [r for r in self._starts if r in self._results]:
            del self._starts[rid]
        if not self._starts:
            return
        pending = list(self._starts.items())[:BATCH * STARTS_IN_FLIGHT]
        batches = [dict(pending[i : i + BATCH]) for i in range(0, len(pending), BATCH)]
        now = self.cluster.now_us()
        lease_until = now + int(self.lease * 1e6)

        async def report(batch: dict[str, int]) -> None:
            await self.svc.propose(StartRuns(at_us=now, node=self.me, runs=tuple(batch), started_us=batch,
                                             lease_until_us=lease_until), attempts=1)
            # Done with at once, not when the slowest of the entries is: renewals skip what is
            # still here, and these attempts' leases run from now.
            for rid in batch:
                self._starts.pop(rid, None)

        outcomes = await asyncio.gather(*(report(b) for b in batches), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        for outcome in failed:
            if not isinstance(outcome, Exception):
                raise outcome  # cancelled: not a failure to retry
        if failed:
            raise failed[0]  # its starts are kept and proposed again (a start is idempotent)

    async def _flush_results(self) -> None:
        while self._results:
            batch = list(self._results.items())[:BATCH]
            await self.svc.propose(FinishRuns(at_us=self.cluster.now_us(), node=self.me,
                                              results=tuple(r for _, r in batch)), attempts=1)
            for rid, _ in batch:
                self._results.pop(rid, None)

    async def _renew(self) -> None:
        running = tuple(r for r in self._running if r not in self._starts)
        if running:
            now = self.cluster.now_us()
            until = now + int(self.lease * 1e6)
            await self.svc.propose(RenewLeases(at_us=now, node=self.me, runs=running,
                                               lease_until_us=until), attempts=1, timeout=self.lease / 3)

    # ---- after a restart ------------------------------------------------------------------

    async def report_orphans(self, replay_upto: int) -> None:
        """Attempts this node held before it restarted are lost: say so, until committed."""
        while self.state.applied_index < replay_upto:
            await self.clock.sleep(0.05)
        orphans = tuple(
            rid for rid in list(self.state.active)
            if (r := self.state.runs.get(rid)) is not None and r["node"] == self.me
            and r["status"] in HELD and r["token"] // MAX_CLAIMS_PER_ENTRY <= replay_upto
        )
        if not orphans:
            return
        log.warning("reporting %d attempt(s) held before the restart as lost: %s", len(orphans), ", ".join(orphans[:10]))
        delay = 0.1
        while True:
            try:
                # In the cluster's time, as every report: the loss is the retry's due time, which
                # the leader compares with its own clock (this node's, 30 s ahead, held it 30 s).
                await self.svc.propose(ReportLost(at_us=self.cluster.now_us(), node=self.me, runs=orphans))
                return
            except RaftcronError as exc:
                log.info("lost report not committed yet: %s", exc)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 2.0)

    @property
    def busy(self) -> int:
        return len(self._running)

    @property
    def pending_reports(self) -> int:
        return len(self._starts) + len(self._results)


def _some(runs: list[RunRecord]) -> str:
    shown = ", ".join(f"{r['job']} run {r['id']}" for r in runs[:5])
    return shown + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")


def _result(rid: str, o: Outcome) -> dict[str, Any]:
    return {
        "run_id": rid, "status": o.status.value, "started_us": us(o.started_at), "finished_us": us(o.finished_at),
        "exit_code": o.exit_code, "http_status": o.http_status, "output": o.output, "error": o.error,
    }
