"""PutJobs in the state machine: a batch is stored whole or not at all, decided the same on every
replica, whether the proposer's parse is offered or the entry is decoded; and its metrics."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from api.metrics import Metrics
from raftlog.fsm import ApplyContext
from raftlog.node import NodeStatus
from scheduler.commands import PutJobs, encode_command
from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.state import Applied, State

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
MIN = 60_000_000
SEC = 1_000_000


def slot(n: int) -> int:
    return T0 + n * MIN


def job_doc(name: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "schedule": "* * * * *", "executor": "http",
                           "http": {"url": "https://example.test/hook"}, **over}
    return {k: v for k, v in doc.items() if v is not None}


def batch(*docs: dict[str, Any], at_us: int = T0, create_only: bool = False) -> PutJobs:
    return PutJobs(at_us=at_us, specs=tuple(docs), create_only=create_only)


def test_a_batch_creates_configures_and_leaves_unchanged_in_one_entry(h: Any) -> None:
    h.put("old")
    h.put("same")
    index = h.index
    result = h.ok(batch(job_doc("new"), job_doc("old", description="edited"), job_doc("same"), at_us=T0 + SEC))
    assert h.index == index + 1
    assert [(i["name"], i["change"], i["version"]) for i in result["items"]] == [
        ("new", "created", 1), ("old", "configured", 2), ("same", "unchanged", 1)]
    assert h.state.jobs["new"]["created_us"] == T0 + SEC and h.state.job_runs["new"] == []
    assert h.state.jobs["new"]["spec"]["timezone"] == "UTC"  # canonical documents, as PutJob stores
    assert h.state.jobs["old"]["spec"]["description"] == "edited"


def test_a_bad_document_anywhere_stores_nothing_and_names_it(h: Any) -> None:
    h.put("old")
    before = h.semantic()
    refused = h.rejected(batch(job_doc("a"), job_doc("old", description="edited"),
                               job_doc("c", http={"url": "ftp://x"}, timeout="soon")))
    assert refused.code == "invalid" and refused.message.startswith("jobs[2].")
    assert "jobs[2].http.url: " in refused.message and "jobs[2].timeout: " in refused.message
    assert h.semantic() == before
    assert "a" not in h.state.jobs and h.state.jobs["old"]["version"] == 1


def test_duplicate_names_are_refused_whole(h: Any) -> None:
    refused = h.rejected(batch(job_doc("a"), job_doc("b"), job_doc("a", description="again")))
    assert refused.code == "invalid" and "jobs[2].name" in refused.message and "jobs[0]" in refused.message
    assert h.state.jobs == {}


def test_create_only_refuses_the_whole_batch_naming_every_existing_job(h: Any) -> None:
    h.put("x")
    h.put("y")
    before = h.semantic()
    refused = h.rejected(batch(job_doc("x"), job_doc("fresh"), job_doc("y"), create_only=True))
    assert refused.code == "conflict" and "'x'" in refused.message and "'y'" in refused.message
    assert h.semantic() == before
    assert h.ok(batch(job_doc("fresh"), create_only=True))["items"][0]["change"] == "created"


def test_a_cycle_closed_within_the_batch_is_refused(h: Any) -> None:
    refused = h.rejected(batch(job_doc("a", schedule=None, depends_on={"job": "b"}),
                               job_doc("b", schedule=None, depends_on={"job": "a"})))
    assert refused.code == "invalid" and "dependency cycle" in refused.message
    assert h.state.jobs == {}


def test_cycles_are_judged_on_the_state_the_whole_batch_leaves(h: Any) -> None:
    # Stored: a -> b. The batch turns it round (b -> a) and moves a to c: no cycle once applied,
    # though one document at a time (b -> a while a -> b still stands) would close one.
    h.put("b", schedule="@hourly")
    h.put("a", schedule=None, depends_on={"job": "b"})
    h.put("c", schedule="@hourly")
    result = h.ok(batch(job_doc("b", schedule=None, depends_on={"job": "a"}),
                        job_doc("a", schedule=None, depends_on={"job": "c"})))
    assert [i["change"] for i in result["items"]] == ["configured", "configured"]
    assert h.state.job("b").depends_on.job == "a"  # type: ignore[union-attr]


def test_an_edit_in_a_batch_withdraws_claims_like_a_single_put(h: Any) -> None:
    h.put("ping")
    run = h.claim_one("ping", slot(2))
    result = h.ok(batch(job_doc("ping", schedule="*/5 * * * *"), at_us=slot(1)))
    assert result["cancelled"] == [run["id"]] == result["items"][0]["cancelled"]
    assert h.run(run["id"])["status"] == "cancelled"


def test_offered_and_decoded_batches_leave_byte_identical_snapshots() -> None:
    # The proposer applies its own parse (State.offer); every other replica decodes and parses.
    docs = [job_doc(f"j{i}", schedule=f"{i % 60} * * * *", labels={"team": f"t{i % 3}"}) for i in range(50)]
    jobs = tuple(parse_job(d) for d in docs)
    cmd = PutJobs(at_us=T0, specs=tuple(j.to_doc() for j in jobs))
    raw = encode_command(cmd)
    proposer, follower = State(), State()
    proposer.offer(raw, cmd, jobs)
    first = proposer.apply(raw, ApplyContext(index=1))
    second = follower.apply(raw, ApplyContext(index=1))
    assert isinstance(first, Applied) and isinstance(second, Applied)
    assert first.result == second.result
    assert proposer.snapshot_bytes() == follower.snapshot_bytes()
    assert len(proposer.jobs) == 50


def test_metrics_count_each_job_of_a_batch_and_the_batch(make_harness: Callable[[], Any]) -> None:
    h = make_harness()
    h.put("old")
    metrics = Metrics(node_id="n1", state=h.state, raft=lambda: NodeStatus.__new__(NodeStatus))  # never scraped
    h.index += 1
    raw = encode_command(batch(job_doc("new"), job_doc("old", description="x"), at_us=T0 + MIN))
    applied = h.state.apply(raw, ApplyContext(index=h.index))
    assert isinstance(applied, Applied)
    metrics.on_applied(applied, replay=False)
    writes = {(s.labels["command"], s.labels["change"]): s.value
              for family in metrics.job_writes.collect() for s in family.samples if s.name.endswith("_total")}
    assert writes == {("put_jobs", "created"): 1.0, ("put_jobs", "configured"): 1.0}
    batches = [s.value for family in metrics.job_batches.collect() for s in family.samples if s.name.endswith("_total")]
    assert batches == [1.0]
