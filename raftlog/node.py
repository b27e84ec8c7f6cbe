"""pysyncobj glue: one replicated entry point taking bytes, a durable journal,
msgpack snapshots written off the raft thread, the cluster secret, and status.

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
  it already holds from the current leader (see ``_Pacer``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pysyncobj.journal as _journal_module
import pysyncobj.syncobj as _pso
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import FileJournal, MetaStorer, ResizableFile
from pysyncobj.pipe_notifier import PipeNotifier

from .clock import ClockEstimate
from .fsm import ApplyContext, StateMachine
from .snapshot import SnapshotWriter, read_snapshot

__all__ = ["NodeConfig", "RaftNode", "NodeStatus", "MemberStatus", "FAIL_REASON", "MissingSecret"]

log = logging.getLogger("raftcron.raft")

SubmitCallback = Callable[[Any, int], None]
AppliedHook = Callable[[ApplyContext, Any], None]


class MissingSecret(ValueError):
    pass


class _DurableMeta(MetaStorer):  # type: ignore[misc]
    """pysyncobj's term / vote / commit-index file, replaced durably.

    pysyncobj writes a temporary file and renames it over the old one without
    syncing either, so a power loss can leave an empty file: the node restarts at
    term 0 with no vote and may vote twice in a term. Here the new file's data is
    synced before the rename and the directory after it (term changes are rare;
    the commit index is stored at most once a second).
    """

    def getMeta(self) -> dict[str, Any]:  # noqa: N802 - pysyncobj's name; closes the file it reads
        try:
            with open(self.getPath(), "rb") as f:
                meta = _journal_module.loads(f.read())
        except Exception:  # noqa: BLE001 - missing or unreadable: start from nothing, as pysyncobj does
            return {}
        return meta if isinstance(meta, dict) else {}

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 - pysyncobj's name
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_journal_module.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _SizedFile(ResizableFile):  # type: ignore[misc]
    """pysyncobj's mmap-backed journal file, knowing its own size.

    ResizableFile.write asks the mapping for its size (an fstat) before every write, and
    FileJournal.add writes twice per entry: two system calls per entry on every node, on
    the path of every write. The size changes only when a write grows the mapping, which
    stays with ResizableFile.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rc_size: int = self._ResizableFile__mm.size()

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end <= self._rc_size:
            self._ResizableFile__mm[offset:end] = values
            return
        super().write(offset, values)  # grows (or, where mmap cannot resize, remaps) the file
        self._rc_size = self._ResizableFile__mm.size()

    def fileno(self) -> int:
        """The descriptor of the file now (growing it without mremap reopens it)."""
        return self._ResizableFile__f.fileno()  # type: ignore[no-any-return]


class _DurableJournal(FileJournal):  # type: ignore[misc]
    """A FileJournal that syncs appended records before anyone is told of them.

    pysyncobj writes the journal through an mmap and never syncs it, so an
    acknowledged entry could vanish with a power loss on a majority. Syncing
    (in ``add``, or once per batch where ``defer`` says) puts it before the
    follower's AppendEntries answer and before the leader counts its own
    copy. ``fdatasync`` on the file (Linux writes a
    shared mapping's dirty pages with it) rather than pysyncobj's ``flush``:
    that is ``mmap.flush``, an msync of the whole mapping that holds the GIL
    and so froze the event loop for every entry.
    """

    def __init__(self, journal_file: str) -> None:
        # FileJournal names its meta storer's and file's classes at construction; swap in ours.
        meta, _journal_module.MetaStorer = _journal_module.MetaStorer, _DurableMeta
        file, _journal_module.ResizableFile = _journal_module.ResizableFile, _SizedFile
        try:
            super().__init__(journal_file)
        finally:
            _journal_module.MetaStorer, _journal_module.ResizableFile = meta, file
        self._rc_file: _SizedFile = self._FileJournal__journalFile
        self._rc_dirty = False
        # True only while pysyncobj appends new commands as leader (``_Host.
        # _checkCommandsToApply``): those appends are synced by ``sync`` at the end of
        # the same raft tick, after the AppendEntries carrying them went out, so the
        # leader's disk write overlaps the followers' (Raft lets a leader persist in
        # parallel with replication). No message is read in between, and a commit is
        # counted only at the next tick, after that sync. A follower's appends from one
        # AppendEntries are deferred too and synced once, before its answer is sent
        # (``_Host._SyncObj__sendNextNodeIdx``). Every other append (a new leader's no-op)
        # is synced at once.
        self.defer = False

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        if self.defer:
            self._rc_dirty = True
        else:
            os.fdatasync(self._rc_file.fileno())

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        # pysyncobj rewrites the kept entries one ``add`` at a time: one sync, not one each.
        deferred, self.defer = self.defer, True
        try:
            super().deleteEntriesTo(entryTo)
        finally:
            self.defer = deferred
        self.sync()

    def sync(self) -> None:
        if self._rc_dirty:
            self._rc_dirty = False
            os.fdatasync(self._rc_file.fileno())


