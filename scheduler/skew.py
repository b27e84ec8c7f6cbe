"""The cluster's time, and which nodes' clocks are too far from it to be trusted.

Slots are due by one clock, the leader's wall clock. Raft traffic gives each
node an estimate of the leader's clock against its own (``ClockEstimate``:
offset ``o``, error bound ``e``), so the leader's wall time lies in
``local + o ± e``. ``ClusterTime`` translates with that; ``ClockGuard`` is the
pure rule the leader applies to every member's estimate.

A node is *skewed* when its clock is more than ``max_skew`` from the leader's,
or when the leader can reach it and still holds no estimate of it. A skewed
node gets no attempts (the leader leaves it out of the planner's live set,
``SkewWatch``) and refuses to start any itself (``Worker``). Each change is
committed (``NodeClock``), logged, and raises a ``clock_skew`` alert (or
``clock_skew_recovered``).

The leader cannot leave itself out of leading. When its clock is far from a
majority of its followers' it is reported the same way, takes no attempts, and
records how far ahead it runs; workers then wait for the slot by the majority's
clock too (``leader_lead_us``), so a leader running fast does not make the
cluster fire early either. A leader running slow only makes slots late.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from raftlog import ClockEstimate

from .clock import Clock
from .commands import NodeClock
from .duration import parse_duration
from .errors import RaftcronError
from .instants import us
from .service import Service

__all__ = ["REUSE", "ClockEstimate", "ClockGuard", "ClockStatus", "ClusterTime", "SkewVerdict", "SkewWatch", "trusted",
           "estimated_lead_us", "leader_lead_us", "not_before_local_us", "parse_max_skew"]

log = logging.getLogger("raftcron.skew")


def parse_max_skew(text: str) -> float:
    """Seconds in a ``--max-clock-skew`` value: a duration (``1s``, ``2m``) or whole
    milliseconds (``500ms``; job durations have no use for them, so only this flag reads
    them); must be positive. Raises ValueError naming the flag."""
    value = text.strip()
    try:
        if value.endswith("ms") and value[:-2].isdigit():
            seconds = int(value[:-2]) / 1000
        else:
            seconds = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"--max-clock-skew {text!r}: {exc}; or whole milliseconds, e.g. '500ms'") from exc
    if seconds <= 0:
        raise ValueError(f"--max-clock-skew {text!r}: must be more than zero")
    return seconds


REUSE = 0.002
"""Seconds ``ClusterTime.now`` carries a reading forward on the monotonic clock."""


class ClusterTime:
    """This node's reading of the cluster's clock (the leader's wall clock).

    ``source`` is the raft node's ``clock_offset_to_leader``. ``now()`` keeps
    using the last estimate it saw while none is known (a leader change), so
    reports made meanwhile are still in the cluster's time; before any estimate
    it reads the local clock, the best there is.
    """

    def __init__(self, clock: Clock, source: Callable[[], ClockEstimate | None],
                 lead_us: Callable[[], int] | None = None) -> None:
        """``lead_us``: how far the leader recorded its own clock ahead of its followers'
        median (``leader_lead_us``; 0 unless it recorded itself skewed). The cluster's time is
        the leader's clock less that lead, as the leader plans by (``SkewWatch.planning_now_us``),
        so leases and start times reported from here compare with the leader's plans."""
        self.clock = clock
        self._source = source
        self._lead_us = lead_us
        self._last: ClockEstimate | None = None
        self._read: tuple[float, datetime] | None = None  # (monotonic, reading) of the last fresh reading

    def estimate(self) -> ClockEstimate | None:
        """The newest estimate of the leader's clock against this node's, None if unknown."""
        est = self._source()
        if est is not None:
            self._last = est
        return est

    @property
    def last(self) -> ClockEstimate | None:
        """The newest estimate ever seen (None before the first)."""
        return self._last

    def now(self) -> datetime:
        """The cluster's time as this node reads it, for what a report or a record carries.

        A reading less than ``REUSE`` old is carried forward on the monotonic clock instead of
        estimated afresh: an hourly burst reads it twice per attempt, thousands of times a
        second, and the estimate (the leader's offset, its recorded lead) moves only when a
        new round trip lands. Decisions about an instant read ``estimate()`` itself."""
        mono = self.clock.monotonic()
        read = self._read
        if read is not None and 0.0 <= mono - read[0] < REUSE:
            return read[1] + timedelta(seconds=mono - read[0])
        reading = self._fresh()
        self._read = (mono, reading)
        return reading

    def _fresh(self) -> datetime:
        self.estimate()
        last = self._last
        local = self.clock.now()
        lead = self._lead_us() if self._lead_us is not None else 0
        if last is None:
            return local
        return local + timedelta(seconds=last.offset, microseconds=-lead)

    def now_us(self) -> int:
        return us(self.now())

    def reached_us(self) -> int:
        """An instant the leader's clock has certainly reached: the reading less its error
        bound. What an operator's write is stamped with, so that no edit is dated ahead of the
        leader's own clock (the leader's next plan would count as made before the edit)."""
        reading = us(self._fresh())  # not a reading carried forward: its error is the one subtracted
        last = self._last
        return reading - (round(last.error * 1e6) if last is not None else 0)


def not_before_local_us(due_us: int, est: ClockEstimate) -> int:
    """The local wall instant by which the leader's clock has certainly reached ``due_us``.

    leader = local + true_offset with |true_offset - offset| <= error, so at local
    ``due - offset + error`` the leader reads at least ``due``: never early, and at
    most ``2 * error`` late by the leader's clock.
    """
    return due_us - round(est.offset * 1e6) + round(est.error * 1e6)


@dataclass(frozen=True, slots=True)
class ClockStatus:
    """One node's clock as the leader judged it."""

    node: str
    skewed: bool
    offset_us: int | None  # that node's wall minus the leader's; for the leader, its wall minus its followers' median
    error_us: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class SkewVerdict:
    skewed: frozenset[str]  # node ids to give no attempts (the leader too, when its own clock is the far one)
    leader_skewed: bool
    changed: tuple[ClockStatus, ...]  # judgements changed (and settled) since the last report
    leader: ClockStatus | None = None  # the leader's own, changed or not


class ClockGuard:
    """Judges members' clocks against the leader's; pure (no clock, no I/O).

    Call ``check`` with ``member_clocks()`` (raft_addr -> that member's wall minus
    the leader's), the member registry (raft_addr -> node id), the node ids the
    leader can reach, the leader's own raft address and a monotonic ``now``.

    - A follower is skewed when its offset is beyond ``max_skew``, or when the
      leader can reach it and has held no estimate of it for ``unmeasured_grace``
      seconds (the grace: a new leader's first samples take a keepalive round or
      two, and every election must not raise an alert). A member the leader
      cannot reach and holds no estimate of keeps its last judgement: it gets no
      attempts anyway, and flapping its status on every partition would alert
      for nothing.
    - The leader is skewed when its clock is beyond ``max_skew`` from more than
      half of ALL its followers' (not only of the measured ones: with two of four
      followers not measured yet, the other two being far is no majority). Its
      status carries its offset from the median of its followers' clocks, which
      workers use so as not to fire early by the majority's clock either (see
      ``leader_lead_us``); it leads on, but takes no attempts itself. Followers
      are then judged against that median, not against the leader's clock: the
      fault is the leader's, and leaving the healthy followers out would hand
      every attempt to the one suspect clock.

    A skewed node is left out at once (``skewed``), but a change is reported
    (``changed``) only once it has held for ``settle`` seconds. ``known``: the
    judgements already recorded (the replicated state's, at the start of a
    leadership), so a node an earlier leader found skewed is reported when it
    recovers, and one already reported is not reported again.
    """

    def __init__(self, max_skew: float, known: Mapping[str, bool] | None = None, *,
                 unmeasured_grace: float = 5.0, settle: float = 1.0) -> None:
        if max_skew <= 0:
            raise ValueError("max_skew must be positive")
        self.max_skew = max_skew
        self.unmeasured_grace = unmeasured_grace
        self.settle = settle
        self._judged: dict[str, bool] = dict(known or {})  # as last reported
        self._unmeasured_since: dict[str, float] = {}
        self._turning: dict[str, float] = {}  # node -> since when its judgement differs from the reported one

    def check(self, clocks: Mapping[str, ClockEstimate], members: Mapping[str, str], reachable: Collection[str],
              leader_addr: str, now: float) -> SkewVerdict:
        limit = self.max_skew
        leader_id = members.get(leader_addr)
        measured: dict[str, ClockEstimate] = {}
        statuses: list[ClockStatus] = []
        followers = sorted((node, addr) for addr, node in members.items() if node != leader_id)
        for node, addr in followers:
            est = clocks.get(addr)
            if est is not None:
                measured[node] = est
                self._unmeasured_since.pop(node, None)
                continue
            if node not in reachable:  # the grace counts from when it can be reached (and sampled)
                self._unmeasured_since.pop(node, None)
                continue
            since = self._unmeasured_since.setdefault(node, now)
            if now - since >= self.unmeasured_grace:
                statuses.append(ClockStatus(node, True, None, None,
                                            f"the leader has had no estimate of its clock for {now - since:.0f}s"))
        far = sum(1 for est in measured.values() if abs(est.offset) > limit)
        leader_skewed = bool(followers) and 2 * far > len(followers)
        reference = 0.0
        own: ClockStatus | None = None
        if leader_skewed:
            reference = _median([est.offset for est in measured.values()])
            error = max(est.error for est in measured.values())
            assert leader_id is not None  # followers beyond the limit are measured against a leader
            own = ClockStatus(
                leader_id, True, round(-reference * 1e6), round(error * 1e6),
                f"the leader's clock is {-reference:+.3f}s from the median of its followers' clocks, and beyond "
                f"{limit:g}s from {far} of its {len(followers)} followers'")
        elif leader_id is not None:
            own = ClockStatus(leader_id, False, 0, 0, "the leader's clock agrees with its followers'")
        if own is not None:
            statuses.append(own)
        against = "the median of its followers'" if leader_skewed else "the leader's"
        for node, est in sorted(measured.items()):
            off = est.offset - reference
            beyond = abs(off) > limit
            why = f"its clock is {off:+.3f}s (±{est.error:.3f}s) from {against}" + (f", beyond {limit:g}s" if beyond else "")
            statuses.append(ClockStatus(node, beyond, round(est.offset * 1e6), round(est.error * 1e6), why))
        changed = self._settle(statuses, now, leader_id)
        ids = set(members.values())
        for table in (self._judged, self._unmeasured_since, self._turning):
            for node in [n for n in table if n not in ids]:
                del table[node]  # removed from the cluster
        # Left out at once, reported once settled.
        current = {**self._judged, **{st.node: st.skewed for st in statuses}}
        skewed = frozenset(n for n, bad in current.items() if bad)
        return SkewVerdict(skewed, leader_skewed, tuple(changed), own)

    def _settle(self, statuses: list[ClockStatus], now: float, leader_id: str | None) -> list[ClockStatus]:
        """The judgements that changed and have held for ``settle`` seconds. A leader's clock
        step reaches its followers' samples a keepalive round apart, so for a moment one
        follower alone looks far; that must not raise an alert and its recovery. The
        leader's own judgement needs a majority of followers far at once and is not
        transient that way; it is reported at once, since workers time slots by the lead
        it records."""
        changed = []
        for st in statuses:
            was = self._judged.get(st.node)
            if was == st.skewed or (was is None and not st.skewed):
                self._turning.pop(st.node, None)
                self._judged[st.node] = st.skewed  # a node first seen with a good clock is no news
                continue
            since = self._turning.setdefault(st.node, now)
            if now - since >= self.settle or st.node == leader_id:
                del self._turning[st.node]
                self._judged[st.node] = st.skewed
                changed.append(st)
        return changed


def trusted(live: set[str], clocks: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """``live`` without the nodes whose clocks the replicated state records as skewed: what
    any node (not only the leader) hands the picker, e.g. for a manual run."""
    return {n for n in live if not ((rec := clocks.get(n)) is not None and rec["skewed"])}


class SkewWatch:
    """The leader's side of clock skew: every ``interval`` it judges the members' clocks
    (``ClockGuard``), leaves the skewed ones out of the planner's live set (``live``), logs
    each change of judgement and commits it as a ``NodeClock`` entry, which records it in
    the state and raises the ``clock_skew`` / ``clock_skew_recovered`` alert. Runs only
    while this node leads; one per leadership."""

    def __init__(self, service: Service, clock: Clock, live: Callable[[], set[str]], max_skew: float, *,
                 interval: float = 0.25, unmeasured_grace: float = 5.0, settle: float = 1.0) -> None:
        self.svc = service
        self.state = service.state
        self.clock = clock
        self._live = live
        self.max_skew = max_skew
        self.interval = interval
        self.unmeasured_grace = unmeasured_grace
        self.settle = settle
        self._guard: ClockGuard | None = None
        self._verdict: SkewVerdict | None = None
        self._skewed: frozenset[str] = frozenset()
        self._pending: dict[str, ClockStatus] = {}

    def live(self) -> set[str]:
        """The planner's live set: reachable, and with a clock near enough the cluster's. A node
        is left out the moment the guard finds it skewed, and taken back only once its
        recovery is recorded (``trusted``): a clock seen good for a moment is not yet trusted."""
        return trusted(self._live(), self.state.clocks) - self._skewed

    def planning_now_us(self) -> int | None:
        """The instant the leader plans by: its wall clock, or, when its own clock is the far
        one, its wall clock less its recorded lead over its followers' median. None until
        this leadership has judged the clocks (and, when skewed, committed its own record, by
        which workers hold attempts back): a node elected with a clock 30 s ahead must not
        record the next 30 s of slots as late, nor one 3 s behind claim every slot 3 s late."""
        verdict = self._verdict
        if verdict is None and self._ready():
            verdict = self.check()  # the loop's first tick after its barrier: judge now, not at the next round
        if verdict is None:
            return None
        now = self.svc.now_us()
        own = verdict.leader
        if own is None or not own.skewed:
            return now
        lead = _recorded_lead(self.state.clocks, self.svc.node_id)
        return None if lead is None else now - lead[0]

    def not_planning(self) -> str:
        """Why ``planning_now_us`` is None now, in words for the log."""
        term = self.svc.node.status().term
        if self._guard is None:
            return (f"this term's barrier is not applied here yet (term {term}; the last barrier applied is of term "
                    f"{self.state.last_noop.get('term')})")
        verdict = self._verdict
        if verdict is None:
            return "the clocks are not judged: this node knows no leader"
        own = verdict.leader
        if own is not None and own.skewed:
            return (f"this leader's clock is judged skewed ({own.reason}) and the lead it plans by is not recorded "
                    f"yet (its clock record: {self.state.clocks.get(self.svc.node_id)})")
        return "a planning instant is known now"

    async def run(self) -> None:
        node = self.svc.node
        term = node.status().term
        # Start from what earlier leaders recorded, so a recovery from their judgement is
        # reported and their reports are not repeated: wait until this term's barrier (the
        # leader loop commits it) is applied here.
        while node.is_leader() and not self._ready():
            await self.clock.sleep(self.interval)
        while node.is_leader():
            self.check()
            await self._commit(term)
            await self.clock.sleep(self.interval)

    def _ready(self) -> bool:
        """Whether this term's barrier is applied here; the guard then starts from what it found."""
        if self._guard is None:
            if self.state.last_noop.get("term") != self.svc.node.status().term:
                return False
            self._guard = ClockGuard(self.max_skew, {n: bool(r["skewed"]) for n, r in self.state.clocks.items()},
                                     unmeasured_grace=self.unmeasured_grace, settle=self.settle)
        return True

    def check(self) -> SkewVerdict | None:
        """Judge now; None before ``run`` has read what earlier leaders recorded."""
        leader = self.svc.node.leader()
        if self._guard is None or leader is None:
            return None
        members = {n["raft_addr"]: n["node_id"] for n in list(self.state.nodes.values())}
        verdict = self._guard.check(self.svc.node.member_clocks(), members, self._live(), leader,
                                    self.clock.monotonic())
        self._skewed = verdict.skewed
        self._verdict = verdict
        own, rec = verdict.leader, self.state.clocks.get(self.svc.node_id)
        if own is not None and own.skewed and own not in verdict.changed and rec is not None and (
                rec["leader"] != self.svc.node_id or abs((rec["offset_us"] or 0) - (own.offset_us or 0))
                > self.max_skew * 250_000):
            # Workers hold attempts back by the lead this leader recorded for itself
            # (leader_lead_us): it must be this leadership's record, and kept near the truth.
            self._pending[own.node] = own
        for st in verdict.changed:
            self._pending[st.node] = st
            if st.node == self.svc.node_id:
                log.warning("this leader's clock %s: %s", "is skewed" if st.skewed else "is back in line", st.reason)
            elif st.skewed:
                log.warning("node %s gets no attempts: %s", st.node, st.reason)
            else:
                log.warning("node %s gets attempts again: %s", st.node, st.reason)
        return verdict

    async def _commit(self, term: int) -> None:
        for node, st in list(self._pending.items()):
            cmd = NodeClock(at_us=self.svc.now_us(), node=st.node, offset_us=st.offset_us, error_us=st.error_us,
                            skewed=st.skewed, leader=self.svc.node_id, term=term, reason=st.reason)
            try:
                await self.svc.propose(cmd)
            except RaftcronError as exc:
                log.warning("clock status of node %s not committed yet (%s); retrying", node, exc)
                return
            if self._pending.get(node) is st:  # a newer judgement waits for the next round
                del self._pending[node]


def leader_lead_us(clocks: Mapping[str, Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]],
                   leader_addr: str | None) -> tuple[int, int]:
    """How far the current leader's clock runs from the median of its followers', with its
    error bound, as the leader recorded it (``NodeClock`` on itself); ``(0, 0)`` unless it
    recorded itself skewed. Reads the replicated state's ``clocks`` and ``nodes``."""
    if leader_addr is None:
        return 0, 0
    leader = next((n["node_id"] for n in list(nodes.values()) if n["raft_addr"] == leader_addr), None)
    lead = _recorded_lead(clocks, leader) if leader is not None else None
    return (0, 0) if lead is None else lead


def estimated_lead_us(clocks: Mapping[str, ClockEstimate], leader_addr: str, max_skew: float,
                      followers: int) -> tuple[int, int]:
    """The leader's lead over its followers' median clock as this node estimates it from
    ``member_clocks()`` (each member's wall minus the leader's), by ``ClockGuard``'s rule: only
    when more than half of ALL the leader's ``followers`` (the cluster's size less one, measured
    or not) are beyond ``max_skew``; else ``(0, 0)``. Counting only the measured ones would let a
    follower whose own clock is the far one, before it has measured the other followers, take the
    leader for the skewed node and fire its slots early by its own clock."""
    others = [est for addr, est in clocks.items() if addr != leader_addr]
    far = sum(abs(est.offset) > max_skew for est in others)
    if not others or 2 * far <= max(followers, len(others)):
        return 0, 0
    return round(-_median([est.offset for est in others]) * 1e6), round(max(est.error for est in others) * 1e6)


def _recorded_lead(clocks: Mapping[str, Mapping[str, Any]], leader: str) -> tuple[int, int] | None:
    """The lead (and its error) ``leader`` recorded for its own clock while it led, if skewed."""
    rec = clocks.get(leader)
    if rec is None or not rec["skewed"] or rec["leader"] != leader or rec["offset_us"] is None:
        return None
    return int(rec["offset_us"]), int(rec["error_us"] or 0)


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
