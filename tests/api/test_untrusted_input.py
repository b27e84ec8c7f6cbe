"""Input an attacker controls: a bearer token that is not ASCII, a pattern that backtracks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("token", ["wé", "ключ", "🔑"])
async def test_a_non_ascii_bearer_token_is_401_not_500(api: Cluster, token: str) -> None:
    for method in ("GET", "PUT"):
        resp = await api.secured.request(method, "/v1/jobs" if method == "GET" else "/v1/jobs/x",
                                         headers={"Authorization": f"Bearer {token}"}, json={})
        await api.error(resp, 401, code="unauthorized")


@pytest.mark.parametrize("raw", [b"w\xe9", b"\xff\xfe", "wé".encode()])
async def test_raw_non_ascii_token_bytes_are_401(api: Cluster, raw: bytes) -> None:
    # What a client that does not encode UTF-8 sends (aiohttp's client would drop the byte).
    url = api.secured.make_url("/v1/jobs")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + raw
                     + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.split()[1] == b"401", answer[:300]
    assert b'"unauthorized"' in answer


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=ok)", r"(?<!x)ok", r"(?!no)", "(unclosed", "a{2000}"])
async def test_a_pattern_re2_cannot_run_is_a_400_naming_expect_body(api: Cluster, pattern: str) -> None:
    name = api.name()
    doc = api.doc(name)
    doc["http"]["expect_body"] = pattern
    err = await api.error(await api.client.put(f"/v1/jobs/{name}", json=doc), 400, "http.expect_body")
    assert "regular expression" in err["details"][0]["message"]
    assert name not in api.state.jobs


async def test_a_catastrophic_pattern_for_re_is_accepted_and_linear_for_re2(api: Cluster) -> None:
    name = api.name()
    doc = api.doc(name)
    doc["http"]["expect_body"] = r"(a+)+$"
    resp = await api.client.put(f"/v1/jobs/{name}", json=doc)
    assert resp.status == 201, await resp.json()
