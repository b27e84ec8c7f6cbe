"""GET /metrics: Prometheus text, behind the token like every path but /v1/health."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..context import ApiContext
from ..metrics import CONTENT_TYPE, Metrics
from ..routing import Route
from .common import ctx_of

__all__ = ["ROUTES", "metrics_of"]


def metrics_of(ctx: ApiContext) -> Metrics:
    """The agent gives the context its Metrics; an app built without (the API tests) gets one made
    here on first use, reading what the context has: raft status and ledger, no worker."""
    if ctx.metrics is None:
        ctx.metrics = Metrics(node_id=ctx.node_id, state=ctx.state, raft=ctx.node.status)
    return ctx.metrics


async def _metrics(request: web.Request, args: dict[str, Any]) -> web.Response:
    # On a thread: a scrape of a node holding 100,000 jobs is ~45 ms in-process and several times
    # that on a busy agent (the GIL shared with the raft and snapshot threads), and the loop goes
    # on answering meanwhile instead of holding every other request for it.
    body = await asyncio.to_thread(metrics_of(ctx_of(request)).render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


ROUTES = [
    Route("GET", "/metrics", _metrics, "Prometheus metrics of this node (text exposition format)",
          responses={200: "text"}, tag="cluster"),
]
