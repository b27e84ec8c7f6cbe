"""A real single-node raftcron cluster in this process, for the API tests.

``cluster`` (one per test module, on the module's event loop) starts a
``RaftNode`` on a free 127.0.0.1 port, waits until it leads, commits a
``RegisterNode`` for ``n1`` so manual runs have a target, and serves
``create_app`` twice on 127.0.0.1: ``cluster.client`` without tokens and
``cluster.secured`` with ``Tokens(write="w", read="r")``. No leader loop and no
worker run, so claimed runs stay ``claimed``; tests that need a run to move on
commit ``StartRuns``/``FinishRuns`` through ``cluster.commit``.

Every response either app gives passes a recorder middleware that holds it to
``/openapi.json``: its status is documented for the operation, its body
matches the documented schema, and every error has SPEC's shape. Tests take the
cluster through the function-scoped ``api`` fixture, which fails the test
(at teardown) for any response that broke those rules.

Test modules using it run on the module loop:
``pytestmark = pytest.mark.asyncio(loop_scope="module")``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app, openapi_document
from api.context import ApiContext, Tokens
from raftlog import ApplyContext, Bridge, ClockEstimate, NodeConfig, RaftNode
from raftlog.node import FAIL_REASON, NodeStatus
from scheduler.clock import SystemClock
from scheduler.commands import (
    Claim,
    ClaimSlots,
    Command,
    FinishRuns,
    RegisterNode,
    StartRuns,
)
from scheduler.instants import us
from scheduler.service import Service
from scheduler.state import Rejected, State

try:  # brought by openapi-spec-validator (the test extra)
    from openapi_schema_validator import OAS30Validator, oas30_format_checker
except ImportError:  # pragma: no cover - body checks are skipped, statuses still checked
    OAS30Validator = None
    oas30_format_checker = None

Client = TestClient[web.Request, web.Application]
NODE = "n1"
WRITE, READ = "w", "r"
LEADER_WAIT = 15.0
HOOK = "http://127.0.0.1:9/hook"  # never called: no worker runs here

SPEC = openapi_document()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_doc(name: str, **over: Any) -> dict[str, Any]:
    """A valid http job document; keyword arguments replace or add top-level fields."""
    doc: dict[str, Any] = {"name": name, "schedule": "@hourly", "executor": "http", "http": {"url": HOOK}}
    doc.update(over)
    return doc


def operation(method: str, path: str) -> dict[str, Any] | None:
    op: dict[str, Any] | None = SPEC["paths"].get(path, {}).get(method.lower())
    return op


def _documented_schema(op: dict[str, Any], status: int) -> dict[str, Any] | None:
    entry = op["responses"].get(str(status)) or {}
    content = entry.get("content", {}).get("application/json")
    if content is None:
        return None
    # $refs point at #/components: resolve them against a root that holds them.
    schema: dict[str, Any] = {**content["schema"], "components": SPEC["components"]}
    return schema


def error_shape_problem(body: Any) -> str | None:
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return "no {'error': {...}} object"
    if not isinstance(err.get("code"), str) or not isinstance(err.get("message"), str):
        return "error.code and error.message must be strings"
    if not isinstance(err.get("details"), list):
        return "error.details must be a list"
    return None


@dataclass
class Cluster:
    node: RaftNode
    state: State
    service: Service
    raft_addr: str
    client: Client = field(init=False)
    secured: Client = field(init=False)
    problems: list[str] = field(default_factory=list)
    seen: set[tuple[str, str, int]] = field(default_factory=set)  # (method, route, status)
    _ids: Iterator[int] = field(default_factory=itertools.count)

    @staticmethod
    def doc(name: str, **over: Any) -> dict[str, Any]:
        return job_doc(name, **over)

    @staticmethod
    async def error(resp: ClientResponse, status: int, *fields: str, code: str | None = None) -> dict[str, Any]:
        """Assert SPEC's error shape with this status, naming at least ``fields`` in details."""
        body = await resp.json()
        assert resp.status == status, body
        assert error_shape_problem(body) is None, body
        err = body["error"]
        assert err["message"], err
        if code is not None:
            assert err["code"] == code, err
        named = {d["field"] for d in err["details"]}
        assert set(fields) <= named, f"expected {fields} in details, got {err['details']}"
        return dict(err)

    def name(self, prefix: str = "job") -> str:
        """A job name no other test in the module uses."""
        return f"{prefix}-{next(self._ids)}"

    async def commit(self, cmd: Command) -> Any:
        result, _ = await self.service.propose(cmd)
        assert not isinstance(result, Rejected), f"{cmd.TAG} was refused: {result}"
        return result

    async def create(self, name: str, **over: Any) -> dict[str, Any]:
        resp = await self.client.put(f"/v1/jobs/{name}", json=job_doc(name, **over))
        body = await resp.json()
        assert resp.status == 201, body
        return dict(body)

    async def claim(self, job: str, *, slot_us: int | None = None, trigger: str = "manual",
                    retry_of: str | None = None, attempt: int = 1) -> str:
        """Commit one claim on n1 as a leader would; returns the run id."""
        now = us(self.service.clock.now())
        c = Claim(job=job, slot_us=now if slot_us is None else slot_us, trigger=trigger, node=NODE,
                  attempt=attempt, retry_of=retry_of, request_key=uuid.uuid4().hex)
        result = await self.commit(ClaimSlots(at_us=now, leader="test", term=1, claims=(c,)))
        assert result["runs"], f"claim refused: {result['refused']}"
        return str(result["runs"][0]["id"])

    async def finish(self, run_id: str, status: str = "succeeded", **extra: Any) -> dict[str, Any]:
        """Start and finish an attempt on n1 the way a worker would."""
        now = us(self.service.clock.now())
        await self.commit(StartRuns(at_us=now, node=NODE, runs=(run_id,), started_us={run_id: now},
                                    lease_until_us=now + 60_000_000))
        result = {"run_id": run_id, "status": status, "started_us": now, "finished_us": now + 1500,
                  "exit_code": None, "http_status": 200 if status == "succeeded" else 500,
                  "output": extra.pop("output", "done"), "error": None if status == "succeeded" else "boom", **extra}
        await self.commit(FinishRuns(at_us=now, node=NODE, results=(result,)))
        return dict(self.state.runs[run_id])

    async def dead_letter(self, job: str) -> str:
        """Two failed attempts of a job with ``retries.max: 1``: the second is dead."""
        first = await self.claim(job)
        assert (await self.finish(first, "failed"))["status"] == "retrying"
        second = await self.claim(job, trigger="retry", retry_of=first, attempt=2,
                                  slot_us=self.state.runs[first]["slot_us"])
        assert (await self.finish(second, "failed"))["status"] == "dead"
        return second

    # ---- the recorder -------------------------------------------------------------

    def check(self, request: web.Request, resp: web.StreamResponse) -> None:
        route = request.match_info.route
        resource = route.resource if route is not None else None
        path = resource.canonical if resource is not None else None
        status = resp.status
        where = f"{request.method} {request.path_qs} -> {status}"
        body: Any = None
        raw = resp.body if isinstance(resp, web.Response) else None
        if resp.content_type == "application/json" and isinstance(raw, (bytes, bytearray)):
            body = json.loads(raw)
        if status >= 400 and (problem := error_shape_problem(body)):
            self.problems.append(f"{where}: error body {problem}: {body!r:.200}")
        # 503 "unavailable" (no leader, or a node catching up after its start) is an answer the
        # API promises, with Retry-After; the documented-status check below still applies.
        unavailable = status == 503 and isinstance(body, dict) and body.get("error", {}).get("code") == "unavailable"
        if status >= 500 and not unavailable:
            self.problems.append(f"{where}: server error {body!r:.300}")
        op = operation(request.method, path) if path else None
        if op is None:
            return
        self.seen.add((request.method, path, status))  # type: ignore[arg-type]
        if str(status) not in op["responses"]:
            self.problems.append(f"{where}: status not documented for {request.method} {path}")
            return
        schema = _documented_schema(op, status)
        if schema is not None and body is None:
            self.problems.append(f"{where}: documented as JSON, answered {resp.content_type}")
        elif schema is not None and OAS30Validator is not None:
            errors = sorted(OAS30Validator(schema, format_checker=oas30_format_checker).iter_errors(body), key=str)
            if errors:
                self.problems.append(f"{where}: body breaks the documented schema: {errors[0].message:.300}")

    def middleware(self) -> Any:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                resp: web.StreamResponse = await handler(request)
            except Exception as exc:
                self.problems.append(f"{request.method} {request.path_qs}: escaped the error middleware: {exc!r}")
                raise
            self.check(request, resp)
            return resp

        return record


