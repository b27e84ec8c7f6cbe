"""``raftcron apply``'s batching: documents split in order, duplicates and nameless documents
left out with a reason, a refusal mapped back to the file and field of each document."""

from __future__ import annotations

from api.batches import refusal_lines, split
from api.client import ClientError
from api.manifest import Document


def docs(*names: str | None) -> list[Document]:
    return [Document(f"f.yaml#{i + 1}", {"name": n} if n else {}) for i, n in enumerate(names)]


def test_split_keeps_order_and_size_and_leaves_out_duplicates_and_nameless() -> None:
    batches, problems = split(docs("a", "b", None, "c", "a", "d", "e"), 2)
    assert [[d.name for d in b] for b in batches] == [["a", "b"], ["c", "d"], ["e"]]
    assert problems == ["f.yaml#3: name is required",
                        "f.yaml#5: job/a: named by f.yaml#1 already; not applied"]


def test_a_refusal_names_file_job_and_field_of_each_document() -> None:
    batch = tuple(docs("a", "b"))
    error = ClientError(400, "invalid", "1 of 2 documents refused", [
        {"field": "jobs[1].http.url", "message": "must be http(s)", "job": "b"},
        {"field": "jobs[0]", "message": "must be a job document (an object)"},
        {"field": "mode", "message": "must be one of create, apply"},
        {"field": "jobs[7].name", "message": "out of this batch"},
    ])
    assert refusal_lines(error, batch) == [
        "f.yaml#2: job/b: http.url: must be http(s)",
        "f.yaml#1: job/a: must be a job document (an object)",
        "mode: must be one of create, apply",
        "jobs[7].name: out of this batch",
    ]
    assert refusal_lines(ClientError(409, "conflict", "taken"), batch) == ["taken"]
