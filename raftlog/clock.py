"""Estimates of other members' wall clocks (placeholder for the merge).

This branch codes against the names below; the estimator itself (NTP-style
samples carried on raft keepalives) lands from another branch, which replaces
this module and the two ``RaftNode`` methods that return these values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClockEstimate"]


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    offset: float  # seconds: the other clock's wall time minus this node's wall time
    error: float  # seconds: bound on |true offset - offset|
    age: float  # seconds since the sample it comes from was taken