class _Pacer:
    """Commit latency without losing batching, and without pysyncobj's re-truncation.

    In batched mode pysyncobj sends AppendEntries only every ``appendEntriesPeriod``,
    so a commit waits for the next period (PUT p50 ~24 ms); its unbatched mode sends
    one message per command, and the pipelined duplicates that follow a follower's
    "reset" answer made followers truncate and re-append entries they had applied.
    This keeps batched mode and adds three things, all on the raft thread:

    - ``wake``: a submit from another thread wakes the raft thread's poll at once
      (batched mode has no such notifier, so a command waited up to a tick);
    - ``on_tick`` (leader, after new commands were appended this tick): send now if
      some connected follower has acknowledged everything it was sent and has new
      entries to get, or a commit index that a follower's forwarded command waits
      for. A busy follower is not sent more until it answers, so under load messages
      still carry many entries each;
    - ``inbound`` (follower): an AppendEntries whose leading entries this node
      already holds with the same term is trimmed to what is new. pysyncobj would
      otherwise delete everything after ``prevLogIdx`` and re-append it, entries
      it had already acknowledged (and applied) included.
    """

    def __init__(self, host: SyncObj, journal: _DurableJournal | None = None) -> None:
        self._host = host
        self._journal = journal
        self._notifier = PipeNotifier(host._poller, callback=self._woken)
        self._wake_pending = False
        self.heard_leader = 0.0  # monotonic time of the last AppendEntries taken from the leader
        self._sent_commit = 0
        self._forwarded = False  # a follower forwarded a command since the last tick
        self._awaited_upto = 0  # the newest entry a follower's forwarded command waits on
        self._deliver = host._SyncObj__onMessageReceived
        host._SyncObj__transport.setOnMessageReceivedCallback(self.inbound)

    def wake(self) -> None:
        # One pipe write per wake-up, not per submit: the flag is cleared on the raft thread
        # after it drained the pipe, in the poll that ends a tick; a command queued before
        # that is taken by the next tick's _checkCommandsToApply, one queued after writes.
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            self._notifier.notify()
        except BlockingIOError:  # the pipe is full: a wake-up is already pending
            pass
        except OSError:
            self._wake_pending = False  # nothing was written: the next submit tries again
            raise

    def _woken(self) -> None:
        self._wake_pending = False

    def on_tick(self) -> None:
        host = self._host
        if not host._isLeader():
            return
        last = host._SyncObj__getCurrentLogIndex()
        if self._forwarded:  # appended by now (pysyncobj appends before it runs tick callbacks)
            self._forwarded = False
            self._awaited_upto = last
        commit = host._SyncObj__raftCommitIndex
        # A commit index alone is worth a message only to a follower whose client waits for
        # it; otherwise it rides on the next entries or the periodic heartbeat.
        tell_commit = commit > self._sent_commit and self._awaited_upto > self._sent_commit
        next_index = host._SyncObj__raftNextIndex
        match_index = host._SyncObj__raftMatchIndex
        for node in host.otherNodes:
            nxt = next_index.get(node)
            if nxt is None or match_index.get(node, 0) != nxt - 1 or not host.isNodeConnected(node):
                continue  # this one still has entries in flight, or cannot be reached
            if nxt <= last or tell_commit:
                host._SyncObj__sendAppendEntries()
                self._sent_commit = commit
                return

    def inbound(self, node: Any, message: Any) -> None:
        kind = message.get("type") if type(message) is dict else None
        if kind == "rc_batch":  # see _Host._rc_send: delivered one by one, in order
            for one in message.get("messages") or ():
                self.inbound(node, one)
            return
        journal = None
        if kind == "rc_keepalive" and message.get("batch"):
            self._host._rc_batch_peers.add(node.id)
        elif kind == "append_entries" and message.get("entries"):
            message = self._trim(message)
            # One sync for the whole batch, not one per entry: _Host syncs before the answer
            # that acknowledges them goes out, and again here in any case.
            journal = self._journal
        elif kind == "apply_command":
            self._forwarded = True
        if journal is None:
            self._deliver(node, message)
        else:
            journal.defer = True
            try:
                self._deliver(node, message)
            finally:
                journal.defer = False
                journal.sync()
        if kind == "append_entries":
            self._note_leader(node)

    def _note_leader(self, node: Any) -> None:
        # After delivery pysyncobj has taken the sender as its leader, or refused a stale one.
        if self._host._SyncObj__raftLeader == node:
            self.heard_leader = time.monotonic()

    def _trim(self, message: dict[str, Any]) -> dict[str, Any]:
        entries = message["entries"]
        journal = self._host._SyncObj__raftLog
        first = journal[0][1]
        last = journal[-1][1]
        held = 0
        for _command, idx, term in entries:
            if idx < first or idx > last or journal[idx - first][2] != term:
                break
            held += 1
        if held == 0:
            return message
        if held < len(entries):
            kept = entries[held - 1]
            return {**message, "entries": entries[held:], "prevLogIdx": kept[1], "prevLogTerm": kept[2]}
        # Everything sent is already here. Entries after them are this leader's own
        # only if the newest carries its term (Raft's log matching); then answer for
        # all of them. Otherwise let pysyncobj decide, as it would have.
        tail_term = journal[-1][2]
        if last > entries[-1][1] and tail_term != message.get("term"):
            return message
        return {**message, "entries": [], "prevLogIdx": last, "prevLogTerm": tail_term}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    raft_addr: str
    peers: tuple[str, ...]
    data_dir: Path
    secret: str
    # Timing, chosen from bench/ measurements on a 2-core machine (README, "Benchmarks").
    # Batched AppendEntries, a heartbeat every 20 ms, and _Pacer's eager sends between them.
    # pysyncobj's unbatched mode (batch_append=False, one message per command) cost twice the
    # CPU per run, and its overlapping re-sends made pysyncobj truncate and re-append entries
    # it had applied (reports waited seconds for commits, leases lapsed); _Pacer trims those.
    election_min: float = 0.4
    election_max: float = 1.0
    append_period: float = 0.02
    tick_period: float = 0.005
    batch_append: bool = True
    leader_fallback: float = 1.2
    fsync: bool = True
    compaction_entries: int = 20000
    compaction_seconds: float = 300.0
    keepalive: float = 0.5  # seconds between keepalives on every raft link; under connectionTimeout


