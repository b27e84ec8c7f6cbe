"""``raftcron apply``'s batching: documents split in order, duplicates and nameless documents
left out with a reason, a refusal mapped back to the file and field of each document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.batches import apply_in_batches, refusal_lines, split
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


class Sender:
    """Answers like the cluster: 413 (entry too large) for a batch of more than ``fits`` documents."""

    def __init__(self, fits: int) -> None:
        self.fits = fits
        self.sent: list[list[str]] = []

    async def apply_jobs(self, documents: Sequence[dict[str, Any]], *, mode: str = "apply") -> dict[str, Any]:
        self.sent.append([d["name"] for d in documents])
        if len(documents) > self.fits:
            raise ClientError(413, "payload_too_large", "entry too large",
                              [{"field": "jobs", "message": "entry of 70000 bytes over 64512; split the batch"}])
        return {"items": [{"name": d["name"], "change": "created", "version": 1} for d in documents]}


async def test_a_batch_making_too_large_an_entry_is_sent_again_in_halves() -> None:
    sender = Sender(fits=2)
    batches, _ = split(docs("a", "b", "c", "d", "e", "f"), 5)
    outcomes = await apply_in_batches(sender, batches, lambda o: None)
    assert sender.sent == [["a", "b", "c", "d", "e"], ["a", "b"], ["c", "d", "e"], ["c"], ["d", "e"], ["f"]]
    assert [(o.number, o.total, [d.name for d in o.documents]) for o in outcomes] == [
        (1, 3, ["a", "b"]), (2, 4, ["c"]), (3, 4, ["d", "e"]), (4, 4, ["f"])]
    assert all(o.error is None for o in outcomes)


async def test_a_single_document_too_large_is_reported_not_split() -> None:
    outcomes = await apply_in_batches(Sender(fits=0), [tuple(docs("a"))], lambda o: None)
    assert len(outcomes) == 1 and outcomes[0].error is not None and outcomes[0].error.status == 413
