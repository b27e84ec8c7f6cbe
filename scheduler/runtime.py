"""The scheduler's composition root: one node's state, worker, leader loop and alert sender.

Wiring, in the order a slot travels:

- the raft thread hands each applied entry to ``applied_from_raft``, which
  posts it through one ``Relay`` to the event loop (in log order, together
  with the submits it settles); there ``_dispatch`` gives it to the observer
  (metrics), the worker (claims addressed to this node, cancels, fencing) and
  the running leader loop (jobs edited);
- leadership arrives as ``RoleChange`` events (``role_from_raft`` from the
  raft thread, ``on_role`` on the loop): leading in a term starts that term's
  leader loop, barrier first, with the alert sender beside it; anything else
  stops them;
- a leader loop that crashes is restarted with backoff (``restart_first``
  doubling to ``restart_max``; back to the first after ``restart_healthy``
  seconds without a crash), so one bad job cannot make it spin.

The raft node itself is reached only through ``RaftPort`` and ``Committer``
(``scheduler/base.py``); this module knows nothing of pysyncobj or HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raftlog import ApplyContext
from raftlog.bridge import Relay

from .alert_sender import AlertSender
from .base import ClockEstimate, Committer, Observer, RaftPort, RoleChange, observed_role
from .clock import Clock
from .commands import RegisterNode
from .errors import RaftcronError
from .executors.base import Executor
from .instants import us
from .leader import LeaderConfig, LeaderLoop
from .planner import PlanConfig
from .service import Service
from .skew import ClusterTime, SkewWatch, leader_lead_us, trusted
from .state import Applied, State
from .worker import Worker

__all__ = ["RuntimeConfig", "SchedulerRuntime"]

log = logging.getLogger("raftcron.runtime")


def _say_if_failed(task: asyncio.Task[Any]) -> None:
    """A leader's side task (alerts, the clock judge) that ended on an error, in the log: it is
    not restarted within the leadership, and nothing else would tell."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s stopped on an error for the rest of this leadership: %s: %s", task.get_name(),
                  type(exc).__name__, exc, exc_info=exc)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    node_id: str
    raft_addr: str
    http_addr: str  # the API address other nodes and alert links use
    tags: Mapping[str, str] = field(default_factory=dict)
    allow_shell: bool = False
    lease: float = 5.0
    alert_webhook: str | None = None
    max_clock_skew: float = 0.5  # seconds; a node further from the leader's clock gets no attempts
    leader: LeaderConfig | None = None  # None: derived from the lease (see leader_config)
    restart_first: float = 0.1
    restart_max: float = 5.0
    restart_healthy: float = 30.0

    def leader_config(self) -> LeaderConfig:
        if self.leader is not None:
            return self.leader
        # A claim not started this long after its slot is lost: two leases, at least 10 s.
        deadline = max(2 * self.lease, 10.0)
        return LeaderConfig(lease=self.lease, plan=PlanConfig(start_deadline_us=int(deadline * 1e6)))


