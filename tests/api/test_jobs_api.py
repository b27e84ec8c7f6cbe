"""/v1/jobs against a real single-node cluster: the job store, run now, pause and
resume, a job's runs and explain, listing and paging, and every documented refusal.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def names(api: Cluster, query: str = "") -> list[str]:
    resp = await api.client.get("/v1/jobs" + query)
    assert resp.status == 200
    return [j["name"] for j in (await resp.json())["items"]]


# ---- create, replace, read, delete ---------------------------------------------


async def test_post_creates_201_then_409_for_the_same_name(api: Cluster) -> None:
    name = api.name()
    resp = await api.client.post("/v1/jobs", json=api.doc(name, labels={"team": "billing"}, timezone="Europe/Berlin"))
    body = await resp.json()
    assert resp.status == 201, body
    assert body["change"] == "created" and body["version"] == 1
    assert body["spec"]["labels"] == {"team": "billing"} and body["spec"]["timezone"] == "Europe/Berlin"
    assert body["spec"]["http"]["method"] == "POST"  # the canonical document has defaults filled in

    again = await api.client.post("/v1/jobs", json=api.doc(name, description="other"))
    await api.error(again, 409, code="conflict")
    kept = await (await api.client.get(f"/v1/jobs/{name}")).json()
    assert kept["spec"]["description"] == "" and kept["version"] == 1


async def test_a_put_reads_the_cluster_clock_once_and_its_view_is_dated_by_the_edit(
        api: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit's stamp and the view's next slots come from one reading (each costs a busy
    leader a look at the raft node's status)."""
    readings: list[int] = []
    stamp = 1_000_000_000_000_000 + 123  # 2001-09-09 01:46:40.000123: a view dated by the clock would say 2026
    service = api.service

    def reading() -> int:
        readings.append(stamp)
        return stamp

    monkeypatch.setattr(service, "cluster_now_us", reading)
    name = api.name()
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, schedule="*/10 * * * *", timezone="UTC"))
    body = await resp.json()
    assert resp.status == 201, body
    assert readings == [stamp]
    assert api.state.jobs[name]["updated_us"] == stamp
    assert body["status"]["next_slots"][0] == "2001-09-09T01:50:00Z"


async def test_answers_are_utf8_json_and_keep_text_as_sent(api: Cluster) -> None:
    name = api.name()
    text = "Überweisung prüfen, 日次 \u2603, \U0001f600 and a \"quote\" \\ back"
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, description=text, labels={"owner": "zoë"}))
    assert resp.status == 201
    assert resp.headers["Content-Type"] == "application/json; charset=utf-8"
    raw = await resp.read()
    assert "Überweisung".encode() in raw  # written as UTF-8, not \u-escaped
    for got in (json.loads(raw), await (await api.client.get(f"/v1/jobs/{name}")).json()):
        assert got["spec"]["description"] == text and got["spec"]["labels"] == {"owner": "zoë"}


async def test_put_answers_created_configured_unchanged(api: Cluster) -> None:
    name = api.name()
    first = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name))
    assert first.status == 201 and (await first.json())["change"] == "created"

    changed = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, schedule="*/5 * * * *"))
    body = await changed.json()
    assert changed.status == 200 and body["change"] == "configured" and body["version"] == 2
    assert body["spec"]["schedule"] == "*/5 * * * *"

    same = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name, schedule="*/5 * * * *"))
    body = await same.json()
    assert same.status == 200 and body["change"] == "unchanged" and body["version"] == 2

    # a document without a name takes the URL's
    doc = api.doc(name, schedule="*/5 * * * *")
    del doc["name"]
    nameless = await api.client.put(f"/v1/jobs/{name}", json=doc)
    assert nameless.status == 200 and (await nameless.json())["change"] == "unchanged"


async def test_get_shows_the_job_and_its_state(api: Cluster) -> None:
    name = api.name()
    await api.create(name, schedule="0 2 * * *")
    body = await (await api.client.get(f"/v1/jobs/{name}")).json()
    assert body["name"] == name and body["spec"]["schedule"] == "0 2 * * *"
    status = body["status"]
    assert status["paused"] is False and status["last_run"] is None and status["consecutive_failures"] == 0
    assert len(status["next_slots"]) == 5 and all(s.endswith("T02:00:00Z") for s in status["next_slots"])

    run_id = await api.claim(name)
    await api.finish(run_id, "failed")
    status = (await (await api.client.get(f"/v1/jobs/{name}")).json())["status"]
    assert status["last_run"]["id"] == run_id and status["last_run"]["status"] == "failed"
    assert status["consecutive_failures"] == 1


