"""Health, cluster status, members, and bearer tokens, against a real single-node cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from api.app import ROUTES
from api.routing import Route

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_health(api: Cluster) -> None:
    resp = await api.client.get("/v1/health")
    assert resp.status == 200 and (await resp.json()) == {"status": "ok", "node_id": "n1", "caught_up": True}


async def test_a_node_catching_up_after_its_start_refuses_reads_of_the_state(
        api: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Restarted, a node answers from the state it restored until a leader says what is
    # committed: measured before this, all three nodes of a restarted cluster answered 404 for a
    # job written 60 times, for 2.7 s. Such a node now answers 503 (the CLI retries it) unless
    # asked stale=true; health, cluster status and writes still answer.
    assert (await api.client.put("/v1/jobs/catching", json=api.doc("catching"))).status in (200, 201)
    real = api.node.status
    monkeypatch.setattr(api.node, "status", lambda: dataclasses.replace(real(), caught_up=False))
    for path in ("/v1/jobs", "/v1/jobs/catching", "/v1/jobs/catching/runs", "/v1/jobs/catching/explain",
                 "/v1/runs", "/v1/dead-letters"):
        resp = await api.client.get(path)
        body = await resp.json()
        assert resp.status == 503, (path, body)
        assert "catching up after its start" in body["error"]["message"] and "stale=true" in body["error"]["message"]
        assert resp.headers["Retry-After"] == "1"
        stale = await api.client.get(path, params={"stale": "true"})
        assert stale.status == 200, (path, await stale.text())
    bad = await api.client.get("/v1/jobs", params={"stale": "yes"})
    assert bad.status == 400 and "query.stale" in await bad.text()
    health = await api.client.get("/v1/health")
    assert health.status == 200 and (await health.json())["caught_up"] is False
    assert (await (await api.client.get("/v1/cluster")).json())["caught_up"] is False
    assert (await api.client.put("/v1/jobs/catching", json=api.doc("catching", description="x"))).status == 200
    monkeypatch.undo()
    assert (await api.client.get("/v1/jobs/catching")).status == 200


async def test_cluster_names_n1_as_leader(api: Cluster) -> None:
    resp = await api.client.get("/v1/cluster")
    body = await resp.json()
    assert resp.status == 200, body
    assert body["node_id"] == "n1" and body["state"] == "leader" and body["term"] >= 1
    assert body["leader"] == {"node_id": "n1", "raft_addr": api.raft_addr, "http_addr": "127.0.0.1:0"}
    assert body["commit_index"] >= body["applied_index"] >= 1 and body["has_quorum"] is True
    [me] = body["members"]
    assert me["node_id"] == "n1" and me["raft_addr"] == api.raft_addr
    assert me["role"] == "leader" and me["reachable"] is True


async def test_members_list(api: Cluster) -> None:
    body = await (await api.client.get("/v1/members")).json()
    assert body["next_cursor"] is None
    assert [(m["node_id"], m["role"], m["reachable"]) for m in body["items"]] == [("n1", "leader", True)]


async def test_member_changes_that_are_refused(api: Cluster) -> None:
    for bad, fieldname in (({}, "raft_addr"), ({"raft_addr": "no-port"}, "raft_addr"),
                           ({"raft_addr": "host:port"}, "raft_addr"), ({"raft_addr": "host:70000"}, "raft_addr"),
                           ({"raft_addr": ":4321"}, "raft_addr"), ({"raft_addr": 4321}, "raft_addr"),
                           ({"raft_addr": "h:1", "role": "voter"}, "role")):
        await api.error(await api.client.post("/v1/members", json=bad), 400, fieldname)
    await api.error(await api.client.post("/v1/members", json=["h:1"]), 400, "$")
    await api.error(await api.client.post("/v1/members", json={"raft_addr": api.raft_addr}), 409)
    await api.error(await api.client.delete("/v1/members/n1"), 409)
    await api.error(await api.client.delete(f"/v1/members/{api.raft_addr}"), 409)
    await api.error(await api.client.delete("/v1/members/n9"), 404)
    assert len((await (await api.client.get("/v1/members")).json())["items"]) == 1


# ---- tokens ----------------------------------------------------------------------------


async def _targets(api: Cluster) -> list[tuple[str, str, Any, Route]]:
    """One concrete request per route, each valid for the write token."""
    name, gone = api.name(), api.name()
    await api.create(name)
    await api.create(gone)
    run_id = await api.claim(name)
    await api.create(dj := api.name(), retries={"max": 1})
    dead, dead2 = await api.dead_letter(dj), await api.dead_letter(dj)
    fill = {"name": name, "id": run_id, "member": "n9"}
    special: dict[tuple[str, str], tuple[str, Any]] = {
        ("POST", "/v1/jobs"): ("/v1/jobs", api.doc(api.name())),
        ("PUT", "/v1/jobs/{name}"): (f"/v1/jobs/{name}", api.doc(name, description="put")),
        ("DELETE", "/v1/jobs/{name}"): (f"/v1/jobs/{gone}", None),
        ("POST", "/v1/dead-letters/{id}/replay"): (f"/v1/dead-letters/{dead}/replay", None),
        ("DELETE", "/v1/dead-letters/{id}"): (f"/v1/dead-letters/{dead2}", None),
        ("POST", "/v1/members"): ("/v1/members", {"raft_addr": api.raft_addr}),  # 409: never a real change
        ("POST", "/v1/jobs:batch"): ("/v1/jobs:batch", {"mode": "apply", "jobs": [api.doc(api.name())]}),
        ("GET", "/v1/watch"): ("/v1/watch?after=0", None),  # applied past 0 already: answers at once
    }
    out = []
    for r in ROUTES:
        path, body = special.get((r.method, r.path), (r.path.format(**fill), None))
        out.append((r.method, path, body, r))
    return out


async def test_only_health_and_the_dashboard_files_are_public() -> None:
    public = {(r.method, r.path) for r in ROUTES if r.public}
    assert ("GET", "/v1/health") in public
    # SPEC 3 names /v1/health alone; the dashboard's static files (no cluster data, not the JSON
    # API) are public too because a browser navigating to /ui/ cannot send a bearer token.
    assert {p for m, p in public if (m, p) != ("GET", "/v1/health")} <= {r.path for r in ROUTES if not r.openapi}
    assert all(p == "/ui" or p.startswith("/ui/") for m, p in public if p != "/v1/health")


async def test_without_a_token_everything_but_health_is_401(api: Cluster) -> None:
    for method, path, body, route in await _targets(api):
        resp = await api.secured.request(method, path, json=body, allow_redirects=False)
        if route.public:
            assert resp.status in (200, 302), (path, resp.status)
            continue
        err = await api.error(resp, 401, code="unauthorized")
        assert "Authorization: Bearer" in err["message"]
    for path in ("/v1/nothing-here", "/openapi.json"):
        await api.error(await api.secured.get(path), 401)


async def test_a_wrong_token_is_401(api: Cluster) -> None:
    for header in ("Bearer nope", "Bearer", "Basic dzp3", "w", "Bearer w2", "Bearer rw"):
        resp = await api.secured.get("/v1/jobs", headers={"Authorization": header})
        await api.error(resp, 401, code="unauthorized")
    name = api.name()
    await api.error(await api.secured.put(f"/v1/jobs/{name}", json=api.doc(name),
                                          headers={"Authorization": "Bearer nope"}), 401)
    assert name not in api.state.jobs


def _ledger(api: Cluster) -> tuple[Any, ...]:
    return ({n: r["version"] for n, r in api.state.jobs.items()}, sorted(api.state.runs), sorted(api.state.dead),
            {rid: r["status"] for rid, r in api.state.runs.items()})


async def test_the_read_token_reads_but_cannot_write(api: Cluster) -> None:
    read = {"Authorization": "Bearer r"}
    targets = await _targets(api)
    before = _ledger(api)
    for method, path, body, _ in targets:
        resp = await api.secured.request(method, path, json=body, headers=read)
        if method == "GET":
            assert resp.status == 200, (path, await resp.text())
        else:
            err = await api.error(resp, 403, code="forbidden")
            assert "read-only" in err["message"]
    assert _ledger(api) == before
    resp = await api.secured.get("/v1/jobs", headers={"Authorization": "bearer r"})  # the scheme is case-insensitive
    assert resp.status == 200


async def test_the_write_token_can_do_everything(api: Cluster) -> None:
    write = {"Authorization": "Bearer w"}
    expected = {"POST /v1/jobs": 201, "POST /v1/jobs/{name}/run": 202, "POST /v1/dead-letters/{id}/replay": 202,
                "POST /v1/members": 409, "DELETE /v1/members/{member}": 404}
    for method, path, body, route in await _targets(api):
        resp = await api.secured.request(method, path, json=body, headers=write)
        want = expected.get(f"{method} {route.path}", 200)
        assert resp.status == want, (method, path, resp.status, await resp.text())


async def test_watch_answers_when_the_node_applies_past_after_or_at_its_timeout(api: Cluster) -> None:
    index = (await (await api.client.get("/v1/cluster")).json())["applied_index"]
    now = await api.client.get("/v1/watch", params={"after": str(index - 1)})
    assert now.status == 200 and (await now.json())["applied_index"] >= index  # already past: at once
    waiting = asyncio.ensure_future(api.client.get("/v1/watch", params={"after": str(index), "timeout": "20"}))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing applied yet: it waits
    await api.create(api.name("watched"))
    resp = await asyncio.wait_for(waiting, 20)
    assert resp.status == 200 and (await resp.json())["applied_index"] > index
    quiet = await api.client.get("/v1/watch", params={"after": str(index + 10_000), "timeout": "1"})
    assert quiet.status == 200 and (await quiet.json())["applied_index"] < index + 10_000  # its timeout
    await api.error(await api.client.get("/v1/watch"), 400, "query.after")
    await api.error(await api.client.get("/v1/watch?after=1&timeout=60"), 400, "query.timeout")
