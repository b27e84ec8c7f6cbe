"""The HTTP executor: one attempt is one request, judged by its status and body.

aiohttp client failures are translated into a readable ``error`` here, the one
place they enter; they never leave as exceptions.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import math
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import yarl

from ..pattern import BodyPattern, compile_pattern
from ..redaction import mask_url, scrub_urls
from .base import Attempt, Outcome, OutcomeStatus, identity
from .shell import OutputTail

__all__ = ["CONNECTIONS_PER_HOST", "HttpExecutor", "MATCH_CAP"]

CONNECTIONS_PER_HOST = 256
"""Connections one node holds open to one host (scheme, host and port) at once; an attempt
beyond them waits for one to come free, within its own timeout. Without a bound, thousands of
slots due at the same instant opened thousands of connections at once: the target's accept
queue overflowed, and the dropped connections were retried by TCP after 1, 3 and 7 s (measured
with ``python -m bench.burst``: 3,000 slots due together, the last started 10.6 s late; 3.1 s
with 64 connections a host, 1.75 s with 256; the same requests from three bare processes, 64 at
a time: 0.9-1.0 s). 256 also kept a thousand jobs due at each second's start (reusing their
connections second after second) quickest: p50 236 ms against 409-474 with 64 and 281-308 with
no bound (``bench.lateness --aligned``). A target whose accept queue is shorter than the
cluster's nodes times this wants a lower bound. Waits are counted, and a wait over
``WAIT_WARNING`` is logged (once a minute per host), so the queue is never silent."""

WAIT_WARNING = 1.0

MATCH_CAP = 64 * 1024
"""Bytes from the start of the body that ``expect_body`` is searched in: a response
may be arbitrarily large and the executor never buffers more than a bounded amount.
RE2 (``scheduler.pattern``) searches this in time linear in the text and in the pattern's
program size (capped): 0.004-1.5 ms per 64 KiB for everyday patterns, up to ~0.4 s for the
worst measured under the cap, so the search runs in a thread (RE2 releases the GIL)."""

_CHUNK = 64 * 1024

log = logging.getLogger("raftcron.http")


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Response:
    """What came back so far; filled in as it arrives so a timeout keeps what was seen."""

    head_cap: int
    status: int | None = None
    charset: str = "utf-8"
    head: bytearray = field(default_factory=bytearray)
    tail: OutputTail = field(default_factory=OutputTail)

    def feed(self, chunk: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail.feed(chunk)

    def output(self) -> str:
        return self.tail.text(self.charset)


@dataclass(slots=True)
class _Wait:
    """One attempt's wait for a connection to its host."""

    url: str
    since: float | None = None
    waited: float | None = None

    @property
    def host(self) -> str:
        """Worked out only when a wait is logged or reported, not for every attempt."""
        return _host(self.url)


@dataclass(slots=True)
class _Gate:
    """The connections one host may have from this node: a semaphore, and how many attempts
    hold it or wait on it (the gate is dropped when none do, so hosts no job names any more
    leave nothing behind)."""

    key: str  # _host
    slots: asyncio.Semaphore
    users: int = 0


