"""/v1/runs and /v1/dead-letters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from scheduler.errors import NotFound
from scheduler.instants import us
from scheduler.runs import RUN_STATUSES, RunRecord

from ..routing import Param, Route
from ..views import run_view
from .common import ctx_of, ok, runs_page
from .jobs import CURSOR, LIMIT

__all__ = ["ROUTES"]

RUN_ID = Param("id", "path", required=True, description="run id")


async def _list_runs(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    since = us(args["since"]) if args.get("since") else None
    until = us(args["until"]) if args.get("until") else None
    node = args.get("node")
    listed = (ctx.state.job_runs.get(args["job"]) or []) if args.get("job") else None

    def ids(after: int | None) -> Iterator[str]:
        # Every run: from below the cursor (the token index), not walked from the newest.
        return ctx.state.runs.newest(after) if listed is None else reversed(listed)
    return ok(runs_page(ctx, ids, args, lambda run: (since is None or run["slot_us"] >= since)
                        and (until is None or run["slot_us"] <= until) and (node is None or run["node"] == node)))


def _run(request: web.Request, run_id: str) -> RunRecord:
    run = ctx_of(request).state.runs.get(run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id!r}")
    return run


async def _get_run(request: web.Request, args: dict[str, Any]) -> web.Response:
    return ok(run_view(_run(request, args["id"])))


async def _cancel(request: web.Request, args: dict[str, Any]) -> web.Response:
    _run(request, args["id"])
    run = await ctx_of(request).service.cancel(args["id"])
    return ok(run_view(run))


async def _dead(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    job = args.get("job")
    dead = list(ctx.state.dead)
    return ok(runs_page(ctx, lambda after: reversed(dead), args, lambda run: not job or run["job"] == job))


async def _replay(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    run_id = await ctx.service.replay(args["id"], ctx.live())
    return ok({"run_id": run_id}, 202)


async def _delete_dead(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    if args["id"] not in ctx.state.dead:
        raise NotFound(f"no dead letter with id {args['id']!r}")
    await ctx.service.delete_dead(args["id"])
    return ok({"deleted": args["id"]})


ROUTES = [
    Route("GET", "/v1/runs", _list_runs, "All runs, newest first",
          params=(Param("status", type="enum", enum=RUN_STATUSES), Param("job"),
                  Param("since", type="date-time", description="slots at or after"),
                  Param("until", type="date-time", description="slots at or before"),
                  Param("node", description="runs taken by this node id"), LIMIT, CURSOR),
          responses={200: "RunList"}, tag="runs", replica=True),
    Route("GET", "/v1/runs/{id}", _get_run, "One run, with its output", params=(RUN_ID,),
          responses={200: "Run", 404: "Error"}, tag="runs", replica=True),
    Route("POST", "/v1/runs/{id}/cancel", _cancel, "Cancel a claimed or running attempt", params=(RUN_ID,),
          responses={200: "Run", 404: "Error", 409: "Error"}, write=True, tag="runs"),
    Route("GET", "/v1/dead-letters", _dead, "Dead runs (retries exhausted)", params=(Param("job"), LIMIT, CURSOR),
          responses={200: "RunList"}, tag="runs", replica=True),
    Route("POST", "/v1/dead-letters/{id}/replay", _replay, "Run a dead letter's slot again", params=(RUN_ID,),
          responses={202: "RunAccepted", 404: "Error"}, write=True, tag="runs"),
    Route("DELETE", "/v1/dead-letters/{id}", _delete_dead, "Forget a dead letter", params=(RUN_ID,),
          responses={200: "Object", 404: "Error"}, write=True, tag="runs"),
]
