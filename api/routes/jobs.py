"""/v1/jobs: the job store, runs of a job, explain, run now, pause and resume."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from scheduler.errors import NotFound, ValidationFailed
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.redaction import unmask_doc
from scheduler.runs import RUN_STATUSES

from ..context import ApiContext, reads_only
from ..routing import Param, Route
from ..views import explain_view, job_view
from .common import ctx_of, cursor, ok, page, read_json, require_job, runs_page

__all__ = ["ROUTES", "keep_secrets"]

NAME = Param("name", "path", required=True, description="job name")
LIMIT = Param("limit", type="integer", minimum=1, maximum=1000, description="page size, default 100")
CURSOR = Param("cursor", description="next_cursor of the previous page")


async def _list(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    labels = [lv.split("=", 1) for lv in request.query.getall("label", [])]
    after = cursor(args)
    q = (args.get("q") or "").lower()
    now = ctx.service.cluster_now_us()
    items: list[str] = []
    for name in _names_after(ctx.state.job_names(), after):
        rec = ctx.state.jobs.get(name)
        if rec is None:
            continue
        spec = rec["spec"]
        if any(spec.get("labels", {}).get(k) != v for k, v in labels):
            continue
        if q and q not in name and q not in str(spec.get("description", "")).lower():
            continue
        status = args.get("status")
        if status == "paused" and not spec.get("paused") or status == "active" and spec.get("paused"):
            continue
        if status == "failing" and not rec["consecutive_failures"]:
            continue
        items.append(name)
        if len(items) > (args.get("limit") or 100):
            break
    result = page(items, lambda n: n, args)
    masked = reads_only()
    result["items"] = [v for n in result["items"] if (v := job_view(ctx.state, n, now, masked=masked)) is not None]
    return ok(result)


def _names_after(names: list[str], after: str | None, step: int = 512) -> Iterator[str]:
    """The sorted names after ``after``, read in slices: the raft thread may insert or delete
    meanwhile, so each slice starts again after the last name seen, never at a stale index."""
    last = after
    while True:
        start = 0 if last is None else bisect.bisect_right(names, last)
        chunk = names[start : start + step]
        if not chunk:
            return
        yield from chunk
        last = chunk[-1]


async def _put(request: web.Request, args: dict[str, Any], *, name: str | None, create_only: bool) -> web.Response:
    ctx = ctx_of(request)
    doc = keep_secrets(ctx, await read_json(request), name)
    job = parse_job(doc, name=name)
    result = await ctx.service.put_job(job, create_only=create_only)
    view = job_view(ctx.state, job.name, ctx.service.cluster_now_us()) or {"name": job.name}
    view["change"] = result["change"]
    return ok(view, 201 if result["change"] == "created" else 200)


def keep_secrets(ctx: ApiContext, doc: Any, name: str | None) -> Any:
    """A document as a read-only caller is shown it, applied back by a writer, stores the
    secrets it masked rather than ``***``."""
    if not isinstance(doc, dict):
        return doc
    target = name if name is not None else doc.get("name")
    rec = ctx.state.jobs.get(target) if isinstance(target, str) else None
    return unmask_doc(doc, rec["spec"] if rec is not None else None)


async def _create(request: web.Request, args: dict[str, Any]) -> web.Response:
    return await _put(request, args, name=None, create_only=True)


async def _replace(request: web.Request, args: dict[str, Any]) -> web.Response:
    return await _put(request, args, name=args["name"], create_only=False)


async def _get(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    view = job_view(ctx.state, args["name"], ctx.service.cluster_now_us(), masked=reads_only())
    if view is None:
        raise NotFound(f"no job named {args['name']!r}")
    return ok(view)


async def _delete(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    require_job(ctx, args["name"])
    await ctx.service.delete_job(args["name"])
    return ok({"deleted": args["name"]})


async def _run(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    require_job(ctx, args["name"])
    run_id = await ctx.service.run_now(args["name"], ctx.live())
    return ok({"run_id": run_id}, 202)


async def _note(request: web.Request) -> str | None:
    body = await read_json(request, optional=True)
    if body is None:
        return None
    if not isinstance(body, dict):
        raise ValidationFailed([{"field": "$", "message": 'expected {"note": "..."} or no body'}])
    if unknown := sorted(set(body) - {"note"}):
        raise ValidationFailed([{"field": k, "message": "unknown field"} for k in unknown])
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise ValidationFailed([{"field": "note", "message": "must be a string"}])
    return note


async def _pause(request: web.Request, args: dict[str, Any], paused: bool) -> web.Response:
    ctx = ctx_of(request)
    note = await _note(request)
    require_job(ctx, args["name"])
    await ctx.service.pause(args["name"], paused, note)
    return ok(job_view(ctx.state, args["name"], ctx.service.cluster_now_us()))


async def _pause_job(request: web.Request, args: dict[str, Any]) -> web.Response:
    return await _pause(request, args, True)


async def _resume_job(request: web.Request, args: dict[str, Any]) -> web.Response:
    return await _pause(request, args, False)


async def _job_runs(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    require_job(ctx, args["name"])
    return ok(runs_page(ctx, list(ctx.state.job_runs.get(args["name"]) or []), args))


async def _explain(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    require_job(ctx, args["name"])
    since = args.get("since")
    items = explain_view(ctx.state, args["name"], us(since) if since is not None else None)
    return ok({"items": items, "next_cursor": None})


ROUTES = [
    Route("GET", "/v1/jobs", _list, "List jobs (secrets read *** with the read-only token)",
          params=(Param("label", type="label", description="k=v; repeat to AND several"),
                  Param("q", description="substring of name or description"),
                  Param("status", type="enum", enum=("active", "paused", "failing")), LIMIT, CURSOR),
          responses={200: "JobList"}),
    Route("POST", "/v1/jobs", _create, "Create a job (409 if the name exists)", body="JobDocument",
          responses={201: "Job", 409: "Error"}, write=True),
    Route("PUT", "/v1/jobs/{name}", _replace, "Create or replace a job (a *** where the read-only token was shown "
          "a secret keeps the stored value)", params=(NAME,), body="JobDocument",
          responses={200: "Job", 201: "Job"}, write=True),
    Route("GET", "/v1/jobs/{name}", _get, "A job, with last run, next slots, consecutive failures "
          "(secrets read *** with the read-only token)",
          params=(NAME,), responses={200: "Job", 404: "Error"}),
    Route("DELETE", "/v1/jobs/{name}", _delete, "Delete a job and its history", params=(NAME,),
          responses={200: "Object", 404: "Error"}, write=True),
    Route("POST", "/v1/jobs/{name}/run", _run, "Run now", params=(NAME,),
          responses={202: "RunAccepted", 404: "Error", 409: "Error"}, write=True),
    Route("POST", "/v1/jobs/{name}/pause", _pause_job, "Pause", params=(NAME,), body="Note",
          responses={200: "Job", 404: "Error"}, write=True),
    Route("POST", "/v1/jobs/{name}/resume", _resume_job, "Resume", params=(NAME,), body="Note",
          responses={200: "Job", 404: "Error"}, write=True),
    Route("GET", "/v1/jobs/{name}/runs", _job_runs, "Runs of a job, newest first",
          params=(NAME, Param("status", type="enum", enum=RUN_STATUSES), LIMIT, CURSOR),
          responses={200: "RunList", 404: "Error"}),
    Route("GET", "/v1/jobs/{name}/explain", _explain, "Slot decisions and their reasons",
          params=(NAME, Param("since", type="date-time")), responses={200: "ExplainList", 404: "Error"}),
]