async def test_get_of_a_missing_job_is_404(api: Cluster) -> None:
    err = await api.error(await api.client.get("/v1/jobs/no-such-job"), 404, code="not_found")
    assert "no-such-job" in err["message"]


async def test_delete_removes_the_job_and_its_history(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = await api.claim(name)
    resp = await api.client.delete(f"/v1/jobs/{name}")
    assert resp.status == 200 and (await resp.json()) == {"deleted": name}
    await api.error(await api.client.get(f"/v1/jobs/{name}"), 404)
    await api.error(await api.client.get(f"/v1/runs/{run_id}"), 404)
    await api.error(await api.client.delete(f"/v1/jobs/{name}"), 404)
    assert name not in await names(api)


# ---- refusals: 4xx in SPEC's shape, the field named, nothing stored ----------------

BAD_DOCUMENTS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("invalid JSON", "{not json", ("$",)),
    ("not an object", "[1, 2]", ("$",)),
    ("empty body", "", ("$",)),
    ("wrong types", {"paused": "yes", "timeout": True, "labels": ["a"], "retries": {"max": "3"}},
     ("paused", "timeout", "labels", "retries.max")),
    ("unknown field", {"colour": "red"}, ("colour",)),
    ("unknown nested field", {"retries": {"max": 1, "jitter": "1s"}, "http": {"url": "http://h.test/", "verb": "GET"}},
     ("retries.jitter", "http.verb")),
    ("bad cron", {"schedule": "61 * * * *"}, ("schedule",)),
    ("cron never matching", {"schedule": "0 0 31 2 *"}, ("schedule",)),
    ("unknown time zone", {"timezone": "Mars/Olympus_Mons"}, ("timezone",)),
    ("shell job without command", {"executor": "shell", "http": None, "shell": {"env": {"A": "b"}}},
     ("shell.command",)),
    ("every problem at once", {"schedule": "nope", "timezone": "Nowhere/X", "concurrency": "sometimes",
                               "target": {"count": 0}}, ("schedule", "timezone", "concurrency", "target.count")),
    ("list item path", {"http": {"url": "http://h.test/", "expect_status": [200, "ok"]}}, ("http.expect_status[1]",)),
    ("unpaired surrogate", {"description": "\ud800"}, ("description",)),
    ("integer beyond 64 bits", {"target": {"count": 10**30}}, ("target.count",)),
    ("float beyond 64 bits", {"retries": {"max": 1, "factor": 1e30}}, ("retries.factor",)),
    ("nesting too deep", "[" * 100_000 + "]" * 100_000, ("$",)),
]


def _body(api: Cluster, name: str, bad: Any) -> bytes:
    if isinstance(bad, str):
        return bad.encode()
    doc = {k: v for k, v in api.doc(name, **bad).items() if v is not None}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize(("case", "bad", "fields"), BAD_DOCUMENTS, ids=[c[0] for c in BAD_DOCUMENTS])
async def test_bad_document_is_400_naming_the_field_and_stores_nothing(
        api: Cluster, method: str, case: str, bad: Any, fields: tuple[str, ...]) -> None:
    name = api.name("bad")
    before = await names(api)
    url = "/v1/jobs" if method == "POST" else f"/v1/jobs/{name}"
    resp = await api.client.request(method, url, data=_body(api, name, bad), headers={"Content-Type": "application/json"})
    await api.error(resp, 400, *fields, code="invalid")
    await api.error(await api.client.get(f"/v1/jobs/{name}"), 404)
    assert await names(api) == before


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_name_breaking_the_pattern_is_400(api: Cluster, method: str) -> None:
    before = await names(api)
    for bad in ("Upper", "-dash-first", "a" * 64, "with space", "ünï"):
        url = "/v1/jobs" if method == "POST" else f"/v1/jobs/{bad}"
        await api.error(await api.client.request(method, url, json=api.doc(bad)), 400, "name")
    await api.error(await api.client.post("/v1/jobs", json={k: v for k, v in api.doc("x").items() if k != "name"}),
                   400, "name")
    assert await names(api) == before