class HttpExecutor:
    """Runs ``http`` jobs over one lazily created aiohttp session; ``await close()`` it.

    ``per_host``: connections open to one host at once (``CONNECTIONS_PER_HOST``; 0: no bound).
    The bound is a semaphore per host of the executor's own, held for the whole exchange:
    learning of a wait from aiohttp's ``limit_per_host`` took its request tracing, whose signals
    cost ~7 % of a worker's event loop when a thousand attempts start at once (bench/README
    item 99). aiohttp's bound stays behind it for the hosts a redirect leads to, which the
    semaphore of the first host does not cover; a wait there is not counted. ``waits`` may count
    an attempt that found the last free connection promised to one woken in the same turn of
    the loop: it waited ~0 s."""

    def __init__(self, *, now: Callable[[], datetime] = _utcnow, per_host: int = CONNECTIONS_PER_HOST) -> None:
        if per_host < 0:
            raise ValueError(f"connections per host must be 0 (no bound) or more, not {per_host}")
        self._now = now
        self.per_host = per_host
        self._session: aiohttp.ClientSession | None = None
        self.waits = 0  # attempts that waited for a connection to their host
        self.waiting = 0  # attempts waiting for one now
        self.longest_wait = 0.0
        self._warned: dict[str, float] = {}  # host -> when a long wait was last logged (monotonic)
        self._gates: dict[str, _Gate] = {}  # scheme://host:port (_host) -> its connections

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        # Created here, inside the running loop, not in __init__.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # Jobs share the session: cookies set for one must not reach another.
                cookie_jar=aiohttp.DummyCookieJar(),
                # The attempt's own deadline is the only timeout (aiohttp's default is 5 min).
                timeout=aiohttp.ClientTimeout(total=None),
                # Per host only (see CONNECTIONS_PER_HOST): attempts to other hosts never wait
                # behind one host's slow answers; the scheduler bounds concurrency overall.
                # The bound per host is the executor's own (_bounded); aiohttp's, the same,
                # only ever holds back a redirect's next hop.
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=self.per_host),
                headers={"User-Agent": "raftcron"},
            )
        return self._session

    def _gate(self, url: str) -> _Gate | None:
        """The gate of the host ``url`` names, None when hosts are not bounded."""
        if not self.per_host:
            return None
        key = _host(url)
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(key, asyncio.Semaphore(self.per_host))
        return gate

    async def _enter(self, gate: _Gate, wait: _Wait) -> None:
        """Take one of the host's connections, waiting (counted) while it has none free."""
        if not gate.slots.locked():
            await gate.slots.acquire()  # free: returns without a turn of the loop
            return
        wait.since = time.monotonic()
        self.waiting += 1
        try:
            await gate.slots.acquire()
        finally:
            self.waiting -= 1
        wait.waited = time.monotonic() - wait.since

    def _leave(self, gate: _Gate) -> None:
        gate.users -= 1
        if gate.users == 0 and self._gates.get(gate.key) is gate:
            del self._gates[gate.key]

    def _waited(self, wait: _Wait) -> None:
        seconds = wait.waited or 0.0
        self.waits += 1
        self.longest_wait = max(self.longest_wait, seconds)
        if seconds < WAIT_WARNING:
            return
        now = time.monotonic()
        if now - self._warned.get(wait.host, -math.inf) >= 60.0:
            self._warned[wait.host] = now
            log.warning("an attempt waited %.1fs for a connection to %s: %d are open to it already "
                        "(--http-connections-per-host); logged at most once a minute per host",
                        seconds, wait.host, self.per_host)

    async def run(self, attempt: Attempt) -> Outcome:
        started = self._now()
        spec = attempt.spec
        try:
            pattern = _compile(spec.get("expect_body"))
        except ValueError as exc:
            # Judged before sending: never fire a side effect whose result cannot be judged.
            return self._outcome(started, OutcomeStatus.FAILED, error=f"invalid expect_body regex: {exc}")
        response = _Response(head_cap=MATCH_CAP if pattern else 0)
        wait = _Wait(url=spec["url"])
        try:
            async with asyncio.timeout(attempt.timeout):
                await self._bounded(attempt, response, wait)
        except TimeoutError:
            error = f"timed out after {attempt.timeout:g}s"
            if wait.since is not None and wait.waited is None:
                error += (f", waiting for a connection to {wait.host} ({self.per_host} open to it already; "
                          "--http-connections-per-host)")
            return self._outcome(started, OutcomeStatus.TIMED_OUT, response, error=error)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            # An aiohttp message may quote the URL (or a redirect's) whole: scrub every URL in it.
            error = scrub_urls(_describe(exc, spec["url"]))
            return self._outcome(started, OutcomeStatus.FAILED, response, error=error)
        if pattern is None:
            verdict = _judge(response, spec.get("expect_status") or [], None)
        else:  # off the event loop: a search may take a while (see MATCH_CAP)
            verdict = await asyncio.to_thread(_judge, response, spec.get("expect_status") or [], pattern)
        status = OutcomeStatus.FAILED if verdict else OutcomeStatus.SUCCEEDED
        return self._outcome(started, status, response, error=verdict)

    async def _bounded(self, attempt: Attempt, response: _Response, wait: _Wait) -> None:
        """The exchange, holding one of its host's connections throughout."""
        url = attempt.spec["url"]
        gate = self._gate(url)
        if gate is None:
            await self._exchange(attempt, response)
            return
        gate.users += 1
        try:
            await self._enter(gate, wait)
            try:
                if wait.waited is not None:
                    self._waited(wait)
                await self._exchange(attempt, response)
            finally:
                gate.slots.release()
        finally:
            self._leave(gate)

    async def _exchange(self, attempt: Attempt, response: _Response) -> None:
        spec = attempt.spec
        body: str | None = spec.get("body")
        async with self._client().request(
            spec.get("method") or "POST",
            spec["url"],
            headers=_headers(attempt),
            data=body.encode("utf-8") if body is not None else None,
        ) as resp:
            response.status = resp.status
            response.charset = _charset(resp.charset)
            try:
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    response.feed(chunk)
            except BaseException:
                resp.close()  # drop the connection: a half-read body cannot go back to the pool
                raise

    def _outcome(
        self,
        started: datetime,
        status: OutcomeStatus,
        response: _Response | None = None,
        *,
        error: str | None,
    ) -> Outcome:
        extra: dict[str, Any] = {}
        if response is not None and response.status is not None:
            extra["output_bytes"] = response.tail.total
        return Outcome(
            status=status,
            started_at=started,
            finished_at=self._now(),
            http_status=response.status if response else None,
            output=response.output() if response else "",
            error=error,
            extra=extra,
        )


