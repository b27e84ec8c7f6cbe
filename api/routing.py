"""Routes declared once: the router, the query validation and /openapi.json
are all built from the same ``Route`` table, so they cannot disagree.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from aiohttp import web

from scheduler.errors import ValidationFailed
from scheduler.instants import parse_instant

__all__ = ["Param", "Route", "Handler", "STALE", "parse_params", "encode_cursor", "decode_cursor", "openapi"]

Handler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    where: str = "query"  # query | path
    type: str = "string"  # string | integer | date-time | label | enum
    required: bool = False
    description: str = ""
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None

    def schema(self) -> dict[str, Any]:
        if self.type == "integer":
            s: dict[str, Any] = {"type": "integer"}
            if self.minimum is not None:
                s["minimum"] = self.minimum
            if self.maximum is not None:
                s["maximum"] = self.maximum
            return s
        if self.type == "date-time":
            return {"type": "string", "format": "date-time"}
        if self.type == "enum":
            return {"type": "string", "enum": list(self.enum)}
        if self.type == "label":
            return {"type": "string", "pattern": "^[^=]+=.*$"}
        return {"type": "string"}


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    params: tuple[Param, ...] = ()
    body: str | None = None  # a component schema name
    responses: dict[int, str | None] = field(default_factory=dict)  # status -> component schema name
    write: bool = False
    tag: str = "jobs"
    public: bool = False  # no token needed
    openapi: bool = True
    # Answered from this node's replica of the state: refused (503) while the node catches up
    # after its start, unless the caller asks ``stale=true``.
    replica: bool = False

    @property
    def all_params(self) -> tuple[Param, ...]:
        return (*self.params, STALE) if self.replica else self.params


STALE = Param("stale", type="enum", enum=("true", "false"),
              description="true: answer from this node's replica even while it catches up after its start, "
                          "when it may lack acknowledged writes")


def _coerce(p: Param, raw: str, problems: list[dict[str, str]]) -> Any:
    field_path = f"{p.where}.{p.name}"
    if p.type == "integer":
        try:
            value = int(raw)
        except ValueError:
            problems.append({"field": field_path, "message": f"must be an integer, got {raw!r}"})
            return None
        if (p.minimum is not None and value < p.minimum) or (p.maximum is not None and value > p.maximum):
            problems.append({"field": field_path, "message": f"must be between {p.minimum} and {p.maximum}"})
            return None
        return value
    if p.type == "date-time":
        try:
            return parse_instant(raw)
        except ValueError as exc:
            problems.append({"field": field_path, "message": str(exc)})
            return None
    if p.type == "enum" and raw not in p.enum:
        problems.append({"field": field_path, "message": f"must be one of {', '.join(p.enum)}"})
        return None
    if p.type == "label" and "=" not in raw:
        problems.append({"field": field_path, "message": "must look like key=value"})
        return None
    return raw


_NO_QUERY: Mapping[str, str] = MappingProxyType({})


def parse_params(request: web.Request, route: Route) -> dict[str, Any]:
    problems: list[dict[str, str]] = []
    args: dict[str, Any] = {}
    # Without a query string, no need to parse one (most writes have none).
    query = request.query if request.query_string else _NO_QUERY
    if query:
        known = {p.name for p in route.all_params if p.where == "query"}
        for key in query:
            if key not in known:
                problems.append({"field": f"query.{key}", "message": "unknown query parameter"})
    for p in route.all_params:
        raw = request.match_info.get(p.name) if p.where == "path" else query.get(p.name)
        if raw is None:
            if p.required:
                problems.append({"field": f"{p.where}.{p.name}", "message": "is required"})
            continue
        args[p.name] = _coerce(p, raw, problems)
    if problems:
        raise ValidationFailed(problems)
    return args


def encode_cursor(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def decode_cursor(raw: str | None) -> str | None:
    if raw is None:
        return None
    problem = [{"field": "query.cursor", "message": "not a cursor this server issued"}]
    try:
        # validate=True: the lenient decoder drops foreign characters, so "%%%" read as "" (the first page).
        value = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed(problem) from exc
    if not value:
        raise ValidationFailed(problem)
    return value


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_STATUS_TEXT = {200: "OK", 201: "Created", 202: "Accepted", 400: "Invalid input", 401: "No or wrong token",
                403: "Token may not write", 404: "Not found", 409: "Conflict", 413: "Body too large",
                503: "No leader, or this node is catching up after its start; retry after Retry-After seconds", 504: "Commit not confirmed; safe to repeat",
                507: "This node's data directory is nearly full; nothing was written"}


def openapi(routes: list[Route], components: dict[str, Any], version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for r in routes:
        if not r.openapi:
            continue
        op: dict[str, Any] = {"summary": r.summary, "operationId": r.handler.__name__.lstrip("_"), "tags": [r.tag]}
        if r.all_params:
            op["parameters"] = [
                {"name": p.name, "in": p.where, "required": p.required or p.where == "path",
                 "description": p.description, "schema": p.schema()}
                for p in r.all_params
            ]
        if r.body:
            op["requestBody"] = {"required": r.body != "Note",
                                 "content": {"application/json": {"schema": _ref(r.body)}}}
        responses: dict[str, Any] = {}
        statuses = dict(r.responses)
        statuses.setdefault(400, "Error")
        if not r.public:
            statuses.setdefault(401, "Error")
        if r.replica:
            statuses[503] = "Error"
        if r.write:
            statuses.update({403: "Error", 413: "Error", 503: "Error", 504: "Error", 507: "Error"})
        for status, schema in sorted(statuses.items()):
            entry: dict[str, Any] = {"description": _STATUS_TEXT.get(status, "")}
            if schema == "text":
                entry["content"] = {"text/plain": {"schema": {"type": "string"}}}
            elif schema == "html":
                entry["content"] = {"text/html": {"schema": {"type": "string"}}}
            elif schema:
                entry["content"] = {"application/json": {"schema": _ref(schema)}}
            responses[str(status)] = entry
        op["responses"] = responses
        if not r.public:
            op["security"] = [{"bearer": []}, {}]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {"title": "raftcron", "version": version,
                 "description": "A distributed cron: Raft-replicated schedules and a run ledger."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }

