"""Pre-vote (Raft thesis §9.6): a node asks before it starts an election.

pysyncobj has none. A follower cut off from the leader (or paused) for longer than
the election timeout kept starting elections, raising its term each time; when it
came back, its first vote request carried that term and made the healthy leader
step down (the e2e logs showed it; on this machine every round of "cut a follower
10 s, heal" cost an election).

With pre-vote a node whose election deadline passed first asks its peers whether
they would vote for it at the next term, and changes nothing of its own state: not
its term, not its vote. A peer says yes only if that term is above its own, it is
not the leader, it has not heard from a leader for at least the minimum election
timeout, and the asker's log is at least as up to date as its own. Only when a
majority says yes does pysyncobj get to start its election (its deadline is set to
0, so its next tick does). A node cut off hears no answers, so its term stays
where it was and the leader's next AppendEntries is simply accepted.

Mixed releases: a node announces ``prevote`` in its keepalive (``transport.KEEPALIVE``)
and is asked only by peers that heard it. A peer whose keepalive came without it runs
an older release (keepalives came before pre-vote) and is counted as a yes: it would
vote in the real election anyway, and counting it as a no could leave a cluster
mid-upgrade unable to elect. A node with no peer that reads pre-vote therefore elects as
pysyncobj always did. A peer not heard from at all is not such a yes: a node just
started has heard no one's keepalive yet, and counting its peers silent then let a
restarted follower elect 1 s after its start, before the live leader's first
AppendEntries reached it; its higher term deposed that leader (seen in the kill -9
fault test: three elections in a row where there should have been none). Only a peer
connected for ``silent_after`` seconds (a few keepalive rounds past the longest election
timeout) without a keepalive counts as one, for a release that sends none.

One way out: a node whose term got ahead of a live leader's (it elected before it
heard its peers announce pre-vote, say) ignores that leader's AppendEntries and
would be refused pre-vote for as long as the leader lives. Such a node elects
without asking (``note_append_entries``), as Raft without pre-vote would: one
election, and the cluster is whole again.

``PreVote.around_tick`` wraps every pysyncobj tick on the raft thread
(``host._Host._onTick``); ``take`` and ``note_append_entries`` get the messages
(``pacing._Pacer.inbound``). Every pysyncobj private name used here is
listed in ``pysyncobj_names``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from .clock import raft_clock

__all__ = ["PREVOTE_REQUEST", "PREVOTE_RESPONSE", "PreVote"]

PREVOTE_REQUEST = "rc_prevote_req"
PREVOTE_RESPONSE = "rc_prevote_resp"


class PreVote:
    """The pre-vote gate in front of pysyncobj's elections, and the answers to peers' asks.

    ``host`` is the SyncObj; ``heard_leader`` returns the time (``raft_clock``) this node last
    took an AppendEntries from its leader (0.0 for never); ``send(node, message)`` puts
    a message on the raft link to ``node``; ``silent_after``: seconds a peer must be
    connected with no keepalive heard before it counts as an older release (see the module
    docstring). Raft thread only, except ``peers``, which status readers copy.
    """

    def __init__(self, host: Any, *, election_min: float, election_max: float,
                 heard_leader: Callable[[], float], send: Callable[[Any, Any], Any], asks: bool = True,
                 silent_after: float = 2.5, monotonic: Callable[[], float] = raft_clock,
                 rng: random.Random | None = None) -> None:
        self._host = host
        self.asks = asks  # False: answer peers, but elect as pysyncobj does (an older release)
        self._min = election_min
        self._max = election_max
        self._heard_leader = heard_leader
        self._send = send
        self._now = monotonic
        self._rng = rng or random.Random()
        self._silent_after = silent_after
        self.peers: set[str] = set()  # ids of the peers that announced they read pre-vote
        self.heard: set[str] = set()  # ids of the peers whose keepalive came, announcing it or not
        self._connected_since: dict[str, float] = {}  # peer id -> since when (raft_clock) it is connected
        self._proposed = 0  # the term the round in progress asks for; 0: no round
        self._granted: set[str] = set()
        self._cleared = False  # a majority said yes: the expired deadline starts pysyncobj's election
        self._stale_leader = 0.0  # when (raft_clock) an AppendEntries came at a term below ours
        # Counters, for status and tests: rounds asked, rounds a majority granted, elections let through.
        self.rounds = 0
        self.won = 0
        self.elections = 0

    # ---- the asking side -------------------------------------------------------

    def around_tick(self, tick: Callable[[], None]) -> None:
        """Run pysyncobj's ``tick`` behind the gate.

        pysyncobj starts an election when its deadline has passed (and it is connected to
        anyone), at the top of its tick. Unless the gate is open, that check must not see a
        passed deadline: ``before_tick`` asks the peers instead, and pysyncobj's check sees
        no deadline at all (``inf``) for the tick. Merely moving a passed deadline is not
        enough: one that passed between our reading of the clock and pysyncobj's (a thread
        preempted there, a SIGSTOP) started an election no one granted; seen once in 20
        paused rounds. What pysyncobj writes there itself (a leader's message, a vote it
        granted, a majority's yes) is kept; otherwise the held deadline is put back."""
        held = self.before_tick()
        if held is None:
            tick()
            return
        host = self._host
        host._SyncObj__raftElectionDeadline = math.inf
        try:
            tick()
        finally:
            if host._SyncObj__raftElectionDeadline == math.inf:
                host._SyncObj__raftElectionDeadline = held

    def before_tick(self) -> float | None:
        """The deadline to hold while pysyncobj ticks (see ``around_tick``), or None to let its
        election check see its own: the gate is open, or it would not elect anyway."""
        self._note_connections()
        host = self._host
        if not self.asks or host._isLeader():
            self._end_round()
            return None
        if getattr(host, "_SyncObj__transferInProgress", False):
            # The leader handed leadership to this node (TimeoutNow): its own wish, so there is
            # no one to ask, and peers that hear that leader would refuse (Raft thesis 3.10, 9.6).
            self._end_round()
            self.elections += host._SyncObj__raftElectionDeadline < self._now()
            return None
        now = self._now()
        if self._stale_leader and now - self._stale_leader < self._max:
            # A leader at a lower term is live and this node ignores it: only an election
            # (its vote request's higher term) brings them back together. Pre-vote would never
            # allow one while that leader answers the others.
            self.elections += host._SyncObj__raftElectionDeadline < now
            return None
        deadline = float(host._SyncObj__raftElectionDeadline)
        if deadline >= now:
            # A leader's message (or a vote pysyncobj granted) moved the deadline after the
            # gate opened: that election is no longer called for.
            self._cleared = False
            return deadline
        others = list(host.otherNodes)
        if others and not any(host.isNodeConnected(n) for n in others):
            return deadline  # pysyncobj starts no election while it reaches nobody; nor do we ask
        if self._cleared:
            self._end_round()
            self.elections += 1
            return None
        asked = [n for n in others if n.id in self.peers and host.isNodeConnected(n)]
        if self._majority(others, set()):
            self.elections += 1  # no peer reads pre-vote, or those that do not are enough
            return None
        if not asked:
            return deadline  # no peer heard yet (just started, say): wait to hear them (module docstring)
        return self._start_round(host, asked, now)

    def _note_connections(self) -> None:
        host = self._host
        now = self._now()
        since = self._connected_since
        for node in host.otherNodes:
            if host.isNodeConnected(node):
                since.setdefault(node.id, now)
            else:
                since.pop(node.id, None)

    def note_append_entries(self, term: int) -> None:
        """An AppendEntries arrived (before pysyncobj takes it): one from a leader at a term
        below this node's own is ignored by pysyncobj, and opens the gate (``before_tick``)."""
        if term < self._host.raftCurrentTerm:
            self._stale_leader = self._now()
        else:
            self._stale_leader = 0.0

    def _start_round(self, host: Any, asked: list[Any], now: float) -> float:
        deadline = now + self._min + (self._max - self._min) * self._rng.random()
        host._SyncObj__raftElectionDeadline = deadline
        self._proposed = host.raftCurrentTerm + 1
        self._granted = set()
        self.rounds += 1
        last_index, last_term = self._last_entry(host)
        request = {"type": PREVOTE_REQUEST, "term": self._proposed,
                   "last_log_index": last_index, "last_log_term": last_term}
        for node in asked:
            self._send(node, request)
        return deadline

    def _majority(self, others: list[Any], granted: set[str]) -> bool:
        # This node, the peers of an older release (see the module docstring), and the yeses.
        return 1 + sum(1 for n in others if self._older(n.id)) + len(granted) > (len(others) + 1) / 2

    def _older(self, peer: str) -> bool:
        """A peer that cannot be asked and would vote anyway: its keepalive came without
        ``prevote``, or it has been connected ``silent_after`` seconds and sent none."""
        if peer in self.peers:
            return False
        if peer in self.heard:
            return True
        since = self._connected_since.get(peer)
        return since is not None and self._now() - since >= self._silent_after

    def _end_round(self) -> None:
        self._proposed = 0
        self._granted = set()
        self._cleared = False

    def _take_answer(self, node: Any, message: dict[str, Any]) -> None:
        host = self._host
        proposed = self._proposed
        # A late answer to an earlier round, or the term moved on since we asked: not ours.
        if not proposed or message.get("term") != proposed or host.raftCurrentTerm + 1 != proposed:
            return
        if not message.get("granted") or node.id not in self.peers:
            return
        self._granted.add(node.id)
        if self._majority(list(host.otherNodes), self._granted):
            self.won += 1
            self._proposed = 0
            self._cleared = True
            host._SyncObj__raftElectionDeadline = 0.0

    # ---- the answering side ----------------------------------------------------

    def would_vote(self, message: dict[str, Any]) -> bool:
        """Whether this node would vote for the asker at the term it names (the rules are in
        the module docstring). Nothing of this node's state changes either way."""
        host = self._host
        term = message.get("term")
        if not isinstance(term, int) or term <= host.raftCurrentTerm or host._isLeader():
            return False
        heard = self._heard_leader()
        if heard and self._now() - heard < self._min:
            return False
        last_index, last_term = self._last_entry(host)
        theirs = (message.get("last_log_term"), message.get("last_log_index"))
        if not all(isinstance(v, int) for v in theirs):
            return False
        return theirs >= (last_term, last_index)

    def take(self, node: Any, message: dict[str, Any]) -> None:
        """A pre-vote message from ``node``: answer a request, count an answer."""
        if message.get("type") == PREVOTE_REQUEST:
            answer = {"type": PREVOTE_RESPONSE, "term": message.get("term"), "granted": self.would_vote(message)}
            self._send(node, answer)
        else:
            self._take_answer(node, message)

    @staticmethod
    def _last_entry(host: Any) -> tuple[int, int]:
        journal = host._SyncObj__raftLog
        last = journal[-1]
        return int(last[1]), int(last[2])
