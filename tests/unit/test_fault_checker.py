"""The fault suite's one checker must catch every broken promise it names: each case breaks
one thing in an otherwise clean record of five slots and expects exactly that violation."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.faults.checker import Expect, Verdict, check

T0 = 1_800_000_000.0  # the job's creation; "@every 1s" slots fall on T0 + k
WINDOW = (T0 + 10, T0 + 14)
SPEC = {"name": "a", "schedule": "@every 1s", "executor": "http", "http": {"url": "http://sink.test/a"},
        "delivery": "at-least-once"}


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Delivery:
    at: float
    headers: dict[str, str]


@dataclass
class Record:
    """A fake cluster's API state and a fake receiver, both editable by a case."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    got: dict[str, list[Delivery]] = field(default_factory=dict)

    def of(self, job: str) -> list[Delivery]:
        return self.got.get(job, [])

    def run(self, slot: float, attempt: int, token: int, status: str = "succeeded", **kw: Any) -> dict[str, Any]:
        r = {"id": f"r{slot:.0f}-{attempt}", "job": "a", "slot": _iso(slot), "attempt": attempt, "status": status,
             "trigger": "schedule" if attempt == 1 else "retry", "node": "n1", "fencing_token": token,
             "started_at": _iso(slot + 0.002), "lease_expires_at": None}
        r.update(kw)
        return r

    def deliver(self, run: dict[str, Any], at: float) -> None:
        self.got.setdefault(run["job"], []).append(Delivery(at, {
            "X-Raftcron-Job": run["job"], "X-Raftcron-Slot": run["slot"], "X-Raftcron-Run-Id": run["id"],
            "X-Raftcron-Attempt": str(run["attempt"]), "X-Raftcron-Fencing-Token": str(run["fencing_token"])}))


class FakeApi:
    """One node's API over ``record``; a write goes to ``commits_to`` (default: the same record),
    so a node given an older record than the one it commits to is a node that trails."""

    def __init__(self, record: Record, commits_to: Record | None = None) -> None:
        rec = record
        committed = commits_to or record

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                parts = self.path.split("?")[0].strip("/").split("/")
                body: Any = None
                if len(parts) == 3 and parts[2] in rec.jobs:
                    body = rec.jobs[parts[2]]
                elif len(parts) == 4 and parts[3] == "runs" and parts[2] in rec.jobs:
                    body = {"items": sorted(rec.runs.get(parts[2], []), key=lambda r: r["slot"], reverse=True),
                            "next_cursor": None}
                raw = json.dumps(body).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_PUT(self) -> None:  # noqa: N802 - the http.server API
                name = self.path.strip("/").split("/")[2]
                spec = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                committed.jobs[name] = {"name": name, "spec": spec, "created_at": _iso(T0)}
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def live(self) -> list[FakeApi]:
        return [self]


@pytest.fixture
def clean() -> Iterator[tuple[Record, FakeApi]]:
    rec = Record()
    rec.jobs["a"] = {"name": "a", "spec": SPEC, "created_at": _iso(T0)}
    for k, slot in enumerate(range(10, 15)):
        run = rec.run(T0 + slot, 1, 100 + k)
        rec.runs.setdefault("a", []).append(run)
        rec.deliver(run, T0 + slot + 0.01)
    api = FakeApi(rec)
    yield rec, api
    api.server.shutdown()
    api.server.server_close()


def _check(rec: Record, api: FakeApi, delivery: str = "at-least-once", **kw: Any) -> Verdict:
    kw.setdefault("settle_timeout", 0.0)
    return check(rec, api, [Expect("a", delivery)], WINDOW, **kw)


def test_a_clean_record_passes(clean: tuple[Record, FakeApi]) -> None:
    v = _check(*clean, acknowledged={"a": {"schedule": "@every 1s"}})
    assert v.ok, v.report()
    assert v.counts["slots"] == 5 and v.counts["delivered"] == 5 and v.counts["acknowledged"] == 1


def _drop_delivery(rec: Record) -> None:
    rec.got["a"].pop(2)


def _early(rec: Record) -> None:
    rec.got["a"][1].at -= 0.2


def _doubled(rec: Record) -> None:
    d = rec.got["a"][3]
    rec.got["a"].append(Delivery(d.at + 1, dict(d.headers)))


def _stuck(rec: Record) -> None:
    rec.runs["a"][4]["status"] = "running"


def _lost_never_retried(rec: Record) -> None:
    rec.runs["a"][4].update(status="lost", retry_at=rec.runs["a"][4]["slot"], retried_by=None)


def _tokens_down(rec: Record) -> None:
    first = rec.runs["a"][0]
    first["status"] = "lost"
    retry = rec.run(T0 + 10, 2, first["fencing_token"] - 1)
    rec.runs["a"].append(retry)
    rec.deliver(retry, T0 + 12)