@dataclass(frozen=True, slots=True)
class MemberStatus:
    raft_addr: str
    connected: bool
    match_index: int | None


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


_STATES = {0: "follower", 1: "candidate", 2: "leader"}


class _Host(SyncObj):  # type: ignore[misc]
    """The SyncObj subclass: its only replicated method is ``_rc_apply``."""

    def __init__(self, owner: RaftNode, self_addr: str, peers: list[str], conf: SyncObjConf) -> None:
        self._rc_owner = owner
        self._rc_batch: dict[Any, list[Any]] | None = None  # see _rc_send
        self._rc_batch_peers: set[str] = set()  # ids of the peers that read batches
        super().__init__(self_addr, peers, conf)
        transport = self._SyncObj__transport
        self._rc_transport_send = transport.send
        transport.send = self._rc_send

    def _checkCommandsToApply(self) -> None:  # noqa: N802 - pysyncobj's name
        owner = self._rc_owner
        # Only once RaftNode._on_tick runs (it creates the pacer), since it does the sync.
        journal = owner._journal if owner._pacer is not None else None
        if journal is not None:
            journal.defer = True  # synced by RaftNode._on_tick, later in this same tick
        self._rc_batch = {}
        try:
            super()._checkCommandsToApply()
        finally:
            if journal is not None:
                journal.defer = False
            self._rc_flush()

    def _rc_send(self, node: Any, message: Any) -> bool:
        """The transport's send while this node takes commands from its queue.

        There a follower forwards each submitted command to the leader as its own message
        and the leader answers each with its own (``apply_command`` / ``_response``): under
        load dozens per tick, each pickled, Fernet-encrypted and sent, and decrypted and
        unpickled on the other side. Messages to a peer that announced it reads batches (in
        its keepalive) are collected here and sent as one at the end of the same call,
        before anything else this tick sends, so the order on the link is unchanged."""
        batch = self._rc_batch
        if batch is not None and node.id in self._rc_batch_peers:
            batch.setdefault(node, []).append(message)
            return True
        return bool(self._rc_transport_send(node, message))

    def _rc_flush(self) -> None:
        batch, self._rc_batch = self._rc_batch, None
        for node, messages in (batch or {}).items():
            one = messages[0] if len(messages) == 1 else {"type": "rc_batch", "messages": messages}
            self._rc_transport_send(node, one)

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,  # noqa: N802, N803
                                  success: bool = False) -> None:
        # A follower's answer to AppendEntries: the entries it acknowledges must be on disk
        # before it leaves (appends inside one message are synced once, see _Pacer.inbound).
        journal = self._rc_owner._journal
        if journal is not None:
            journal.sync()
        super()._SyncObj__sendNextNodeIdx(node, reset, nextNodeIdx, success)

    @replicated  # type: ignore[untyped-decorator]
    def _rc_apply(self, payload: bytes) -> Any:
        # pysyncobj bumps raftLastApplied right after this returns.
        return self._rc_owner._apply(payload, self.raftLastApplied + 1)


