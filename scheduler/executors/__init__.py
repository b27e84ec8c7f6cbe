"""Executors: run one attempt of one slot, on this node, to an outcome."""

from __future__ import annotations

from .base import OUTPUT_CAP, Attempt, Executor, Outcome, OutcomeStatus, identity
from .http import MATCH_CAP, HttpExecutor
from .shell import DISABLED_ERROR, OutputTail, ShellExecutor

__all__ = [
    "Attempt",
    "Outcome",
    "OutcomeStatus",
    "Executor",
    "OUTPUT_CAP",
    "MATCH_CAP",
    "DISABLED_ERROR",
    "identity",
    "HttpExecutor",
    "ShellExecutor",
    "OutputTail",
]