def _token_mismatch(rec: Record) -> None:
    rec.got["a"][0].headers["X-Raftcron-Fencing-Token"] = "7"


def _unknown_run(rec: Record) -> None:
    rec.got["a"][0].headers["X-Raftcron-Run-Id"] = "r-nobody"


def _trimmed(rec: Record) -> None:
    run = rec.runs["a"].pop(0)
    rec.got["a"] = [d for d in rec.got["a"] if d.headers["X-Raftcron-Run-Id"] != run["id"]]


@pytest.mark.parametrize(("breaks", "says"), [
    (_drop_delivery, "never received"),
    (_early, "before its instant"),
    (_doubled, "received 2 times without a lost attempt"),
    (_stuck, "still running"),
    (_lost_never_retried, "still lost and never retried"),
    (_tokens_down, "fencing tokens not increasing"),
    (_token_mismatch, "the ledger says"),
    (_unknown_run, "which the ledger does not know"),
    (_trimmed, "history trimmed"),
])
def test_each_broken_promise_is_caught(clean: tuple[Record, FakeApi], breaks: Callable[[Record], None],
                                       says: str) -> None:
    rec, api = clean
    breaks(rec)
    v = _check(rec, api)
    assert not v.ok and any(says in line for line in v.violations), v.report()


def test_a_retry_after_a_lost_attempt_in_a_fault_is_allowed_once_and_never_for_at_most_once(
        clean: tuple[Record, FakeApi]) -> None:
    rec, api = clean
    first = rec.runs["a"][1]  # slot T0+11, started at T0+11.002
    first.update(status="lost", lease_expires_at=_iso(T0 + 16))
    retry = rec.run(T0 + 11, 2, 200)
    rec.runs["a"].append(retry)
    rec.deliver(retry, T0 + 17)
    v = _check(rec, api, faults=[(T0 + 10.5, T0 + 20)], lease=5.0)
    assert v.ok and v.counts["doubled_allowed"] == 1, v.report()
    late_fault = _check(rec, api, faults=[(T0 + 5, T0 + 20)], lease=5.0)  # started 6 s into the fault
    assert any("without a lost attempt" in line for line in late_fault.violations), late_fault.report()
    no_fault = _check(rec, api, lease=5.0)
    assert not no_fault.ok, no_fault.report()
    at_most_once = _check(rec, api, "at-most-once", faults=[(T0 + 10.5, T0 + 20)], lease=5.0)
    assert any("at-most-once job received 2 times" in line for line in at_most_once.violations)


def test_acknowledged_writes_missing_or_different_are_caught(clean: tuple[Record, FakeApi]) -> None:
    rec, api = clean
    v = _check(rec, api, acknowledged={"gone": {"schedule": "@hourly"}, "a": {"schedule": "@daily"}})
    assert any("gone: GET answers 404" in line for line in v.violations), v.report()
    assert any("acknowledged write a: fields differ" in line for line in v.violations), v.report()


def test_a_barrier_reads_only_from_nodes_that_applied_every_acknowledged_write(clean: tuple[Record, FakeApi]) -> None:
    # A node restarted from a snapshot answers from it until a leader tells it what is
    # committed: read first, it showed an acknowledged write's earlier version (4 writers' first
    # jobs in one clean-clone run of test_kill9_of_every_node_during_concurrent_writes).
    rec, current = clean
    older = Record(jobs={"a": {"name": "a", "spec": {**SPEC, "description": "write 0"}, "created_at": _iso(T0)}})
    trailing = FakeApi(older, commits_to=rec)
    rec.jobs["a"]["spec"] = {**SPEC, "description": "write 20"}

    try:
        written = {"a": {"description": "write 20"}}
        stale = check(rec, FakeApiCluster([trailing, current]), [], WINDOW, acknowledged=written, settle_timeout=0.0)
        assert any("fields differ" in line for line in stale.violations), stale.report()
        v = check(rec, FakeApiCluster([trailing, current]), [], WINDOW, acknowledged=written, settle_timeout=0.0, barrier=1.0)
        assert v.ok and v.counts["acknowledged"] == 1, v.report()
        assert "fault-checker-barrier" in rec.jobs and "fault-checker-barrier" not in older.jobs
        nobody = check(older, FakeApiCluster([trailing]), [], WINDOW, acknowledged=written, barrier=0.5)
        assert any("no node showed the checker's barrier write" in line for line in nobody.violations), nobody.report()
    finally:
        trailing.server.shutdown()
        trailing.server.server_close()


class FakeApiCluster:
    def __init__(self, nodes: list[FakeApi]) -> None:
        self.nodes = nodes

    def live(self) -> list[FakeApi]:
        return self.nodes
