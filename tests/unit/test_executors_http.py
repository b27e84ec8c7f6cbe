from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from scheduler.executors import OUTPUT_CAP, Attempt, HttpExecutor, OutcomeStatus

SLOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
BIG_BODY = b"0123456789" * 300_000 + b"THE-END"  # about 3 MB


@dataclass
class Seen:
    method: str
    path: str
    headers: CIMultiDictProxy[str]
    body: bytes


@dataclass
class Hook:
    """A webhook receiver that records what it was sent."""

    server: TestServer
    requests: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


def build_app(hook_ref: list[Hook]) -> web.Application:
    def hook() -> Hook:
        return hook_ref[0]

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        hook().requests.append(Seen(request.method, request.path, request.headers, body))
        return web.Response(text="ok: " + body.decode())

    async def status(request: web.Request) -> web.Response:
        await echo(request)
        code = int(request.match_info["code"])
        return web.Response(status=code, text=None if code == 204 else f"status {code}")

    async def hang(request: web.Request) -> web.Response:
        await hook().release.wait()
        return web.Response(text="too late")

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"partial")
        await hook().release.wait()
        return response

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(BIG_BODY), 65536):
            await response.write(BIG_BODY[start : start + 65536])
        return response

    async def latin1(request: web.Request) -> web.Response:
        return web.Response(body="café".encode("latin-1"), content_type="text/plain", charset="latin-1")

    async def set_cookie(request: web.Request) -> web.Response:
        response = web.Response(text="set")
        response.set_cookie("session", "secret")
        return response

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_route("*", "/hang", hang)
    app.router.add_route("*", "/stall", stall)
    app.router.add_route("*", "/big", big)
    app.router.add_route("*", "/latin1", latin1)
    app.router.add_route("*", "/set-cookie", set_cookie)
    return app


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    ref: list[Hook] = []
    server = TestServer(build_app(ref), host="127.0.0.1")
    ref.append(Hook(server))
    await server.start_server()
    try:
        yield ref[0]
    finally:
        ref[0].release.set()  # let parked handlers finish so shutdown does not wait on them
        await server.close()


@pytest.fixture
async def executor() -> AsyncIterator[HttpExecutor]:
    ex = HttpExecutor()
    try:
        yield ex
    finally:
        await ex.close()


def attempt(url: str, *, timeout: float = 10.0, **spec: Any) -> Attempt:
    full: dict[str, Any] = {
        "url": url,
        "method": "POST",
        "headers": {},
        "body": None,
        "expect_status": [],
        "expect_body": None,
    }
    full.update(spec)
    return Attempt(
        job="job",
        run_id="run-1",
        slot=SLOT,
        attempt=2,
        fencing_token=42,
        executor="http",
        spec=full,
        timeout=timeout,
    )


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_sends_identity_job_headers_method_and_body(hook: Hook, executor: HttpExecutor) -> None:
    headers = {
        "X-Team": "billing",
        "Content-Type": "application/json",
        "idempotency-key": "forged",  # the identity wins, whatever the case
        "X-RAFTCRON-FENCING-TOKEN": "1",
    }
    outcome = await executor.run(attempt(hook.url("/echo"), method="PUT", headers=headers, body='{"a": 1}'))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert outcome.http_status == 200
    assert outcome.output == 'ok: {"a": 1}'
    [seen] = hook.requests
    assert seen.method == "PUT"
    assert seen.body == b'{"a": 1}'
    assert seen.headers.getall("Idempotency-Key") == ["job@2026-12-01T10:00:00Z"]
    assert seen.headers.getall("X-Raftcron-Fencing-Token") == ["42"]
    assert seen.headers["X-Raftcron-Run-Id"] == "run-1"
    assert seen.headers["X-Raftcron-Job"] == "job"
    assert seen.headers["X-Raftcron-Slot"] == "2026-12-01T10:00:00Z"
    assert seen.headers["X-Raftcron-Attempt"] == "2"
    assert seen.headers["X-Team"] == "billing"
    assert seen.headers["Content-Type"] == "application/json"


async def test_default_post_without_body(hook: Hook, executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(hook.url("/echo")))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    [seen] = hook.requests
    assert (seen.method, seen.body) == ("POST", b"")


async def test_non_2xx_fails(hook: Hook, executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(hook.url("/status/500")))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.http_status == 500
    assert outcome.error == "unexpected status 500 (expected 2xx)"
    assert outcome.output == "status 500"


