"""Run statuses: the one transition table of ``scheduler.runs`` against what the ledger does.

Two directions. Every edge of the table is made by the ledger in a scenario of its own
(``test_the_ledger_makes_every_transition_of_the_table``), and every status change the
ledger makes while the ledger, state and simulation tests run again here is an edge of the
table (those tests are collected a second time in this module, with ``State.apply``
wrapped by ``_checked_apply``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import pytest

from api import cli
from api.app import openapi_document
from raftlog.fsm import ApplyContext
from scheduler import ledger
from scheduler.commands import CancelRun, ExpireRuns
from scheduler.instants import us
from scheduler.runs import (
    ACTIVE,
    CLAIM_STATUSES,
    FOLLOWS,
    RUN_STATUSES,
    SCHEDULED,
    TERMINAL,
    TRANSITIONS,
    RunStatus,
    StatusName,
    Trigger,
    TriggerName,
)
from scheduler.state import State
from tests.unit import test_ledger, test_simulation, test_state, test_state_properties

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
MIN = 60_000_000
SEC = 1_000_000
S = RunStatus


def slot(n: int) -> int:
    return T0 + n * MIN


# ---- the table itself ------------------------------------------------------------------------


def test_statuses_and_triggers_are_those_of_the_spec() -> None:
    assert RUN_STATUSES == ("claimed", "running", "succeeded", "failed", "timed_out", "retrying", "lost",
                            "cancelled", "skipped", "missed", "dead")
    assert [t.value for t in Trigger] == ["schedule", "catchup", "manual", "retry", "dependency", "replay"]
    assert SCHEDULED == {"schedule", "catchup"}


def test_active_and_terminal_split_the_statuses_by_whether_a_transition_leaves_them() -> None:
    assert ACTIVE == {"claimed", "running", "retrying", "lost"}
    assert TERMINAL == {"succeeded", "failed", "timed_out", "cancelled", "skipped", "missed", "dead"}
    assert ACTIVE | TERMINAL == set(RunStatus) and not ACTIVE & TERMINAL
    targets = {new for news in TRANSITIONS.values() for new in news}
    assert targets <= set(RunStatus) and CLAIM_STATUSES <= set(RunStatus)
    # A status a new attempt may follow is one a record keeps once its slot goes on without it.
    assert all(follows <= {S.RETRYING, S.LOST, S.DEAD} for follows in FOLLOWS.values())


def test_every_reader_shares_the_one_definition() -> None:
    assert ledger.ACTIVE is ACTIVE and ledger.TERMINAL is TERMINAL
    assert vars(cli)["TERMINAL"] is TERMINAL and vars(cli)["RUN_STATUSES"] is RUN_STATUSES


def test_the_api_status_filter_is_the_enum() -> None:
    doc = openapi_document()
    filters = {
        path: [p["schema"]["enum"] for p in op.get("parameters", []) if p["name"] == "status"]
        for path, ops in doc["paths"].items() for method, op in ops.items() if method == "get"
    }
    assert filters["/v1/runs"] == [[s.value for s in RunStatus]]
    assert filters["/v1/jobs/{name}/runs"] == [[s.value for s in RunStatus]]


# ---- every edge of the table is one the ledger makes ----------------------------------------------

EDGES = sorted((old, new) for old, news in TRANSITIONS.items() for new in news)


def _attempt(h: Any, *, to: RunStatus) -> str:
    """A claimed attempt of a job set up so that ``to`` is what the move below makes of it."""
    h.put("ping", retries={"max": 1 if to in (S.RETRYING, S.DEAD) else 0})
    run = h.claim_one("ping", slot(1))
    if to is S.DEAD:  # retries.max 1: the failure of attempt 2 exhausts them
        h.finish("n1", run["id"], "failed", slot(1) + SEC)
        run = h.claim_one("ping", slot(1), trigger="retry", attempt=2, retry_of=run["id"])
    rid: str = run["id"]
    return rid


def _reach(h: Any, status: RunStatus, to: RunStatus) -> str:
    if status in (S.CLAIMED, S.RUNNING):
        rid = _attempt(h, to=to)
        if status is S.RUNNING:
            h.start("n1", rid, at_us=slot(1) + 2 * SEC)
    elif status is S.RETRYING:
        rid = _attempt(h, to=S.RETRYING)
        h.finish("n1", rid, "failed", slot(1) + SEC)
    else:  # lost under at-least-once (the default): awaiting its retry
        rid = _attempt(h, to=to)
        h.ok(ExpireRuns(at_us=slot(1) + SEC, leader="n1", term=1, runs=(rid,)))
    assert h.run(rid)["status"] == status
    return rid


def _move(h: Any, rid: str, to: RunStatus) -> None:
    at = slot(1) + 3 * SEC
    if to is S.RUNNING:
        h.start("n1", rid, at_us=at)
    elif to is S.LOST:
        h.ok(ExpireRuns(at_us=at, leader="n1", term=1, runs=(rid,)))
    elif to is S.CANCELLED:
        h.ok(CancelRun(at_us=at, run_id=rid))
    else:
        h.finish("n1", rid, to.value if to in (S.SUCCEEDED, S.FAILED, S.TIMED_OUT) else "failed", at)


@pytest.mark.parametrize(("old", "new"), EDGES, ids=[f"{a}->{b}" for a, b in EDGES])
def test_the_ledger_makes_every_transition_of_the_table(h: Any, old: RunStatus, new: RunStatus) -> None:
    rid = _reach(h, old, new)
    _move(h, rid, new)
    assert h.run(rid)["status"] == new


# ---- every status change the ledger makes is an edge of the table -----------------------------


def _violations(before: dict[str, str], state: State) -> list[str]:
    """What in ``state`` breaks the table, given each run's status before one apply."""
    found = []
    for rid, run in state.runs.items():
        status, old = run["status"], before.get(rid)
        if status not in RUN_STATUSES:
            found.append(f"{rid}: unknown status {status!r}")
        elif old is None and status not in CLAIM_STATUSES:
            found.append(f"{rid}: created as {status}")
        elif old is not None and old != status and status not in TRANSITIONS.get(RunStatus(old), ()):
            found.append(f"{rid}: {old} -> {status}")
        elif old is None and run["retry_of"] and (prev := state.runs.get(run["retry_of"])) is not None:
            if prev["status"] not in FOLLOWS.get(Trigger(run["trigger"]), ()):
                found.append(f"{rid}: a {run['trigger']} attempt after a {prev['status']} one")
    return found


