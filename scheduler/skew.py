"""The cluster's time, and which nodes' clocks are too far from it to be trusted.

Slots are due by one clock, the leader's wall clock. Raft traffic gives each
node an estimate of the leader's clock against its own (``ClockEstimate``:
offset ``o``, error bound ``e``), so the leader's wall time lies in
``local + o ± e``. ``ClusterTime`` translates with that; ``ClockGuard`` is the
pure rule the leader applies to every member's estimate.

A node is *skewed* when its clock is more than ``max_skew`` from the leader's,
or when the leader can reach it and still holds no estimate of it. A skewed
node gets no attempts (the leader leaves it out of the planner's live set) and
refuses to start any itself. The leader cannot leave itself out of leading;
when its clock is far from a majority of its followers' it is reported the
same way (a log line and a ``clock_skew`` alert).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from raftlog import ClockEstimate

from .clock import Clock
from .planner import us

__all__ = ["ClockEstimate", "ClockGuard", "ClockStatus", "ClusterTime", "SkewVerdict"]

log = logging.getLogger("raftcron.skew")


class ClusterTime:
    """This node's reading of the cluster's clock (the leader's wall clock).

    ``source`` is the raft node's ``clock_offset_to_leader``. ``now()`` keeps
    using the last estimate it saw while none is known (a leader change), so
    reports made meanwhile are still in the cluster's time; before any estimate
    it reads the local clock, the best there is.
    """

    def __init__(self, clock: Clock, source: Callable[[], ClockEstimate | None]) -> None:
        self.clock = clock
        self._source = source
        self._last: ClockEstimate | None = None

    def estimate(self) -> ClockEstimate | None:
        """The newest estimate of the leader's clock against this node's, None if unknown."""
        est = self._source()
        if est is not None:
            self._last = est
        return est

    def now(self) -> datetime:
        self.estimate()
        last = self._last
        local = self.clock.now()
        return local if last is None else local + timedelta(seconds=last.offset)

    def now_us(self) -> int:
        return us(self.now())


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
    skewed: frozenset[str]  # node ids to give no attempts (never the leader: see ClockGuard)
    leader_skewed: bool
    changed: tuple[ClockStatus, ...]  # nodes whose skewed/not-skewed judgement changed since the last check


class ClockGuard:
    """Judges members' clocks against the leader's; pure (no clock, no I/O).

    Call ``check`` with ``member_clocks()`` (raft_addr -> that member's wall minus
    the leader's), the member registry (raft_addr -> node id), the node ids the
    leader can reach and the leader's own raft address. A member the leader
    cannot reach and holds no estimate of keeps its last judgement: it gets no
    attempts anyway, and flapping its status on every partition would alert for
    nothing. ``known``: the judgements already recorded (the replicated state's, at the
    start of a leadership), so a node an earlier leader found skewed is reported when it
    recovers, and one already reported is not reported again.
    """

    def __init__(self, max_skew: float, known: Mapping[str, bool] | None = None) -> None:
        if max_skew <= 0:
            raise ValueError("max_skew must be positive")
        self.max_skew = max_skew
        self._judged: dict[str, bool] = dict(known or {})

    def check(self, clocks: Mapping[str, ClockEstimate], members: Mapping[str, str], reachable: Collection[str],
              leader_addr: str) -> SkewVerdict:
        limit = self.max_skew
        statuses: list[ClockStatus] = []
        far: list[float] = []  # offsets of followers beyond the limit
        followers: list[float] = []
        leader_id = members.get(leader_addr)
        for addr, node in sorted(members.items(), key=lambda kv: kv[1]):
            if node == leader_id:
                continue
            est = clocks.get(addr)
            if est is None:
                if node in reachable:
                    statuses.append(ClockStatus(node, True, None, None, "no estimate of its clock yet"))
                continue
            followers.append(est.offset)
            beyond = abs(est.offset) > limit
            if beyond:
                far.append(est.offset)
            why = (f"its clock is {est.offset:+.3f}s (±{est.error:.3f}s) from the leader's, beyond {limit:g}s"
                   if beyond else f"its clock is {est.offset:+.3f}s (±{est.error:.3f}s) from the leader's")
            statuses.append(ClockStatus(node, beyond, round(est.offset * 1e6), round(est.error * 1e6), why))
        n_followers = sum(1 for n in members.values() if n != leader_id)
        # A majority of ALL followers, not of those measured: two unmeasured followers of five
        # must not let one far clock outvote the leader.
        leader_skewed = n_followers > 0 and 2 * len(far) > n_followers
        if leader_id is not None:
            median = _median(followers) if followers else 0.0
            why = (f"the leader's clock is {-median:+.3f}s from the median of its followers', and beyond {limit:g}s "
                   f"from {len(far)} of its {n_followers} followers'")
            statuses.append(ClockStatus(leader_id, leader_skewed, round(-median * 1e6), None, why))
        changed = []
        for st in statuses:
            if self._judged.get(st.node) != st.skewed:
                # A node first seen with a good clock is no news; a first skewed one is.
                if st.node in self._judged or st.skewed:
                    changed.append(st)
                self._judged[st.node] = st.skewed
        for node in [n for n in self._judged if n not in members.values()]:
            del self._judged[node]  # removed from the cluster
        skewed = frozenset(n for n, bad in self._judged.items() if bad and n != leader_id)
        return SkewVerdict(skewed, leader_skewed, tuple(changed))


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