@pytest.mark.parametrize(("code", "status"), [(204, OutcomeStatus.SUCCEEDED), (301, OutcomeStatus.FAILED)])
async def test_without_expect_status_any_2xx_succeeds(hook: Hook, executor: HttpExecutor, code: int,
                                                      status: OutcomeStatus) -> None:
    outcome = await executor.run(attempt(hook.url(f"/status/{code}")))
    assert (outcome.status, outcome.http_status) == (status, code)


async def test_expect_status_list(hook: Hook, executor: HttpExecutor) -> None:
    ok = await executor.run(attempt(hook.url("/status/204"), expect_status=[204]))
    assert ok.status is OutcomeStatus.SUCCEEDED
    assert ok.http_status == 204
    wrong = await executor.run(attempt(hook.url("/status/200"), expect_status=[204]))
    assert wrong.status is OutcomeStatus.FAILED
    assert wrong.error == "unexpected status 200 (expected 204)"
    not_2xx = await executor.run(attempt(hook.url("/status/404"), expect_status=[200, 404]))
    assert not_2xx.status is OutcomeStatus.SUCCEEDED


async def test_expect_body_match_and_mismatch(hook: Hook, executor: HttpExecutor) -> None:
    match = await executor.run(attempt(hook.url("/echo"), body="all good", expect_body=r"g[o]+d$"))
    assert match.status is OutcomeStatus.SUCCEEDED, match.error
    mismatch = await executor.run(attempt(hook.url("/echo"), body="all bad", expect_body=r"g[o]+d$"))
    assert mismatch.status is OutcomeStatus.FAILED
    assert mismatch.http_status == 200
    assert mismatch.error == "body does not match expect_body regex 'g[o]+d$'"


async def test_invalid_regex_fails_without_sending(hook: Hook, executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(hook.url("/echo"), expect_body="(unclosed"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error is not None and outcome.error.startswith("invalid expect_body regex")
    assert hook.requests == []


async def test_slow_server_times_out(hook: Hook, executor: HttpExecutor) -> None:
    began = time.monotonic()
    outcome = await executor.run(attempt(hook.url("/hang"), timeout=0.5))
    assert time.monotonic() - began < 3
    assert outcome.status is OutcomeStatus.TIMED_OUT
    assert outcome.error == "timed out after 0.5s"
    assert outcome.http_status is None


async def test_timeout_mid_body_keeps_status_and_partial_output(hook: Hook, executor: HttpExecutor) -> None:
    began = time.monotonic()
    outcome = await executor.run(attempt(hook.url("/stall"), timeout=0.5))
    assert time.monotonic() - began < 3
    assert outcome.status is OutcomeStatus.TIMED_OUT
    assert outcome.http_status == 200
    assert outcome.output == "partial"


async def test_connection_refused_is_an_outcome(executor: HttpExecutor) -> None:
    url = f"http://127.0.0.1:{closed_port()}/hook"
    outcome = await executor.run(attempt(url))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == f"connection refused: {url}"
    assert outcome.http_status is None


async def test_error_does_not_leak_url_password(executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(f"http://ops:hunter2@127.0.0.1:{closed_port()}/hook"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error is not None and "hunter2" not in outcome.error


async def test_error_keeps_query_strings_and_user_info_out(executor: HttpExecutor) -> None:
    # Run errors land in the ledger (read-only callers see them) and in the worker's log.
    port = closed_port()
    outcome = await executor.run(attempt(f"http://ops@127.0.0.1:{port}/hook?api_key=K3Y#frag"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == f"connection refused: http://***@127.0.0.1:{port}/hook?***#***"


async def test_large_body_keeps_the_tail(hook: Hook, executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(hook.url("/big"), method="GET", expect_body="^0123"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert len(outcome.output.encode()) == OUTPUT_CAP
    assert outcome.output == BIG_BODY[-OUTPUT_CAP:].decode()
    assert outcome.extra["output_bytes"] == len(BIG_BODY)


async def test_declared_charset_is_used(hook: Hook, executor: HttpExecutor) -> None:
    outcome = await executor.run(attempt(hook.url("/latin1"), method="GET", expect_body="café"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert outcome.output == "café"


async def test_cookies_do_not_carry_between_attempts(hook: Hook, executor: HttpExecutor) -> None:
    await executor.run(attempt(hook.url("/set-cookie"), method="GET"))
    await executor.run(attempt(hook.url("/echo")))
    [seen] = hook.requests
    assert "Cookie" not in seen.headers


async def test_usable_again_after_close(hook: Hook, executor: HttpExecutor) -> None:
    await executor.run(attempt(hook.url("/echo")))
    await executor.close()
    outcome = await executor.run(attempt(hook.url("/echo")))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert len(hook.requests) == 2
