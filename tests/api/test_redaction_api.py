"""Job secrets through the API: masked for the read-only token in every view and list, shown to
the write token and on a cluster without tokens, and kept when a masked document is PUT back.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

W = {"Authorization": "Bearer w"}
R = {"Authorization": "Bearer r"}
URL = "https://ops:hunter2@api.example/v1/ping?api_key=K3Y#tok=F7"
MASKED_URL = "https://***@api.example/v1/ping?***#***"
HOOK = "https://hooks.example/services/T0/B0/H00K"
HEADERS = {"Authorization": "Bearer T0K", "X-Trace": "plain"}
ENV = {"DB_PASSWORD": "pw1", "MODE": "fast"}
SECRETS = ("hunter2", "K3Y", "F7", "T0K", "plain", "H00K", "pw1", "fast")


def http_job(name: str) -> dict[str, Any]:
    return {"name": name, "schedule": "@hourly", "executor": "http", "http": {"url": URL, "headers": HEADERS},
            "alerts": {"webhook": HOOK, "on": ["failure"]}}


def shell_job(name: str) -> dict[str, Any]:
    return {"name": name, "schedule": "@hourly", "executor": "shell",
            "shell": {"command": ["env"], "env": ENV}}


async def store(api: Cluster, doc: dict[str, Any]) -> None:
    resp = await api.secured.put(f"/v1/jobs/{doc['name']}", json=doc, headers=W)
    assert resp.status == 201, await resp.text()


async def get(api: Cluster, path: str, headers: dict[str, str] | None) -> tuple[dict[str, Any], str]:
    client = api.client if headers is None else api.secured
    resp = await client.get(path, headers=headers or {})
    text = await resp.text()
    assert resp.status == 200, text
    return json.loads(text), text


def assert_masked(spec: dict[str, Any], raw: str) -> None:
    if spec["executor"] == "http":
        assert spec["http"]["url"] == MASKED_URL
        assert spec["http"]["headers"] == {"Authorization": "***", "X-Trace": "***"}
        assert spec["alerts"]["webhook"] == "***"
    else:
        assert spec["shell"]["env"] == {"DB_PASSWORD": "***", "MODE": "***"}
    leaked = [s for s in SECRETS if s in raw]
    assert not leaked, f"the read-only answer holds {leaked}"


def assert_shown(spec: dict[str, Any]) -> None:
    if spec["executor"] == "http":
        assert spec["http"]["url"] == URL and spec["http"]["headers"] == HEADERS
        assert spec["alerts"]["webhook"] == HOOK
    else:
        assert spec["shell"]["env"] == ENV


async def test_the_read_token_gets_every_secret_masked_in_get_and_list(api: Cluster) -> None:
    names = [api.name("mask"), api.name("mask")]
    await store(api, http_job(names[0]))
    await store(api, shell_job(names[1]))
    for name in names:
        body, raw = await get(api, f"/v1/jobs/{name}", R)
        assert_masked(body["spec"], raw)
    listed, raw = await get(api, "/v1/jobs?q=mask-&limit=1000", R)
    specs = [j["spec"] for j in listed["items"] if j["name"] in names]
    assert len(specs) == 2
    for spec in specs:
        assert_masked(spec, json.dumps(spec))
    assert not [s for s in SECRETS if s in raw]


@pytest.mark.parametrize("headers", [W, None], ids=["write-token", "no-tokens"])
async def test_writers_and_clusters_without_tokens_see_every_secret(api: Cluster,
                                                                    headers: dict[str, str] | None) -> None:
    names = [api.name("shown"), api.name("shown")]
    await store(api, http_job(names[0]))
    await store(api, shell_job(names[1]))
    for name in names:
        body, _ = await get(api, f"/v1/jobs/{name}", headers)
        assert_shown(body["spec"])
    listed, _ = await get(api, "/v1/jobs?q=shown-&limit=1000", headers)
    specs = [j["spec"] for j in listed["items"] if j["name"] in names]
    assert len(specs) == 2
    for spec in specs:
        assert_shown(spec)


def masked(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as a read-only caller is shown it."""
    if doc["executor"] == "http":
        return {**doc, "http": {"url": MASKED_URL, "headers": dict.fromkeys(HEADERS, "***")},
                "alerts": {**doc["alerts"], "webhook": "***"}}
    return {**doc, "shell": {**doc["shell"], "env": dict.fromkeys(ENV, "***")}}


@pytest.mark.parametrize("make", [http_job, shell_job])
async def test_a_masked_document_put_back_keeps_the_stored_secrets(api: Cluster, make: Any) -> None:
    name = api.name("roundtrip")
    await store(api, make(name))
    # Built by hand rather than fetched, so this holds whatever the read views do.
    doc = masked(make(name))

    resp = await api.secured.put(f"/v1/jobs/{name}", json=doc, headers=W)
    body = await resp.json()
    assert resp.status == 200, body
    assert body["change"] == "unchanged" and body["version"] == 1
    assert_shown(body["spec"])

    edited = {**doc, "description": "edited where the secrets were masked"}
    resp = await api.secured.put(f"/v1/jobs/{name}", json=edited, headers=W)
    body = await resp.json()
    assert resp.status == 200 and body["change"] == "configured", body
    stored, _ = await get(api, f"/v1/jobs/{name}", W)
    assert stored["spec"]["description"] == "edited where the secrets were masked"
    assert_shown(stored["spec"])


async def test_a_mask_where_nothing_is_stored_is_a_400_naming_the_field(api: Cluster) -> None:
    name = api.name("nothing")
    doc = {"name": name, "schedule": "@hourly", "executor": "http",
           "http": {"url": "https://h.example/x?***", "headers": {"Authorization": "***"}},
           "alerts": {"webhook": "***"}}
    resp = await api.secured.post("/v1/jobs", json=doc, headers=W)
    await api.error(resp, 400, "http.url", "http.headers.Authorization", "alerts.webhook", code="invalid")
    assert (await api.secured.get(f"/v1/jobs/{name}", headers=W)).status == 404

    await store(api, shell_job(name))
    resp = await api.secured.put(f"/v1/jobs/{name}",
                                 json={**shell_job(name), "shell": {"command": ["env"], "env": {"NEW": "***"}}},
                                 headers=W)
    await api.error(resp, 400, "shell.env.NEW", code="invalid")
    kept, _ = await get(api, f"/v1/jobs/{name}", W)
    assert kept["spec"]["shell"]["env"] == ENV and kept["version"] == 1

