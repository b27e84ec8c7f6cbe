"""/v1/jobs: the job store, runs of a job, explain, run now, pause and resume."""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from raftlog.trace import mark
from scheduler.errors import NotFound, ValidationFailed
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.planner import known_next_slot
from scheduler.redaction import unmask_doc
from scheduler.runs import RUN_STATUSES, RunRecord
from scheduler.state import State
from scheduler.store import copied

from ..context import ApiContext, reads_only
from ..routing import Param, Route, encode_cursor
from ..views import explain_view, iso, job_view, next_slots
from .common import ctx_of, cursor, ok, page, read_json, require_job, runs_page

__all__ = ["ROUTES", "keep_secrets"]

NAME = Param("name", "path", required=True, description="job name")
LIMIT = Param("limit", type="integer", minimum=1, maximum=1000, description="page size, default 100")
CURSOR = Param("cursor", description="next_cursor of the previous page")


# Outcomes that count as a failure for sort=last_failure (a lost attempt is retried, and its
# retry's outcome is the one that counts).
FAILURES = frozenset({"failed", "timed_out", "dead"})
RECENT = 20  # runs per job with include=recent_runs, as the dashboard's strip shows them
SORTS = ("name", "next_slot", "last_failure", "failures")


async def _list(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    state = ctx.state
    labels = [lv.split("=", 1) for lv in request.query.getall("label", [])]
    q = (args.get("q") or "").lower()
    status, last = args.get("status"), args.get("last")
    now = ctx.service.cluster_now_us()
    limit = args.get("limit") or 100

    def wanted(name: str) -> bool:
        rec = state.jobs.get(name)
        if rec is None:
            return False
        spec = rec["spec"]
        if labels and any(spec.get("labels", {}).get(k) != v for k, v in labels):
            return False
        if q and q not in name and q not in str(spec.get("description", "")).lower():
            return False
        if status == "paused" and not spec.get("paused") or status == "active" and spec.get("paused"):
            return False
        if status == "failing" and not rec["consecutive_failures"]:
            return False
        if status == "never_run" and last_outcome(state, name) is not None:
            return False
        if last is not None and ((run := last_outcome(state, name)) is None or run["status"] != last):
            return False
        return True

    # Failing jobs are read from their own index: the dashboard opens on them, and walking every
    # name to find the few would cost the whole list (~0.5 s at 1,000,000 jobs).
    names = sorted(copied(state.failing_jobs())) if status == "failing" else state.job_names()
    sort = args.get("sort") or "name"
    if sort == "name":
        items: list[str] = []
        for name in _names_after(names, cursor(args)):
            if wanted(name):
                items.append(name)
                if len(items) > limit:
                    break
        result = page(items, lambda n: n, args)
    else:
        result = _sorted_page(state, sort, [n for n in list(names) if wanted(n)], now, args)
    masked = reads_only()
    views = []
    for name in result["items"]:
        view = job_view(state, name, now, masked=masked)
        if view is None:
            continue
        if args.get("include") == "recent_runs":
            view["recent_runs"] = recent_runs(state, name)
        views.append(view)
    result["items"] = views
    result["total"] = len(state.jobs)  # every job, whatever the filter
    if args.get("cursor") is None:
        # Jobs whose last run failed, whatever the filter: the dashboard opens on them when any.
        result["failing"] = len(state.failing_jobs())
    return ok(result)


def last_outcome(state: State, name: str) -> RunRecord | None:
    """The newest run of ``name`` that is not only claimed ahead (the dashboard's "last outcome")."""
    for run in state.runs.newest_of(name):
        if run["status"] != "claimed":
            return run
    return None


def recent_runs(state: State, name: str) -> list[dict[str, Any]]:
    """The newest ``RECENT`` runs, newest first, with what a strip of boxes shows of each."""
    out = []
    for run in itertools.islice(state.runs.newest_of(name), RECENT):
        rid = run["id"]
        started, finished = run["started_us"], run["finished_us"]
        out.append({"id": rid, "slot": iso(run["slot_us"]), "status": run["status"], "attempt": run["attempt"],
                    "node": run["node"], "trigger": run["trigger"],
                    "duration_ms": (finished - started) // 1000 if started is not None and finished is not None else None})
    return out


def _sort_key(state: State, sort: str, name: str, now: int) -> list[Any]:
    """Ascending order of ``sort``, the name breaking ties: the soonest next slot first (none:
    last), the latest failure first (never failed: last), the most consecutive failures first."""
    rec = state.jobs[name]
    if sort == "failures":
        return [-int(rec["consecutive_failures"]), name]
    if sort == "last_failure":
        for run in state.runs.newest_of(name, statuses=FAILURES):
            if run["status"] in FAILURES:
                return [0, -(run["finished_us"] or run["slot_us"]), name]
        return [1, 0, name]
    known, slot = known_next_slot(rec)
    if not known:
        try:
            slots = next_slots(state, name, now, 1)
            slot = us(slots[0]) if slots else None
        except Exception:  # noqa: BLE001 - a job that cannot be planned sorts last, as its view says why
            slot = None
    if rec["spec"].get("paused"):
        slot = None
    return [1, 0, name] if slot is None else [0, int(slot), name]


def _sorted_page(state: State, sort: str, names: list[str], now: int, args: dict[str, Any]) -> dict[str, Any]:
    after: list[Any] | None = None
    if (raw := cursor(args)) is not None:
        try:
            after = json.loads(raw)
        except ValueError:
            after = None
        size = 2 if sort == "failures" else 3
        if not isinstance(after, list) or len(after) != size or not isinstance(after[-1], str) \
                or not all(type(x) is int for x in after[:-1]):
            raise ValidationFailed([{"field": "query.cursor", "message": "not a cursor this server issued for this sort"}])
    keyed = sorted(k for n in names if (k := _sort_key(state, sort, n, now)) and (after is None or k > after))
    limit = args.get("limit") or 100
    chosen = keyed[:limit]
    more = len(keyed) > limit
    return {"items": [k[-1] for k in chosen],
            "next_cursor": encode_cursor(json.dumps(chosen[-1])) if more and chosen else None}


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
    mark("http_in")
    ctx = ctx_of(request)
    doc = keep_secrets(ctx, await read_json(request), name)
    job = parse_job(doc, name=name)
    # One reading of the cluster's clock stamps the edit and dates the view's next slots: in a
    # profile of a busy leader a reading took ~60 us (it takes the raft node's status lock).
    now = ctx.service.cluster_now_us()
    result = await ctx.service.put_job(job, create_only=create_only, at_us=now)
    view = job_view(ctx.state, job.name, now) or {"name": job.name}
    view["change"] = result["change"]
    mark("http_out")
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
    ids = ctx.state.job_runs.get(args["name"]) or []
    return ok(runs_page(ctx, lambda after: reversed(ids), args))


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
                  Param("status", type="enum", enum=("active", "paused", "failing", "never_run"),
                        description="failing: its last run failed; never_run: no run recorded"),
                  Param("last", type="enum", enum=RUN_STATUSES, description="the status of its last run (not counting "
                        "a slot only claimed ahead)"),
                  Param("sort", type="enum", enum=SORTS, description="name (default); next_slot: soonest first; "
                        "last_failure: latest first; failures: most consecutive failures first"),
                  Param("include", type="enum", enum=("recent_runs",),
                        description=f"recent_runs: each job's newest {RECENT} runs, newest first"),
                  LIMIT, CURSOR),
          responses={200: "JobList"}, replica=True),
    Route("POST", "/v1/jobs", _create, "Create a job (409 if the name exists)", body="JobDocument",
          responses={201: "Job", 409: "Error"}, write=True),
    Route("PUT", "/v1/jobs/{name}", _replace, "Create or replace a job (a *** where the read-only token was shown "
          "a secret keeps the stored value)", params=(NAME,), body="JobDocument",
          responses={200: "Job", 201: "Job"}, write=True),
    Route("GET", "/v1/jobs/{name}", _get, "A job, with last run, next slots, consecutive failures "
          "(secrets read *** with the read-only token)",
          params=(NAME,), responses={200: "Job", 404: "Error"}, replica=True),
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
          responses={200: "RunList", 404: "Error"}, replica=True),
    Route("GET", "/v1/jobs/{name}/explain", _explain, "Slot decisions and their reasons",
          params=(NAME, Param("since", type="date-time")), responses={200: "ExplainList", 404: "Error"},
          replica=True),
]