async def _serve(cluster: Cluster, tokens: Tokens) -> Client:
    ctx = ApiContext(service=cluster.service, node_id=NODE, http_addr="127.0.0.1:0", raft_addr=cluster.raft_addr,
                     live=lambda: {NODE} if NODE in cluster.state.nodes else set(), tokens=tokens)
    app = create_app(ctx)
    app.middlewares.insert(0, cluster.middleware())  # outermost: sees what the client sees
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def _wait(what: str, cond: Any, bound: float) -> None:
    deadline = time.monotonic() + bound
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {bound}s for {what}")
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    state = State()
    raft_addr = f"127.0.0.1:{free_port()}"
    node = RaftNode(NodeConfig(raft_addr=raft_addr, peers=(), data_dir=tmp_path_factory.mktemp("raft"),
                               secret="test", fsync=False), state)
    await asyncio.to_thread(node.start)
    clients: list[Client] = []
    try:
        await _wait("the single node to become leader", node.is_leader, LEADER_WAIT)
        clock = SystemClock()
        service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, NODE)
        c = Cluster(node=node, state=state, service=service, raft_addr=raft_addr)
        await c.commit(RegisterNode(at_us=us(clock.now()), node_id=NODE, raft_addr=raft_addr,
                                    http_addr="127.0.0.1:0"))
        assert NODE in state.nodes
        c.client = await _serve(c, Tokens())
        clients.append(c.client)
        c.secured = await _serve(c, Tokens(write=WRITE, read=READ))
        clients.append(c.secured)
        yield c
    finally:
        for client in clients:
            await client.close()
        await asyncio.to_thread(node.stop)


