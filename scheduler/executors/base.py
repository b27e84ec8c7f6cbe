"""The executor seam: one attempt in, one outcome out.

An executor runs exactly one attempt of one slot and never raises for a
failure of the job itself: a refused connection, a non-zero exit code, a
timeout, an unexpected body are all outcomes. It raises only if it was
cancelled (``asyncio.CancelledError``), after it has stopped what it started.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from scheduler.instants import format_instant

__all__ = ["Attempt", "Outcome", "OutcomeStatus", "Executor", "OUTPUT_CAP", "identity"]

OUTPUT_CAP = 8192
"""Bytes of output tail kept per attempt (stdout+stderr for shell, body for HTTP)."""


class OutcomeStatus(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """Everything an executor needs; ``spec`` is the job's ``http`` or ``shell`` section."""

    job: str
    run_id: str
    slot: datetime
    attempt: int
    fencing_token: int
    executor: str  # "http" | "shell"
    spec: dict[str, Any]
    timeout: float  # seconds, per attempt

    @property
    def idempotency_key(self) -> str:
        return f"{self.job}@{format_instant(self.slot)}"


def identity(a: Attempt) -> dict[str, str]:
    """SPEC section 2: the identity every attempt carries, as HTTP header names."""
    return {
        "Idempotency-Key": a.idempotency_key,
        "X-Raftcron-Run-Id": a.run_id,
        "X-Raftcron-Job": a.job,
        "X-Raftcron-Slot": format_instant(a.slot),
        "X-Raftcron-Attempt": str(a.attempt),
        "X-Raftcron-Fencing-Token": str(a.fencing_token),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    status: OutcomeStatus
    started_at: datetime
    finished_at: datetime
    exit_code: int | None = None
    http_status: int | None = None
    output: str = ""  # tail, at most OUTPUT_CAP bytes once utf-8 encoded
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> int:
        return int((self.finished_at - self.started_at).total_seconds() * 1000)


class Executor(Protocol):
    async def run(self, attempt: Attempt) -> Outcome:
        """Run one attempt to its outcome within ``attempt.timeout`` seconds."""
        ...
