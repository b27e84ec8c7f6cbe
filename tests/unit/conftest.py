"""Fixtures for the state-machine tests: a harness applying commands with rising log indexes.

Everything is pure: commands carry fixed ``at_us`` values, nothing reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from raftlog.fsm import ApplyContext
from scheduler.commands import (
    Claim,
    ClaimSlots,
    Command,
    FinishRuns,
    PutJob,
    RegisterNode,
    Rejected,
    StartRuns,
    encode_command,
)
from scheduler.instants import us
from scheduler.state import Applied, State

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
"""A fixed instant on a minute boundary: the tests' "now" is always derived from it."""
MIN = 60_000_000
SEC = 1_000_000


def slot(n: int) -> int:
    """The n-th minute slot after T0 (an every-minute job created at T0 has slot(1) first)."""
    return T0 + n * MIN


def job_doc(name: str = "ping", **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name, "schedule": "* * * * *", "executor": "http", "http": {"url": "https://example.test/hook"},
    }
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


def semantic_snapshot(state: State) -> bytes:
    """The snapshot with applied_index zeroed: what a rejected command must leave untouched."""
    copy = State()
    copy.restore(state.snapshot_bytes())
    copy.applied_index = 0
    return copy.snapshot_bytes()


class Harness:
    """One State, fed commands at log indexes 1, 2, 3, ... (``index`` is the last used)."""

    def __init__(self) -> None:
        self.state = State()
        self.index = 0

    def apply(self, cmd: Command | bytes) -> Applied | Rejected:
        self.index += 1
        raw = cmd if isinstance(cmd, bytes) else encode_command(cmd)
        return self.state.apply(raw, ApplyContext(index=self.index))

    def ok(self, cmd: Command) -> Any:
        out = self.apply(cmd)
        assert isinstance(out, Applied), f"{type(cmd).__name__} was refused: {out}"
        return out.result

    def rejected(self, cmd: Command | bytes) -> Rejected:
        out = self.apply(cmd)
        assert isinstance(out, Rejected), f"expected a rejection, got {out}"
        return out

    # ---- shorthands ---------------------------------------------------------------

    def node(self, node_id: str, *, tags: dict[str, str] | None = None, allow_shell: bool = False) -> None:
        self.ok(RegisterNode(at_us=T0, node_id=node_id, raft_addr=f"{node_id}:7000", http_addr=f"{node_id}:8000",
                             tags=tags or {}, allow_shell=allow_shell))

    def put(self, name: str = "ping", *, at_us: int = T0, expect_version: int | None = None, **over: Any) -> Any:
        return self.apply(PutJob(at_us=at_us, spec=job_doc(name, **over), expect_version=expect_version))

    def claim(self, *claims: Claim, at_us: int = T0, cancel: tuple[str, ...] = (),
              summaries: tuple[dict[str, Any], ...] = (), leader: str = "n1", term: int = 1) -> dict[str, Any]:
        result: dict[str, Any] = self.ok(ClaimSlots(at_us=at_us, leader=leader, term=term, claims=tuple(claims),
                                                    cancel=cancel, summaries=summaries))
        return result

    def claim_one(self, job: str, slot_us: int, node: str = "n1", *, at_us: int = T0,
                  trigger: str = "schedule", **kw: Any) -> dict[str, Any]:
        """Claim one slot and return the created run (fails if refused)."""
        result = self.claim(Claim(job=job, slot_us=slot_us, trigger=trigger, node=node, **kw), at_us=at_us)
        assert len(result["runs"]) == 1, result
        run: dict[str, Any] = result["runs"][0]
        return run

    def start(self, node: str, *run_ids: str, at_us: int, lease_until_us: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.ok(StartRuns(
            at_us=at_us, node=node, runs=run_ids, started_us={r: at_us for r in run_ids},
            lease_until_us=lease_until_us if lease_until_us is not None else at_us + 5 * SEC))
        return result

    def finish(self, node: str, run_id: str, status: str, finished_us: int, **extra: Any) -> dict[str, Any]:
        res = {"run_id": run_id, "status": status, "started_us": extra.pop("started_us", None),
               "finished_us": finished_us, "exit_code": None, "http_status": 200 if status == "succeeded" else 500,
               "output": "", "error": None, **extra}
        result: dict[str, Any] = self.ok(FinishRuns(at_us=finished_us, node=node, results=(res,)))
        return result

    def run(self, run_id: str) -> dict[str, Any]:
        return self.state.runs[run_id]

    def semantic(self) -> bytes:
        return semantic_snapshot(self.state)

    job_doc = staticmethod(job_doc)


@pytest.fixture
def h() -> Harness:
    """A harness with nodes n1, n2 and no jobs."""
    harness = Harness()
    harness.node("n1")
    harness.node("n2")
    return harness


@pytest.fixture
def make_harness() -> Callable[[], Harness]:
    return Harness