@pytest.fixture
def api(cluster: Cluster) -> Iterator[Cluster]:
    """The module's cluster; fails the test if any response broke /openapi.json or SPEC's error shape."""
    cluster.problems.clear()
    yield cluster
    problems, cluster.problems[:] = list(cluster.problems), []
    assert not problems, "responses that break the API's own spec:\n" + "\n".join(problems)


class OneReplica:
    """Stands in for RaftNode in tests that need no HTTP: commits and applies at once, and leads."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.index = 0

    def submit(self, payload: bytes, callback: Callable[[Any, int], None]) -> None:
        self.index += 1
        callback(self.state.apply(payload, ApplyContext(index=self.index)), FAIL_REASON.SUCCESS)

    def add_member(self, raft_addr: str, callback: Callable[[Any, int], None]) -> None:
        callback(None, FAIL_REASON.REQUEST_DENIED)  # one fixed replica: no membership to change

    def remove_member(self, raft_addr: str, callback: Callable[[Any, int], None]) -> None:
        callback(None, FAIL_REASON.REQUEST_DENIED)

    def is_leader(self) -> bool:
        return True

    def leader(self) -> str:
        return "mem:1"

    def leader_contact_age(self) -> float:
        return 0.0

    def status(self) -> NodeStatus:
        return NodeStatus(raft_addr="mem:1", state="leader", leader="mem:1", term=1, commit_index=self.index,
                          applied_index=self.index, has_quorum=True, raft_thread_alive=True)

    @property
    def replay_upto(self) -> int:
        return 0

    def clock_offset_to_leader(self) -> ClockEstimate | None:
        return ClockEstimate(0.0, 0.0, 0.0)

    def member_clocks(self) -> Mapping[str, ClockEstimate]:
        return {"mem:1": ClockEstimate(0.0, 0.0, 0.0)}

    def peers_apply(self, form: str) -> bool:
        return True  # one replica: no peer to wait for

    def leader_uses(self, form: str) -> bool:
        return True
