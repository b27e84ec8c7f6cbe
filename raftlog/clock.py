"""Peers' wall clocks, estimated NTP-style from raft traffic.

On the keepalive cadence a node sends each peer that announced it reads them a
``rc_clock_req`` stamped with its wall time t1; the peer answers ``rc_clock_resp``
with its receive and answer times t2 and t3; the asker takes the answer at t4:

    offset = ((t2 - t1) + (t3 - t4)) / 2      the peer's wall minus ours
    delay  = (t4 - t1) - (t3 - t2)            the round trip, less the peer's hold time

and the true offset lies within ``delay / 2`` of the estimate whatever the split of
the delay between the two directions. Each side measures its own intervals (t4 - t1,
t3 - t2) on its monotonic clock, so a wall clock stepped during a round cannot corrupt
the delay. A sample is kept against this node's monotonic clock (the peer's wall
minus our monotonic time), so a step of our own wall clock after the sample moves the
offset with it at once. Of the last ``SAMPLES`` per peer the one with the smallest
delay is used (NTP's clock filter: queueing only ever adds delay, and the least
queued sample is the most accurate); its error bound grows with its age by
``DRIFT`` to cover the two clocks' rates drifting apart since. The true offset lies
within every sample's bound, so a new sample whose bound does not meet an older
one's proves the peer's clock was stepped in between: the older ones are dropped,
and a step shows in the estimate at the next round, not after ``SAMPLES`` rounds.

Thread-safety: samples are added on the raft thread and read from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pysyncobj.monotonic import monotonic as _pysyncobj_monotonic

__all__ = ["CLOCK_REQUEST", "CLOCK_RESPONSE", "DRIFT", "MAX_AGE", "SAMPLES", "ClockEstimate", "ClockSync",
           "TimeSource", "raft_clock", "relative_to"]

raft_clock: Callable[[], float] = _pysyncobj_monotonic
"""The clock raft times are read on: pysyncobj's own (``CLOCK_MONOTONIC_RAW`` on Linux), with
which it stamps its election deadline and its followers' answers. ``time.monotonic`` is slewed
by NTP and parts from it by the clock's frequency error: 0.31 s after 1 h 52 min of uptime on the
machine the benchmarks ran on, so ~4 s a day. Compared with pysyncobj's stamps, that offset
became a leader's contact age (past half a lease, it cut off its own attempts), an excused
stall and pre-vote's deadline."""

CLOCK_REQUEST = "rc_clock_req"
CLOCK_RESPONSE = "rc_clock_resp"
SAMPLES = 8
DRIFT = 15e-6  # seconds of error per second of age: NTP's bound on two clocks' frequency error
MAX_AGE = 60.0  # a sample older than this (the peer unreachable since) says nothing worth keeping


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    offset: float  # seconds: the other clock's wall time minus this node's wall time
    error: float  # seconds: bound on |true offset - offset|
    age: float  # seconds since the sample it comes from was taken


@dataclass(frozen=True, slots=True)
class TimeSource:
    """Where a node reads time; tests pass fakes to play a peer whose clock is off."""

    wall: Callable[[], float] = time.time
    mono: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class _Sample:
    peer_minus_mono: float  # the peer's wall time minus our monotonic time, when taken
    delay: float
    taken: float  # our monotonic time


@dataclass(frozen=True, slots=True)
class _Asked:
    seq: int
    t1: float  # our wall time when sent
    m1: float  # our monotonic time when sent


@dataclass(slots=True)
class ClockSync:
    """One node's estimates of its peers' wall clocks, and its side of the exchange.

    ``request``, ``answer`` and ``take`` run on the raft thread only; ``estimate``
    on any thread."""

    time: TimeSource = field(default_factory=TimeSource)
    peers: set[str] = field(default_factory=set)  # peers that announced they read clock messages
    _samples: dict[str, deque[_Sample]] = field(default_factory=dict)
    _asked: dict[str, _Asked] = field(default_factory=dict)
    _seq: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, peer: str) -> dict[str, Any]:
        """The message to send ``peer`` now. One round per peer is outstanding: a request
        whose answer never came is replaced (its answer, if late, is ignored)."""
        self._seq += 1
        asked = _Asked(seq=self._seq, t1=self.time.wall(), m1=self.time.mono())
        self._asked[peer] = asked
        return {"type": CLOCK_REQUEST, "seq": asked.seq, "t1": asked.t1}

    def answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Our answer to a peer's request, stamped on arrival and on the way out."""
        m2, t2 = self.time.mono(), self.time.wall()
        t1 = message.get("t1")
        if not isinstance(t1, (int, float)):
            return None
        hold = self.time.mono() - m2
        return {"type": CLOCK_RESPONSE, "seq": message.get("seq"), "t1": t1, "t2": t2, "t3": t2 + hold}

    def take(self, peer: str, message: dict[str, Any]) -> bool:
        """Record the sample a peer's answer completes; False if it answers no round of ours."""
        m4 = self.time.mono()
        asked = self._asked.get(peer)
        t2, t3 = message.get("t2"), message.get("t3")
        if asked is None or message.get("seq") != asked.seq or message.get("t1") != asked.t1:
            return False
        if not isinstance(t2, (int, float)) or not isinstance(t3, (int, float)):
            return False
        del self._asked[peer]
        hold = max(0.0, t3 - t2)
        elapsed = m4 - asked.m1
        delay = max(0.0, elapsed - hold)
        # t4 by our monotonic clock from t1: a wall step of ours during the round does not count.
        t4 = asked.t1 + elapsed
        offset = ((t2 - asked.t1) + (t3 - t4)) / 2
        sample = _Sample(peer_minus_mono=offset + asked.t1 - asked.m1, delay=delay, taken=m4)
        with self._lock:
            kept = self._samples.setdefault(peer, deque(maxlen=SAMPLES))
            consistent = [s for s in kept if abs(s.peer_minus_mono - sample.peer_minus_mono)
                          <= s.delay / 2 + DRIFT * (m4 - s.taken) + sample.delay / 2]
            if len(consistent) < len(kept):  # the peer's clock was stepped since those
                kept.clear()
                kept.extend(consistent)
            kept.append(sample)
        return True

    def estimate(self, peer: str) -> ClockEstimate | None:
        """``peer``'s wall clock minus ours, from the least delayed recent sample; None if none."""
        now_mono = self.time.mono()
        with self._lock:
            samples = [s for s in self._samples.get(peer, ()) if now_mono - s.taken <= MAX_AGE]
        if not samples:
            return None
        best = min(samples, key=lambda s: s.delay)
        age = max(0.0, now_mono - best.taken)
        offset = best.peer_minus_mono - (self.time.wall() - now_mono)
        return ClockEstimate(offset=offset, error=best.delay / 2 + DRIFT * age, age=age)


def relative_to(leader: ClockEstimate, member: ClockEstimate) -> ClockEstimate:
    """A member's wall minus the leader's, from both clocks' offsets to this node's own."""
    return ClockEstimate(offset=member.offset - leader.offset, error=member.error + leader.error,
                         age=max(member.age, leader.age))
