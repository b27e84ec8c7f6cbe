"""The public face of raftlog: RaftNode hosts a StateMachine on pysyncobj, with one
replicated entry point taking bytes, a durable journal, msgpack snapshots written off
the raft thread, the cluster secret, status, leadership events and the cluster's clock.

Its parts, one concern each: ``journal`` (durable meta, sized file, durable journal),
``transport`` (keepalives, per-peer batches), ``listener`` and ``connection`` (the raft
port against strangers: frame limits, unauthenticated connections swept and capped, a
listener that survives running out of descriptors), ``pacing`` (when the raft thread sends,
what a follower takes), ``host`` (the SyncObj subclass), ``clock`` (peers' wall
clocks), and ``pysyncobj_names``, the table of every pysyncobj private name they use,
checked against the installed pysyncobj when a node starts.

The rules come from what was measured of pysyncobj 0.3.17 (see the project's
design notes); each is applied here once so nothing above this module needs to
know them:

- no secret, no start: without a password pysyncobj unpickles anything that
  reaches its port;
- journal AND full dump always, or a restart after compaction applies nothing;
- exactly one ``@replicated`` method (they are numbered by sorted name);
- ``apply`` never raises into pysyncobj (a raising entry wedges the cluster);
- the applied-entry hook never raises either (a raising callback makes the
  node apply the entry twice);
- the journal is flushed to disk before pysyncobj acknowledges anything it
  appended (pysyncobj itself never fsyncs);
- the dump is msgpack written by a thread of ours (no pickle, no fork holding
  our listening sockets);
- AppendEntries go out as soon as a follower has acknowledged what it was sent
  (not only every ``append_period``), and a follower never truncates entries
  it already holds from the current leader (see ``_Pacer``);
- the cluster's time is the leader's wall clock; each node estimates every peer's
  wall clock against its own from round trips on the keepalive cadence (see
  ``clock``), and no wall time of one node is compared with another's anywhere
  else (a node's wall clock may be seconds off: it is reported, never trusted).
"""

from __future__ import annotations

import ctypes
import logging
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pysyncobj import SyncObjConf
from pysyncobj.config import FAIL_REASON

from .clock import ClockEstimate, ClockSync, TimeSource, raft_clock, relative_to
from .codec import CodecError
from .fsm import ApplyContext, LocalStateLost, StateMachine
from .heap import quiet_restore
from .host import _Host
from .journal import _DurableJournal, align_to_snapshot, journal_factory
from .listener import raise_fd_limit
from .pacing import _contact_at, _Pacer
from .prevote import PreVote
from .pysyncobj_names import check_pysyncobj
from .recovery import remove_partial_files
from .snapshot import SnapshotWriter, check_snapshot, read_snapshot
from .space import MIN_FREE, Space
from .transport import KEEPALIVE, send_keepalives

__all__ = ["FAIL_REASON", "ClockEstimate", "MemberStatus", "MissingSecret", "NodeConfig", "NodeStatus", "RaftNode",
           "RoleChange"]

log = logging.getLogger("raftcron.raft")

SubmitCallback = Callable[[Any, int], None]
AppliedHook = Callable[[ApplyContext, Any], None]


