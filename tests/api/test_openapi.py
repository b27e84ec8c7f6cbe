"""/openapi.json matches what the server does: its routes, its statuses, and the job
document that ``scheduler.model`` accepts.

Statuses and bodies are checked on every response of every API test by the
recorder in ``conftest.py``; ``test_the_recorder_can_fail`` shows it is able to.
"""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from api.app import ROUTES, openapi_document
from api.schemas import JOB_DOCUMENT
from scheduler.errors import ValidationFailed
from scheduler.model import _JOB_FIELDS, parse_job

if TYPE_CHECKING:
    from conftest import Cluster

module_loop = pytest.mark.asyncio(loop_scope="module")  # the cluster fixture lives on the module loop

HOOK = "https://hooks.example.test/raftcron"
FULL_HTTP: dict[str, Any] = {
    "name": "nightly-report", "description": "every field the schema names", "labels": {"team": "billing"},
    "schedule": "0 2 * * *", "timezone": "Europe/Berlin", "paused": False,
    "starts_at": "2026-01-01T00:00:00Z", "ends_at": "2030-01-01T00:00:00+01:00", "executor": "http",
    "http": {"url": "https://example.test/hook", "method": "POST", "headers": {"Authorization": "Bearer x"},
             "body": '{"report": "nightly"}', "expect_status": [200, 204], "expect_body": "ok"},
    "timeout": "5m", "retries": {"max": 3, "backoff": "10s", "factor": 2, "max_backoff": "5m"},
    "concurrency": "forbid", "delivery": "at-most-once", "catchup": {"policy": "all", "window": "1h"},
    "target": {"tags": {"zone": "a"}, "count": 2}, "depends_on": {"job": "extract", "on": "any"},
    "alerts": {"webhook": HOOK, "on": ["failure", "late"], "after_failures": 2, "late_after": "30s"},
    "history": {"keep": 50, "max_age": "30d"},
}
FULL_SHELL: dict[str, Any] = {
    **{k: v for k, v in FULL_HTTP.items() if k != "http"}, "executor": "shell",
    "shell": {"command": ["/usr/local/bin/report", "--full"], "env": {"REPORT_DIR": "/var/reports"}, "cwd": "/srv",
              "limits": {"processes": 64, "memory": "512Mi", "cpu": "10m", "open_files": 256}},
}


