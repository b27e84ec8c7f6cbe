"""``raftcron apply -f``: documents sent in batches (``POST /v1/jobs:batch``, mode apply).

Each batch is stored whole or not at all. A batch the cluster refuses is reported document by
document, named by the file it came from (``jobs.yaml#3: job/x: http.url: ...``); the
batches after it are still sent. Documents without a name, or naming a job an earlier
document names already, are reported here and not sent.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .client import ClientError, NoClusterError
from .manifest import Document

__all__ = ["DEFAULT_BATCH_SIZE", "MAX_BATCH_SIZE", "BatchOutcome", "BatchSender", "apply_in_batches", "split", "refusal_lines"]

DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 5000  # the server's cap (api/routes/batch.py)

_INDEX = re.compile(r"^jobs\[(\d+)\](?:\.(.*))?$")


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    number: int  # from 1
    total: int  # batches known when this one was answered (a split adds one)
    documents: tuple[Document, ...]
    answer: dict[str, Any] | None  # the server's answer, None when refused
    error: ClientError | None


def split(documents: Sequence[Document], size: int) -> tuple[list[tuple[Document, ...]], list[str]]:
    """Batches of at most ``size`` documents, and the problems of the documents left out."""
    problems: list[str] = []
    kept: list[Document] = []
    first: dict[str, Document] = {}
    for doc in documents:
        name = doc.name
        if name is None:
            problems.append(f"{doc.source}: name is required")
        elif name in first:
            problems.append(f"{doc.source}: job/{name}: named by {first[name].source} already; not applied")
        else:
            first[name] = doc
            kept.append(doc)
    return [tuple(kept[i:i + size]) for i in range(0, len(kept), size)], problems


def refusal_lines(error: ClientError, batch: Sequence[Document]) -> list[str]:
    """A refused batch as lines naming the file, the job and the field of each problem."""
    lines = []
    for detail in error.details:
        if not isinstance(detail, dict):
            continue
        field = str(detail.get("field") or "")
        m = _INDEX.match(field)
        if m is not None and int(m.group(1)) < len(batch):
            doc, field = batch[int(m.group(1))], m.group(2)
        elif len(batch) == 1 and m is None:  # a document sent alone (PUT) names its own fields
            doc = batch[0]
        else:
            lines.append(f"{field or 'batch'}: {detail.get('message')}")
            continue
        where = f"{doc.source}: job/{doc.name}: " if doc.name else f"{doc.source}: "
        lines.append(f"{where}{field + ': ' if field else ''}{detail.get('message')}")
    return lines or [error.message]


class BatchSender(Protocol):
    async def apply_jobs(self, documents: Sequence[dict[str, Any]], *, mode: str = "apply") -> dict[str, Any]: ...

    async def put_job(self, name: str, document: dict[str, Any]) -> dict[str, Any]: ...


async def apply_in_batches(client: BatchSender, batches: Sequence[tuple[Document, ...]],
                           on_batch: Callable[[BatchOutcome], Awaitable[None] | None]) -> list[BatchOutcome]:
    """Send each batch in turn; a refusal that every later batch would meet too (no cluster, no
    or a read-only token) is raised, any other is reported and the next batch sent. A batch whose
    documents make too large a replicated entry (413 naming ``jobs``) is sent again as two halves,
    each reported as a batch of its own."""
    outcomes: list[BatchOutcome] = []
    pending = list(batches)
    number = 0
    one_by_one = False  # the server predates POST /v1/jobs:batch: a PUT per document
    while pending:
        batch = pending.pop(0)
        try:
            if one_by_one:
                answer = await _put_each(client, batch)
            else:
                answer = await client.apply_jobs([doc.body for doc in batch])
            outcome = BatchOutcome(number + 1, number + 1 + len(pending), batch, answer, None)
        except ClientError as exc:
            if isinstance(exc, NoClusterError) or exc.status in (401, 403):
                raise
            if not one_by_one and exc.status in (404, 405):
                one_by_one = True
                pending[:0] = [(doc,) for doc in batch]
                continue
            if _entry_too_large(exc) and len(batch) > 1:
                half = len(batch) // 2
                pending[:0] = [batch[:half], batch[half:]]
                continue
            outcome = BatchOutcome(number + 1, number + 1 + len(pending), batch, None, exc)
        number += 1
        outcomes.append(outcome)
        shown = on_batch(outcome)
        if shown is not None:
            await shown
    return outcomes


async def _put_each(client: BatchSender, batch: tuple[Document, ...]) -> dict[str, Any]:
    """A batch of one document sent as a PUT, answered in the batch's shape."""
    items = []
    for doc in batch:
        answer = await client.put_job(str(doc.body["name"]), doc.body)
        items.append({"name": doc.body["name"], "change": answer["change"]})
    changes: dict[str, int] = {}
    for item in items:
        changes[item["change"]] = changes.get(item["change"], 0) + 1
    return {"items": items, "changes": changes}


def _entry_too_large(error: ClientError) -> bool:
    return error.status == 413 and any(isinstance(d, dict) and d.get("field") == "jobs" and "split" in str(d.get("message"))
                                       for d in error.details)