async def test_put_with_a_different_name_in_the_body_is_400(api: Cluster) -> None:
    url_name, body_name = api.name(), api.name()
    err = await api.error(await api.client.put(f"/v1/jobs/{url_name}", json=api.doc(body_name)), 400, "name")
    assert url_name in err["message"]
    for n in (url_name, body_name):
        await api.error(await api.client.get(f"/v1/jobs/{n}"), 404)


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_body_over_1_mib_is_413(api: Cluster, method: str) -> None:
    name = api.name("big")
    before = await names(api)
    doc = api.doc(name, description="x" * (1 << 20))
    url = "/v1/jobs" if method == "POST" else f"/v1/jobs/{name}"
    data = io.BytesIO(json.dumps(doc).encode())  # raw bytes this large make aiohttp's client warn
    resp = await api.client.request(method, url, data=data, headers={"Content-Type": "application/json"})
    err = await api.error(resp, 413, code="payload_too_large")
    assert str(1 << 20) in err["message"]
    await api.error(await api.client.get(f"/v1/jobs/{name}"), 404)
    assert await names(api) == before


async def test_unknown_query_parameter_is_400_and_stores_nothing(api: Cluster) -> None:
    name = api.name()
    await api.error(await api.client.post("/v1/jobs?x=1", json=api.doc(name)), 400, "query.x")
    await api.error(await api.client.get(f"/v1/jobs/{name}"), 404)
    for path in ("/v1/jobs?x=1", "/v1/jobs/any?x=", "/v1/jobs/any/runs?x=1", "/v1/jobs/any/explain?x=1"):
        await api.error(await api.client.get(path), 400, "query.x")


async def test_bad_query_values_are_400(api: Cluster) -> None:
    for query, fieldname in (("limit=0", "query.limit"), ("limit=abc", "query.limit"), ("limit=1001", "query.limit"),
                             ("status=sleeping", "query.status"), ("label=noequals", "query.label")):
        await api.error(await api.client.get(f"/v1/jobs?{query}"), 400, fieldname)


async def test_unknown_path_and_method_answer_json_errors(api: Cluster) -> None:
    await api.error(await api.client.get("/v1/nothing-here"), 404, code="not_found")
    await api.error(await api.client.get("/v2/jobs"), 404, code="not_found")
    await api.error(await api.client.patch("/v1/jobs"), 405, code="method_not_allowed")


# ---- run now, pause, resume ---------------------------------------------------------


async def test_run_now_is_202_with_a_claimed_manual_run(api: Cluster) -> None:
    name = api.name()
    await api.create(name, schedule="@manually")
    resp = await api.client.post(f"/v1/jobs/{name}/run")
    body = await resp.json()
    assert resp.status == 202, body
    run = await (await api.client.get(f"/v1/runs/{body['run_id']}")).json()
    assert run["id"] == body["run_id"] and run["job"] == name
    assert run["status"] == "claimed" and run["trigger"] == "manual" and run["node"] == "n1"
    assert run["attempt"] == 1 and run["fencing_token"] > 0 and run["output"] == ""

    other = await (await api.client.post(f"/v1/jobs/{name}/run")).json()
    assert other["run_id"] != body["run_id"]
    await api.error(await api.client.post("/v1/jobs/no-such-job/run"), 404)