def test_the_check_finds_a_change_outside_the_table() -> None:
    state = State()
    state.runs = {"r1": {"status": "running", "retry_of": None, "trigger": "schedule"},
                  "r2": {"status": "running", "retry_of": None, "trigger": "schedule"},
                  "r3": {"status": "claimed", "retry_of": "r4", "trigger": "retry"},
                  "r4": {"status": "succeeded", "retry_of": None, "trigger": "schedule"},
                  "r5": {"status": "done", "retry_of": None, "trigger": "schedule"}}
    assert _violations({"r1": "succeeded", "r2": "claimed", "r4": "succeeded", "r5": "running"}, state) == [
        "r1: succeeded -> running", "r3: a retry attempt after a succeeded one", "r5: unknown status 'done'",
    ]
    assert _violations({}, State()) == []


_FOUND: list[str] = []


@pytest.fixture(autouse=True)
def _checked_apply(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``State.apply`` in this module's tests is checked against the table.

    Violations are collected, not raised inside apply: the simulation applies on its own
    paths, which may swallow an exception; the test fails at teardown instead.
    """
    original = State.apply

    def checked(self: State, data: bytes, ctx: ApplyContext) -> Any:
        before = {rid: run["status"] for rid, run in self.runs.items()}
        out = original(self, data, ctx)
        _FOUND.extend(_violations(before, self))
        return out

    _FOUND.clear()
    monkeypatch.setattr(State, "apply", checked)
    yield
    assert _FOUND == [], "status changes outside scheduler.runs.TRANSITIONS"


for _module in (test_ledger, test_state, test_state_properties, test_simulation):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test):
            globals()[f"{_name}__again_in_{_module.__name__.rsplit('.', 1)[-1]}"] = _test


def test_the_literal_names_are_the_enums_values() -> None:
    assert get_args(StatusName) == tuple(s.value for s in RunStatus)
    assert get_args(TriggerName) == tuple(t.value for t in Trigger)


def test_mypy_refuses_a_misspelt_status_or_trigger(tmp_path: Path) -> None:
    """Records hold plain strings (see scheduler.runs), typed by the Literal names, so a typo
    is a type error, not a comparison that is silently never true."""
    from mypy import api as mypy_api

    snippet = tmp_path / "typo.py"
    snippet.write_text(
        "from scheduler.runs import RunRecord\n\n\n"
        "def stuck(run: RunRecord) -> bool:\n"
        "    return run[\"status\"] == \"claimd\"\n\n\n"
        "def by_hand(run: RunRecord) -> RunRecord:\n"
        "    return {**run, \"trigger\": \"manul\"}\n"
    )
    out, err, code = mypy_api.run(["--strict", "--no-incremental", "--follow-imports=silent",
                                   "--cache-dir", str(tmp_path / "cache"), str(snippet)])
    assert code == 1, out + err
    assert "typo.py:5" in out and "typo.py:9" in out, out
