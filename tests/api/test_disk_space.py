"""A node whose data directory is under its free-space floor refuses writes with 507
``insufficient_storage`` before proposing them, still serves reads, and takes writes again once
space returns. The answer is in the OpenAPI document of every write. (The ``cluster`` fixture,
not ``api``: that one counts every 5xx as a server fault.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from api.context import CTX
from raftlog import Space
from tests.api.conftest import error_shape_problem, operation

if TYPE_CHECKING:
    from conftest import Cluster



@pytest.fixture
def space(cluster: Cluster, tmp_path: Path) -> Iterator[list[Space | None]]:
    """Set [0] to the Space the API checks; unset again after the test."""
    ctx = cluster.client.app[CTX]
    holder: list[Space | None] = [None]
    original = ctx.space

    class Live:
        def short(self) -> int | None:
            s = holder[0]
            return None if s is None else s.short()

        min_free = property(lambda self: (holder[0] or Space(tmp_path)).min_free)

    ctx.space = Live()  # type: ignore[assignment]
    yield holder
    ctx.space = original


@pytest.mark.asyncio(loop_scope="module")
async def test_a_full_data_directory_refuses_writes_with_507(cluster: Cluster, space: list[Space | None],
                                                              tmp_path: Path) -> None:
    api = cluster
    kept = api.name("kept")
    await api.create(kept)
    space[0] = Space(tmp_path, min_free=1 << 62)  # more than any disk has free
    name = api.name("refused")
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name))
    err = await api.error(resp, 507, code="insufficient_storage")
    assert "MiB free, under the" in err["message"] and "nothing acknowledged was lost" in err["message"]
    assert name not in api.state.jobs
    resp = await api.client.delete(f"/v1/jobs/{kept}")
    await api.error(resp, 507, code="insufficient_storage")
    assert kept in api.state.jobs
    resp = await api.client.get(f"/v1/jobs/{kept}")
    assert resp.status == 200

    space[0] = Space(tmp_path)  # space returned
    resp = await api.client.put(f"/v1/jobs/{name}", json=api.doc(name))
    assert resp.status == 201, await resp.text()
    assert name in api.state.jobs


def test_507_is_documented_for_every_write() -> None:
    for method, path in [("PUT", "/v1/jobs/{name}"), ("DELETE", "/v1/jobs/{name}"), ("POST", "/v1/jobs/{name}/run"), ("POST", "/v1/jobs")]:
        op = operation(method, path)
        assert op is not None and "507" in op["responses"], f"{method} {path}"
    assert operation("GET", "/v1/jobs/{name}") is not None
    assert "507" not in operation("GET", "/v1/jobs/{name}")["responses"]  # type: ignore[index]
    assert error_shape_problem({"error": {"code": "insufficient_storage", "message": "m", "details": []}}) is None
