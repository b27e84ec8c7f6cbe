"""Job sections parsed once and shared: the same result as a fresh parse, never across values
that parse apart (True and 1), never for a section with a problem, and bounded."""

from __future__ import annotations

from typing import Any

import pytest

import scheduler.model as model
from scheduler.errors import ValidationFailed
from scheduler.model import parse_job
from tests.unit.conftest import job_doc

SECTIONS = {"retries": {"max": 2, "backoff": "5s"}, "catchup": {"policy": "all", "window": "2h"},
            "target": {"tags": {"zone": "a"}, "count": 2}, "alerts": {"on": ["failure", "dead"], "after_failures": 3},
            "history": {"keep": 7, "max_age": "1d"}}


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    tables = (model._SECTIONS, model._SECTION_DOCS, model._RECURRING, model._DOCS)
    saved = [dict(t) for t in tables]
    for t in tables:
        t.clear()
    yield
    for t, kept in zip(tables, saved, strict=True):
        t.clear()
        t.update(kept)  # type: ignore[attr-defined]


def test_jobs_writing_the_same_sections_share_them_and_equal_a_fresh_parse() -> None:
    a = parse_job(job_doc("a", **SECTIONS))
    b = parse_job(job_doc("b", **SECTIONS))
    for key in SECTIONS:
        assert getattr(a, key) is getattr(b, key), key
    model._SECTIONS.clear()
    fresh = parse_job(job_doc("b", **SECTIONS))
    assert fresh == b and fresh.to_doc() == b.to_doc()


def test_stored_documents_of_jobs_sharing_a_section_share_its_document_and_equal_a_fresh_one() -> None:
    a, b = parse_job(job_doc("a", **SECTIONS)).to_doc(), parse_job(job_doc("b", **SECTIONS)).to_doc()
    for key in SECTIONS:
        assert a[key] is b[key], key
    model._SECTIONS.clear()
    model._SECTION_DOCS.clear()
    fresh = parse_job(job_doc("b", **SECTIONS))
    assert fresh.to_doc() == b
    assert all(fresh.to_doc()[key] is not b[key] for key in SECTIONS)


def _outcome(doc: dict[str, Any]) -> Any:
    try:
        return parse_job(doc).to_doc()
    except ValidationFailed as exc:
        return exc.details


@pytest.mark.parametrize("variant", [{"max": 1.0}, {"max": "1"}, {"max": True}, [1], ({"max": 1},),
                                     {"max": 1, "backoff": b"5s"}, {"max": 2**70}])
def test_a_section_that_differs_only_in_type_parses_as_it_would_with_nothing_kept(variant: Any) -> None:
    fresh = _outcome(job_doc("b", retries=variant))
    model._SECTIONS.clear()
    model._SECTION_DOCS.clear()
    parse_job(job_doc("a", retries={"max": 1, "backoff": "5s"}))  # the look-alike, kept first
    assert _outcome(job_doc("b", retries=variant)) == fresh


@pytest.mark.parametrize(("section", "good", "bad", "message"), [
    ("retries", {"max": 1}, {"max": True}, "retries.max: must be an integer, not a boolean"),
    ("history", {"keep": 3}, {"keep": "3"}, "history.keep"),
    ("target", {"count": 2}, {"count": 2.5}, "target.count"),
])
def test_a_value_that_parses_apart_is_never_served_from_the_cache(section: str, good: dict[str, Any],
                                                                  bad: dict[str, Any], message: str) -> None:
    parse_job(job_doc("a", **{section: good}))
    with pytest.raises(ValidationFailed) as err:
        parse_job(job_doc("b", **{section: bad}))
    assert message in err.value.message


def test_a_section_with_a_problem_is_not_kept_and_is_reported_each_time() -> None:
    for _ in range(2):
        with pytest.raises(ValidationFailed) as err:
            parse_job(job_doc("a", retries={"max": 1, "speed": 3}))
        assert any(d["field"] == "retries.speed" for d in err.value.details)
    assert not [key for key, _ in model._SECTIONS if key == "retries"]


def test_past_its_bound_the_cache_keeps_nothing_new_and_parses_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "_SECTIONS_MAX", 3)
    jobs = [parse_job(job_doc(f"j{i}", retries={"max": i})) for i in range(6)]
    assert [j.retries.max for j in jobs] == list(range(6))
    assert len(model._SECTIONS) == 3