async def test_pause_and_resume_with_a_note(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    resp = await api.client.post(f"/v1/jobs/{name}/pause", json={"note": "db migration"})
    body = await resp.json()
    assert resp.status == 200, body
    assert body["status"]["paused"] is True and body["status"]["pause_note"] == "db migration"
    assert body["spec"]["paused"] is True and body["status"]["next_slots"] == []
    assert (await api.client.get(f"/v1/jobs?status=paused&q={name}")).status == 200
    assert name in await names(api, "?status=paused") and name not in await names(api, "?status=active")

    resp = await api.client.post(f"/v1/jobs/{name}/resume")  # no body at all
    body = await resp.json()
    assert resp.status == 200 and body["status"]["paused"] is False and len(body["status"]["next_slots"]) == 5
    assert name in await names(api, "?status=active")


async def test_pause_refusals(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    await api.error(await api.client.post(f"/v1/jobs/{name}/pause", json={"note": 5}), 400, "note")
    await api.error(await api.client.post(f"/v1/jobs/{name}/pause", json={"note": "x", "until": "later"}), 400, "until")
    await api.error(await api.client.post(f"/v1/jobs/{name}/pause", json=["x"]), 400, "$")
    await api.error(await api.client.post(f"/v1/jobs/{name}/pause", data=b"{oops"), 400, "$")
    assert (await (await api.client.get(f"/v1/jobs/{name}")).json())["status"]["paused"] is False
    await api.error(await api.client.post("/v1/jobs/no-such-job/pause", json={"note": "x"}), 404)
    await api.error(await api.client.post("/v1/jobs/no-such-job/resume"), 404)


# ---- a job's runs and explain ----------------------------------------------------------


async def test_job_runs_newest_first_with_status_filter_and_pages(api: Cluster) -> None:
    name, other = api.name(), api.name()
    await api.create(name)
    await api.create(other)
    ids = [await api.claim(name) for _ in range(5)]
    await api.claim(other)
    await api.finish(ids[1], "succeeded")
    await api.finish(ids[3], "failed")

    body = await (await api.client.get(f"/v1/jobs/{name}/runs")).json()
    assert [r["id"] for r in body["items"]] == ids[::-1] and body["next_cursor"] is None
    assert "output" not in body["items"][0]  # lists leave output to GET /v1/runs/{id}

    ok = await (await api.client.get(f"/v1/jobs/{name}/runs?status=succeeded")).json()
    assert [r["id"] for r in ok["items"]] == [ids[1]]
    claimed = await (await api.client.get(f"/v1/jobs/{name}/runs?status=claimed")).json()
    assert [r["id"] for r in claimed["items"]] == [ids[4], ids[2], ids[0]]

    seen: list[str] = []
    cursor: str | None = None
    for _ in range(5):
        q = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await (await api.client.get(f"/v1/jobs/{name}/runs{q}")).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]

    await api.error(await api.client.get("/v1/jobs/no-such-job/runs"), 404)
    await api.error(await api.client.get(f"/v1/jobs/{name}/runs?cursor=YWJj"), 400, "query.cursor")


async def test_explain_gives_decisions_and_reasons(api: Cluster) -> None:
    name = api.name()
    await api.create(name)
    run_id = (await (await api.client.post(f"/v1/jobs/{name}/run")).json())["run_id"]
    await api.client.post(f"/v1/jobs/{name}/pause", json={"note": "holiday freeze"})

    body = await (await api.client.get(f"/v1/jobs/{name}/explain")).json()
    assert body["next_cursor"] is None
    by_decision = {i["decision"]: i for i in body["items"]}
    assert by_decision["paused"]["reason"] == "holiday freeze"
    assert by_decision["claimed"]["run_id"] == run_id and "run by hand" in by_decision["claimed"]["reason"]

    later = await (await api.client.get(f"/v1/jobs/{name}/explain?since=2999-01-01T00:00:00Z")).json()
    assert later["items"] == []
    await api.error(await api.client.get(f"/v1/jobs/{name}/explain?since=yesterday"), 400, "query.since")
    await api.error(await api.client.get("/v1/jobs/no-such-job/explain"), 404)


# ---- listing ----------------------------------------------------------------------------


async def test_list_filters_by_label_query_and_status(api: Cluster) -> None:
    a, b = api.name("alpha"), api.name("beta")
    team = api.name("team")
    await api.create(a, labels={"team": team, "tier": "1"}, description="Nightly REPORT")
    await api.create(b, labels={"team": "search"})
    assert await names(api, f"?label=team={team}") == [a]
    assert await names(api, f"?label=team={team}&label=tier=1") == [a]
    assert await names(api, f"?label=team={team}&label=tier=2") == []
    assert await names(api, "?q=nightly report") == [a]
    assert await names(api, f"?q={b}") == [b]

    run_id = await api.claim(b)
    await api.finish(run_id, "failed")
    failing = await names(api, "?status=failing")
    assert b in failing and a not in failing


@pytest.mark.parametrize("count", [7, 6])
async def test_job_pages_have_no_duplicates_or_omissions(api: Cluster, count: int) -> None:
    label = f"page={api.name('p')}"
    made = sorted([api.name("pg") for _ in range(count)])
    for n in made:
        await api.create(n, labels={"page": label.split("=", 1)[1]})
    pages: list[list[str]] = []
    cursor: str | None = None
    for _ in range(count + 2):
        q = f"?label={label}&limit=3" + (f"&cursor={cursor}" if cursor else "")
        body = await (await api.client.get("/v1/jobs" + q)).json()
        pages.append([j["name"] for j in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert cursor is None, "paging did not end"
    assert [len(p) for p in pages] == ([3, 3, 1] if count == 7 else [3, 3])
    flat = [n for p in pages for n in p]
    assert flat == made and len(set(flat)) == count


async def test_a_garbage_cursor_is_400(api: Cluster) -> None:
    for cursor in ("%%%", "not-a-cursor!", "A"):
        await api.error(await api.client.get(f"/v1/jobs?cursor={cursor}"), 400, "query.cursor")
