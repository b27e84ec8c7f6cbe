"""`raftcron agent`: the process around one node.

Parses the arguments, builds the raft node around the state machine, hands it
to the scheduler's runtime (``scheduler/runtime.py``: worker, leader loop,
alert sender) and serves the HTTP API; runs them until SIGTERM or SIGINT,
then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from raftlog import Bridge, ClockEstimate, MissingSecret, NodeConfig, RaftNode, Space
from raftlog.heap import FreezeAfterSlowCollections, tune_collector
from raftlog.space import MIN_FREE
from scheduler.clock import SystemClock
from scheduler.commands import APPLIES
from scheduler.duration import parse_duration
from scheduler.executors import HttpExecutor, ShellExecutor
from scheduler.executors.http import CONNECTIONS_PER_HOST
from scheduler.executors.shell import ShellUser, resolve_shell_user
from scheduler.runtime import RuntimeConfig, SchedulerRuntime
from scheduler.skew import ClusterTime, leader_lead_us, parse_max_skew
from scheduler.spill import Spiller
from scheduler.state import SNAPSHOT_VERSION, SNAPSHOT_VERSIONS, State

from .app import create_app
from .context import ApiContext, Tokens
from .logs import setup_logging
from .metrics import MAX_JOB_SERIES, Metrics
from .secretfile import check_secret, read_secret_file

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
    shell_user: ShellUser | None = None
    api_token: str | None = None
    api_read_token: str | None = None
    alert_webhook: str | None = None
    lease: float = 5.0
    fsync: bool = True
    min_free: int = MIN_FREE
    compaction_entries: int = 20000
    max_clock_skew: float = 0.5
    http_connections_per_host: int = CONNECTIONS_PER_HOST
    metrics_max_jobs: int = MAX_JOB_SERIES
    snapshot_format: int = SNAPSHOT_VERSION
    event_loop: str = "uvloop"
    runs_in_memory: bool = False


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
    p.add_argument("--secret", default=_env("SECRET"), help="cluster secret, at least 32 bytes; this or --secret-file is required (RAFTCRON_SECRET)")
    p.add_argument("--secret-file", default=_env("SECRET_FILE"), help="read the cluster secret from this file, if --secret is not given (RAFTCRON_SECRET_FILE)")
    p.add_argument("--tag", action="append", default=None, metavar="K=V", help="node tag for job targeting; repeatable (RAFTCRON_TAGS=k=v,k2=v2)")
    p.add_argument("--allow-shell", action="store_true", default=_truthy(_env("ALLOW_SHELL")), help="run shell jobs on this node (RAFTCRON_ALLOW_SHELL)")
    p.add_argument("--shell-user", default=_env("SHELL_USER"), help="run shell jobs as this unprivileged user; the agent must run as root (RAFTCRON_SHELL_USER)")
    p.add_argument("--api-token", default=_env("API_TOKEN"), help="bearer token for the API (RAFTCRON_API_TOKEN)")
    p.add_argument("--api-read-token", default=_env("API_READ_TOKEN"), help="read-only bearer token (RAFTCRON_API_READ_TOKEN)")
    p.add_argument("--alert-webhook", default=_env("ALERT_WEBHOOK"), help="default alert webhook (RAFTCRON_ALERT_WEBHOOK)")
    p.add_argument("--lease", default=_env("LEASE", "5s"), help="attempt lease, e.g. 5s (RAFTCRON_LEASE)")
    p.add_argument("--max-clock-skew", default=_env("MAX_CLOCK_SKEW", "500ms"), help="a node whose clock is further than this from the leader's gets no attempts, e.g. 500ms, 2s (RAFTCRON_MAX_CLOCK_SKEW)")
    p.add_argument("--http-connections-per-host", default=_env("HTTP_CONNECTIONS_PER_HOST", str(CONNECTIONS_PER_HOST)),
                   help=f"connections the http executor holds open to one host at once; an attempt beyond them waits, "
                        f"within its timeout; 0: no bound (default {CONNECTIONS_PER_HOST}) (RAFTCRON_HTTP_CONNECTIONS_PER_HOST)")
    p.add_argument("--metrics-max-jobs", default=_env("METRICS_MAX_JOBS", str(MAX_JOB_SERIES)),
                   help=f"jobs with per-job series in /metrics on this node; the runs of further jobs are counted "
                        f"under job=\"_other\" (default {MAX_JOB_SERIES}) (RAFTCRON_METRICS_MAX_JOBS)")
    p.add_argument("--compaction-entries", type=int, default=int(_env("COMPACTION_ENTRIES", "20000")), help="snapshot after this many journal entries (RAFTCRON_COMPACTION_ENTRIES)")
    p.add_argument("--snapshot-format", default=_env("SNAPSHOT_FORMAT", str(SNAPSHOT_VERSION)),
                   help=f"state snapshot version this node writes: {SNAPSHOT_VERSION} (default), or an earlier one "
                        f"({', '.join(str(v) for v in SNAPSHOT_VERSIONS[:-1])}) while a node of a release that reads "
                        f"only up to it is still a member (a rolling upgrade); every version listed is read "
                        f"(RAFTCRON_SNAPSHOT_FORMAT)")
    p.add_argument("--runs-in-memory", action="store_true", default=_truthy(_env("RUNS_IN_MEMORY")),
                   help="keep all of the run history in memory; by default the history of jobs that have not run "
                        "for a while is kept in an unnamed scratch file in the data directory and read back when "
                        "needed (RAFTCRON_RUNS_IN_MEMORY)")
    p.add_argument("--no-fsync", action="store_true", default=_truthy(_env("NO_FSYNC")), help="do not fsync the journal (faster, loses acknowledged writes on power loss) (RAFTCRON_NO_FSYNC)")
    p.add_argument("--min-free", type=int, default=int(_env("MIN_FREE", str(MIN_FREE))), help=f"refuse writes (507) while the data directory has fewer free bytes than this (default {MIN_FREE}) (RAFTCRON_MIN_FREE)")
    p.add_argument("--event-loop", default=_env("EVENT_LOOP", "uvloop"),
                   help="the agent's event loop: uvloop (default), which takes less CPU a request, or asyncio, the "
                        "standard library's (RAFTCRON_EVENT_LOOP)")
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
    secret_file = getattr(args, "secret_file", None)
    if args.secret:
        secret = args.secret
        check_secret(secret, "--secret (RAFTCRON_SECRET)")
        if os.environ.get("RAFTCRON_SECRET") != secret:
            log.warning("the cluster secret was given as --secret on the command line, which every local user "
                        "can read in /proc/<pid>/cmdline; prefer --secret-file or RAFTCRON_SECRET")
    elif secret_file:
        secret = read_secret_file(Path(secret_file))
    else:
        raise MissingSecret(
            "--secret or --secret-file (RAFTCRON_SECRET, RAFTCRON_SECRET_FILE) is required: the raft port "
            "carries pickled objects, and only the secret keeps strangers from running code through it"
        )
    shell_user_name = getattr(args, "shell_user", None)
    shell_user = resolve_shell_user(shell_user_name) if shell_user_name else None
    peers = tuple(p.strip() for p in (args.peers or "").split(",") if p.strip())
    return AgentConfig(
        node_id=args.node_id, raft_addr=args.raft_addr, peers=peers, http_addr=args.http_addr,
        data_dir=Path(args.data_dir or f"./data/{args.node_id}"), secret=secret, tags=_tags(args.tag),
        allow_shell=bool(args.allow_shell), shell_user=shell_user, api_token=args.api_token, api_read_token=args.api_read_token,
        alert_webhook=args.alert_webhook, lease=parse_duration(args.lease), fsync=not args.no_fsync,
        compaction_entries=args.compaction_entries, max_clock_skew=parse_max_skew(str(args.max_clock_skew)),
        min_free=args.min_free, http_connections_per_host=_count("--http-connections-per-host", args.http_connections_per_host),
        metrics_max_jobs=_count("--metrics-max-jobs", args.metrics_max_jobs),
        snapshot_format=_snapshot_format(args.snapshot_format),
        event_loop=_event_loop(getattr(args, "event_loop", "uvloop")),
        runs_in_memory=bool(getattr(args, "runs_in_memory", False)),
    )


EVENT_LOOPS = ("uvloop", "asyncio")


def _event_loop(value: object) -> str:
    name = str(value).strip().lower()
    if name not in EVENT_LOOPS:
        raise ValueError(f"--event-loop (RAFTCRON_EVENT_LOOP): expected one of {', '.join(EVENT_LOOPS)}, got {value!r}")
    return name


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the agent's event loop for ``asyncio.Runner``: uvloop's, or None for the standard
    library's, made and set as this thread's current loop as ``asyncio.run`` does."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def _snapshot_format(value: object) -> int:
    if str(value).strip() not in {str(v) for v in SNAPSHOT_VERSIONS}:
        raise ValueError(f"--snapshot-format (RAFTCRON_SNAPSHOT_FORMAT): expected one of "
                         f"{', '.join(str(v) for v in SNAPSHOT_VERSIONS)}, got {value!r}")
    return int(str(value))


def _count(flag: str, value: object) -> int:
    """A flag's whole number of 0 or more, or an error naming the flag and its variable."""
    try:
        n = int(str(value))
    except ValueError:
        n = -1
    if n < 0:
        env = "RAFTCRON_" + flag.removeprefix("--").upper().replace("-", "_")
        raise ValueError(f"{flag} ({env}): expected a whole number, 0 or more, got {value!r}")
    return n


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class Agent:
    def __init__(self, cfg: AgentConfig, advertise_http: str | None = None) -> None:
        self.cfg = cfg
        self.advertise_http = advertise_http or cfg.http_addr
        self.clock = SystemClock()
        self.state = State(snapshot_version=cfg.snapshot_format)
        self.node: RaftNode | None = None
        self.runtime: SchedulerRuntime | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        # Executors and worker read the cluster's time (the leader's clock), see scheduler.skew.
        self.cluster_time = ClusterTime(self.clock, self._offset_to_leader, self._leader_lead_us)
        self.http = HttpExecutor(now=self.cluster_time.now, per_host=cfg.http_connections_per_host)
        self.metrics: Metrics | None = None

    def _offset_to_leader(self) -> ClockEstimate | None:
        return self.node.clock_offset_to_leader() if self.node is not None else None

    def _leader_lead_us(self) -> int:
        leader = self.node.leader() if self.node is not None else None
        return leader_lead_us(self.state.clocks, self.state.nodes, leader)[0]

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.cfg
        runtime = SchedulerRuntime(
            self.state, self.clock,
            RuntimeConfig(node_id=c.node_id, raft_addr=c.raft_addr, http_addr=self.advertise_http, tags=c.tags,
                          allow_shell=c.allow_shell, lease=c.lease, alert_webhook=c.alert_webhook,
                          max_clock_skew=c.max_clock_skew),
            {"http": self.http, "shell": ShellExecutor(c.allow_shell, user=c.shell_user, now=self.cluster_time.now)},
            loop,
            cluster_time=self.cluster_time)
        self.runtime = runtime
        _private_dir(c.data_dir)
        if not c.runs_in_memory:
            self.state.runs.spill_to(Spiller(c.data_dir, min_free=c.min_free))
        node = RaftNode(
            NodeConfig(raft_addr=c.raft_addr, peers=c.peers, data_dir=c.data_dir, secret=c.secret, fsync=c.fsync,
                       compaction_entries=c.compaction_entries, min_free=c.min_free, applies=APPLIES),
            self.state, on_applied=runtime.applied_from_raft, on_role=runtime.role_from_raft,
        )
        await asyncio.to_thread(node.start)
        self.node = node
        self.metrics = Metrics(node_id=c.node_id, state=self.state, raft=node.status, max_jobs=c.metrics_max_jobs,
                               relay=runtime.relay)
        service = runtime.start(node, Bridge(node, loop, runtime.relay), observer=self.metrics)
        self.metrics.worker = runtime.worker
        self.metrics.unplanned = runtime.unplanned_jobs
        ctx = ApiContext(service=service, node_id=c.node_id, http_addr=self.advertise_http, raft_addr=c.raft_addr,
                         live=runtime.trusted_live, tokens=Tokens(c.api_token, c.api_read_token), metrics=self.metrics,
                         space=Space(c.data_dir, c.min_free))
        self.api_context = ctx
        self._runner = web.AppRunner(create_app(ctx), access_log=None)
        await self._runner.setup()
        host, port = _split(c.http_addr)
        await web.TCPSite(self._runner, host, port).start()
        log.info("node %s: API on http://%s, raft on %s, peers %s; event loop %s", c.node_id, c.http_addr, c.raft_addr,
                 ", ".join(c.peers) or "(none: single-node cluster)", type(asyncio.get_running_loop()).__module__.split(".")[0])
        self._tasks = [
            asyncio.create_task(self._watch_peers(), name="peer-watch"),
            asyncio.create_task(self._sample_trend(), name="trend"),
        ]

    async def stop(self) -> None:
        log.info("shutting down")
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.runtime is not None:
            await self.runtime.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http.close()
        if self.node is not None:
            await asyncio.to_thread(self.node.stop)

    # ---- background duties -----------------------------------------------------------------

    async def _sample_trend(self) -> None:
        """The dashboard's cluster charts: a sample of this node every few seconds (api.metrics.Trend)."""
        assert self.metrics is not None
        while True:
            try:
                self.metrics.sample_trend(time.time())
            except Exception:  # noqa: BLE001 - a bug here must not freeze the charts for good
                log.exception("could not sample the trend")
            await asyncio.sleep(self.metrics.trend.every)

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