def test_jobs_that_leave_a_section_out_share_its_default_and_its_document() -> None:
    # What most documents sent to the API look like. Once, each such job parsed and stored a
    # section and a document of its own on the node that took the request (~130 MB more there
    # than on the other nodes for 100,000 jobs); the others parse the stored document, which
    # writes every section out.
    a, b = parse_job(job_doc("a")), parse_job(job_doc("b"))
    da, db = a.to_doc(), b.to_doc()
    for key in SECTIONS:
        assert getattr(a, key) is getattr(b, key), key
        assert da[key] is db[key], key
    model._SECTIONS.clear()
    model._SECTION_DOCS.clear()
    assert parse_job(job_doc("b")) == b and parse_job(job_doc("b")).to_doc() == db
    assert parse_job(job_doc("c", retries=None)).retries is parse_job(job_doc("d")).retries


def test_stored_labels_and_executor_sections_are_shared_by_jobs_that_write_equal_ones() -> None:
    one = {"url": "https://hooks.test/run", "headers": {"X-Team": "a"}}
    a = parse_job(job_doc("a", http=one, labels={"team": "a"})).to_doc()
    b = parse_job(job_doc("b", http=dict(one), labels={"team": "a"})).to_doc()
    c = parse_job(job_doc("c", http={**one, "method": "PUT"}, labels={"team": "b"})).to_doc()
    assert a["http"] is b["http"] and a["labels"] is b["labels"]
    assert c["http"] is not a["http"] and c["http"]["method"] == "PUT" and c["labels"] == {"team": "b"}
    assert a["http"] == {"url": "https://hooks.test/run", "method": "POST", "headers": {"X-Team": "a"}, "body": None,
                         "expect_status": [], "expect_body": None}


def test_past_its_bound_the_document_cache_starts_again_and_documents_stay_equal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "_DOCS_MAX", 4)
    monkeypatch.setattr(model, "_DOCS", {})
    docs = [parse_job(job_doc(f"j{i}", labels={"n": str(i % 6)})).to_doc() for i in range(12)]
    assert len(model._DOCS) <= 4
    assert [d["labels"] for d in docs] == [{"n": str(i % 6)} for i in range(12)]


def test_jobs_of_one_template_share_their_parsed_executor_section_labels_and_schedule() -> None:
    one = {"url": "https://hooks.test/run", "headers": {"X-Team": "a"}}
    a = parse_job(job_doc("a", http=one, labels={"team": "a", "app": "x"}, schedule="5 * * * *"))
    b = parse_job(job_doc("b", http=dict(one), labels={"app": "x", "team": "a"}, schedule="5  *  * * *"))
    assert a.http is b.http and a.labels is b.labels and a.schedule is b.schedule
    assert list(a.labels) == ["app", "team"]  # kept sorted, as the stored document writes them
    c = parse_job(job_doc("c", http={**one, "url": "https://hooks.test/other"}, labels={"team": "b"}))
    assert c.http is not a.http and c.http is not None and c.http.url == "https://hooks.test/other"
    assert c.labels == {"team": "b"} and c.schedule is not a.schedule
    s1 = parse_job(job_doc("s1", executor="shell", http=None, shell={"command": ["/bin/true"]}))
    s2 = parse_job(job_doc("s2", executor="shell", http=None, shell={"command": ["/bin/true"]}))
    assert s1.shell is s2.shell and s1.shell is not None
    model._RECURRING.clear()
    model._DOCS.clear()
    assert parse_job(job_doc("b", http=dict(one), labels={"app": "x", "team": "a"}, schedule="5 * * * *")) == b


def test_an_executor_section_with_a_problem_is_not_kept_and_is_reported_each_time() -> None:
    for _ in range(2):
        with pytest.raises(ValidationFailed) as err:
            parse_job(job_doc("a", http={"url": "https://hooks.test/", "method": "FETCH"}))
        assert any(d["field"] == "http.method" for d in err.value.details)
    assert not model._RECURRING


def test_past_its_bound_the_executor_cache_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model, "_DOCS_MAX", 4)
    jobs = [parse_job(job_doc(f"j{i}", http={"url": f"https://hooks.test/{i % 6}"})) for i in range(12)]
    assert len(model._RECURRING) <= 4
    assert [j.http.url if j.http else None for j in jobs] == [f"https://hooks.test/{i % 6}" for i in range(12)]