def object_paths(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema with named properties, by dotted path ("" is the document)."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        if "properties" in sub:
            yield from object_paths(sub, f"{path}.{name}" if path else name)


def property_paths(schema: dict[str, Any]) -> set[str]:
    return {f"{p}.{n}" if p else n for p, s in object_paths(schema) for n in s["properties"]}


def doc_paths(doc: dict[str, Any], schema: dict[str, Any], path: str = "") -> set[str]:
    """Dotted paths of a document's keys, descending where the schema names properties."""
    out = set()
    for key, value in doc.items():
        p = f"{path}.{key}" if path else key
        out.add(p)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            out |= doc_paths(value, sub, p)
    return out


def problems_of(doc: Any) -> list[dict[str, str]]:
    try:
        parse_job(doc)
    except ValidationFailed as exc:
        return exc.details
    return []


def validator(schema: dict[str, Any]) -> Any:
    osv = pytest.importorskip("openapi_schema_validator", reason="openapi-spec-validator is not installed")
    return osv.OAS30Validator({**schema, "components": openapi_document()["components"]},
                              format_checker=osv.oas30_format_checker)


# ---- the document ---------------------------------------------------------------------


@module_loop
async def test_openapi_json_is_served(api: Cluster) -> None:
    resp = await api.client.get("/openapi.json")
    assert resp.status == 200 and resp.content_type == "application/json"
    doc = await resp.json()
    assert doc == json.loads(json.dumps(openapi_document()))
    assert doc["openapi"].startswith("3.0") and doc["paths"]


def test_the_document_is_valid_openapi() -> None:
    osv = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator is not installed")
    osv.validate(openapi_document())


@module_loop
async def test_every_route_is_in_the_spec_and_every_spec_path_is_routed(api: Cluster) -> None:
    routed: set[tuple[str, str]] = set()
    for app in (api.client.server.app, api.secured.server.app):
        assert app is not None
        for resource in app.router.resources():
            for route in resource:
                if route.method != "HEAD":
                    routed.add((route.method, resource.canonical))
    # Routes declared openapi=False (the dashboard's page and assets) are not the JSON API.
    undocumented = {(r.method, r.path) for r in ROUTES if not r.openapi}
    assert not [p for _, p in undocumented if p.startswith("/v1/")], "every /v1 route belongs in /openapi.json"
    spec = openapi_document()
    documented = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert routed - undocumented - documented == set(), "routes missing from /openapi.json"
    assert documented - routed == set(), "/openapi.json paths no route serves"
    for path, ops in spec["paths"].items():
        placeholders = set(re.findall(r"{(\w+)}", path))
        for method, op in ops.items():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == placeholders, f"{method.upper()} {path}: path parameters {declared}"
            assert all(p["required"] for p in op.get("parameters", []) if p["in"] == "path")
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(set(ids)) == len(ids), "operationIds must be unique"


@module_loop
async def test_representative_statuses_are_documented(api: Cluster) -> None:
    """One request per status the API gives; the recorder holds each to the spec."""
    name = api.name()
    c, s = api.client, api.secured
    big = io.BytesIO(json.dumps(api.doc(name, description="x" * (1 << 20))).encode())
    requests = [
        (c.post("/v1/jobs", json=api.doc(name)), 201),
        (c.put(f"/v1/jobs/{name}", json=api.doc(name)), 200),
        (c.post("/v1/jobs", json=api.doc(name)), 409),
        (c.post("/v1/jobs", json={"name": name}), 400),
        (c.get("/v1/jobs/no-such-job"), 404),
        (c.post(f"/v1/jobs/{name}/run"), 202),
        (c.post("/v1/jobs", data=big, headers={"Content-Type": "application/json"}), 413),
        (s.get("/v1/jobs"), 401),
        (s.delete(f"/v1/jobs/{name}", headers={"Authorization": "Bearer r"}), 403),
        (c.get("/v1/runs?limit=0"), 400),
        (c.delete(f"/v1/jobs/{name}"), 200),
    ]
    for request, status in requests:
        resp = await request
        assert resp.status == status, await resp.text()
    seen = {st for _, _, st in api.seen}
    assert {200, 201, 202, 400, 401, 403, 404, 409, 413} <= seen
    spec = openapi_document()
    for method, path, status in api.seen:
        assert str(status) in spec["paths"][path][method.lower()]["responses"], (method, path, status)


@module_loop
async def test_the_recorder_can_fail(api: Cluster) -> None:
    """The conftest recorder flags an undocumented status, a body off its schema, a bad error."""

    async def teapot(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"}, status=418)

    async def bad_health(request: web.Request) -> web.Response:
        return web.json_response({"node_id": 5})

    async def bad_error(request: web.Request) -> web.Response:
        return web.json_response({"message": "no"}, status=404)

    app = web.Application(middlewares=[api.middleware()])
    app.router.add_get("/v1/health", teapot)
    app.router.add_get("/v1/cluster", bad_health)
    app.router.add_get("/v1/jobs/{name}", bad_error)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        for path in ("/v1/health", "/v1/cluster", "/v1/jobs/x"):
            await (await client.get(path)).read()
    finally:
        await client.close()
    found, api.problems[:] = "\n".join(api.problems), []
    assert "-> 418: status not documented" in found
    assert "/v1/cluster -> 200: body breaks the documented schema" in found
    assert "/v1/jobs/x -> 404: error body" in found


# ---- the job document against scheduler.model ----------------------------------------------


def test_the_full_documents_use_every_schema_property_and_parse() -> None:
    names = property_paths(JOB_DOCUMENT)
    used = doc_paths(FULL_HTTP, JOB_DOCUMENT) | doc_paths(FULL_SHELL, JOB_DOCUMENT)
    assert names - used == set(), "extend FULL_HTTP/FULL_SHELL to use every property"
    assert used - names == set()
    for doc in (FULL_HTTP, FULL_SHELL):
        assert problems_of(doc) == []
        assert list(validator(JOB_DOCUMENT).iter_errors(doc)) == []


@pytest.mark.parametrize("path", sorted(property_paths(JOB_DOCUMENT)))
def test_each_schema_property_is_a_field_the_model_knows(path: str) -> None:
    doc = copy.deepcopy(FULL_SHELL if path.startswith("shell") else FULL_HTTP)
    unknown = [p for p in problems_of(doc) if p["message"] == "unknown field"]
    assert unknown == []
    # and with only that property set (others at their defaults), it is still no unknown field
    base: dict[str, Any] = {"name": "x", "schedule": "@hourly", "executor": doc["executor"]}
    base[doc["executor"]] = {"command": "true"} if doc["executor"] == "shell" else {"url": "https://h.test/"}
    *parents, leaf = path.split(".")
    source: Any = doc
    target: dict[str, Any] = base
    for key in parents:  # nested sections (shell.limits) too
        source = source[key]
        target[key] = dict(target.get(key) or {})
        target = target[key]
    target[leaf] = source[leaf]
    assert not [p for p in problems_of(base) if p["field"] == path and p["message"] == "unknown field"]


@pytest.mark.parametrize("path", [p for p, _ in object_paths(JOB_DOCUMENT)])
def test_a_property_outside_the_schema_is_refused(path: str) -> None:
    doc = copy.deepcopy(FULL_SHELL if path.startswith("shell") else FULL_HTTP)
    target = doc
    for key in filter(None, path.split(".")):
        target = target[key]
    target["zz_extra"] = 1
    where = f"{path}.zz_extra" if path else "zz_extra"
    assert {"field": where, "message": "unknown field"} in problems_of(doc)
    schema = JOB_DOCUMENT
    for key in filter(None, path.split(".")):
        schema = schema["properties"][key]
    assert schema["additionalProperties"] is False


def test_the_canonical_document_is_what_the_schema_describes() -> None:
    assert list(JOB_DOCUMENT["properties"]) == list(_JOB_FIELDS)
    for doc in (FULL_HTTP, FULL_SHELL, {"name": "m", "executor": "http", "http": {"url": "https://h.test/"},
                                        "schedule": "@manually"}):
        canonical = parse_job(doc).to_doc()
        assert doc_paths(canonical, JOB_DOCUMENT) <= property_paths(JOB_DOCUMENT)
        assert list(validator(JOB_DOCUMENT).iter_errors(canonical)) == []
        assert parse_job(canonical).to_doc() == canonical
