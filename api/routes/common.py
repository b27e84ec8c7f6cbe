"""Small helpers every handler module uses."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web

from scheduler.errors import NotFound, ValidationFailed
from scheduler.runs import RunRecord

from ..context import CTX, ApiContext
from ..routing import decode_cursor, encode_cursor
from ..views import run_view

__all__ = ["ctx_of", "read_json", "parse_json", "ok", "page", "require_job"]

DEFAULT_LIMIT = 100


def ctx_of(request: web.Request) -> ApiContext:
    return request.app[CTX]


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    return parse_json(await request.read(), optional=optional)


def parse_json(raw: bytes, *, optional: bool = False) -> Any:
    """A request body as JSON the replicated log can hold, or ValidationFailed naming the problem."""
    if not raw.strip():
        if optional:
            return None
        raise ValidationFailed([{"field": "$", "message": "a JSON body is required"}])
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise ValidationFailed([{"field": "$", "message": f"invalid JSON: {exc}"}]) from exc
    try:
        fine = _storable(doc)
    except RecursionError:  # deeper than the quick walk goes: the iterative one decides
        fine = False
    if not fine and (problems := _unstorable(doc)):
        raise ValidationFailed(problems)
    return doc


_INT_RANGE = (-(1 << 63), (1 << 63) - 1)


def _storable(value: Any) -> bool:
    """The quick yes of ``_unstorable`` (no paths built): every string UTF-8, every number in range."""
    t = type(value)
    if t is str:
        return value.isascii() or _utf8(value)
    if t is dict:
        return all(type(k) is str and (k.isascii() or _utf8(k)) and _storable(v) for k, v in value.items())
    if t is list:
        return all(_storable(v) for v in value)
    if t is int or t is float:
        return not math.isfinite(value) or _INT_RANGE[0] <= value <= _INT_RANGE[1]
    return t is bool or value is None


def _unstorable(doc: Any) -> list[dict[str, str]]:
    """Values JSON allows but the replicated log (msgpack, UTF-8) cannot hold.

    Without this a lone surrogate (``"\\ud800"``) or an integer beyond 64 bits
    (also ``1e30``, which the job model turns into an int) fails only when the
    command is encoded, and is answered 500.
    """
    problems: list[dict[str, str]] = []
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        where = path or "$"
        if isinstance(value, dict):
            for k, v in value.items():
                sub = f"{path}.{k}" if path else str(k)
                if not _utf8(k):
                    problems.append({"field": sub, "message": "key is not valid UTF-8 (unpaired surrogate)"})
                stack.append((sub, v))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str) and not _utf8(value):
            problems.append({"field": where, "message": "is not valid UTF-8 (unpaired surrogate)"})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            problems.append({"field": where, "message": "is out of range: numbers must lie within ±2^63"})
    return sorted(problems, key=lambda p: p["field"])


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ok(data: Any, status: int = 200) -> web.Response:
    """A JSON answer (compact; UTF-8 as is, not \\u-escaped). orjson encodes a job view in
    ~1 us where the json module takes ~10, on the path of every write."""
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status,
                        content_type="application/json", charset="utf-8")


def page(items: list[Any], key: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``items`` already start after the cursor; cut to ``limit`` and name the next cursor."""
    limit = args.get("limit") or DEFAULT_LIMIT
    chosen = items[:limit]
    more = len(items) > limit
    return {"items": chosen, "next_cursor": encode_cursor(str(key(chosen[-1]))) if more and chosen else None}


def cursor(args: dict[str, Any]) -> str | None:
    return decode_cursor(args.get("cursor"))


def cursor_int(args: dict[str, Any]) -> int | None:
    raw = cursor(args)
    if raw is None:
        return None
    if not raw.isdigit():
        raise ValidationFailed([{"field": "query.cursor", "message": "not a cursor this server issued"}])
    return int(raw)


def runs_page(ctx: ApiContext, ids: Callable[[int | None], Iterable[str]], args: dict[str, Any],
              keep: Callable[[RunRecord], bool] = lambda run: True) -> dict[str, Any]:
    """Newest first: ``ids(cursor)`` gives run ids newest first (token order, descending), from
    below the cursor where it can; the cursor is a token."""
    after = cursor_int(args)
    limit = args.get("limit") or DEFAULT_LIMIT
    status = args.get("status")
    items: list[RunRecord] = []
    for rid in ids(after):
        run = ctx.state.runs.get(rid)
        if run is None or (after is not None and run["token"] >= after):
            continue
        if (status and run["status"] != status) or not keep(run):
            continue
        items.append(run)
        if len(items) > limit:
            break
    result = page(items, lambda r: r["token"], args)
    result["items"] = [run_view(r, output=False) for r in result["items"]]
    return result


def require_job(ctx: ApiContext, name: str) -> None:
    if name not in ctx.state.jobs:
        raise NotFound(f"no job named {name!r}")
