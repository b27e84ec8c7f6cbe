"""``expect_body`` by RE2: linear-time matching over a capped prefix, refused when RE2 cannot run it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from scheduler.executors import MATCH_CAP, Attempt, HttpExecutor, OutcomeStatus
from scheduler.jobrules import check_body_pattern
from scheduler.model import ValidationFailed, parse_job
from scheduler.pattern import compile_pattern

SLOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
EVIL = r"(a+)+$"
BODIES = {"/short": b"a" * 25 + b"b", "/mib": b"a" * (1 << 20) + b"b", "/late": b"x" * MATCH_CAP + b"needle"}


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    async def body(request: web.Request) -> web.Response:
        return web.Response(body=BODIES[request.path], content_type="text/plain")

    app = web.Application()
    for path in BODIES:
        app.router.add_get(path, body)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


def attempt(url: str, expect_body: str) -> Attempt:
    spec: dict[str, Any] = {"url": url, "method": "GET", "headers": {}, "body": None, "expect_status": [],
                            "expect_body": expect_body}
    return Attempt(job="j", run_id="r", slot=SLOT, attempt=1, fencing_token=1, executor="http", spec=spec,
                   timeout=30)


@pytest.mark.timeout(120)  # Python's re took ~9 s for /short and would never finish /mib
@pytest.mark.parametrize("path", ["/short", "/mib"])
async def test_a_catastrophic_pattern_completes(server: TestServer, path: str) -> None:
    executor = HttpExecutor()
    try:
        outcome = await executor.run(attempt(str(server.make_url(path)), EVIL))
    finally:
        await executor.close()
    if path == "/short":
        assert outcome.status is OutcomeStatus.FAILED
        assert outcome.error == f"body does not match expect_body regex {EVIL!r}"
    else:  # the first 64 KiB are all 'a', and that prefix is what is searched
        assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error


async def test_only_the_first_64_kib_are_searched(server: TestServer) -> None:
    executor = HttpExecutor()
    try:
        late = await executor.run(attempt(str(server.make_url("/late")), "needle"))
        early = await executor.run(attempt(str(server.make_url("/late")), "^x{100}"))
    finally:
        await executor.close()
    assert MATCH_CAP == 64 * 1024
    assert late.status is OutcomeStatus.FAILED and early.status is OutcomeStatus.SUCCEEDED


async def test_a_stored_pattern_re2_refuses_fails_before_sending(server: TestServer) -> None:
    # A job written before patterns were checked by RE2 can hold one.
    executor = HttpExecutor()
    try:
        outcome = await executor.run(attempt(str(server.make_url("/short")), r"(a)\1"))
    finally:
        await executor.close()
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error is not None and outcome.error.startswith("invalid expect_body regex")


def test_re2_finds_what_re_finds() -> None:
    assert compile_pattern(r"\bstatus: (ok|up)\b").search("service status: ok\n") is not None
    assert compile_pattern(r"(?i)HEALTHY").search("healthy") is not None
    assert compile_pattern("ok$").search("not ok at all") is None
    assert compile_pattern(EVIL).search("a" * 25 + "b") is None


@pytest.mark.parametrize(("pattern", "reason"), [
    (r"(a)\1", "invalid escape sequence"),
    (r"(?=a)", "invalid perl operator"),
    (r"(?<=a)b", "invalid perl operator"),
    ("[", "missing ]"),
])
def test_patterns_re2_cannot_run_are_refused_with_its_reason(pattern: str, reason: str) -> None:
    problem = check_body_pattern(pattern)
    assert problem is not None and reason in problem and "RE2" in problem


def test_a_stored_job_with_a_pattern_only_re_runs_still_parses() -> None:
    # Replay of a journal written before RE2: the state machine's rule is unchanged.
    doc = {"name": "j", "schedule": "@hourly", "executor": "http",
           "http": {"url": "http://h.test/", "expect_body": r"(?=ok)ok"}}
    job = parse_job(doc)
    assert job.http is not None and job.http.expect_body == r"(?=ok)ok"
    with pytest.raises(ValidationFailed) as exc:
        parse_job({**doc, "http": {"url": "http://h.test/", "expect_body": "(unclosed"}})
    assert [d["field"] for d in exc.value.details] == ["http.expect_body"]


BIG = "|".join(["(?:(a|b|c|d|e|f|g|h|i|j)*.{999}Q)"] * 6)  # 203 characters; ~48,000 instructions


def test_a_pattern_too_large_for_a_fast_search_is_refused() -> None:
    """RE2 accepts it, but with its DFA cache outgrown a search over 64 KiB took 12-113 s."""
    problem = check_body_pattern(BIG)
    assert problem is not None and "instructions, over the limit of 1000" in problem
    with pytest.raises(ValueError, match="over the limit"):
        compile_pattern(BIG)
    for everyday in (r"(a+)+$", r'"status"\s*:\s*"(ok|healthy|up)"', r"(?i)HEALTHY", r"\bstatus: (ok|up)\b"):
        assert check_body_pattern(everyday) is None


async def test_the_search_runs_off_the_event_loop(server: TestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading
    import time

    import scheduler.executors.http as http_executor

    loop_thread = threading.get_ident()
    searched_in: list[int] = []

    class Slow:
        pattern = "needle"

        def search(self, text: str) -> object | None:
            searched_in.append(threading.get_ident())
            time.sleep(0.3)
            return object()

    monkeypatch.setattr(http_executor, "_compile", lambda expect_body: Slow())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tick = asyncio.create_task(ticker())
    executor = HttpExecutor()
    try:
        outcome = await executor.run(attempt(str(server.make_url("/short")), "needle"))
    finally:
        tick.cancel()
        await executor.close()
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert searched_in and searched_in[0] != loop_thread
    assert ticks >= 10  # the loop went on ticking during the 0.3 s search
