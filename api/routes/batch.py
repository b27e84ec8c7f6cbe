"""POST /v1/jobs:batch: many job documents in one replicated entry, all or none.

Every document is validated before anything is proposed; a refusal names the document
(``jobs[i]``, and its name in ``job``) and the field. The body has its own cap
(``MAX_BATCH_BYTES``, above the API's ordinary ``max_body``) and a cap on the count of
documents (``MAX_BATCH_JOBS``); either answers 413 naming the cap.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from scheduler.errors import Conflict, FieldError, PayloadTooLarge, ValidationFailed
from scheduler.model import Job, parse_job

from ..context import ApiContext
from ..routing import Route
from .common import ctx_of, ok, parse_json
from .jobs import keep_secrets

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_JOBS", "MAX_PROBLEMS", "ROUTES"]

MAX_BATCH_BYTES = 8 * 2**20
MAX_BATCH_JOBS = 5000
MAX_PROBLEMS = 100  # details listed in one refusal; the message gives the total
MODES = ("create", "apply")


async def _read_capped(request: web.Request) -> bytes:
    """The body, refused at the cap before it is read whole (aiohttp's own cap is ``max_body``)."""
    too_large = PayloadTooLarge(f"a batch body may hold at most {MAX_BATCH_BYTES} bytes",
                                [{"field": "$", "message": f"body over {MAX_BATCH_BYTES} bytes"}])
    if request.content_length is not None and request.content_length > MAX_BATCH_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_BATCH_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _envelope(body: Any) -> tuple[str, list[Any]]:
    if not isinstance(body, dict):
        raise ValidationFailed([{"field": "$", "message": 'expected {"mode": "create"|"apply", "jobs": [...]}'}])
    problems: list[FieldError] = [{"field": k, "message": "unknown field"} for k in sorted(set(body) - {"mode", "jobs"})]
    mode = body.get("mode")
    if mode not in MODES:
        problems.append({"field": "mode", "message": f"must be one of {', '.join(MODES)}"})
    jobs = body.get("jobs")
    if not isinstance(jobs, list):
        problems.append({"field": "jobs", "message": "must be a list of job documents"})
    if problems:
        raise ValidationFailed(problems)
    assert isinstance(mode, str) and isinstance(jobs, list)
    if len(jobs) > MAX_BATCH_JOBS:
        raise PayloadTooLarge(f"a batch may hold at most {MAX_BATCH_JOBS} documents, got {len(jobs)}",
                              [{"field": "jobs", "message": f"at most {MAX_BATCH_JOBS} documents"}])
    return mode, jobs


def _parse_all(ctx: ApiContext, docs: list[Any]) -> tuple[Job, ...]:
    """Every document parsed, or one ValidationFailed naming each bad one (index, name, field)."""
    problems: list[dict[str, Any]] = []
    jobs: list[Job] = []
    first: dict[str, int] = {}
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            problems.append({"field": f"jobs[{i}]", "message": "must be a job document (an object)", "job": None})
            continue
        name = doc.get("name")
        shown = name if isinstance(name, str) else None
        try:
            job = parse_job(keep_secrets(ctx, doc, None))
        except ValidationFailed as exc:
            problems.extend({"field": f"jobs[{i}].{d['field']}" if d.get("field") else f"jobs[{i}]",
                             "message": d["message"], "job": shown} for d in exc.details)
            continue
        if job.name in first:
            problems.append({"field": f"jobs[{i}].name",
                             "message": f"{job.name!r} is also jobs[{first[job.name]}]: one document per name",
                             "job": job.name})
            continue
        first[job.name] = i
        jobs.append(job)
    if problems:
        bad = len({p["field"].split(".", 1)[0] for p in problems})
        listed = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:3])
        more = f" (and {len(problems) - 3} more problems)" if len(problems) > 3 else ""
        raise ValidationFailed(problems[:MAX_PROBLEMS],
                               f"{bad} of {len(docs)} documents refused, nothing stored: {listed}{more}")
    return tuple(jobs)


def _read_batch(ctx: ApiContext, raw: bytes) -> tuple[str, tuple[Job, ...]]:
    mode, docs = _envelope(parse_json(raw))
    return mode, _parse_all(ctx, docs)


async def _batch(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    raw = await _read_capped(request)
    # Parsing takes 0.1-0.5 ms a document on this machine: 1,000 of them on the event loop would
    # hold every other request (health checks included) that long. In a thread, the loop gets
    # the GIL back at each switch interval.
    mode, jobs = await asyncio.to_thread(_read_batch, ctx, raw)
    if mode == "create" and (taken := [(i, j.name) for i, j in enumerate(jobs) if j.name in ctx.state.jobs]):
        # Answered here without a proposal; the state machine decides again at apply.
        raise Conflict(f"{len(taken)} job(s) exist already, nothing stored: "
                       + ", ".join(repr(n) for _, n in taken[:20]) + (" ..." if len(taken) > 20 else ""),
                       [{"field": f"jobs[{i}].name", "message": f"a job named {n!r} exists already", "job": n}
                        for i, n in taken[:MAX_PROBLEMS]])
    result = await ctx.service.put_jobs(jobs, create_only=mode == "create") if jobs else {"items": []}
    items = [{"name": r["name"], "change": r["change"], "version": r["version"]} for r in result["items"]]
    counts = {change: 0 for change in ("created", "configured", "unchanged")}
    for item in items:
        counts[item["change"]] += 1
    return ok({"mode": mode, "count": len(items), "changes": counts, "items": items})


ROUTES = [
    Route("POST", "/v1/jobs:batch", _batch,
          f"Create (mode create: 409 if any name exists) or create-or-replace (mode apply) up to "
          f"{MAX_BATCH_JOBS} jobs in one replicated entry, all or none: every document is validated "
          f"first, and a refusal names each bad document (jobs[i], its name) and field. Bodies up to "
          f"{MAX_BATCH_BYTES // 2**20} MiB; over either cap, 413. A *** where the read-only token was "
          f"shown a secret keeps the stored value, as with PUT.",
          body="JobBatch", responses={200: "JobBatchResult", 409: "Error"}, write=True),
]
