"""Small helpers every handler module uses."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from scheduler.errors import NotFound, ValidationFailed

from ..context import ApiContext
from ..routing import decode_cursor, encode_cursor

__all__ = ["ctx_of", "read_json", "ok", "page", "require_job"]

DEFAULT_LIMIT = 100


def ctx_of(request: web.Request) -> ApiContext:
    from ..app import CTX

    return request.app[CTX]


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return None
        raise ValidationFailed([{"field": "$", "message": "a JSON body is required"}])
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed([{"field": "$", "message": f"invalid JSON: {exc}"}]) from exc


def ok(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda v: json.dumps(v, separators=(",", ":")))


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


def require_job(ctx: ApiContext, name: str) -> None:
    if name not in ctx.state.jobs:
        raise NotFound(f"no job named {name!r}")