def _compile(expect_body: str | None) -> BodyPattern | None:
    # A job stored before patterns were checked by RE2 may hold one RE2 refuses: that
    # attempt fails before anything is sent (see run).
    return compile_pattern(expect_body) if expect_body is not None else None


def _headers(attempt: Attempt) -> dict[str, str]:
    """The job's headers, then the identity, which the job cannot override in any case."""
    ident = identity(attempt)
    reserved = {name.lower() for name in ident}
    job: dict[str, str] = attempt.spec.get("headers") or {}
    headers = {k: str(v) for k, v in job.items() if k.lower() not in reserved}
    headers.update(ident)
    return headers


def _charset(declared: str | None) -> str:
    if declared:
        try:
            return codecs.lookup(declared).name
        except LookupError:
            pass  # a charset Python does not know: read it as utf-8 rather than fail
    return "utf-8"


def _judge(response: _Response, expect_status: list[int], pattern: BodyPattern | None) -> str | None:
    """Why the response is a failure, or None when it is a success."""
    status = response.status
    assert status is not None  # the exchange completed
    if expect_status:
        if status not in expect_status:
            wanted = ", ".join(str(s) for s in expect_status)
            return f"unexpected status {status} (expected {wanted})"
    elif not 200 <= status < 300:
        return f"unexpected status {status} (expected 2xx)"
    if pattern is not None:
        text = bytes(response.head).decode(response.charset, errors="replace")
        if pattern.search(text) is None:
            return f"body does not match expect_body regex {pattern.pattern!r}"
    return None


def _describe(exc: BaseException, url: str) -> str:
    """One readable line for a request that got no usable response."""
    where = _display(url)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate error: {exc.certificate_error}: {where}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return f"connection refused: {where}"
        if isinstance(os_error, socket.gaierror):
            return f"cannot resolve host {exc.host!r} ({os_error.strerror}): {where}"
        if isinstance(os_error, ssl.SSLError):
            return f"TLS error: {os_error.reason or os_error}: {where}"
        return f"cannot connect: {os_error.strerror or os_error}: {where}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"server disconnected: {where}"
    if isinstance(exc, aiohttp.InvalidURL):
        return f"invalid url: {where}"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"bad response: {exc.message}: {where}"
    return f"request failed: {str(exc) or type(exc).__name__}: {where}"


def _host(url: str) -> str:
    """The scheme, host and port a connection is kept for, as a log line may show it, and the
    key of the host's bound (``HttpExecutor._gate``): yarl gives the host in lower case and the
    port a scheme implies, as aiohttp keys its connections."""
    try:
        u = yarl.URL(url)
        return f"{u.scheme}://{u.host}:{u.port}"
    except (ValueError, TypeError):
        return _display(url)


def _display(url: str) -> str:
    # An error message ends up in the run ledger, which read-only callers see, and in the
    # worker's log: user info and query strings (``?api_key=``) stay out of both.
    return mask_url(url)
