"""Issue 12 at the API: bounded instants, dependency cycles refused with their field, and a job
whose view cannot be computed answered 200 with its error (never a 500 for the whole list)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize(("field", "value"), [
    ("starts_at", "9999-12-31T23:59:59Z"),
    ("ends_at", "9001-01-01T00:00:00Z"),
    ("schedule", "@at 9999-01-01T00:00:00Z"),
])
async def test_an_instant_beyond_year_9000_is_a_400_naming_its_field(api: Cluster, field: str, value: str) -> None:
    name = api.name()
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, **{field: value}))
    err = await api.error(resp, 400, field, code="invalid")
    assert "end of year 9000" in err["message"]
    assert name not in api.state.jobs


async def test_a_dependency_cycle_is_a_400_naming_the_cycle_and_the_field(api: Cluster) -> None:
    a, b = api.name("a"), api.name("b")
    await api.create(a)
    await api.create(b, schedule=None, depends_on={"job": a})
    resp = await api.client.put(f"/v1/jobs/{a}", json=api.doc(a, depends_on={"job": b}))
    err = await api.error(resp, 400, "depends_on.job", code="invalid")
    assert f"{a} -> {b} -> {a}" in err["message"]
    assert api.state.jobs[a]["version"] == 1


async def test_a_job_whose_view_cannot_be_computed_answers_200_with_its_error(api: Cluster) -> None:
    name = api.name("stored-by-an-older-version")
    await api.create(name)
    # A document an older version stored before instants were bounded: it no longer parses.
    rec = api.state.jobs[name]
    api.state.jobs[name] = {**rec, "spec": {**rec["spec"], "starts_at": "9999-12-31T23:59:59Z"}}
    api.state._parsed.pop(name, None)
    try:
        one = await api.client.get(f"/v1/jobs/{name}")
        body = await one.json()
        assert one.status == 200 and "starts_at" in body["error"] and body["status"]["next_slots"] == []
        listed = await api.client.get("/v1/jobs?limit=1000")
        items = (await listed.json())["items"]
        assert listed.status == 200 and [j["error"] for j in items if j["name"] == name] == [body["error"]]
    finally:
        api.state.jobs[name] = rec
        api.state._parsed.pop(name, None)


async def test_history_max_age_is_stored_as_written_and_a_bad_one_is_a_400_naming_it(api: Cluster) -> None:
    name = api.name("aged")
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, history={"keep": 10, "max_age": "2s"}))
    err = await api.error(resp, 400, "history.max_age", code="invalid")
    assert "between 1m and 3650d" in err["message"]
    assert name not in api.state.jobs
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, history={"keep": 10, "max_age": "720h"}))
    assert resp.status in (200, 201), await resp.text()
    got = await (await api.client.get(f"/v1/jobs/{name}")).json()
    assert got["spec"]["history"] == {"keep": 10, "max_age": "30d"}
    assert api.state.aged_jobs() == {**api.state.aged_jobs(), name: 30 * 86_400 * 1_000_000}
