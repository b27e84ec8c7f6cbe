"""GET /metrics: Prometheus text, behind the token like every path but /v1/health."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..context import ApiContext
from ..metrics import CONTENT_TYPE, Metrics
from ..routing import Route
from .common import ctx_of

__all__ = ["ROUTES", "metrics_of"]


def metrics_of(ctx: ApiContext) -> Metrics:
    """The agent puts its Metrics into ``ctx.extras``; an app built without one (the API tests) gets
    one made here on first use, reading what the context has: raft status and ledger, no worker."""
    metrics = ctx.extras.get("metrics")
    if not isinstance(metrics, Metrics):
        metrics = Metrics(node_id=ctx.node_id, state=ctx.state, raft=ctx.node.status)
        ctx.extras["metrics"] = metrics
        ctx.extras.setdefault("observe_api", metrics.observe_api)
    return metrics


async def _metrics(request: web.Request, args: dict[str, Any]) -> web.Response:
    body = metrics_of(ctx_of(request)).render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


ROUTES = [
    Route("GET", "/metrics", _metrics, "Prometheus metrics of this node (text exposition format)",
          responses={200: "text"}, tag="cluster"),
]
