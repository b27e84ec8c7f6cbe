"""The leader loop: runs only while this node leads.

Barrier first (invariant 3): a no-op is committed and applied before anything
is planned, so every claim an earlier leader committed is visible. Then a
timer heap of each job's next decision time drives ``planner.plan_job``: no
scan of all jobs per tick. Everything one tick decides goes into as few
``ClaimSlots`` entries as the size cap allows. The loop ends the moment a
commit says this node no longer leads, or the runtime (``runtime.py``)
cancels it on a leadership change; being "leader" is never a lock, only a
committed claim is. An exception out of ``run`` ends this loop; the runtime
starts a fresh one, barrier first, after a backoff. Every wait is on the
``Clock`` (a tick, or a wake-up from ``notify``), so a FakeClock drives it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .clock import Clock
from .commands import (
    EXPIRE_SEEN,
    Claim,
    ClaimSlots,
    DeleteJob,
    ExpireRuns,
    JobPlanning,
    Noop,
    NoteNextSlots,
    PauseJob,
    PutJob,
    PutJobs,
    Rejected,
)
from .errors import RaftcronError
from .instants import format_instant, from_us
from .model import Concurrency, Job
from .planner import (
    Picker,
    PlanConfig,
    decides_ahead,
    dependency_claims,
    due_retries,
    expired_runs,
    known_next_slot,
    next_slot_record,
    plan_job,
    stored_next_slot,
)
from .runs import RunRecord
from .service import Service
from .state import Applied
from .store import copied

__all__ = ["LeaderLoop", "LeaderConfig"]

log = logging.getLogger("raftcron.leader")
MAX_CLAIMS_PER_COMMAND = 400  # keeps each entry well under pysyncobj's 64 KiB message comfort zone
PLAN_RETRY_MAX = 60.0  # seconds between tries of a job that keeps failing to plan
PLAN_SLICE = 100
"""Jobs a tick plans between two turns of the event loop. A thousand planned in one go held it
for 75-230 ms (measured on the leader during a bulk load of 100,000 jobs), and the API's
answers, the worker and the commits waited that long."""
START_SLICE = 5000
"""Jobs a new leader's first pass (which of them have a next slot an earlier leader recorded)
reads between two turns of the event loop. The pass over 100,000 jobs in one go took ~0.2-0.4 s
in-process, during which the node that had just been elected answered nothing."""
NOT_PLANNING_SAY = 5.0  # seconds a leader may plan nothing (no planning instant) before it says why, and between sayings


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderConfig:
    tick: float = 0.05
    lease: float = 5.0
    plan: PlanConfig = PlanConfig()
    # The scan of every active attempt (expired leases, due retries, node load) runs at
    # most this often; the heap of due jobs is served every tick.
    scan: float = 0.1
    # ... and less often when it is slow: at most this share of the loop's time (its cost is
    # measured). 44,000 attempts in flight took ~50 ms a scan, ten scans a second: half the
    # leader's CPU went on walking them while the burst they belonged to starved.
    scan_share: float = 0.1
    # Jobs decided ahead of their slot are woken on this grid, so that one tick and one
    # ClaimSlots entry serve every job that falls in the same step.
    ahead_grid: float = 0.05
    # Jobs planned per tick. A new leader finds every job due at its first tick; planning
    # 100,000 at once held the event loop for seconds (a first plan parses each job, ~75 us),
    # so no API answer and no commit went out meanwhile. The rest wait a tick. The same cap
    # holds for jobs just created or edited (a bulk load notifies thousands between ticks):
    # those first, in the order they were applied, then jobs due from the heaps.
    max_jobs_per_tick: int = 1000
    # Next slots walked to go in a ``NoteNextSlots`` entry once this many are waiting, or the
    # oldest has waited this long: at most an entry every few seconds, whatever the rate.
    walked_batch: int = 1000
    walked_wait: float = 5.0
    # Bursts: when at least ``burst_min`` jobs fall due within a stretch, and planning them at
    # the rate this leader plans (its measured seconds per job, of which it counts on
    # ``burst_share`` for planning; the rest goes on commits, applies and the workers firing)
    # would not end a horizon before their slots, they are taken early enough that it does:
    # 10,000 hourly jobs due at :00 are claimed seconds before :00, not during it. Looked at
    # up to ``burst_lookahead`` seconds ahead. ``burst_rate``: a fixed jobs/s instead (tests).
    burst_min: int = 500
    burst_share: float = 0.25
    burst_lookahead: int = 300
    burst_rate: float | None = None
    # Losses in bulk: with 100,000 slots due at one instant each node starts what it can
    # within the late limit and declines the rest, and at the start deadline the leader found
    # ~50,000 claims lost in one scan. It proposed their expiry and their retries back to
    # back, ~250 entries, and the last retries were applied on the workers 5 s and more after
    # they were made, past their instant: declined again, until each slot had used its
    # attempts and was dead. So each scan expires at most ``expiries_per_scan`` attempts and
    # claims at most ``retries_per_scan`` retries (the rest at the next scans), and when at
    # least ``retry_crowd`` retries come due in one scan they are claimed a horizon ahead of
    # now, as a burst of slots is, instead of due at once (a retry after a failure whose
    # backoff ends sooner than that waits for it too). One loss, or a few hundred, is retried
    # as before, due at once. The caps are for scans ``scan_unit`` seconds apart; when scans
    # are rarer (a slow scan runs less often, see ``scan_share``) they grow with the gap, up to
    # ``scan_units_max`` times, and a crowd's lead with them (with 100,000 attempts in flight
    # scans came every 3-4 s, and at 4,000 a scan the expiries alone took 35 s).
    expiries_per_scan: int = 4000
    retries_per_scan: int = 2000
    retry_crowd: int = 500
    scan_unit: float = 0.5
    scan_units_max: float = 4.0


class LeaderLoop:
    def __init__(self, service: Service, clock: Clock, cfg: LeaderConfig, live: Callable[[], set[str]],
                 now_us: Callable[[], int | None] | None = None, not_planning: Callable[[], str] | None = None) -> None:
        """``now_us``: the instant to plan by (``SkewWatch.planning_now_us``), None while it is not
        known yet; nothing is planned then. Default: this node's wall clock. ``not_planning``:
        why it is None (``SkewWatch.not_planning``), logged when that lasts."""
        self.svc = service
        self._plan_now = now_us or service.now_us
        self._not_planning = not_planning
        self._unplanning_since: float | None = None  # since when (monotonic) no planning instant was known
        self._unplanning_said = float("-inf")
        self.state = service.state
        self.clock = clock
        self.cfg = cfg
        self.live = live
        self._heap: list[tuple[int, str]] = []  # (when the planner must look at it, job)
        # Jobs whose next slot is claimed a horizon ahead: (that slot, job), with how many fall
        # due in each second (a job's entry that an edit made stale still counts until taken).
        self._ahead: list[tuple[int, str]] = []
        self._due_secs: dict[int, int] = {}
        self._plan_cost = 1 / 8000  # seconds per job planned, measured on ticks of 100 jobs or more
        self._pull_until = 0  # jobs claimed ahead whose next slot is before this are taken now (a burst)
        self._ticked = 0.0  # when the last tick began (monotonic)
        self._dirty: dict[str, None] = {}  # jobs created, edited or refused since they were planned, in order
        self._wake = asyncio.Event()
        self.claimed_total = 0
        self.ticks = 0
        self._unreachable_since: dict[str, float] = {}
        self._picker: Picker | None = None
        self._scanned = float("-inf")
        self._scan_gap = 0.0  # seconds between the last two scans
        self._scan_cost = 0.0  # seconds per scan (moving average)
        self.scan_every = cfg.scan  # seconds between scans, from their cost (LeaderConfig.scan_share)
        self.scans = 0
        self._picked_nodes = 0  # registered nodes when the picker was built
        self._unplanned: set[str] | None = None  # jobs not planned yet in this term (None: before the barrier)
        self._walked: dict[str, dict[str, Any]] = {}  # next slots not yet sent (NoteNextSlots), by job
        self._walked_since = 0.0  # when the oldest of them was planned (monotonic)
        self._sending: asyncio.Task[None] | None = None  # the NoteNextSlots commit in flight

    # ---- notifications from applied entries (event-loop thread) ----------------

    def notify(self, applied: Applied) -> None:
        cmd = applied.command
        if isinstance(cmd, PutJob):
            self._dirty[str(applied.result.get("name"))] = None
        elif isinstance(cmd, PutJobs):
            self._dirty.update(dict.fromkeys(str(item["name"]) for item in applied.result["items"]))
        elif isinstance(cmd, (PauseJob, DeleteJob)):
            self._dirty[cmd.name] = None
        else:
            return
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # ---- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        term = await self._barrier()
        if term is None:
            return
        led_since = self.clock.monotonic()
        log.info("leader loop started after barrier (term %d)", term)
        # A job whose next slot an earlier leader recorded (and that no edit or decision has
        # voided since) is due a horizon before that slot: it is neither parsed nor planned
        # until then. Every other job is due at the first tick: 0, not this node's wall clock,
        # which a leader far from its followers does not plan by (its first ticks would wait
        # until the planning instant caught up with its own clock: 30 s of nothing, seen with
        # a clock 30 s fast).
        unplanned: set[str] = set()
        heap: list[tuple[int, str]] = []
        ahead: list[tuple[int, str]] = []
        jobs = list(copied(self.state.jobs).items())
        for start in range(0, len(jobs), START_SLICE):
            if start:
                await asyncio.sleep(0)  # the API, the worker and the commits between slices
            for name, rec in jobs[start:start + START_SLICE]:
                known, slot = known_next_slot(rec)
                if not known:
                    unplanned.add(name)
                    heap.append((0, name))
                elif slot is not None:  # a job of concurrency forbid/replace moves to the other heap once planned
                    ahead.append((slot, name))
                    self._count_due(slot, 1)
        self._unplanned = unplanned  # until now, unplanned() counted every job
        heapq.heapify(heap)
        heapq.heapify(ahead)
        self._heap, self._ahead = heap, ahead
        try:
            while self.svc.node.is_leader() and self.svc.node.status().term == term:
                try:
                    await self._tick(led_since)
                    self.ticks += 1
                except RaftcronError as exc:
                    log.warning("leader tick could not commit: %s", exc)
                    if not self.svc.node.is_leader():
                        break
                    await self.clock.sleep(self.cfg.tick)
                await self._sleep()
        finally:
            sending, self._sending = self._sending, None
            if sending is not None and not sending.done():
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
        log.info("leader loop for term %d stopped: this node no longer leads in that term", term)

    def _note_unplanning(self, mono: float) -> None:
        """A tick with no instant to plan by. Normal for the first tick or two of a leadership; a
        leader that plans nothing for longer says so, and why: its jobs' slots wait meanwhile."""
        if self._unplanning_since is None:
            self._unplanning_since = mono
            return
        waited = mono - self._unplanning_since
        if waited >= NOT_PLANNING_SAY and mono - self._unplanning_said >= NOT_PLANNING_SAY:
            self._unplanning_said = mono
            why = self._not_planning() if self._not_planning is not None else "no planning instant"
            log.warning("this leader has planned nothing for %.0fs: %s", waited, why)

    def unplanned(self) -> int:
        """Jobs whose next decision this leader does not know yet: every job until the loop
        has begun, then those its ticks have not planned (0: every job's next slot is known)."""
        return len(self.state.jobs) if self._unplanned is None else len(self._unplanned)

    async def _barrier(self) -> int | None:
        while self.svc.node.is_leader():
            term = self.svc.node.status().term
            try:
                result, _ = await self.svc.propose(Noop(at_us=self.svc.now_us(), node=self.svc.node_id, term=term))
                if not isinstance(result, Rejected):
                    return term
            except RaftcronError as exc:
                log.info("barrier not committed yet: %s", exc)
            await self.clock.sleep(self.cfg.tick)
        return None

    def _take_dirty(self) -> set[str]:
        """The jobs created or edited since the last tick, the oldest first, at most a tick's worth."""
        dirty = self._dirty
        names = set(itertools.islice(dirty, self.cfg.max_jobs_per_tick))
        if len(names) == len(dirty):
            dirty.clear()
        else:
            for name in names:
                del dirty[name]
        return names

    def _count_due(self, slot: int, n: int) -> None:
        sec = slot // 1_000_000
        left = self._due_secs.get(sec, 0) + n
        if left > 0:
            self._due_secs[sec] = left
        else:
            self._due_secs.pop(sec, None)

    def _plan_rate(self) -> float:
        """Jobs a second this leader counts on planning in a burst (see ``LeaderConfig.burst_share``)."""
        return self.cfg.burst_rate or min(max(self.cfg.burst_share / self._plan_cost, 200.0), 50_000.0)

    def _burst_lead_us(self, now: int) -> int:
        """How much earlier than a horizon before its slot the next job must be taken for every
        burst ahead to be planned a horizon before its slots (0 when there is no burst)."""
        if len(self._ahead) < self.cfg.burst_min:
            return 0
        rate = self._plan_rate()
        horizon = self.cfg.plan.horizon_us
        first = now // 1_000_000
        due = 0
        until = 0
        for sec in range(first, first + self.cfg.burst_lookahead):
            n = self._due_secs.get(sec)
            if not n:
                continue
            due += n
            # Jobs due by the end of ``sec`` need due/rate seconds of planning, to end a horizon before.
            if due >= self.cfg.burst_min and due / rate > (sec * 1_000_000 - horizon - now) / 1e6:
                until = (sec + 1) * 1_000_000
        return max(0, until - now - horizon)

    async def _sleep(self) -> None:
        wait = 0.0 if self._dirty else self.cfg.tick  # more than a tick's worth came (see max_jobs_per_tick)
        now = self._plan_now()
        if self._heap and now is not None:
            wait = min(wait, max(0.0, (self._heap[0][0] - now) / 1e6))
        if self._ahead and now is not None:
            wait = min(wait, max(0.0, (self._ahead[0][0] - self.cfg.plan.horizon_us - now) / 1e6))
        self._wake.clear()
        await self.clock.wait_for(self._wake, wait)

    async def _tick(self, led_since: float) -> None:
        planned_now = self._plan_now()
        mono = self.clock.monotonic()
        if planned_now is None:
            self._note_unplanning(mono)
            return  # the clocks are not judged yet: a leader with a far clock must not plan by it
        if self._unplanning_since is not None:
            if self._unplanning_said >= self._unplanning_since:  # its warning was said
                log.info("planning again, after %.0fs without a planning instant", mono - self._unplanning_since)
            self._unplanning_since = None
        now = planned_now
        names = self._take_dirty()
        while self._heap and self._heap[0][0] <= now and len(names) < self.cfg.max_jobs_per_tick:
            names.add(heapq.heappop(self._heap)[1])
        plan_cfg = self.cfg.plan
        until = now + plan_cfg.horizon_us
        if self._ahead:
            # A burst once begun is taken to its end at the next ticks, at the rate its lead was
            # reckoned for: taken at once, 100,000 jobs due together were planned and claimed
            # back to back and starved the raft thread (elections, one after another).
            base = until
            self._pull_until = max(self._pull_until, until + self._burst_lead_us(now))
            early = 0
            if self._pull_until > until:
                until = self._pull_until
                plan_cfg = replace(plan_cfg, horizon_us=until - now)
                early = 1 + int(self._plan_rate() * min(1.0, max(0.0, mono - self._ticked)))
            while self._ahead and self._ahead[0][0] <= until and len(names) < self.cfg.max_jobs_per_tick:
                if self._ahead[0][0] > base:
                    if early <= 0:
                        break
                    early -= 1
                taken, name = heapq.heappop(self._ahead)
                self._count_due(taken, -1)
                names.add(name)
        self._ticked = mono
        # A node registered since the last scan is not in the picker yet: scan now, or a job
        # planned in between finds "no live node" and its slots are recorded failed (seen in
        # a cluster that had just started: a job made 60 ms after the last registration).
        scan = self._picker is None or mono - self._scanned >= self.scan_every or len(self.state.nodes) != self._picked_nodes
        scan_cost = 0.0
        active: list[RunRecord] = []
        live: set[str] = set()
        if scan:
            # O(active attempts): not on every tick. Between scans the picker keeps
            # counting what it hands out, so its load figures stay close.
            began = time.perf_counter()
            live = self.live()
            active = self.state.active_runs()
            self._picker = self.svc.picker(live, active)
            self._picked_nodes = len(self.state.nodes)
            self._scan_gap = mono - self._scanned
            self._scanned = mono
            self.scans += 1
            scan_cost += time.perf_counter() - began
        picker = self._picker
        assert picker is not None
        claims: list[Claim] = []
        summaries: list[dict[str, Any]] = []
        cancel: list[str] = []
        next_due: dict[str, int | None] = {}
        next_slot: dict[str, int] = {}  # jobs claimed ahead: their next slot
        recorded: list[tuple[str, int, str | None]] = []  # planning errors to record (None: cleared)
        planning = 0.0  # seconds spent planning, less the loop's turns between slices
        started = time.perf_counter()
        for i, name in enumerate(sorted(names)):
            if i and i % PLAN_SLICE == 0:
                planning += time.perf_counter() - started
                await asyncio.sleep(0)
                started = time.perf_counter()
            try:
                job, rec = self.state.job(name), self.state.jobs.get(name)
                if job is None or rec is None:
                    self.state.planning_errors.pop(name, None)  # deleted: a job made again starts clean
                    continue
                # Only forbid / replace look at the job's attempts in flight; read them fresh.
                busy = [] if job.concurrency is Concurrency.ALLOW else self._active_of(name)
                plan = plan_job(job, rec, busy, now, plan_cfg, picker)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the others
                next_due[name] = self._plan_failed(name, exc, now, recorded)
                continue
            self.state.planning_errors.pop(name, None)
            if rec.get("planning_error") is not None:
                recorded.append((name, rec["version"], None))
            claims += plan.claims
            summaries += plan.summaries
            cancel += plan.cancel
            if plan.walk_end is not None:
                walked_to, slot = plan.walk_end
                item = next_slot_record(rec, name, walked_to, slot)
                # Unless the job's record says so already (a plan with nothing to decide).
                if rec.get("next_slot") != stored_next_slot(item):
                    if not self._walked:
                        self._walked_since = mono
                    self._walked[name] = item
            if decides_ahead(job) and plan.walk_end is not None:
                if plan.walk_end[1] is not None:  # else: no slot left
                    grid = int(self.cfg.ahead_grid * 1e6)
                    next_slot[name] = -(-plan.walk_end[1] // grid) * grid
                continue
            next_due[name] = plan.next_due_us
        if len(names) >= 100:
            per_job = (planning + time.perf_counter() - started) / len(names)
            self._plan_cost = 0.8 * self._plan_cost + 0.2 * per_job
        if scan:
            began = time.perf_counter()
            jobs: dict[str, Job] = {}
            for r in active:
                if r["job"] not in jobs and (j := self.state.job(r["job"])) is not None:
                    jobs[r["job"]] = j
            claims += self._retries(active, jobs, now, picker)
            scan_cost += time.perf_counter() - began
        if self.state.pending_deps:
            pending = list(self.state.pending_deps.values())
            dep_jobs = {d["job"]: j for d in pending if (j := self.state.job(d["job"])) is not None}
            claims += dependency_claims(pending, dep_jobs, picker)
        ok = await self._commit(claims, summaries, cancel, now)
        self._send_walked(now, mono)
        if ok and self._unplanned:
            self._unplanned.difference_update(names)
        await self._record_planning(recorded, now)
        for name, due in next_due.items():
            if not ok:
                due = now + int(self.cfg.tick * 1e6)
            if due is not None:
                heapq.heappush(self._heap, (due, name))
        for name, at in next_slot.items():
            if not ok:
                heapq.heappush(self._heap, (now + int(self.cfg.tick * 1e6), name))
                continue
            heapq.heappush(self._ahead, (at, name))
            self._count_due(at, 1)
        if not scan:
            return
        reachable = self._reachable(live)  # every scan: a node's unreachable time counts from now on
        expired: list[str] = []
        if mono - led_since >= self.cfg.lease:
            began = time.perf_counter()
            expired = expired_runs(active, now, self.cfg.plan, reachable)
            scan_cost += time.perf_counter() - began
        self._scanned_cost(scan_cost)
        if expired:
            cap = int(self.cfg.expiries_per_scan * self._scan_units())
            left = len(expired) - cap
            expired = expired[:cap]  # the rest at the next scans (LeaderConfig)
            log.warning("leases lapsed for %d attempt(s)%s: %s", len(expired),
                        f" ({left} more at the next scans)" if left > 0 else "", ", ".join(expired[:10]))
            term = self.svc.node.status().term
            # What was seen lapse goes with the expiry, so a start or renewal that commits
            # before it keeps its attempt (ExpireRuns.seen); once every member applies that.
            seen: dict[str, int] = {}
            if self.svc.node.peers_apply(EXPIRE_SEEN):
                wanted = set(expired)
                seen = {r["id"]: r["lease_us"] or 0 for r in active if r["id"] in wanted}
            for start in range(0, len(expired), MAX_CLAIMS_PER_COMMAND):  # short applies on every replica
                part = tuple(expired[start : start + MAX_CLAIMS_PER_COMMAND])
                await self.svc.propose(ExpireRuns(at_us=now, leader=self.svc.node_id, term=term, runs=part,
                                                  seen={rid: seen[rid] for rid in part} if seen else {}))

    def _retries(self, active: list[RunRecord], jobs: dict[str, Job], now: int, picker: Picker) -> list[Claim]:
        """The retries due at this scan, at most ``retries_per_scan`` of them; a crowd of them
        (``retry_crowd`` or more) is claimed a horizon ahead (see ``LeaderConfig``)."""
        horizon = self.cfg.plan.horizon_us
        units = self._scan_units()
        claims = due_retries(active, jobs, now, picker, horizon, limit=int(self.cfg.retries_per_scan * units))
        if len(claims) < self.cfg.retry_crowd:
            return claims
        # A scan's retries go out in entries one after another: more of them, further ahead
        # (with 8,000 at 2 s ahead, the last 600 reached the workers past their instant).
        ahead = now + int(horizon * units)
        log.info("%d retries due at once: claimed to start %.1fs from now", len(claims), (ahead - now) / 1e6)
        return [replace(c, not_before_us=ahead) if c.status == "claimed" and (c.not_before_us or 0) < ahead else c
                for c in claims]

    def _scan_units(self) -> float:
        """How many times the per-scan caps (and a crowd of retries' lead) this scan takes: the
        gap since the previous scan in ``scan_unit``s, from 1 to ``scan_units_max``."""
        return min(self.cfg.scan_units_max, max(1.0, self._scan_gap / self.cfg.scan_unit))

    def _scanned_cost(self, seconds: float) -> None:
        """A scan's cost, walking the active attempts three times: the next scan waits until
        that cost is at most ``scan_share`` of the time between them."""
        self._scan_cost = seconds if self.scans <= 1 else 0.7 * self._scan_cost + 0.3 * seconds
        every = max(self.cfg.scan, self._scan_cost / self.cfg.scan_share)
        if every >= 1.0 and self.scan_every < 1.0:
            log.warning("scanning the attempts in flight every %.1f s, not every %.1f s: a scan takes %.0f ms",
                        every, self.cfg.scan, self._scan_cost * 1000)
        self.scan_every = every

    def _plan_failed(self, name: str, exc: Exception, now: int, recorded: list[tuple[str, int, str | None]]) -> int:
        """Note a job that cannot be planned (its view shows why) and when to try it again:
        after 1 s, doubling to a minute while it keeps failing, or at once when it is edited.
        The first failure of a streak is recorded in the replicated state (``recorded``), so
        every node's view shows it and the ``unplannable`` alert goes out."""
        prev = self.state.planning_errors.get(name)
        delay = min(prev["retry_s"] * 2, PLAN_RETRY_MAX) if prev else 1.0
        rec = self.state.jobs.get(name)
        error = f"the leader cannot plan this job, its slots are not being decided: {type(exc).__name__}: {exc}"
        self.state.planning_errors[name] = {
            "error": error, "version": rec["version"] if rec else None, "at_us": now, "retry_s": delay,
        }
        if rec is not None and (prev is None or prev["version"] != rec["version"]):
            recorded.append((name, rec["version"], error))
        # The traceback once per failing streak; an alert-worthy line on every retry.
        log.error("ALERT job %s cannot be planned; its slots are not decided, the other jobs go on "
                  "(next try in %.0fs): %s: %s", name, delay, type(exc).__name__, exc,
                  exc_info=exc if prev is None else None)
        return now + int(delay * 1e6)

    async def _record_planning(self, recorded: list[tuple[str, int, str | None]], now: int) -> None:
        for name, version, error in recorded:
            try:
                await self.svc.propose(JobPlanning(at_us=now, job=name, version=version, error=error,
                                                   leader=self.svc.node_id, term=self.svc.node.status().term))
            except RaftcronError as exc:  # the job's next failure or success tries again
                log.warning("could not record the planning state of job %s: %s", name, exc)
                if error is not None:
                    self.state.planning_errors.pop(name, None)  # so its next failure records it

    def _active_of(self, name: str) -> list[RunRecord]:
        active = self.state.active
        return [r for rid in list(self.state.job_runs.get(name, ())) if rid in active and (r := self.state.runs.get(rid))]

    def _reachable(self, live: set[str]) -> set[str]:
        """Nodes not continuously unreachable for a whole lease: a node starved of CPU may
        miss a heartbeat or two, and its claims must not be given up for that."""
        mono = self.clock.monotonic()
        known = set(self.state.nodes)
        for node in known - live:
            self._unreachable_since.setdefault(node, mono)
        for node in live:
            self._unreachable_since.pop(node, None)
        gone = {n for n, since in self._unreachable_since.items() if mono - since >= self.cfg.lease}
        return known - gone

    def _send_walked(self, now: int, mono: float) -> None:
        """Send the next slots walked to (``NoteNextSlots``) once enough wait or the oldest has
        waited long enough: an entry of their own every few seconds at most, whatever the rate
        of decisions, committed beside the ticks (one send at a time), never waited for by a
        tick that has slots to decide. Lost ones (a failed commit, a lost leadership) only mean
        that a later leader plans those jobs at once."""
        waiting = self._walked
        if not waiting or (len(waiting) < self.cfg.walked_batch and mono - self._walked_since < self.cfg.walked_wait):
            return
        if self._sending is not None and not self._sending.done():
            return
        items = list(waiting.values())
        self._walked = {}
        self._walked_since = mono
        self._sending = asyncio.create_task(self._propose_walked(items, now, self.svc.node.status().term),
                                            name="next-slots")

    async def _propose_walked(self, items: list[dict[str, Any]], now: int, term: int) -> None:
        try:
            for start in range(0, len(items), MAX_CLAIMS_PER_COMMAND):
                await self.svc.propose(NoteNextSlots(at_us=now, leader=self.svc.node_id, term=term,
                                                     slots=tuple(items[start : start + MAX_CLAIMS_PER_COMMAND])))
        except RaftcronError as exc:
            log.info("next slots not recorded (%s); a later leader plans those jobs at once", exc)

    async def _commit(self, claims: list[Claim], summaries: list[dict[str, Any]], cancel: list[str], now: int) -> bool:
        if not (claims or summaries or cancel):
            return True
        term = self.svc.node.status().term
        ok = True
        for start in range(0, max(len(claims), 1), MAX_CLAIMS_PER_COMMAND):
            chunk = tuple(claims[start : start + MAX_CLAIMS_PER_COMMAND])
            first = start == 0
            cmd = ClaimSlots(at_us=now, leader=self.svc.node_id, term=term, claims=chunk,
                             cancel=tuple(cancel) if first else (), summaries=tuple(summaries) if first else ())
            result, _ = await self.svc.propose(cmd)
            if isinstance(result, Rejected):
                log.error("claim entry refused: %s", result.message)
                ok = False
                continue
            self.claimed_total += len(result["runs"])
            if log.isEnabledFor(logging.INFO):  # thousands a second under load: format only when logged
                for r in result["runs"]:
                    log.info("decided %s slot %s: %s%s", r["job"], format_instant(from_us(r["slot_us"])), r["status"],
                             f" on {r['node']}" if r["node"] else f" ({r['error']})")
            if result["refused"]:
                log.info("%d claim(s) refused by the state: %s", len(result["refused"]), result["refused"][:3])
                # Planned from a spec an edit replaced meanwhile (or stamped by a clock a little ahead
                # of this one): planned again at the next tick, not at the job's next due instant,
                # which the refused plan had put past the slots it failed to decide.
                self._dirty.update(dict.fromkeys(r["job"] for r in result["refused"]))
                self._wake.set()
        return ok

