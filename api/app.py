"""The aiohttp application: one factory, the middlewares, the route table.

Every error leaves as ``{"error": {"code", "message", "details"}}``: ours from
the error tree, aiohttp's own (404 for an unknown path, 405, 413) translated
here, anything unexpected logged with its traceback and answered 500 without it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from scheduler.errors import (
    Forbidden,
    InsufficientStorage,
    PayloadTooLarge,
    RaftcronError,
    Unauthorized,
    Unavailable,
)

from .context import CLOSING, CTX, ApiContext, as_reader
from .routes import batch, cluster, jobs, metrics, runs, ui
from .routing import Route, openapi, parse_params
from .schemas import COMPONENTS

__all__ = ["create_app", "CTX", "ROUTES", "openapi_document", "VERSION"]

log = logging.getLogger("raftcron.api")
ROUTE = web.AppKey("route_of", dict)
VERSION = "0.1.0"

_Next = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _all_routes() -> list[Route]:
    return [*cluster.ROUTES, *jobs.ROUTES, *batch.ROUTES, *runs.ROUTES, *metrics.ROUTES, *ui.ROUTES]


ROUTES = _all_routes()


def openapi_document() -> dict[str, Any]:
    return openapi(ROUTES, COMPONENTS, VERSION)


def _error_response(exc: RaftcronError) -> web.Response:
    resp = web.json_response(exc.to_body(), status=exc.status)
    if isinstance(exc, Unavailable):
        resp.headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return resp


@web.middleware
async def error_middleware(request: web.Request, handler: _Next) -> web.StreamResponse:
    try:
        return await handler(request)
    except RaftcronError as exc:
        return _error_response(exc)
    except web.HTTPRequestEntityTooLarge:
        # aiohttp's exception keeps no max_size attribute (reading one answered 500).
        return _error_response(PayloadTooLarge(f"request body over {request.client_max_size} bytes"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        message = f"no route for {request.method} {request.path}" if exc.status in (404, 405) else exc.reason
        return web.json_response({"error": {"code": code, "message": message, "details": []}}, status=exc.status)
    except Exception:  # noqa: BLE001 - logged with traceback, answered without it
        log.exception("unexpected error serving %s %s", request.method, request.path)
        body = {"error": {"code": "internal", "message": "internal error; see the agent log", "details": []}}
        return web.json_response(body, status=500)


def _auth_middleware(ctx: ApiContext) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: _Next) -> web.StreamResponse:
        tokens = ctx.tokens
        if tokens.write is None and tokens.read is None:
            return await handler(request)
        route: Route | None = request.app[ROUTE].get(_route_key(request))
        if route is not None and route.public:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else None
        if given is None:
            raise Unauthorized("this cluster needs a token: send Authorization: Bearer <token>")
        if tokens.write is not None and _same_token(given, tokens.write):
            return await handler(request)
        if tokens.read is not None and _same_token(given, tokens.read):
            if request.method in ("GET", "HEAD"):
                with as_reader():
                    return await handler(request)
            raise Forbidden("the read-only token may not change anything")
        raise Unauthorized("the token is not valid for this cluster")

    return auth


def _space_middleware(ctx: ApiContext) -> Any:
    """A write is refused before it is proposed while the data directory is under its floor:
    proposed, it would reach a journal that cannot grow and time out as outcome unknown."""

    @web.middleware
    async def space(request: web.Request, handler: _Next) -> web.StreamResponse:
        if ctx.space is not None and request.method not in ("GET", "HEAD", "OPTIONS"):
            free = ctx.space.short()
            if free is not None:
                raise InsufficientStorage(
                    f"the data directory of node {ctx.node_id} has {free / 2**20:.1f} MiB free, under the "
                    f"{ctx.space.min_free / 2**20:.1f} MiB its journal needs: free space there, then repeat "
                    "the write (nothing acknowledged was lost)")
        return await handler(request)

    return space


def _same_token(given: str, expected: str) -> bool:
    # compare_digest refuses str with non-ASCII characters (TypeError, a 500): compare the
    # UTF-8 bytes; surrogateescape keeps any header byte encodable.
    return hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape")
    )


def _route_key(request: web.Request) -> tuple[str, str] | None:
    info = request.match_info
    res = info.route.resource if info.route is not None else None
    canonical = res.canonical if res is not None else None
    return (request.method, canonical) if canonical else None


def _require_caught_up(ctx: ApiContext) -> None:
    """A node restarted answers from the state it restored until a leader tells it what is
    committed (raftlog's ``NodeStatus.caught_up``): read then, a job written an hour ago could be
    missing or at an old version. Refused instead, as Consul and Nomad refuse a read with no
    leader; the CLI retries a 503 on its own."""
    st = ctx.node.status()
    if not st.caught_up:
        raise Unavailable(
            f"node {ctx.node_id} is catching up after its start (applied {st.applied_index} of the "
            f"{st.commit_index} committed entries it knows of; leader: {st.leader or 'none yet'}), so its answer "
            "could lack acknowledged writes: retry shortly, ask another node, or add stale=true to read it as it is")


def _bind(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        args = parse_params(request, route)
        if route.replica and args.get("stale") != "true":
            _require_caught_up(request.app[CTX])
        started = time.perf_counter()
        try:
            return await route.handler(request, args)
        finally:
            metrics = request.app[CTX].metrics
            if metrics is not None:
                metrics.observe_api(route.path, request.method, time.perf_counter() - started)

    handle.__name__ = route.handler.__name__
    return handle


def create_app(ctx: ApiContext) -> web.Application:
    app = web.Application(client_max_size=ctx.max_body, middlewares=[error_middleware, _auth_middleware(ctx),
                                                                        _space_middleware(ctx)])
    app[CTX] = ctx
    closing = asyncio.Event()
    app[CLOSING] = closing

    async def close(_: web.Application) -> None:
        closing.set()

    app.on_shutdown.append(close)
    route_of: dict[tuple[str, str], Route] = {}
    for r in ROUTES:
        app.router.add_route(r.method, r.path, _bind(r))
        route_of[(r.method, r.path)] = r
    app[ROUTE] = route_of
    return app
