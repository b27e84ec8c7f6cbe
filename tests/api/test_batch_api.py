"""POST /v1/jobs:batch against a real single-node cluster: every answer code, all or nothing,
auth and redaction as for a single PUT, and bodies between the API's ordinary cap and the batch's."""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

from api.routes.batch import MAX_BATCH_BYTES, MAX_BATCH_JOBS
from scheduler.errors import Conflict
from scheduler.service import ENTRY_LIMIT

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

PATH = "/v1/jobs:batch"
W = {"Authorization": "Bearer w"}
R = {"Authorization": "Bearer r"}
SECRET_URL = "https://ops:hunter2@api.example/v1/ping?api_key=K3Y"


async def post(api: Cluster, body: Any, status: int, headers: dict[str, str] | None = None,
               secured: bool = False) -> dict[str, Any]:
    client = api.secured if secured else api.client
    # As a stream: aiohttp warns about a large body given as bytes (json=), and -W error fails on it.
    resp = await client.post(PATH, data=io.BytesIO(json.dumps(body).encode()),
                             headers={**(headers or {}), "Content-Type": "application/json"})
    answer: dict[str, Any] = await resp.json()
    assert resp.status == status, answer
    return answer


async def test_apply_creates_then_reports_unchanged_and_configured(api: Cluster) -> None:
    names = [api.name("b") for _ in range(3)]
    first = await post(api, {"mode": "apply", "jobs": [api.doc(n) for n in names]}, 200)
    assert first["changes"] == {"created": 3, "configured": 0, "unchanged": 0} and first["count"] == 3
    assert [(i["name"], i["change"], i["version"]) for i in first["items"]] == [(n, "created", 1) for n in names]
    assert all(n in api.state.jobs for n in names)

    docs = [api.doc(names[0]), api.doc(names[1], description="edited"), api.doc(names[2])]
    second = await post(api, {"mode": "apply", "jobs": docs}, 200)
    assert second["changes"] == {"created": 0, "configured": 1, "unchanged": 2}
    assert api.state.jobs[names[1]]["version"] == 2 and api.state.jobs[names[0]]["version"] == 1


async def test_create_mode_conflict_names_the_jobs_and_stores_nothing(api: Cluster) -> None:
    taken, fresh = api.name("taken"), api.name("fresh")
    await api.create(taken)
    err = await api.error(await api.client.post(PATH, json={"mode": "create", "jobs": [api.doc(fresh), api.doc(taken)]}),
                          409, "jobs[1].name", code="conflict")
    assert taken in err["message"] and err["details"][0]["job"] == taken
    assert fresh not in api.state.jobs
    created = await post(api, {"mode": "create", "jobs": [api.doc(fresh)]}, 200)
    assert created["changes"]["created"] == 1


async def test_a_conflict_decided_by_the_state_machine_names_the_jobs(api: Cluster) -> None:
    # The handler checks names first; a job created between that check and the commit is refused at apply.
    taken, fresh = api.name("raced"), api.name("fresh")
    await api.create(taken)
    from scheduler.model import parse_job

    with pytest.raises(Conflict) as info:
        await api.service.put_jobs((parse_job(api.doc(fresh)), parse_job(api.doc(taken))), create_only=True)
    assert taken in info.value.message
    assert info.value.details == [{"field": "jobs[1].name", "message": f"a job named {taken!r} exists already",
                                   "job": taken}]
    assert fresh not in api.state.jobs


async def test_a_bad_document_names_index_job_and_field_and_nothing_is_stored(api: Cluster) -> None:
    good, bad = api.name("good"), api.name("bad")
    docs = [api.doc(good), api.doc(bad, http={"url": "ftp://nowhere"}), api.doc(api.name(), schedule="61 * * * *")]
    err = await api.error(await api.client.post(PATH, json={"mode": "apply", "jobs": docs}), 400,
                          "jobs[1].http.url", "jobs[2].schedule", code="invalid")
    assert "2 of 3 documents refused, nothing stored" in err["message"]
    assert {d["job"] for d in err["details"]} == {bad, docs[2]["name"]}
    assert good not in api.state.jobs and bad not in api.state.jobs


async def test_duplicate_names_and_non_documents_are_refused(api: Cluster) -> None:
    name = api.name("dup")
    await api.error(await api.client.post(PATH, json={"mode": "apply", "jobs": [api.doc(name), api.doc(name)]}),
                    400, "jobs[1].name")
    await api.error(await api.client.post(PATH, json={"mode": "apply", "jobs": [api.doc(api.name()), 7]}),
                    400, "jobs[1]")
    assert name not in api.state.jobs


