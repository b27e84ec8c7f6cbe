"""`raftcron agent`: the composition root.

Builds the raft node around the state machine, the worker, the leader loop
(started and stopped as leadership comes and goes) and the HTTP API; runs
them until SIGTERM or SIGINT, then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from raftlog import ApplyContext, Bridge, MissingSecret, NodeConfig, RaftNode
from raftlog.bridge import Relay
from scheduler.alert_sender import AlertSender
from scheduler.clock import SystemClock
from scheduler.commands import RegisterNode
from scheduler.duration import parse_duration
from scheduler.errors import RaftcronError
from scheduler.executors import HttpExecutor, ShellExecutor
from scheduler.leader import LeaderConfig, LeaderLoop
from scheduler.planner import PlanConfig, us
from scheduler.service import Service
from scheduler.skew import ClusterTime, SkewWatch, parse_max_skew, trusted
from scheduler.state import Applied, State
from scheduler.worker import Worker

from .app import create_app
from .context import ApiContext, Tokens
from .logs import setup_logging
from .metrics import Metrics

__all__ = ["AgentConfig", "Agent", "add_agent_arguments", "run_agent", "config_from_args"]

log = logging.getLogger("raftcron.agent")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    node_id: str
    raft_addr: str
    peers: tuple[str, ...]
    http_addr: str
    data_dir: Path
    secret: str
    tags: dict[str, str] = field(default_factory=dict)
    allow_shell: bool = False
    api_token: str | None = None
    api_read_token: str | None = None
    alert_webhook: str | None = None
    lease: float = 5.0
    fsync: bool = True
    compaction_entries: int = 20000
    max_clock_skew: float = 0.5


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get("RAFTCRON_" + name, default)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-id", default=_env("NODE_ID"), help="this node's name (RAFTCRON_NODE_ID)")
    p.add_argument("--raft-addr", default=_env("RAFT_ADDR"), help="host:port raft binds and peers dial (RAFTCRON_RAFT_ADDR)")
    p.add_argument("--peers", default=_env("PEERS", ""), help="other members' raft addresses, comma separated; empty: single node (RAFTCRON_PEERS)")
    p.add_argument("--http-addr", default=_env("HTTP_ADDR", "127.0.0.1:8001"), help="host:port of the API (RAFTCRON_HTTP_ADDR)")
    p.add_argument("--advertise-http", default=_env("ADVERTISE_HTTP"), help="API address other nodes and clients use, if not --http-addr (RAFTCRON_ADVERTISE_HTTP)")
    p.add_argument("--data-dir", default=_env("DATA_DIR"), help="journal and snapshots (RAFTCRON_DATA_DIR), default ./data/NODE_ID")
    p.add_argument("--secret", default=_env("SECRET"), help="cluster secret, required (RAFTCRON_SECRET)")
    p.add_argument("--tag", action="append", default=None, metavar="K=V", help="node tag for job targeting; repeatable (RAFTCRON_TAGS=k=v,k2=v2)")
    p.add_argument("--allow-shell", action="store_true", default=_truthy(_env("ALLOW_SHELL")), help="run shell jobs on this node (RAFTCRON_ALLOW_SHELL)")
    p.add_argument("--api-token", default=_env("API_TOKEN"), help="bearer token for the API (RAFTCRON_API_TOKEN)")
    p.add_argument("--api-read-token", default=_env("API_READ_TOKEN"), help="read-only bearer token (RAFTCRON_API_READ_TOKEN)")
    p.add_argument("--alert-webhook", default=_env("ALERT_WEBHOOK"), help="default alert webhook (RAFTCRON_ALERT_WEBHOOK)")
    p.add_argument("--lease", default=_env("LEASE", "5s"), help="attempt lease, e.g. 5s (RAFTCRON_LEASE)")
    p.add_argument("--max-clock-skew", default=_env("MAX_CLOCK_SKEW", "500ms"), help="a node whose clock is further than this from the leader's gets no attempts, e.g. 500ms, 2s (RAFTCRON_MAX_CLOCK_SKEW)")
    p.add_argument("--compaction-entries", type=int, default=int(_env("COMPACTION_ENTRIES", "20000")), help="snapshot after this many journal entries (RAFTCRON_COMPACTION_ENTRIES)")
    p.add_argument("--no-fsync", action="store_true", default=_truthy(_env("NO_FSYNC")), help="do not fsync the journal (faster, loses acknowledged writes on power loss) (RAFTCRON_NO_FSYNC)")
    p.add_argument("--log-format", choices=("text", "json"), default=_env("LOG_FORMAT", "text"), help="(RAFTCRON_LOG_FORMAT)")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), help="debug|info|warning (RAFTCRON_LOG_LEVEL)")


def _tags(values: list[str] | None) -> dict[str, str]:
    raw = values if values is not None else [t for t in (_env("TAGS", "") or "").split(",") if t.strip()]
    tags = {}
    for item in raw:
        if "=" not in item:
            raise ValueError(f"--tag {item!r}: expected key=value")
        k, v = item.split("=", 1)
        tags[k.strip()] = v.strip()
    return tags


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    missing = [flag for flag, v in (("--node-id", args.node_id), ("--raft-addr", args.raft_addr)) if not v]
    if missing:
        raise ValueError(f"{', '.join(missing)} required (or the RAFTCRON_* variable)")
    if not args.secret:
        raise MissingSecret(
            "--secret (or RAFTCRON_SECRET) is required: the raft port carries pickled objects, and only "
            "the secret keeps strangers from running code through it"
        )
    peers = tuple(p.strip() for p in (args.peers or "").split(",") if p.strip())
    return AgentConfig(
        node_id=args.node_id, raft_addr=args.raft_addr, peers=peers, http_addr=args.http_addr,
        data_dir=Path(args.data_dir or f"./data/{args.node_id}"), secret=args.secret, tags=_tags(args.tag),
        allow_shell=bool(args.allow_shell), api_token=args.api_token, api_read_token=args.api_read_token,
        alert_webhook=args.alert_webhook, lease=parse_duration(args.lease), fsync=not args.no_fsync,
        compaction_entries=args.compaction_entries, max_clock_skew=parse_max_skew(str(args.max_clock_skew)),
    )


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class Agent:
    def __init__(self, cfg: AgentConfig, advertise_http: str | None = None) -> None:
        self.cfg = cfg
        self.advertise_http = advertise_http or cfg.http_addr
        self.clock = SystemClock()
        self.state = State()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.relay: Relay | None = None
        self.node: RaftNode | None = None
        self.leader: LeaderLoop | None = None
        self._leader_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        # Executors and worker read the cluster's time (the leader's clock), see scheduler.skew.
        self.cluster_time = ClusterTime(self.clock, lambda: self.node.clock_offset_to_leader() if self.node else None)
        self.http = HttpExecutor(now=self.cluster_time.now)
        self.worker: Worker | None = None
        self.metrics: Metrics | None = None

    # ---- raft thread -> event loop ----------------------------------------------------

    def _on_applied(self, ctx: ApplyContext, result: Any) -> None:
        relay = self.relay
        if relay is None or not isinstance(result, Applied):
            return
        relay.post(self._dispatch, result, ctx.replay)

    def _dispatch(self, applied: Applied, replay: bool) -> None:
        if self.metrics is not None:
            self.metrics.on_applied(applied, replay)
        if self.worker is not None:
            self.worker.on_applied(applied, replay)
        if self.leader is not None and self._leader_task is not None and not self._leader_task.done():
            self.leader.notify(applied)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        # One queue for applied entries and settled submits: they reach the loop in the
        # order the raft thread produced them.
        self.relay = Relay(self.loop)
        c = self.cfg
        node = RaftNode(
            NodeConfig(raft_addr=c.raft_addr, peers=c.peers, data_dir=c.data_dir, secret=c.secret, fsync=c.fsync,
                       compaction_entries=c.compaction_entries),
            self.state, on_applied=self._on_applied,
        )
        await asyncio.to_thread(node.start)
        self.node = node
        service = Service(self.state, node, Bridge(node, self.loop, self.relay), self.clock, c.node_id)
        self.service = service
        self.worker = Worker(service, self.clock, {"http": self.http, "shell": ShellExecutor(c.allow_shell, now=self.cluster_time.now)},
                             lease=c.lease, max_skew=c.max_clock_skew, cluster=self.cluster_time)
        self.metrics = Metrics(node_id=c.node_id, state=self.state, raft=node.status, worker=self.worker)
        self.worker.on_start, self.worker.on_finish = self.metrics.run_started, self.metrics.run_finished
        self.worker.start()
        ctx = ApiContext(service=service, node_id=c.node_id, http_addr=self.advertise_http, raft_addr=c.raft_addr,
                         live=lambda: trusted(self.live(), self.state.clocks), tokens=Tokens(c.api_token, c.api_read_token),
                         extras={"metrics": self.metrics, "observe_api": self.metrics.observe_api})
        self.api_context = ctx
        self._runner = web.AppRunner(create_app(ctx), access_log=None)
        await self._runner.setup()
        host, port = _split(c.http_addr)
        await web.TCPSite(self._runner, host, port).start()
        log.info("node %s: API on http://%s, raft on %s, peers %s", c.node_id, c.http_addr, c.raft_addr,
                 ", ".join(c.peers) or "(none: single-node cluster)")
        self._tasks = [
            asyncio.create_task(self._register(), name="register"),
            asyncio.create_task(self._watch_leadership(), name="leadership"),
            asyncio.create_task(self._watch_peers(), name="peer-watch"),
            asyncio.create_task(self.worker.report_orphans(node.replay_upto), name="orphans"),
        ]

    async def stop(self) -> None:
        log.info("shutting down")
        for t in [*self._tasks, *([self._leader_task] if self._leader_task else [])]:
            t.cancel()
        await asyncio.gather(*self._tasks, *([self._leader_task] if self._leader_task else []), return_exceptions=True)
        if self.worker is not None:
            await self.worker.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http.close()
        if self.node is not None:
            await asyncio.to_thread(self.node.stop)
        self.loop = None

    # ---- background duties -----------------------------------------------------------------

    def live(self) -> set[str]:
        """Node ids this node can reach now (itself included), by raft connectivity."""
        if self.node is None:
            return set()
        st = self.node.status()
        addrs = {p.raft_addr for p in st.partners if p.connected} | {self.cfg.raft_addr}
        return {n["node_id"] for n in list(self.state.nodes.values()) if n["raft_addr"] in addrs}

    async def _register(self) -> None:
        c = self.cfg
        cmd = RegisterNode(at_us=us(self.clock.now()), node_id=c.node_id, raft_addr=c.raft_addr,
                           http_addr=self.advertise_http, tags=dict(c.tags), allow_shell=c.allow_shell)
        want = {"node_id": c.node_id, "raft_addr": c.raft_addr, "http_addr": self.advertise_http,
                "tags": dict(c.tags), "allow_shell": c.allow_shell}
        delay = 0.2
        while True:
            have = self.state.nodes.get(c.node_id)
            if have is not None and {k: have.get(k) for k in want} == want:
                return
            try:
                await self.service.propose(cmd)
                log.info("registered node %s (tags %s, shell %s)", c.node_id, c.tags, c.allow_shell)
            except RaftcronError as exc:
                log.debug("registration not committed yet: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _watch_leadership(self) -> None:
        assert self.node is not None
        lease = self.cfg.lease
        while True:
            leading = self.node.is_leader()
            running = self._leader_task is not None and not self._leader_task.done()
            if leading and not running:
                skew = SkewWatch(self.service, self.clock, self.live, self.cfg.max_clock_skew)
                self.leader = LeaderLoop(self.service, self.clock, LeaderConfig(lease=lease, plan=PlanConfig(
                    start_deadline_us=int(max(2 * lease, 10) * 1e6))), skew.live)
                self._leader_task = asyncio.create_task(self._lead(self.leader, skew), name="leader")
            elif not leading and running:
                assert self._leader_task is not None
                self._leader_task.cancel()
            await asyncio.sleep(0.05)

    async def _lead(self, loop: LeaderLoop, skew: SkewWatch) -> None:
        """Everything only the leader does; cancelled as one when leadership goes."""
        sender = AlertSender(self.service, self.clock, self.cfg.alert_webhook, lambda: f"http://{self.advertise_http}",
                             on_delivery=self.metrics.alert_delivered if self.metrics else None)
        # The leader loop decides when this leadership is over (it also ends on a new term,
        # even one this node won again); the sender goes with it, so the watcher starts a
        # fresh loop, barrier first, for the next term.
        sender_task = asyncio.create_task(sender.run(), name="alert-sender")
        skew_task = asyncio.create_task(skew.run(), name="clock-skew")
        try:
            await loop.run()
        finally:
            sender_task.cancel()
            skew_task.cancel()
            await asyncio.gather(sender_task, skew_task, return_exceptions=True)

    async def _watch_peers(self) -> None:
        """pysyncobj drops frames it cannot decrypt without a word: say why no leader appears."""
        assert self.node is not None
        warned = False
        while True:
            await asyncio.sleep(2.0)
            st = self.node.status()
            if st.leader is not None or st.seconds_without_leader < 6.0 or not self.cfg.peers:
                warned = False
                continue
            answering = [p for p in self.cfg.peers if await asyncio.to_thread(_port_open, p)]
            if answering and not warned:
                log.error("no leader for %.0fs although peers %s accept connections: the --secret differs "
                          "between this node and its peers, or too few members are up for a majority",
                          st.seconds_without_leader, ", ".join(answering))
                warned = True
            elif not answering:
                log.warning("no leader for %.0fs: cannot reach any peer (%s)", st.seconds_without_leader,
                            ", ".join(self.cfg.peers))


def _port_open(addr: str) -> bool:
    host, port = _split(addr)
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _serve(cfg: AgentConfig, advertise: str | None) -> int:
    agent = Agent(cfg, advertise)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.start()
    await stop.wait()
    await agent.stop()
    return 0


def run_agent(args: argparse.Namespace) -> int:
    setup_logging(args.log_format, args.log_level)
    # Time zones come from the tzdata package only, never the host's files: job
    # validation runs inside apply, and replicas must agree on which zones exist.
    zoneinfo.reset_tzpath(to=[])
    # The job store and the ledger are many small long-lived dicts, and every applied
    # entry allocates more: with Python's default thresholds (700, 10, 10) the collector
    # kept walking them, ~25 us per job write with 20,000 jobs (~7 us with these). What
    # was loaded at start (the modules) is left out of collections.
    gc.set_threshold(10_000, 50, 50)
    gc.freeze()
    try:
        cfg = config_from_args(args)
    except (ValueError, MissingSecret) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return asyncio.run(_serve(cfg, getattr(args, "advertise_http", None)))
