"""The list of jobs as the dashboard reads it: each job's recent runs in the same answer, the
filters that find the one that failed (state, last outcome, label, text), and the sorts, each
paged by its own cursor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _list(api: Cluster, **query: Any) -> dict[str, Any]:
    resp = await api.client.get("/v1/jobs", params=query)
    body = await resp.json()
    assert resp.status == 200, body
    return dict(body)


async def _names(api: Cluster, **query: Any) -> list[str]:
    return [j["name"] for j in (await _list(api, **query))["items"]]


async def _jobs(api: Cluster) -> tuple[str, str, str, str, str]:
    p = api.name("find")
    ok, bad, never, paused = f"{p}-a-ok", f"{p}-b-bad", f"{p}-c-never", f"{p}-d-paused"
    for n in (ok, bad, never):
        await api.create(n, labels={"team": p})
    await api.create(paused, paused=True, labels={"team": p})
    for _ in range(3):
        await api.finish(await api.claim(ok))
    await api.finish(await api.claim(bad))
    for _ in range(2):
        await api.finish(await api.claim(bad), "failed")
    return p, ok, bad, never, paused


async def test_one_request_carries_each_jobs_recent_runs_and_the_failing_count(api: Cluster) -> None:
    p, ok, bad, never, paused = await _jobs(api)
    body = await _list(api, q=p, include="recent_runs")
    by = {j["name"]: j for j in body["items"]}
    assert list(by) == [ok, bad, never, paused]
    assert [r["status"] for r in by[bad]["recent_runs"]] == ["failed", "failed", "succeeded"]
    assert [r["status"] for r in by[ok]["recent_runs"]] == ["succeeded"] * 3
    assert by[never]["recent_runs"] == [] and by[bad]["recent_runs"][0]["duration_ms"] == 1
    assert set(by[bad]["recent_runs"][0]) == {"id", "slot", "status", "attempt", "node", "trigger", "duration_ms"}
    assert body["total"] >= 4 and body["failing"] >= 1
    assert "recent_runs" not in (await _list(api, q=p))["items"][0]  # only when asked
    cursor = (await _list(api, q=p, limit=1))["next_cursor"]
    assert "failing" not in await _list(api, q=p, limit=1, cursor=cursor)  # first page only


async def test_filters_find_the_job_that_failed(api: Cluster) -> None:
    p, ok, bad, never, paused = await _jobs(api)
    assert await _names(api, q=p, status="failing") == [bad]
    assert await _names(api, q=p, status="never_run") == [never, paused]
    assert await _names(api, q=p, last="succeeded") == [ok]
    assert await _names(api, label=f"team={p}", last="failed") == [bad]
    assert await _names(api, q="b-bad", label=f"team={p}") == [bad]
    assert await _names(api, q=p, status="paused") == [paused]


async def test_each_sort_orders_and_pages_by_its_own_cursor(api: Cluster) -> None:
    p, ok, bad, never, paused = await _jobs(api)
    assert (await _names(api, q=p, sort="failures"))[0] == bad
    assert (await _names(api, q=p, sort="last_failure"))[0] == bad
    by_next = await _names(api, q=p, sort="next_slot")
    assert by_next[-1] == paused and set(by_next) == {ok, bad, never, paused}  # paused: no next slot, last
    for sort in ("name", "next_slot", "last_failure", "failures"):
        whole = await _names(api, q=p, sort=sort)
        paged: list[str] = []
        cursor = None
        for _ in range(10):  # bounded: four jobs, a page each
            body = await _list(api, q=p, sort=sort, limit=1, **({"cursor": cursor} if cursor else {}))
            paged += [j["name"] for j in body["items"]]
            cursor = body["next_cursor"]
            if not cursor:
                break
        assert paged == whole, sort


async def test_a_bad_sort_filter_or_cursor_names_its_field(api: Cluster) -> None:
    await api.error(await api.client.get("/v1/jobs?sort=age"), 400, "query.sort")
    await api.error(await api.client.get("/v1/jobs?last=exploded"), 400, "query.last")
    await api.error(await api.client.get("/v1/jobs?include=everything"), 400, "query.include")
    name_cursor = (await _list(api, limit=1))["next_cursor"]
    assert name_cursor  # the module's cluster holds more than one job
    await api.error(await api.client.get(f"/v1/jobs?sort=failures&cursor={name_cursor}"), 400, "query.cursor")