def _contact_at(host: Any, pacer: _Pacer) -> float:
    """The monotonic time this node was last in touch with a leader that has a quorum (see
    ``RaftNode.leader_contact_age``); 0.0 for never. Raft thread only: it reads pysyncobj's
    own dicts."""
    if not host._isLeader():
        return pacer.heard_leader
    others = list(host.otherNodes)
    if not others:
        return time.monotonic()
    answered = host._SyncObj__lastResponseTime
    times = sorted((answered.get(n, 0.0) for n in others), reverse=True)
    return float(times[(len(others) + 1) // 2 - 1])


class RaftNode:
    """Hosts one StateMachine on pysyncobj.

    ``submit`` may be called from any thread; its callback and ``on_applied``
    run on the raft thread and must only hand results to another thread.
    """

    def __init__(
        self,
        config: NodeConfig,
        fsm: StateMachine,
        *,
        on_applied: AppliedHook | None = None,
        on_restored: Callable[[], None] | None = None,
    ) -> None:
        if not config.secret:
            raise MissingSecret(
                "a cluster secret is required (--secret or RAFTCRON_SECRET): the raft port carries "
                "pickled objects, and only the secret keeps strangers from running code through it"
            )
        self.config = config
        self._fsm = fsm
        self._on_applied = on_applied
        self._on_restored = on_restored
        self._host: _Host | None = None
        self._replay_upto = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._snap = SnapshotWriter(fsm, config.fsync)
        self._leaderless_since: float | None = time.monotonic()
        self._last_state = "follower"
        self._last_leader: str | None = None
        self._cached: NodeStatus | None = None
        self._last_keepalive = 0.0
        self._last_tick = time.monotonic()
        self._pacer: _Pacer | None = None
        self._contact = 0.0  # see leader_contact_age
        self._journal: _DurableJournal | None = None  # set once the node runs, when fsync is on
        self._status_lock = threading.Lock()
        config.data_dir.mkdir(parents=True, exist_ok=True)

    # ---- lifecycle -------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Construct the SyncObj on a long-lived thread of its own.

        pysyncobj's tick thread holds only a weak proxy to the SyncObj; if the
        constructing thread goes away with the last strong reference the tick
        thread dies silently. Our thread keeps it for the node's whole life.
        """
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
            logCompactionMinEntries=c.compaction_entries,
            logCompactionMinTime=c.compaction_seconds,
            connectionRetryTime=1.0,
            connectionTimeout=2.0,
            useFork=False,
        )
        durable = c.fsync
        original = _pso.createJournal
        # pysyncobj has no journal factory option; swap the module's name for
        # the duration of construction (our owner thread is the only caller).
        _pso.createJournal = lambda path=None: _DurableJournal(path) if (path and durable) else original(path)
        try:
            return _Host(self, c.raft_addr, list(c.peers), conf)
        finally:
            _pso.createJournal = original

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._snap.join(timeout)

    # ---- apply path (raft thread) ----------------------------------------

    def _apply(self, payload: bytes, index: int) -> Any:
        ctx = ApplyContext(index=index, replay=index <= self._replay_upto)
        try:
            result = self._fsm.apply(payload, ctx)
        except Exception:  # noqa: BLE001 - a raise here would wedge the whole cluster
            log.exception("state machine raised on entry %d; recorded as rejected", index)
            result = None
        hook = self._on_applied
        if hook is not None:
            try:
                hook(ctx, result)
            except Exception:  # noqa: BLE001 - a raising hook makes pysyncobj re-apply the entry
                log.exception("applied-entry hook raised on entry %d", index)
        return result

    def _deserialize(self, path: str) -> tuple[Any, Any, Any]:
        fsm_bytes, last, prev, cluster = read_snapshot(path)
        # The snapshot names every member, this node included, as an address. pysyncobj drops
        # its own node from that list by comparing Node objects, which never equal our strings:
        # a node restarted from a snapshot then counted itself among its peers, needed three
        # votes of four to win an election and could not be elected by one other survivor.
        cluster = [member for member in cluster if member != self.config.raft_addr]
        self._fsm.restore(fsm_bytes)
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
        if host is None:
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

    def force_compaction(self) -> None:
        if self._host is not None:
            self._host._forceLogCompaction()

    # ---- status --------------------------------------------------------------

    @property
    def replay_upto(self) -> int:
        return self._replay_upto

    def is_leader(self) -> bool:
        host = self._host
        return host is not None and host._isLeader()

    def leader_contact_age(self) -> float:
        """Seconds since this node last knew it was in touch with a leader that has a quorum.

        A follower: since the last AppendEntries it took from its leader (heartbeats come
        every 20 ms). The leader: since the answer that completes a majority, counting itself
        (always now with no other members). ``inf`` before either. Noted by the raft thread
        each tick (``_contact_at``), so a stalled raft thread reads as out of touch too; read
        from any thread.
        """
        at = self._contact
        return time.monotonic() - at if at else math.inf

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        """The leader's wall clock minus this node's; ``ClockEstimate(0, 0, 0)`` on the leader,
        None while no leader is known. Placeholder until the estimator lands: it takes the
        clocks to agree, which is what every node assumed before."""
        if self.is_leader():
            return ClockEstimate(0.0, 0.0, 0.0)
        return None if self.leader() is None else ClockEstimate(0.0, 0.0, 0.0)

    def member_clocks(self) -> dict[str, ClockEstimate]:
        """raft_addr -> that member's wall clock minus the leader's (this node included); ``{}``
        off the leader. Placeholder until the estimator lands (see clock_offset_to_leader)."""
        if not self.is_leader():
            return {}
        st = self.status()
        addrs = [self.config.raft_addr, *(p.raft_addr for p in st.partners if p.connected)]
        return dict.fromkeys(addrs, ClockEstimate(0.0, 0.0, 0.0))

    def leader(self) -> str | None:
        host = self._host
        if host is None:
            return None
        node = host._getLeader()
        return None if node is None else str(node.id)

    def _on_tick(self) -> None:
        """Runs on the raft thread: the only place pysyncobj's dicts are read safely."""
        host = self._host
        if host is None:
            return
        if self._pacer is None:  # made here: it subscribes to the raft thread's poller
            self._pacer = _Pacer(host, self._journal)
        self._pacer.on_tick()
        self._contact = _contact_at(host, self._pacer)
        if self._journal is not None:
            self._journal.sync()  # what this tick appended as leader, before the next tick counts it
        self._excuse_own_stall(host)
        self._keepalive(host)
        st = host.getStatus()
        state = _STATES.get(st["state"], "unknown")
        leader = None if st["leader"] is None else str(st["leader"].id)
        now = time.monotonic()
        if leader is None:
            if self._leaderless_since is None:
                self._leaderless_since = now
        else:
            self._leaderless_since = None
        if state != self._last_state or leader != self._last_leader:
            self._log_transition(state, leader, st["raft_term"])
            self._last_state, self._last_leader = state, leader
        partners = []
        for node in host.otherNodes:
            partners.append(
                MemberStatus(
                    raft_addr=str(node.id),
                    connected=host.isNodeConnected(node),
                    match_index=st.get("match_idx_server_" + node.id),
                )
            )
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
        )
        with self._status_lock:
            self._cached = status

    def _excuse_own_stall(self, host: _Host) -> None:
        """A follower that was itself busy (a long apply, a starved thread) must not
        take its own silence for the leader's.

        pysyncobj checks the election deadline at the top of a tick, before it reads
        the messages that arrived while the previous tick ran. After a tick longer
        than the shortest election timeout the leader's heartbeats are sitting in
        the socket unread, so the deadline is pushed out by that timeout first: the
        next poll reads them, or a dead leader is found out one timeout later.
        """
        now = time.monotonic()
        gap = now - self._last_tick
        self._last_tick = now
        if gap < self.config.election_min / 2 or host._isLeader():
            return
        floor = now + self.config.election_min
        if host._SyncObj__raftElectionDeadline < floor:
            host._SyncObj__raftElectionDeadline = floor
        log.debug("raft tick took %.0f ms; election deadline moved past it", gap * 1000)

    def _keepalive(self, host: _Host) -> None:
        """Keep every link read from, follower-to-follower ones included.

        pysyncobj closes a connection when it *sends* on it and has read nothing
        for ``connectionTimeout``. Links between followers carry no traffic, so
        after a leader died the first vote request a survivor sent closed that
        link instead of reaching its peer, and every failover cost a second
        election round. A small message pysyncobj ignores (no handler matches
        its type) keeps the links alive.
        """
        now = time.monotonic()
        if now - self._last_keepalive < self.config.keepalive:
            return
        self._last_keepalive = now
        transport = host._SyncObj__transport
        for node in host.otherNodes:
            try:
                transport.send(node, {"type": "rc_keepalive", "batch": 1})
            except Exception:  # noqa: BLE001 - best effort; the next round tries again
                log.debug("keepalive to %s failed", node, exc_info=True)

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
                commit_index=0, applied_index=0, has_quorum=False, raft_thread_alive=alive,
            )
        if cached.raft_thread_alive != alive:
            cached = replace(cached, raft_thread_alive=alive)
        return cached
