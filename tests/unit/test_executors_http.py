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


# ---- connections per host ----------------------------------------------------------------------------


async def _held_server(held: dict[str, Any]) -> TestServer:
    """A receiver that holds every request until ``held["release"]`` is set, counting those it holds."""
    async def handle(request: web.Request) -> web.Response:
        held["now"] += 1
        held["most"] = max(held["most"], held["now"])
        try:
            await held["release"].wait()
        finally:
            held["now"] -= 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hold", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def _first_held(ex: HttpExecutor, url: str, held: dict[str, Any]) -> asyncio.Task[Any]:
    """An attempt to ``url`` started and waited for until the receiver holds it (30 s at most)."""
    first = asyncio.create_task(ex.run(attempt(url, timeout=60)))
    deadline = time.monotonic() + 30
    while held["now"] < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return first


async def test_a_burst_to_one_host_opens_at_most_the_bound_and_every_attempt_is_sent() -> None:
    """Thousands of slots due at one instant opened a connection each at once: the target's
    accept queue overflowed and TCP retried the dropped ones 1, 3 and 7 s later. Now one host
    gets at most ``CONNECTIONS_PER_HOST`` at once from a node; the rest wait for one to free."""
    from scheduler.executors.http import CONNECTIONS_PER_HOST

    n = CONNECTIONS_PER_HOST + 100
    held: dict[str, Any] = {"now": 0, "most": 0, "release": asyncio.Event()}
    server = await _held_server(held)
    ex = HttpExecutor()
    try:
        url = str(server.make_url("/hold"))
        tasks = [asyncio.create_task(ex.run(attempt(url, timeout=60))) for _ in range(n)]
        deadline = time.monotonic() + 30
        # Every attempt is either held by the receiver or waiting for a connection (bounded wait).
        while held["now"] + ex.waiting < n and time.monotonic() < deadline and held["now"] <= CONNECTIONS_PER_HOST:
            await asyncio.sleep(0.01)
        at_most = held["most"]
        held["release"].set()
        outcomes = await asyncio.gather(*tasks)
    finally:
        held["release"].set()
        await ex.close()
        await server.close()
    assert at_most == CONNECTIONS_PER_HOST
    assert [o.status for o in outcomes] == [OutcomeStatus.SUCCEEDED] * n
    assert ex.waits == n - CONNECTIONS_PER_HOST and ex.waiting == 0


async def test_an_attempt_that_times_out_waiting_for_a_connection_says_so() -> None:
    held: dict[str, Any] = {"now": 0, "most": 0, "release": asyncio.Event()}
    server = await _held_server(held)
    ex = HttpExecutor(per_host=1)
    try:
        url = str(server.make_url("/hold"))
        first = await _first_held(ex, url, held)
        second = await ex.run(attempt(url, timeout=0.3))
        assert ex.waiting == 0  # the wait given up is not counted as still waiting
        held["release"].set()
        assert (await first).status is OutcomeStatus.SUCCEEDED
    finally:
        held["release"].set()
        await ex.close()
        await server.close()
    assert second.status is OutcomeStatus.TIMED_OUT
    assert second.error == (f"timed out after 0.3s, waiting for a connection to {url.removesuffix('/hold')} "
                            "(1 open to it already; --http-connections-per-host)")


async def test_other_hosts_do_not_wait_behind_a_host_at_its_bound() -> None:
    held: dict[str, Any] = {"now": 0, "most": 0, "release": asyncio.Event()}
    server = await _held_server(held)
    other: dict[str, Any] = {"now": 0, "most": 0, "release": asyncio.Event()}
    other["release"].set()
    server2 = await _held_server(other)
    ex = HttpExecutor(per_host=1)
    try:
        first = await _first_held(ex, str(server.make_url("/hold")), held)
        elsewhere = await ex.run(attempt(str(server2.make_url("/hold")), timeout=30))
        assert elsewhere.status is OutcomeStatus.SUCCEEDED and ex.waits == 0
        held["release"].set()
        await first
    finally:
        held["release"].set()
        await ex.close()
        await server.close()
        await server2.close()


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="connections per host must be 0"):
        HttpExecutor(per_host=-1)


async def test_every_url_of_a_host_shares_its_bound_and_an_idle_host_leaves_nothing_behind() -> None:
    """The bound is per scheme, host and port, whatever the path, the query or the case of the
    scheme; once no attempt holds or waits for a host, the executor keeps nothing for it, a
    wait given up by a timeout included."""
    held: dict[str, Any] = {"now": 0, "most": 0, "release": asyncio.Event()}
    server = await _held_server(held)
    ex = HttpExecutor(per_host=1)
    url = str(server.make_url("/hold"))
    try:
        first = await _first_held(ex, url, held)
        given_up = await ex.run(attempt(url.replace("http://", "HTTP://") + "?job=late", timeout=0.3))
        assert ex.waiting == 0 and ex.waits == 0  # a wait given up is no wait that ended
        second = asyncio.create_task(ex.run(attempt(url + "?job=other", timeout=60)))
        deadline = time.monotonic() + 30
        while ex.waiting < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert ex.waiting == 1 and held["now"] == 1  # the second waits for the first's connection
        held["release"].set()
        outcomes = [await first, await second]
    finally:
        held["release"].set()
        await ex.close()
        await server.close()
    assert given_up.status is OutcomeStatus.TIMED_OUT and "waiting for a connection" in (given_up.error or "")
    assert [o.status for o in outcomes] == [OutcomeStatus.SUCCEEDED] * 2
    assert held["most"] == 1 and ex.waits == 1 and ex.waiting == 0
    assert ex._gates == {}
