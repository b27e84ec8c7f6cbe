"""When the raft thread sends, and what a follower takes from an AppendEntries.

``_Pacer`` sits between pysyncobj's transport and its message handler (every
inbound message passes through ``inbound``) and runs once per raft tick
(``on_tick``). It also unpacks our own message types (``rc_batch``,
``rc_keepalive``, the clock exchange, pre-vote) before pysyncobj sees them. Every pysyncobj
private name used here is listed in ``pysyncobj_names``.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObj
from pysyncobj.pipe_notifier import PipeNotifier

from .clock import CLOCK_REQUEST, CLOCK_RESPONSE, ClockSync, raft_clock
from .journal import _DurableJournal
from .prevote import PREVOTE_REQUEST, PREVOTE_RESPONSE, PreVote
from .trace import mark
from .transport import BATCH, KEEPALIVE

__all__ = ["_Pacer", "_contact_at"]


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

    def __init__(self, host: SyncObj, journal: _DurableJournal | None = None, clock: ClockSync | None = None,
                 prevote: PreVote | None = None) -> None:
        self._host = host
        self._journal = journal
        self._clock = clock  # takes the clock exchange's messages (see raftlog.clock)
        self._prevote = prevote  # takes pre-vote's messages (see raftlog.prevote)
        self._notifier = PipeNotifier(host._poller, callback=self._woken)
        self._wake_pending = False
        self.heard_leader = 0.0  # raft_clock time of the last AppendEntries taken from the leader
        self._sent_commit = 0
        self._forwarded = False  # a follower forwarded a command since the last tick
        self._awaited_upto = 0  # the newest entry a follower's forwarded command waits on
        self._alone_woke_for = 0  # the last entry a leader without followers woke its poll for
        self._deliver = host._SyncObj__onMessageReceived
        # Peer id -> the entry forms it announced it applies, from its newest keepalive
        # (``RaftNode.peers_apply``); each value replaced whole, so any thread may read it.
        self.applies: dict[str, frozenset[str]] = {}
        # And the forms it heard every member announce (``RaftNode.leader_uses``).
        self.all_apply: dict[str, frozenset[str]] = {}
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
        mark("woken")
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
        if not host.otherNodes:
            # Alone, a leader counts its commit at the top of a tick, and an entry submitted
            # during the poll is appended later in the tick; no follower's answer will end the
            # next poll, so the entry waited out a whole tick period (20 ms) to commit. The
            # poll ends at once instead, after this tick's sync. Once per entry: a commit that
            # cannot move (an old term's entry) must not spin the thread.
            if last > commit and last != self._alone_woke_for:
                self._alone_woke_for = last
                self.wake()
            return
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
                mark("send_entries")
                host._SyncObj__sendAppendEntries()
                self._sent_commit = commit
                return

    def inbound(self, node: Any, message: Any) -> None:
        kind = message.get("type") if type(message) is dict else None
        if kind == BATCH:  # see _Host._rc_send: delivered one by one, in order
            for one in message.get("messages") or ():
                self.inbound(node, one)
            return
        if kind in (CLOCK_REQUEST, CLOCK_RESPONSE):  # ours alone: pysyncobj never sees them
            self._clock_message(node, message)
            return
        if kind in (PREVOTE_REQUEST, PREVOTE_RESPONSE):  # ours alone, like the clock's
            if self._prevote is not None:
                self._prevote.take(node, message)
            return
        journal = None
        if kind == KEEPALIVE["type"]:
            # Read on every keepalive, not only added: a peer restarted on an older release
            # must stop being sent what it cannot read.
            _note(self._host._rc_batch_peers, node, bool(message.get("batch")))
            if self._clock is not None:
                _note(self._clock.peers, node, bool(message.get("clock")))
            if self._prevote is not None:
                self._prevote.heard.add(node.id)
                _note(self._prevote.peers, node, bool(message.get("prevote")))
            for key, heard in (("applies", self.applies), ("all_apply", self.all_apply)):
                forms = message.get(key)
                announced = frozenset(f for f in forms if type(f) is str) if type(forms) is list else frozenset()
                if announced or heard:  # absent reads as empty
                    heard[node.id] = announced
        elif kind == "append_entries" and self._prevote is not None and isinstance(message.get("term"), int):
            self._prevote.note_append_entries(message["term"])
        elif kind == "next_node_idx":
            mark("ack_in")
        if kind == "append_entries" and message.get("entries"):
            mark("entries_in")
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

    def _clock_message(self, node: Any, message: dict[str, Any]) -> None:
        clock = self._clock
        if clock is None:
            return
        if message["type"] == CLOCK_REQUEST:
            answer = clock.answer(message)
            if answer is not None:
                self._host._SyncObj__transport.send(node, answer)
        else:
            clock.take(node.id, message)

    def _note_leader(self, node: Any) -> None:
        # After delivery pysyncobj has taken the sender as its leader, or refused a stale one.
        if self._host._SyncObj__raftLeader == node:
            self.heard_leader = raft_clock()

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


def _contact_at(host: Any, pacer: _Pacer) -> float:
    """When (on ``raft_clock``, pysyncobj's clock) this node was last in touch with a leader
    that has a quorum (see ``RaftNode.leader_contact_age``); 0.0 for never. Raft thread only:
    it reads pysyncobj's own dicts."""
    if not host._isLeader():
        return pacer.heard_leader
    others = list(host.otherNodes)
    if not others:
        return raft_clock()
    answered = host._SyncObj__lastResponseTime
    times = sorted((answered.get(n, 0.0) for n in others), reverse=True)
    return float(times[(len(others) + 1) // 2 - 1])


def _note(peers: set[Any], node: Any, supported: bool) -> None:
    if supported:
        peers.add(node.id)
    elif peers:
        peers.discard(node.id)