class MissingSecret(ValueError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    raft_addr: str
    peers: tuple[str, ...]
    data_dir: Path
    secret: str
    # Timing, chosen from bench/ measurements on a 2-core machine (README, "Benchmarks").
    # Batched AppendEntries, a heartbeat every 20 ms (checked each tick: 20-40 ms apart), and
    # _Pacer's eager sends between them.
    # pysyncobj's unbatched mode (batch_append=False, one message per command) cost twice the
    # CPU per run, and its overlapping re-sends made pysyncobj truncate and re-append entries
    # it had applied (reports waited seconds for commits, leases lapsed); _Pacer trims those.
    election_min: float = 0.4
    election_max: float = 1.0
    append_period: float = 0.02
    # The raft thread's poll waits at most this long: a message or a submit (a pipe) wakes it
    # at once, so only timers wait for it (the heartbeat, now 20-40 ms apart; elections;
    # keepalives). At 5 ms, 200 idle ticks a second cost each agent ~0.08 of a core (three idle
    # agents 0.25 cores, etcd's three 0.03-0.05); at 20 ms the three take 0.155.
    tick_period: float = 0.02
    batch_append: bool = True
    leader_fallback: float = 1.2
    fsync: bool = True
    compaction_entries: int = 20000
    # And at least this share of the records the state machine holds (``StateMachine.records``):
    # each snapshot packs the whole state, so at a fixed count a state ten times larger costs
    # ten times more per write (loading 1,000,000 jobs: 50 snapshots, each packing up to all
    # of them, 2,578 jobs/s against ~10,000 at 100,000). A restart replays at most that share.
    compaction_share: float = 0.2
    compaction_seconds: float = 300.0
    keepalive: float = 0.5  # seconds between keepalives on every raft link; under connectionTimeout
    min_free: int = MIN_FREE  # a leader with less free space in data_dir hands leadership over
    # Ask before an election (see raftlog.prevote). Off: this node neither asks nor announces
    # it, as a node of an earlier release would (it still answers a peer that asks).
    prevote: bool = True
    # The entry forms of the state machine this node applies beyond those every release does,
    # announced in its keepalives: a leader proposes such an entry only once every member has
    # announced it applies it (``RaftNode.peers_apply``), so no member of an older release is
    # ever handed an entry it would refuse while the others apply it.
    applies: tuple[str, ...] = ()


RAFT_THREAD_NAME = "raftcron-raft"
"""The raft thread's name as the OS shows it (``top -H``, ``/proc/<pid>/task/<tid>/comm``)."""


def name_os_thread(name: str) -> None:
    """Name the calling thread for the OS (Linux ``prctl(PR_SET_NAME)``, 15 bytes at most);
    elsewhere, or if it fails, nothing happens: a name is for people, nothing depends on it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # 15: PR_SET_NAME
    except Exception:  # noqa: BLE001 - see above
        pass


@dataclass(frozen=True, slots=True)
class MemberStatus:
    raft_addr: str
    connected: bool
    match_index: int | None
    # This member's wall clock minus the leader's, and the bound on that estimate's error
    # (seconds); None while unknown (no leader, or no round trip measured yet).
    clock_offset: float | None = None
    clock_error: float | None = None
    prevote: bool = False  # it announced that it answers pre-vote (see raftlog.prevote)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    raft_addr: str
    state: str  # follower | candidate | leader
    leader: str | None
    term: int
    commit_index: int
    applied_index: int
    has_quorum: bool
    raft_thread_alive: bool
    partners: tuple[MemberStatus, ...] = field(default_factory=tuple)
    last_snapshot_index: int = 0
    seconds_without_leader: float = 0.0
    clock_offset: float | None = None  # this node's wall clock minus the leader's, as in MemberStatus
    clock_error: float | None = None
    prevote: bool = False  # this node asks before an election (NodeConfig.prevote)
    # This node has applied everything committed before its start: see RaftNode._catch_up. A
    # node that has not answers reads from the state it restored, which may lack acknowledged
    # writes (all of them, when it holds no snapshot yet).
    caught_up: bool = True


@dataclass(frozen=True, slots=True)
class RoleChange:
    role: str  # leader | follower | candidate
    leader: str | None  # the leader's raft address, None while unknown
    term: int


RoleHook = Callable[[RoleChange], None]


_STATES = {0: "follower", 1: "candidate", 2: "leader"}


def _member(host: _Host, node: Any, st: dict[str, Any], clock: ClockEstimate | None,
            prevote: set[str]) -> MemberStatus:
    return MemberStatus(
        raft_addr=str(node.id),
        connected=host.isNodeConnected(node),
        match_index=st.get("match_idx_server_" + node.id),
        clock_offset=None if clock is None else clock.offset,
        clock_error=None if clock is None else clock.error,
        prevote=node.id in prevote,
    )


class RaftNode:
    """Hosts one StateMachine on pysyncobj.

    ``submit`` may be called from any thread; its callback, ``on_applied`` and
    ``on_role`` run on the raft thread and must only hand results to another thread.
    ``on_role`` is called whenever this node's role, its known leader or the term
    changes (and once at the first tick). ``time_source`` is where the clock exchange reads
    wall and monotonic time (tests pass fakes).
    """

    def __init__(
        self,
        config: NodeConfig,
        fsm: StateMachine,
        *,
        on_applied: AppliedHook | None = None,
        on_restored: Callable[[], None] | None = None,
        on_role: RoleHook | None = None,
        time_source: TimeSource | None = None,
    ) -> None:
        if not config.secret:
            raise MissingSecret(
                "a cluster secret is required (--secret or RAFTCRON_SECRET): the raft port carries "
                "pickled objects, and only the secret keeps strangers from running code through it"
            )
        self.config = config
        self._fsm = fsm
        self._fsm_idle = getattr(fsm, "idle", None)
        self._idle_failed = False
        self._on_applied = on_applied
        self._on_restored = on_restored
        self._on_role = on_role
        self._clock = ClockSync(time_source or TimeSource())
        self._host: _Host | None = None
        self._replay_upto = 0
        self._caught_up = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._snap = SnapshotWriter(fsm, config.fsync)
        self._weight = 0  # entries applied since the last snapshot began, each as heavy as its fsm says
        self._snaps_seen = 0
        self._leaderless_since: float | None = raft_clock()
        self._last_state = "follower"
        self._last_leader: str | None = None
        self._last_term: int | None = None  # None: on_role not called yet
        self._cached: NodeStatus | None = None
        self._last_keepalive = 0.0
        self._keepalive_message: dict[str, Any] | None = None
        # The other members as the raft thread last saw them (membership changes at run time);
        # None until its first keepalive tick. See peers_apply.
        self._others: frozenset[str] | None = None
        self._last_tick = raft_clock()
        self._pacer: _Pacer | None = None
        self._prevote: PreVote | None = None  # made with the pacer; see raftlog.prevote
        self._contact = 0.0  # see leader_contact_age
        self._journal: _DurableJournal | None = None  # set once the node runs, when fsync is on
        self._status_lock = threading.Lock()
        self._space = Space(config.data_dir, config.min_free, reuse=0.0)  # read once a second anyway
        self._last_space_check = 0.0
        self._fatal: OSError | None = None  # the journal's failed sync, once there was one
        self._restore_failed: Exception | None = None  # a snapshot the state machine refused to restore
        self.refused_ticks = 0  # ticks sat out since then (see _Host._onTick)
        config.data_dir.mkdir(parents=True, exist_ok=True)

    # ---- lifecycle -------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Construct the SyncObj on a long-lived thread of its own.

        pysyncobj's tick thread holds only a weak proxy to the SyncObj; if the
        constructing thread goes away with the last strong reference the tick
        thread dies silently. Our thread keeps it for the node's whole life.

        Raises ``PysyncobjMismatch`` first if the installed pysyncobj lacks a private
        name raftlog relies on.
        """
        check_pysyncobj()
        soft, hard = raise_fd_limit()
        log.info("open-file limit: %d (hard limit %d)", soft, hard)
        self._thread = threading.Thread(target=self._own, name="raftlog-owner", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"raft node did not start within {timeout}s")
        if self._start_error is not None:
            raise self._start_error

    def _own(self) -> None:
        try:
            self._host = self._construct()
            self._host.waitBinded()
            journal = self._host._SyncObj__raftLog  # noqa: SLF001 - replay boundary, see below
            # Entries already in our journal at start were decided before this
            # process lived; the state replays them, but a worker must not act
            # on them again (the design's "act only on live entries" rule).
            self._replay_upto = journal[-1][1] if len(journal) else 0
            if isinstance(journal, _DurableJournal):
                self._journal = journal
            self._host.addOnTickCallback(self._on_tick)
        except BaseException as exc:  # reported to start()'s caller
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        self._stop.wait()
        host, self._host = self._host, None
        if host is not None:
            host.destroy_synchronous()

    def _construct(self) -> _Host:
        c = self.config
        conf = SyncObjConf(
            password=c.secret,
            # Without bindAddress pysyncobj binds 0.0.0.0; bind exactly the address we were given.
            bindAddress=c.raft_addr,
            # pysyncobj caches peer addresses for 600 s by default; a container restarted
            # on a new IP would stay unreachable that long.
            dnsCacheTime=3.0,
            dnsFailCacheTime=1.0,
            journalFile=str(c.data_dir / "raft.journal"),
            fullDumpFile=str(c.data_dir / "raft.dump"),
            serializer=self._snap.start,
            serializeChecker=self._snap.check,
            deserializer=self._deserialize,
            raftMinTimeout=c.election_min,
            raftMaxTimeout=c.election_max,
            appendEntriesPeriod=c.append_period,
            autoTickPeriod=c.tick_period,
            appendEntriesUseBatch=c.batch_append,
            leaderFallbackTimeout=c.leader_fallback,
            commandsWaitLeader=False,
            dynamicMembershipChange=True,
            # The count is ours (_count_weight: every applied entry, by weight and state size);
            # pysyncobj's own, by entries alone, would bring back the fixed count.
            logCompactionMinEntries=2**62,
            logCompactionMinTime=c.compaction_seconds,
            connectionRetryTime=1.0,
            connectionTimeout=2.0,
            useFork=False,
        )
        remove_partial_files(c.data_dir)  # a crash mid-snapshot or mid-meta write leaves its side file
        dump = c.data_dir / "raft.dump"
        if dump.exists():
            # pysyncobj logs a dump it cannot load and goes on with the journal alone, which
            # holds only what came after the snapshot: a node with its state silently cut.
            try:
                prev, last = check_snapshot(str(dump))
            except (CodecError, OSError) as exc:
                raise CodecError(f"{exc}; refusing to start on the journal alone, which would drop the "
                                 "snapshot's state: restore the file, or empty the data directory so the node "
                                 "rejoins from its peers") from exc
            journal = c.data_dir / "raft.journal"
            if journal.exists():
                dropped = align_to_snapshot(str(journal), prev, last)
                if dropped:
                    log.warning("journal compacted to the snapshot at index %d (%d entries before it dropped): "
                                "a crash had come between writing the snapshot and compacting", last[0], dropped)
        with journal_factory(c.fsync):
            return _Host(self, c.raft_addr, list(c.peers), conf)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._snap.join(timeout)

    # ---- apply path (raft thread) ----------------------------------------

    def _apply(self, payload: bytes, index: int) -> Any:
        if self._restore_failed is not None:
            return None  # on top of a state that is not the snapshot's, nothing is applied
        ctx = ApplyContext(index=index, replay=index <= self._replay_upto)
        try:
            result = self._fsm.apply(payload, ctx)
        except LocalStateLost as exc:  # not a rejection: the other replicas applied this entry
            self._lost(exc)
            return None
        except Exception:  # noqa: BLE001 - a raise here would wedge the whole cluster
            log.exception("state machine raised on entry %d; recorded as rejected", index)
            result = None
        self._count_weight(getattr(self._fsm, "entry_weight", 1))
        hook = self._on_applied
        if hook is not None:
            try:
                hook(ctx, result)
            except Exception:  # noqa: BLE001 - a raising hook makes pysyncobj re-apply the entry
                log.exception("applied-entry hook raised on entry %d", index)
        return result

    def _count_weight(self, weight: int) -> None:
        """Ask for a snapshot once the entries applied since the last one weigh
        ``compaction_entries`` and ``compaction_share`` of the state machine's records
        (``StateMachine.records``, when it has one). An entry weighs 1 unless the state machine says more
        (``StateMachine.entry_weight``): a batch of 1,000 job documents is one entry, and
        100 of them never brought a snapshot by count, so a restart replayed them all (15 s
        for 100,000 jobs). pysyncobj starts the snapshot at its next tick."""
        if self._snap.started != self._snaps_seen:  # a snapshot began since: count from there
            self._snaps_seen = self._snap.started
            self._weight = 0
        self._weight += max(1, int(weight))
        if self._weight >= self.config.compaction_entries and self._host is not None:
            records = getattr(self._fsm, "records", None)
            if callable(records) and self._weight < int(records()) * self.config.compaction_share:
                return
            log.info("entries applied since the last snapshot weigh %d: snapshot requested", self._weight)
            self._weight = 0
            self._host.forceLogCompaction()

    def _deserialize(self, path: str) -> tuple[Any, Any, Any]:
        try:
            fsm_bytes, last, prev, cluster = read_snapshot(path)
            with quiet_restore():
                self._fsm.restore(fsm_bytes)
        except Exception as exc:
            # pysyncobj logs this and goes on taking part in raft (and leading) without the
            # snapshot's state. This node sits raft out instead (_Host: from the failed load on).
            self._restore_failed = exc
            self._restore_refused()
            raise
        # The snapshot names every member, this node included, as an address. pysyncobj drops
        # its own node from that list by comparing Node objects, which never equal our strings:
        # a node restarted from a snapshot then counted itself among its peers, needed three
        # votes of four to win an election and could not be elected by one other survivor.
        cluster = [member for member in cluster if member != self.config.raft_addr]
        log.info("state restored from snapshot at index %d", last[1])
        if self._on_restored is not None:
            try:
                self._on_restored()
            except Exception:  # noqa: BLE001
                log.exception("restore hook raised")
        return last, prev, cluster

    # ---- submit ------------------------------------------------------------

    def submit(self, payload: bytes, callback: SubmitCallback) -> None:
        host = self._host
        if host is None or self._restore_failed is not None:  # the second: no tick will ever send it
            callback(None, FAIL_REASON.MISSING_LEADER)
            return

        def guarded(result: Any, err: int) -> None:
            try:
                callback(result, err)
            except Exception:  # noqa: BLE001 - see _apply
                log.exception("submit callback raised")

        host._rc_apply(payload, callback=guarded)
        pacer = self._pacer
        if pacer is not None:
            pacer.wake()

    # ---- membership --------------------------------------------------------

    def add_member(self, raft_addr: str, callback: SubmitCallback) -> None:
        if self._host is None:
            callback(None, FAIL_REASON.MISSING_LEADER)
            return
        self._host.addNodeToCluster(raft_addr, callback=callback)

    def remove_member(self, raft_addr: str, callback: SubmitCallback) -> None:
        if self._host is None:
            callback(None, FAIL_REASON.MISSING_LEADER)
            return
        self._host.removeNodeFromCluster(raft_addr, callback=callback)

    # ---- status --------------------------------------------------------------

    @property
    def replay_upto(self) -> int:
        return self._replay_upto

    def is_leader(self) -> bool:
        host = self._host
        return host is not None and self._restore_failed is None and host._isLeader()

    def leader_contact_age(self) -> float:
        """Seconds since this node last knew it was in touch with a leader that has a quorum.

        A follower: since the last AppendEntries it took from its leader (heartbeats come
        every 20-40 ms). The leader: since the answer that completes a majority, counting itself
        (always now with no other members). ``inf`` before either. Noted by the raft thread
        each tick (``_contact_at``), so a stalled raft thread reads as out of touch too; read
        from any thread.
        """
        at = self._contact
        return raft_clock() - at if at else math.inf

    def leader(self) -> str | None:
        host = self._host
        if host is None:
            return None
        node = host._getLeader()
        return None if node is None else str(node.id)

    def _lost(self, exc: LocalStateLost) -> None:
        """The state machine lost state it kept locally: this replica can no longer be trusted
        and sits raft out from here on (_Host), as after a snapshot it could not restore."""
        self._restore_failed = exc
        self._restore_refused()

    def _idle(self) -> None:
        """The state machine's ``idle`` (see ``raftlog.fsm``), never raising into pysyncobj."""
        if self._fsm_idle is None or self._idle_failed:
            return
        try:
            self._fsm_idle()
        except LocalStateLost as exc:
            self._lost(exc)
        except Exception:  # noqa: BLE001 - housekeeping; raft goes on without it
            self._idle_failed = True
            log.exception("the state machine's idle work failed; it is not called again until a restart")

    def _on_tick(self) -> None:
        """Runs on the raft thread: the only place pysyncobj's dicts are read safely."""
        host = self._host
        if host is None:
            return
        if self._restore_failed is not None:  # sitting raft out: the status says so for good
            if self._journal is not None:
                self._journal.sync()
            return
        if self._pacer is None:  # made here: it subscribes to the raft thread's poller
            name_os_thread(RAFT_THREAD_NAME)
            self._pacer = self._make_pacer(host)
        self._pacer.on_tick()
        self._contact = _contact_at(host, self._pacer)
        if self._journal is not None:
            self._journal.sync()  # what this tick appended as leader, before the next tick counts it
        self._idle()  # after the sync: the leader's commit does not wait for it
        if self._restore_failed is not None:  # lost local state (LocalStateLost): the status says so now
            return
        self._excuse_own_stall(host)
        self._keepalive(host)
        self._step_down_when_full(host)
        st = host.getStatus()
        state = _STATES.get(st["state"], "unknown")
        leader = None if st["leader"] is None else str(st["leader"].id)
        now = raft_clock()
        if leader is None:
            if self._leaderless_since is None:
                self._leaderless_since = now
        else:
            self._leaderless_since = None
        self._catch_up(host, st, leader)
        clocks = self._clocks_to_leader(leader, [str(node.id) for node in host.otherNodes])
        prevote = self._prevote.peers if self._prevote is not None else set()
        partners = [_member(host, node, st, clocks.get(str(node.id)), prevote) for node in host.otherNodes]
        own = clocks.get(self.config.raft_addr)
        status = NodeStatus(
            raft_addr=self.config.raft_addr,
            state=state,
            leader=leader,
            term=st["raft_term"],
            commit_index=st["commit_idx"],
            applied_index=st["last_applied"],
            has_quorum=bool(st["has_quorum"]),
            raft_thread_alive=True,
            partners=tuple(sorted(partners, key=lambda m: m.raft_addr)),
            last_snapshot_index=self._snap.last_index,
            seconds_without_leader=0.0 if self._leaderless_since is None else now - self._leaderless_since,
            clock_offset=None if own is None else own.offset,
            clock_error=None if own is None else own.error,
            prevote=self.config.prevote,
            caught_up=self._caught_up,
        )
        with self._status_lock:
            self._cached = status
        # Told after the status is stored: a consumer of the event reads status() at once (the
        # leader loop compares its term), and a status of the tick before would deny the news.
        self._note_role(state, leader, st["raft_term"])

    def _catch_up(self, host: _Host, st: dict[str, Any], leader: str | None) -> None:
        """Set once for the process's life: a leader is known, everything this node knows to be
        committed is applied, and the last committed entry is of the current term. A leader
        commits an entry of its own term (its no-op) only with everything committed before it,
        so from then on this node's state holds every write acknowledged before it started or
        while it was away. Before, it holds what its snapshot and an old commit index gave it:
        after a restart, pysyncobj applies no journal entry until a leader says what is
        committed, and a node without a snapshot answered 404 for every job."""
        if self._caught_up or leader is None:
            return
        commit, applied = int(st["commit_idx"]), int(st["last_applied"])
        if commit <= 0 or applied < commit:
            return
        journal = host._SyncObj__raftLog  # noqa: SLF001 - see pysyncobj_names
        first = int(journal[0][1]) if len(journal) else commit + 1
        if first <= commit <= int(journal[-1][1]) and int(journal[commit - first][2]) == int(st["raft_term"]):
            self._caught_up = True
            log.info("caught up: applied index %d, of the current term %d", applied, st["raft_term"])

    def _make_pacer(self, host: _Host) -> _Pacer:
        c = self.config
        # Off, pre-vote still answers (costs nothing to a peer that never asks) but never asks.
        # A peer connected this long with no keepalive heard counts as an older release (a yes).
        self._prevote = PreVote(host, election_min=c.election_min, election_max=c.election_max, asks=c.prevote,
                                heard_leader=lambda: pacer.heard_leader, send=host._SyncObj__transport.send,
                                silent_after=c.election_max + 3 * c.keepalive)
        pacer = _Pacer(host, self._journal, self._clock, self._prevote)
        return pacer

    def _note_role(self, state: str, leader: str | None, term: int) -> None:
        if state == self._last_state and leader == self._last_leader and term == self._last_term:
            return
        if state != self._last_state or leader != self._last_leader:
            self._log_transition(state, leader, term)
        self._last_state, self._last_leader, self._last_term = state, leader, term
        self._tell_role(RoleChange(role=state, leader=leader, term=term))

    def _excuse_own_stall(self, host: _Host) -> None:
        """A follower that was itself busy (a long apply, a starved thread) must not
        take its own silence for the leader's.

        pysyncobj checks the election deadline at the top of a tick, before it reads
        the messages that arrived while the previous tick ran. After a tick longer
        than the shortest election timeout the leader's heartbeats are sitting in
        the socket unread, so the deadline is pushed out by that timeout first: the
        next poll reads them, or a dead leader is found out one timeout later.
        """
        now = raft_clock()
        gap = now - self._last_tick
        self._last_tick = now
        if gap < self.config.election_min / 2 or host._isLeader():
            return
        floor = now + self.config.election_min
        if host._SyncObj__raftElectionDeadline < floor:
            host._SyncObj__raftElectionDeadline = floor
        log.debug("raft tick took %.0f ms; election deadline moved past it", gap * 1000)

    def _restore_refused(self) -> None:
        """Called by the raft thread once the state machine refused a snapshot, then at every
        tick it sits out (``refused_ticks`` counts the calls)."""
        self.refused_ticks += 1
        if self.refused_ticks == 1:
            # No more ticks refresh the status: from now on it says what holds for good.
            with self._status_lock:
                cached = self._cached or NodeStatus(
                    raft_addr=self.config.raft_addr, state="refused", leader=None, term=0, commit_index=0,
                    applied_index=0, has_quorum=False, raft_thread_alive=True)
                self._cached = replace(cached, state="refused", leader=None, has_quorum=False, caught_up=False)
            if isinstance(self._restore_failed, LocalStateLost):
                log.critical("the state machine lost state it kept on this node (%s): applying on without it "
                             "would part this replica from its peers, so this node takes no part in raft; restart "
                             "it (the state is rebuilt from the snapshot and journal in %s)",
                             self._restore_failed, self.config.data_dir)
                return
            log.critical("the state machine could not restore the snapshot in %s (%s): running on the journal "
                         "alone would drop the snapshot's state, so this node takes no part in raft; start the "
                         "release that wrote the snapshot, or empty the data directory so the node rejoins from "
                         "its peers", self.config.data_dir, self._restore_failed)

    def _journal_failed(self, exc: OSError) -> None:
        """Called by the raft thread, every tick, once the journal failed to sync."""
        if self._fatal is None:
            self._fatal = exc
            log.critical("the journal could not be synced (%s): what it holds on disk is unknown, so this node "
                         "acknowledges nothing more and leaves raft to its peers; restart it", exc)

    def _step_down_when_full(self, host: _Host) -> None:
        """Once a second: a leader whose data directory is under its floor hands leadership to
        a caught-up follower. It cannot append, so every write, forwarded ones included, would
        otherwise wait for a commit that never comes (seen: writes through a follower answered
        504 for as long as the leader's disk stayed full). As a follower it still cannot store
        entries, so its log falls behind and it wins no election until space returns."""
        now = raft_clock()
        if now - self._last_space_check < 1.0:
            return
        self._last_space_check = now
        if not host._isLeader() or not host.otherNodes:
            return
        free = self._space.short()
        if free is None:
            return
        log.warning("data directory %s has %d bytes free, under the %d a leader needs: handing leadership to "
                    "a follower", self.config.data_dir, free, self.config.min_free)

        def done(_: Any, err: int) -> None:
            if err != FAIL_REASON.SUCCESS:
                log.warning("leadership transfer refused (%s): no follower is caught up yet; trying again", err)

        host.transferLeadership(callback=done)

    def _keepalive(self, host: _Host) -> None:
        """Every ``keepalive`` seconds: see ``transport.send_keepalives``."""
        now = raft_clock()
        if now - self._last_keepalive < self.config.keepalive:
            return
        self._last_keepalive = now
        self._others = frozenset(str(n.id) for n in host.otherNodes)
        c = self.config
        keepalive = self._keepalive_message
        if keepalive is None:
            keepalive = dict(KEEPALIVE) if c.prevote else {k: v for k, v in KEEPALIVE.items() if k != "prevote"}
            if c.applies:
                keepalive["applies"] = list(c.applies)
            self._keepalive_message = keepalive
        if c.applies:
            # And the forms it has heard every member announce: as leader it proposes those
            # (see leader_uses), which a follower's worker may rely on.
            everywhere = [form for form in c.applies if self.peers_apply(form)]
            if keepalive.get("all_apply") != everywhere:
                keepalive = self._keepalive_message = {**keepalive, "all_apply": everywhere}
        send_keepalives(host._SyncObj__transport, host.otherNodes, self._clock, keepalive)

    def _tell_role(self, change: RoleChange) -> None:
        hook = self._on_role
        if hook is None:
            return
        try:
            hook(change)
        except Exception:  # noqa: BLE001 - the raft thread must go on ticking
            log.exception("role hook raised on %s", change)

    def _log_transition(self, state: str, leader: str | None, term: int) -> None:
        if state == "leader":
            log.info("this node became leader (term %d)", term)
        elif leader is None:
            log.warning("no leader (term %d, this node is %s): writes wait for an election", term, state)
        elif self._last_state == "leader":
            log.warning("this node lost leadership; now %s of %s (term %d)", state, leader, term)
        else:
            log.info("following leader %s (term %d)", leader, term)

    def status(self) -> NodeStatus:
        with self._status_lock:
            cached = self._cached
        host = self._host
        alive = bool(host is not None and host.tick_thread_alive())
        if cached is None:
            return NodeStatus(
                raft_addr=self.config.raft_addr, state="unknown", leader=None, term=0,
                commit_index=0, applied_index=0, has_quorum=False, raft_thread_alive=alive, caught_up=False,
            )
        if cached.raft_thread_alive != alive:
            cached = replace(cached, raft_thread_alive=alive)
        return cached

    def peers_apply(self, form: str) -> bool:
        """Whether every other member announced, in the newest keepalive this process heard
        from it, that it applies entries of ``form`` (``NodeConfig.applies``). False for a
        member not heard since this process started, and for one that came back on a release
        without it; so also while such a member is down. The members are the raft thread's
        current ones (``members add`` / ``remove`` change them), False before its first tick.
        Any thread.

        Only for going forward: a member that applied such entries and is then started on an
        older release replays them from its own log, and refuses them."""
        pacer, others = self._pacer, self._others
        if pacer is None or others is None:
            return False
        heard = pacer.applies
        return all(form in heard.get(peer, ()) for peer in others)

    def leader_uses(self, form: str) -> bool:
        """Whether the leader proposes entries of ``form``: this node leading, once every peer
        announced it applies it (``peers_apply``); a follower, once the leader's newest keepalive
        said it heard them all. False with no leader, and with a leader whose keepalive this
        process has not heard since it started or since the leader changed its mind: a worker
        reading it may be a keepalive behind the leader, which is why the entries it gates
        must stay safe read either way (``scheduler.worker.Worker._take_reserved`` checks it
        again when the start commits). Any thread."""
        leader = self.status().leader
        if leader is None:
            return False
        if leader == self.config.raft_addr:
            return self.peers_apply(form)
        pacer = self._pacer
        return pacer is not None and form in pacer.all_apply.get(leader, ())

    # ---- the cluster's clock -------------------------------------------------------

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        """The leader's wall clock minus this node's: (0, 0, 0) on the leader, None while
        there is no leader or no round trip to it has been measured. Any thread."""
        st = self.status()
        if st.leader is None:
            return None
        if st.leader == self.config.raft_addr:
            return ClockEstimate(offset=0.0, error=0.0, age=0.0)
        return self._clock.estimate(st.leader)

    def member_clocks(self) -> dict[str, ClockEstimate]:
        """Every member's wall clock minus the leader's, by raft address, this node and the
        leader (0, 0, 0) included; members not measured yet are left out, and {} while there
        is no leader. On a follower a peer's estimate goes through this node's own clock, so
        the two errors add up. Any thread."""
        st = self.status()
        return self._clocks_to_leader(st.leader, [p.raft_addr for p in st.partners])

    def _clocks_to_leader(self, leader: str | None, others: list[str]) -> dict[str, ClockEstimate]:
        if leader is None:
            return {}
        me = self.config.raft_addr
        own = {addr: self._clock.estimate(addr) for addr in others}  # their wall minus ours
        own[me] = ClockEstimate(offset=0.0, error=0.0, age=0.0)
        to_leader = own.get(leader)
        if to_leader is None:
            return {}
        clocks = {addr: relative_to(to_leader, est) for addr, est in own.items() if est is not None}
        clocks[leader] = ClockEstimate(offset=0.0, error=0.0, age=0.0)  # the cluster's time, by definition
        return clocks
