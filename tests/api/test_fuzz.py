"""Schemathesis against a real single-node cluster served on 127.0.0.1.

Every operation of /openapi.json gets schema-valid (positive) and schema-breaking
(negative) requests: no answer may be a 5xx, and every answer must be documented
for its operation with a body matching the documented schema. Bounded: a few
examples per operation and mode, no deadline, derandomized so CI replays the
same requests; the whole run stays well under a minute.

The blocking requests run in a worker thread while the server keeps serving on
the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from api.app import openapi_document

if TYPE_CHECKING:
    from conftest import Cluster

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (test extra)")
requests = pytest.importorskip("requests")
hypothesis = pytest.importorskip("hypothesis")

# These imports follow the importorskip calls above on purpose: without the test extra the
# module skips with its reason instead of failing to import.
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = 12  # per operation and mode
BUDGET = 60.0  # seconds for the whole fuzz run; the test fails past it rather than hang CI
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Adding a member with a fuzzed address would really reconfigure the one-node cluster (and cost it its
# quorum); its validation is covered in test_cluster_api.py.
# A valid watch waits by design, up to 25 s each (its answers and validation are tested in
# test_cluster_api.py).
SKIP = {("POST", "/v1/members"), ("GET", "/v1/watch")}


def _can_break(spec_op: dict[str, Any]) -> bool:
    """Negative cases need something with a schema to break: a body or a query parameter.
    (Path parameters are plain strings, and any string is valid.)"""
    return "requestBody" in spec_op or any(p["in"] == "query" for p in spec_op.get("parameters", []))


def _fuzz(base_url: str, budget: float) -> tuple[list[str], int]:
    doc = openapi_document()
    schema = schemathesis.openapi.from_dict(doc)
    session = requests.Session()
    failures: list[str] = []
    calls = 0
    deadline = time.monotonic() + budget

    for result in schema.get_all_operations():
        op = result.ok()
        method = op.method.upper()
        if (method, op.path) in SKIP:
            continue
        spec_op = doc["paths"][op.path][op.method.lower()]
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if _can_break(spec_op) else [])
        for mode in modes:

            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                nonlocal calls
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fuzzing took over {budget}s")
                calls += 1
                response = case.call(base_url=base_url, session=session, timeout=15)
                case.validate_response(response, checks=CHECKS)

            try:
                run()
            except TimeoutError:
                raise
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - checks raise a FailureGroup
                failures.append(f"{method} {op.path} ({mode.value}): {exc}")

        if "requestBody" in spec_op:
            try:
                _junk_bodies(base_url, session, method, op.path, spec_op)
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{method} {op.path} (junk body): {exc}")
            calls += EXAMPLES
    session.close()
    return failures, calls


JUNK = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    # JSON leaves include lone surrogates (escaped by json.dumps) and integers of any size.
    st.recursive(st.none() | st.booleans() | st.floats() | st.integers()
                 | st.text(st.characters(exclude_categories=()), max_size=20),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                 max_leaves=12).map(lambda v: json.dumps(v).encode()),
)


def _junk_bodies(base_url: str, session: Any, method: str, path: str, spec_op: dict[str, Any]) -> None:
    """Bodies that are not JSON, or JSON of any shape: never a 5xx, always a documented status."""
    url = base_url + path.format(name="fuzz-junk", id="r0", member="n9")
    documented = set(spec_op["responses"])

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(body=JUNK)
    def run(body: bytes) -> None:
        resp = session.request(method, url, data=body, headers={"Content-Type": "application/json"}, timeout=15)
        assert resp.status_code < 500, f"{resp.status_code} for body {body!r}: {resp.text[:300]}"
        assert str(resp.status_code) in documented, f"undocumented {resp.status_code} for body {body!r}"
        if resp.status_code >= 400:
            assert set(resp.json()["error"]) == {"code", "message", "details"}, resp.text[:300]

    run()


async def test_fuzzed_requests_get_documented_answers_and_no_5xx(api: Cluster) -> None:
    base_url = str(api.client.make_url("")).rstrip("/")
    failures, calls = await asyncio.to_thread(_fuzz, base_url, BUDGET)
    assert calls > 100, f"only {calls} requests were sent"
    assert not failures, "\n\n".join(failures)