@pytest.mark.parametrize(("body", "fields"), [
    ({"jobs": []}, ("mode",)),
    ({"mode": "upsert", "jobs": []}, ("mode",)),
    ({"mode": "apply", "jobs": {"a": 1}}, ("jobs",)),
    ({"mode": "apply", "jobs": [], "force": True}, ("force",)),
    ([], ("$",)),
])
async def test_a_malformed_envelope_is_a_400_naming_the_field(api: Cluster, body: Any, fields: tuple[str, ...]) -> None:
    await api.error(await api.client.post(PATH, json=body), 400, *fields, code="invalid")


async def test_an_empty_batch_stores_nothing_and_answers_200(api: Cluster) -> None:
    before = api.state.applied_index
    assert (await post(api, {"mode": "create", "jobs": []}, 200))["count"] == 0
    assert api.state.applied_index == before


async def test_too_many_documents_is_a_413_naming_the_cap(api: Cluster) -> None:
    docs = [{"name": f"x{i}"} for i in range(MAX_BATCH_JOBS + 1)]
    err = await api.error(await api.client.post(PATH, json={"mode": "apply", "jobs": docs}), 413, "jobs",
                          code="payload_too_large")
    assert str(MAX_BATCH_JOBS) in err["message"]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_the_batch_cap_is_a_413_naming_the_cap(api: Cluster, declared: bool) -> None:
    body = b'{"mode": "apply", "jobs": [], "pad": "' + b"x" * MAX_BATCH_BYTES + b'"}'

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the cap is met while reading
        for start in range(0, len(body), 1 << 20):
            yield body[start:start + (1 << 20)]

    resp = await api.client.post(PATH, data=io.BytesIO(body) if declared else chunks(),
                                 headers={"Content-Type": "application/json"})
    err = await api.error(resp, 413, code="payload_too_large")
    assert str(MAX_BATCH_BYTES) in err["message"]


async def test_a_body_over_the_ordinary_cap_but_under_the_batch_cap_is_taken(api: Cluster) -> None:
    # 1,200 documents of ~1.9 KB: ~2.3 MB, over max_body (1 MiB) that single PUTs are held to.
    names = [api.name("big") for _ in range(1200)]
    docs = [api.doc(n, description="d" * 1800) for n in names]
    answer = await post(api, {"mode": "create", "jobs": docs}, 200)
    assert answer["changes"]["created"] == 1200 and all(n in api.state.jobs for n in names)


async def test_auth_is_that_of_a_single_put(api: Cluster) -> None:
    name = api.name("auth")
    body = {"mode": "apply", "jobs": [api.doc(name)]}
    await api.error(await api.secured.post(PATH, json=body), 401, code="unauthorized")
    await api.error(await api.secured.post(PATH, json=body, headers=R), 403, code="forbidden")
    assert name not in api.state.jobs
    await post(api, body, 200, headers=W, secured=True)
    assert name in api.state.jobs


async def test_a_masked_document_applied_back_keeps_the_stored_secret(api: Cluster) -> None:
    name = api.name("secret")
    await post(api, {"mode": "apply", "jobs": [api.doc(name, http={"url": SECRET_URL})]}, 200, headers=W, secured=True)
    resp = await api.secured.get(f"/v1/jobs/{name}", headers=R)
    shown = (await resp.json())["spec"]
    assert "hunter2" not in str(shown)
    answer = await post(api, {"mode": "apply", "jobs": [{**shown, "name": name, "description": "edited"}]}, 200,
                        headers=W, secured=True)
    assert answer["items"][0]["change"] == "configured"
    assert api.state.jobs[name]["spec"]["http"]["url"] == SECRET_URL
    assert "hunter2" not in str(answer)


async def test_documents_making_too_large_an_entry_are_a_413_and_nothing_is_stored(api: Cluster) -> None:
    # 80 documents of 2,000 random hex characters: ~80 KB once compressed (hex halves), over the
    # 63 KiB entry cap that keeps pysyncobj from chunking the entry.
    names = [api.name("noise") for _ in range(80)]
    docs = [api.doc(n, description=secrets.token_hex(1000)) for n in names]
    resp = await api.client.post(PATH, data=io.BytesIO(json.dumps({"mode": "apply", "jobs": docs}).encode()),
                                 headers={"Content-Type": "application/json"})
    err = await api.error(resp, 413, "jobs", code="payload_too_large")
    assert str(ENTRY_LIMIT) in err["message"] and "fewer documents" in err["message"]
    assert not any(n in api.state.jobs for n in names)
    half = await post(api, {"mode": "apply", "jobs": docs[:40]}, 200)
    assert half["changes"]["created"] == 40