def _private_dir(path: Path) -> None:
    """The data directory 0700 and what is in it 0600: journal and snapshots hold job
    secrets (headers, env). The umask (run_agent) covers what is created from now on;
    this tightens a directory an older version left readable."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    for entry in path.iterdir():
        if entry.is_file() and not entry.is_symlink():
            entry.chmod(0o600)


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


def undumpable() -> None:
    """Make this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``).

    A shell job without ``--shell-user`` runs as the agent's own user and could otherwise read
    ``/proc/<agent>/environ``, which holds the cluster secret and the API tokens when they
    were given as environment variables (as compose does), or attach to the agent with
    ptrace. Non-dumpable, those files belong to root and the attach is refused. Children are
    not affected: exec makes them dumpable again.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        log.warning("could not make the agent non-dumpable (errno %d): shell jobs run as this user can "
                    "read its environment", ctypes.get_errno())


def run_agent(args: argparse.Namespace) -> int:
    setup_logging(args.log_format, args.log_level)
    # Time zones come from the tzdata package only, never the host's files: job
    # validation runs inside apply, and replicas must agree on which zones exist.
    zoneinfo.reset_tzpath(to=[])
    tune_collector()  # see raftlog.heap.THRESHOLDS
    # A large state still makes each full collection walk millions of objects (~1.9 s with
    # 100,000 jobs): what survives a slow one is frozen so that the next walks only what is new.
    FreezeAfterSlowCollections().install()
    # Journal, snapshots and anything else the node writes: readable by this user only.
    os.umask(0o077)
    undumpable()
    try:
        cfg = config_from_args(args)
    except (ValueError, MissingSecret) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        factory = loop_factory(cfg.event_loop)
    except ImportError as exc:
        print(f"error: --event-loop {cfg.event_loop}: {exc}; install it, or start with --event-loop asyncio",
              file=sys.stderr, flush=True)
        return 2
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve(cfg, getattr(args, "advertise_http", None)))
