"""/v1/runs and /v1/dead-letters against a real single-node cluster.

No worker runs: attempts move on only by the StartRuns/FinishRuns commands a
test commits itself, as a worker on n1 would.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from scheduler.commands import StartRuns
from scheduler.instants import us

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


def slot(day: int) -> int:
    return us(datetime(2030, 1, day, 12, 0, tzinfo=UTC))


async def items(api: Cluster, path: str) -> list[dict[str, Any]]:
    resp = await api.client.get(path)
    body = await resp.json()
    assert resp.status == 200, body
    return list(body["items"])


async def ids(api: Cluster, path: str) -> list[str]:
    return [r["id"] for r in await items(api, path)]


async def test_get_run_shows_a_finished_attempt_with_its_output(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = await api.claim(name)
    await api.finish(run_id, "succeeded", output="report written\n")
    resp = await api.client.get(f"/v1/runs/{run_id}")
    run = await resp.json()
    assert resp.status == 200, run
    assert run["status"] == "succeeded" and run["job"] == name and run["node"] == "n1"
    assert run["output"] == "report written\n" and run["http_status"] == 200 and run["duration_ms"] == 1
    assert run["started_at"] and run["finished_at"] and run["claimed_at"]
    await api.error(await api.client.get("/v1/runs/r0"), 404, code="not_found")


async def test_runs_list_filters_by_status_job_since_until(api: Cluster) -> None:
    a, b = api.name(), api.name()
    await api.create(a)
    await api.create(b)
    a1, a2, a3 = [await api.claim(a, slot_us=slot(d)) for d in (1, 2, 3)]
    b1 = await api.claim(b, slot_us=slot(2))
    await api.finish(a2, "failed")

    assert await ids(api, f"/v1/runs?job={a}") == [a3, a2, a1]
    assert await ids(api, f"/v1/runs?job={a}&status=failed") == [a2]
    assert await ids(api, f"/v1/runs?job={a}&status=claimed") == [a3, a1]
    assert await ids(api, "/v1/runs?job=no-such-job") == []
    since, until = "2030-01-02T00:00:00Z", "2030-01-02T23:59:59Z"
    assert await ids(api, f"/v1/runs?since={since}&until={until}") == [b1, a2]
    assert await ids(api, f"/v1/runs?job={a}&since=2030-01-02T12:00:00Z") == [a3, a2]  # since is inclusive
    assert await ids(api, f"/v1/runs?job={a}&until=2030-01-02T12:00:00%2B00:00") == [a2, a1]  # so is until
    everything = await ids(api, "/v1/runs")
    assert {a1, a2, a3, b1} <= set(everything)
    assert everything == sorted(everything, key=lambda r: int(r[1:], 16), reverse=True)  # newest first

    for query, fieldname in (("since=tomorrow", "query.since"), ("until=2030-13-01T00:00:00Z", "query.until"),
                             ("status=asleep", "query.status"), ("limit=-1", "query.limit"), ("x=1", "query.x")):
        await api.error(await api.client.get(f"/v1/runs?{query}"), 400, fieldname)


async def test_runs_pages_have_no_duplicates_or_omissions(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    made = [await api.claim(name) for _ in range(7)]
    pages: list[list[str]] = []
    cursor: str | None = None
    for _ in range(6):
        q = f"/v1/runs?job={name}&limit=3" + (f"&cursor={cursor}" if cursor else "")
        body = await (await api.client.get(q)).json()
        pages.append([r["id"] for r in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert cursor is None, "paging did not end"
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [r for p in pages for r in p] == made[::-1]

    for garbage in ("YWJj", "%%%", "A", "LTE"):  # "abc", junk, not base64, "-1"
        await api.error(await api.client.get(f"/v1/runs?cursor={garbage}"), 400, "query.cursor")


async def test_cancel_a_claimed_run_once(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = (await (await api.client.post(f"/v1/jobs/{name}/run")).json())["run_id"]
    resp = await api.client.post(f"/v1/runs/{run_id}/cancel")
    run = await resp.json()
    assert resp.status == 200, run
    assert run["id"] == run_id and run["status"] == "cancelled" and run["finished_at"]
    assert (await (await api.client.get(f"/v1/runs/{run_id}")).json())["status"] == "cancelled"
    await api.error(await api.client.post(f"/v1/runs/{run_id}/cancel"), 409, code="conflict")

    done = await api.claim(name)
    await api.finish(done, "succeeded")
    await api.error(await api.client.post(f"/v1/runs/{done}/cancel"), 409)
    assert (await (await api.client.get(f"/v1/runs/{done}")).json())["status"] == "succeeded"
    await api.error(await api.client.post("/v1/runs/r0/cancel"), 404)


async def test_a_running_run_can_be_cancelled(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = await api.claim(name)
    now = us(datetime.now(UTC))
    await api.commit(StartRuns(at_us=now, node="n1", runs=(run_id,), started_us={run_id: now},
                               lease_until_us=now + 60_000_000))
    resp = await api.client.post(f"/v1/runs/{run_id}/cancel")
    assert resp.status == 200 and (await resp.json())["status"] == "cancelled"


async def test_dead_letters_list_replay_and_delete(api: Cluster) -> None:
    name, other = api.name(), api.name()
    await api.create(name, retries={"max": 1, "backoff": "1s"})
    await api.create(other, retries={"max": 1})
    dead = await api.dead_letter(name)
    dead2 = await api.dead_letter(name)
    dead_other = await api.dead_letter(other)

    listed = await items(api, "/v1/dead-letters")
    assert [r["id"] for r in listed][:3] == [dead_other, dead2, dead]
    assert all(r["status"] == "dead" for r in listed)
    assert await ids(api, f"/v1/dead-letters?job={name}") == [dead2, dead]
    assert await ids(api, f"/v1/runs?status=dead&job={name}") == [dead2, dead]
    page = await (await api.client.get(f"/v1/dead-letters?job={name}&limit=1")).json()
    assert [r["id"] for r in page["items"]] == [dead2] and page["next_cursor"]
    rest = await ids(api, f"/v1/dead-letters?job={name}&limit=1&cursor={page['next_cursor']}")
    assert rest == [dead]

    resp = await api.client.post(f"/v1/dead-letters/{dead}/replay")
    body = await resp.json()
    assert resp.status == 202, body
    replay = await (await api.client.get(f"/v1/runs/{body['run_id']}")).json()
    assert replay["trigger"] == "replay" and replay["status"] == "claimed" and replay["retry_of"] == dead
    assert replay["attempt"] == 3 and replay["slot"] == (await (await api.client.get(f"/v1/runs/{dead}")).json())["slot"]
    assert await ids(api, f"/v1/dead-letters?job={name}") == [dead2]
    await api.error(await api.client.post(f"/v1/dead-letters/{dead}/replay"), 404)

    resp = await api.client.delete(f"/v1/dead-letters/{dead2}")
    assert resp.status == 200 and (await resp.json()) == {"deleted": dead2}
    assert await ids(api, f"/v1/dead-letters?job={name}") == []
    await api.error(await api.client.delete(f"/v1/dead-letters/{dead2}"), 404)
    await api.error(await api.client.delete("/v1/dead-letters/r0"), 404)
    await api.error(await api.client.post("/v1/dead-letters/r0/replay"), 404)
    await api.error(await api.client.post(f"/v1/dead-letters/{replay['id']}/replay"), 404)  # not dead
    assert await ids(api, f"/v1/dead-letters?job={other}") == [dead_other]
    await api.error(await api.client.get("/v1/dead-letters?cursor=zz!"), 400, "query.cursor")


async def test_runs_across_jobs_filter_by_node(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = await api.claim(name)  # claimed for n1, the module cluster's one node
    assert run_id in await ids(api, f"/v1/runs?node=n1&job={name}")
    assert run_id in await ids(api, "/v1/runs?node=n1&limit=1000")
    assert await ids(api, f"/v1/runs?node=n9&job={name}") == []