class SchedulerRuntime:
    """Build with the loop, hand ``applied_from_raft`` to the raft node, then ``start(port, committer)``."""

    def __init__(self, state: State, clock: Clock, cfg: RuntimeConfig, executors: Mapping[str, Executor],
                 loop: asyncio.AbstractEventLoop, *, cluster_time: ClusterTime | None = None) -> None:
        """``cluster_time``: the reading of the leader's clock the executors were given, if they
        were built first; by default one over the node this runtime is started with."""
        self.state = state
        self.clock = clock
        self.cfg = cfg
        self.executors = dict(executors)
        # One queue for applied entries, role changes and settled submits: they reach the
        # loop in the order the raft thread produced them.
        self.relay = Relay(loop)
        # The cluster's time: this node's wall clock plus its estimated offset to the leader's.
        # Executors and the worker read it, so every instant reported is by the leader's clock.
        self.cluster_time = cluster_time or ClusterTime(clock, self._offset_to_leader, self._leader_lead_us)
        self.service: Service | None = None
        self.worker: Worker | None = None
        self.leader: LeaderLoop | None = None
        self.observer: Observer | None = None
        self.restarts = 0  # leader loop crashes since start
        self._lead_task: asyncio.Task[None] | None = None
        self._lead_term: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ---- raft thread -> event loop ------------------------------------------------

    def applied_from_raft(self, ctx: ApplyContext, result: Any) -> None:
        """``RaftNode(on_applied=...)``: runs on the raft thread."""
        if isinstance(result, Applied):
            self.relay.post(self._dispatch, result, ctx.replay)

    def _offset_to_leader(self) -> ClockEstimate | None:
        return self.service.node.clock_offset_to_leader() if self.service is not None else None

    def _leader_lead_us(self) -> int:
        leader = self.service.node.leader() if self.service is not None else None
        return leader_lead_us(self.state.clocks, self.state.nodes, leader)[0]

    def role_from_raft(self, change: RoleChange) -> None:
        """``RaftNode(on_role=...)``: runs on the raft thread."""
        self.relay.post(self.on_role, change)

    def _dispatch(self, applied: Applied, replay: bool) -> None:
        if self.observer is not None:
            self.observer.on_applied(applied, replay)
        if self.worker is not None:
            self.worker.on_applied(applied, replay)
        if self.leader is not None and self.leading:
            self.leader.notify(applied)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self, port: RaftPort, committer: Committer, *, observer: Observer | None = None) -> Service:
        """Wire the node in and start the worker; leadership then follows ``on_role``."""
        self.service = service = Service(self.state, port, committer, self.clock, self.cfg.node_id,
                                               cluster_now_us=self.cluster_time.reached_us)
        self.observer = observer
        self.worker = worker = Worker(service, self.clock, self.executors, lease=self.cfg.lease,
                                      max_skew=self.cfg.max_clock_skew, cluster=self.cluster_time)
        if observer is not None:
            worker.on_start, worker.on_finish = observer.run_started, observer.run_finished
        worker.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._register(), name="register"),
            loop.create_task(worker.report_orphans(port.replay_upto), name="orphans"),
        ]
        # Events from before the start found nothing to drive: begin from the role as it is.
        self.on_role(observed_role(port.status()))
        return service

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._lead_task] if self._lead_task is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.worker is not None:
            await self.worker.stop()

    @property
    def leading(self) -> bool:
        """A leader loop (or its restart) is in charge on this node now."""
        return self._lead_task is not None and not self._lead_task.done()

    def unplanned_jobs(self) -> int:
        """On the leader, the jobs whose next slot its loop does not know yet; 0 elsewhere."""
        if not self.leading:
            return 0
        return self.leader.unplanned() if self.leader is not None else len(self.state.jobs)

    def trusted_live(self) -> set[str]:
        """``live`` less the nodes whose clock the cluster recorded as skewed (API picks)."""
        return trusted(self.live(), self.state.clocks)

    def live(self) -> set[str]:
        """Node ids this node can reach now (itself included), by raft connectivity."""
        if self.service is None:
            return set()
        st = self.service.node.status()
        addrs = {p.raft_addr for p in st.partners if p.connected} | {self.cfg.raft_addr}
        return {n["node_id"] for n in list(self.state.nodes.values()) if n["raft_addr"] in addrs}

    # ---- leadership --------------------------------------------------------------------

    def on_role(self, change: RoleChange) -> None:
        """On the event loop, after this node's role, its known leader or the term changed."""
        if self.service is None:
            return
        if change.role != "leader":
            self._stop_leading()
            return
        if self.leading and self._lead_term == change.term:
            return  # the same leadership (only the known leader's address changed)
        # A new term, even one this node won again, starts over with its own barrier.
        self._stop_leading()
        self._lead_term = change.term
        self._lead_task = asyncio.get_running_loop().create_task(self._lead(self.service, change.term), name="leader")

    def _stop_leading(self) -> None:
        # What this node's leader loop could not plan says nothing once another node plans.
        self.state.planning_errors.clear()
        if self._lead_task is not None and not self._lead_task.done():
            self._lead_task.cancel()
        self._lead_task = None
        self._lead_term = None

    async def _lead(self, service: Service, term: int) -> None:
        """Everything only the leader does in ``term``; cancelled as one when leadership goes."""
        sender = AlertSender(service, self.clock, self.cfg.alert_webhook, lambda: f"http://{self.cfg.http_addr}",
                             on_delivery=self.observer.alert_delivered if self.observer is not None else None)
        # One clock judge per leadership: skewed members leave the planner's live set.
        skew = SkewWatch(service, self.clock, self.live, self.cfg.max_clock_skew)
        loop = asyncio.get_running_loop()
        side = [loop.create_task(sender.run(), name="alert-sender"), loop.create_task(skew.run(), name="clock-skew")]
        for task in side:
            task.add_done_callback(_say_if_failed)
        try:
            await self._supervise(service, term, skew)
        finally:
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)

    async def _supervise(self, service: Service, term: int, skew: SkewWatch) -> None:
        backoff = self.cfg.restart_first
        while service.node.is_leader() and service.node.status().term == term:
            self.leader = LeaderLoop(service, self.clock, self.cfg.leader_config(), skew.live, skew.planning_now_us,
                                     skew.not_planning)
            began = self.clock.monotonic()
            try:
                # The loop decides when this leadership is over (it ends on a new term too).
                await self.leader.run()
                return
            except Exception as exc:  # noqa: BLE001 - a planning bug must not end leadership: restart, slowly
                ran = self.clock.monotonic() - began
                if ran >= self.cfg.restart_healthy:
                    backoff = self.cfg.restart_first
                self.restarts += 1
                log.error("leader loop crashed after %.1fs (restart %d, next in %.1fs): %s: %s", ran, self.restarts,
                          backoff, type(exc).__name__, exc, exc_info=exc)
            await self.clock.sleep(backoff)
            backoff = min(backoff * 2, self.cfg.restart_max)

    # ---- membership ----------------------------------------------------------------------

    async def _register(self) -> None:
        """Commit this node's entry in the member registry, until it reads as configured."""
        c, service = self.cfg, self.service
        assert service is not None
        cmd = RegisterNode(at_us=us(self.clock.now()), node_id=c.node_id, raft_addr=c.raft_addr,
                           http_addr=c.http_addr, tags=dict(c.tags), allow_shell=c.allow_shell)
        want = {"node_id": c.node_id, "raft_addr": c.raft_addr, "http_addr": c.http_addr,
                "tags": dict(c.tags), "allow_shell": c.allow_shell}
        delay = 0.2
        while True:
            have = self.state.nodes.get(c.node_id)
            if have is not None and {k: have.get(k) for k in want} == want:
                return
            try:
                await service.propose(cmd)
                log.info("registered node %s (tags %s, shell %s)", c.node_id, dict(c.tags), c.allow_shell)
            except RaftcronError as exc:
                log.debug("registration not committed yet: %s", exc)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 2.0)

