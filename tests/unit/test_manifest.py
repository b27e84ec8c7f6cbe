from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from api.manifest import Document, ManifestError, parse_text, read_source, read_sources

TWO_JOBS = """\
name: alpha
schedule: "*/5 * * * *"
executor: http
http: {url: "https://example.test/a"}
---
name: beta
schedule: "@daily"
executor: shell
shell: {command: ["true"]}
"""


def names(documents: list[Document]) -> list[str | None]:
    return [d.name for d in documents]


def test_multi_document_yaml_gives_one_document_each(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(TWO_JOBS)
    documents = read_source(str(path))
    assert names(documents) == ["alpha", "beta"]
    assert documents[0].source == f"{path}#1"
    assert documents[1].body["shell"] == {"command": ["true"]}


def test_empty_documents_are_skipped() -> None:
    documents = parse_text("---\nname: a\n---\n---\n", "x.yaml")
    assert names(documents) == ["a"]
    assert documents[0].source == "x.yaml"


def test_json_object_and_json_list(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"name": "solo", "schedule": "@hourly"}))
    many = tmp_path / "many.json"
    many.write_text(json.dumps([{"name": "a"}, {"name": "b"}]))
    assert names(read_source(str(one))) == ["solo"]
    assert names(read_source(str(many))) == ["a", "b"]


def test_yaml_list_and_items_wrapper() -> None:
    assert names(parse_text("- name: a\n- name: b\n", "l.yaml")) == ["a", "b"]
    assert names(parse_text('{"items": [{"name": "c"}]}', "i.yaml")) == ["c"]


def test_job_resource_from_get_is_applied_as_its_spec() -> None:
    resource = {"name": "r", "version": 3, "spec": {"name": "r", "schedule": "@daily"},
                "status": {"paused": False}, "created_at": "x", "updated_at": "y"}
    [document] = parse_text(json.dumps(resource), "r.json", as_json=True)
    assert document.body == {"name": "r", "schedule": "@daily"}


def test_a_job_with_a_spec_field_of_its_own_is_left_alone() -> None:
    body = {"name": "j", "spec": {"x": 1}, "schedule": "@daily"}
    [document] = parse_text(json.dumps(body), "j.json", as_json=True)
    assert document.body == body


def test_yaml_12_booleans_keep_on_as_a_key_and_times_as_text() -> None:
    text = """\
name: a
paused: false
depends_on: {job: extract, on: success}
alerts: {on: [failure, dead]}
starts_at: 2026-01-01T00:00:00Z
description: yes
"""
    [document] = parse_text(text, "a.yaml")
    body = document.body
    assert body["depends_on"] == {"job": "extract", "on": "success"}
    assert body["alerts"] == {"on": ["failure", "dead"]}
    assert body["starts_at"] == "2026-01-01T00:00:00Z"
    assert body["paused"] is False
    assert body["description"] == "yes"
    json.dumps(body)  # everything read is JSON-serialisable


def test_directory_reads_manifest_files_sorted_and_ignores_others(tmp_path: Path) -> None:
    (tmp_path / "b.yml").write_text("name: second\n")
    (tmp_path / "a.yaml").write_text("name: first\n")
    (tmp_path / "c.json").write_text('{"name": "third"}')
    (tmp_path / "notes.txt").write_text("name: ignored\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.yaml").write_text("name: nested\n")
    assert names(read_source(str(tmp_path))) == ["first", "second", "third"]


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no \\*.yaml"):
        read_source(str(tmp_path))


def test_stdin_is_read_for_dash() -> None:
    documents = read_source("-", io.StringIO(TWO_JOBS))
    assert names(documents) == ["alpha", "beta"]
    assert documents[0].source == "<stdin>#1"


def test_bad_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: a\nschedule: '0 2 * * *'\nhttp: {url: [unclosed\n")
    with pytest.raises(ManifestError) as caught:
        read_source(str(path))
    error = caught.value
    assert error.source == str(path)
    assert error.line is not None and error.line >= 3
    assert str(error).startswith(f"{path}:{error.line}: invalid YAML")


def test_unquoted_at_schedule_is_a_yaml_error_with_line() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_text("name: a\nschedule: @daily\n", "at.yaml")
    assert caught.value.line == 2


def test_bad_json_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "a",\n  "schedule": oops\n}')
    with pytest.raises(ManifestError) as caught:
        read_source(str(path))
    assert caught.value.line == 3
    assert str(caught.value).startswith(f"{path}:3: invalid JSON")


def test_a_document_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(ManifestError, match="document 2: expected a mapping"):
        parse_text("name: a\n---\njust text\n", "s.yaml")


def test_missing_file_is_an_error() -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        read_source("/nonexistent/jobs.yaml")


def test_read_sources_keeps_going_after_a_bad_source(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: ok\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    documents, errors = read_sources([str(bad), str(good)])
    assert names(documents) == ["ok"]
    assert [e.source for e in errors] == [str(bad)]


def test_name_must_be_a_non_empty_string() -> None:
    assert Document("x", {"name": 5}).name is None
    assert Document("x", {"name": ""}).name is None
    assert Document("x", {}).name is None


def test_a_bad_file_in_a_directory_does_not_hide_the_good_ones(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: first\n")
    (tmp_path / "b.yaml").write_text("name: [\n")
    (tmp_path / "c.yaml").write_text("name: third\n")
    documents, errors = read_sources([str(tmp_path)])
    assert names(documents) == ["first", "third"]
    assert [e.source for e in errors] == [str(tmp_path / "b.yaml")]
    with pytest.raises(ManifestError):
        read_source(str(tmp_path))
