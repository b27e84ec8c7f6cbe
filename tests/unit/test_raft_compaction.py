"""When a node asks for a snapshot: once the entries applied since the last weigh
``compaction_entries`` and, for a state machine that counts its records, a share of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raftlog.fsm import ApplyContext
from raftlog.node import NodeConfig, RaftNode
from scheduler.commands import Claim, ClaimSlots, FinishRuns, PutJobs, RegisterNode, StartRuns, encode_command
from tests.unit.conftest import SEC, T0, Harness, job_doc, slot


class Weighed:
    """A state machine whose every entry weighs 100, as a batch of 100 records would."""

    entry_weight = 100

    def apply(self, command: bytes, ctx: ApplyContext) -> Any:
        return None

    def snapshot(self) -> Iterator[bytes]:
        return iter(())

    def restore(self, data: bytes) -> None:
        pass


class Counted(Weighed):
    """And that says it holds ``held`` records."""

    def __init__(self, held: int) -> None:
        self.held = held

    def records(self) -> int:
        return self.held


class Host:
    def __init__(self) -> None:
        self.forced = 0

    def forceLogCompaction(self) -> None:  # noqa: N802 - pysyncobj's name
        self.forced += 1


def node_for(fsm: Any, tmp_path: Path) -> tuple[RaftNode, Host]:
    node = RaftNode(NodeConfig(raft_addr="127.0.0.1:1", peers=(), data_dir=tmp_path, secret="s",
                               compaction_entries=500, compaction_share=0.2), fsm)
    host = Host()
    node._host = host  # type: ignore[assignment]
    return node, host


def entries_until_asked(node: RaftNode, host: Host, fsm: Any, bound: int = 1000) -> int:
    for n in range(1, bound + 1):
        node._apply(b"x", n)
        if host.forced:
            return n
    raise AssertionError("no snapshot asked for")


def test_a_small_state_is_snapshotted_by_the_fixed_count(tmp_path: Path) -> None:
    fsm = Counted(held=1000)  # a fifth is 200, under the 500 of compaction_entries
    node, host = node_for(fsm, tmp_path)
    assert entries_until_asked(node, host, fsm) == 5  # 5 entries of weight 100


def test_a_large_state_waits_for_a_share_of_its_records(tmp_path: Path) -> None:
    fsm = Counted(held=100_000)  # a fifth is 20,000: 200 entries of weight 100
    node, host = node_for(fsm, tmp_path)
    assert entries_until_asked(node, host, fsm) == 200
    # Counting starts again from the request: the next one comes after as much again.
    host.forced = 0
    assert entries_until_asked(node, host, fsm) == 200


def test_a_state_machine_without_a_record_count_keeps_the_fixed_count(tmp_path: Path) -> None:
    fsm = Weighed()
    node, host = node_for(fsm, tmp_path)
    assert entries_until_asked(node, host, fsm) == 5


def test_the_state_counts_its_jobs_and_runs() -> None:
    h = Harness()
    h.node("n1")
    h.put("a")
    h.put("b")
    h.claim_one("a", slot(1))
    assert h.state.records() == 3


def test_an_entry_counts_the_claims_starts_and_results_it_carries(tmp_path: Path) -> None:
    """A burst of runs travels as a few entries of many claims, starts and results each, and the
    journal holds those bytes in memory until the next snapshot: counted as one entry each,
    1,000 runs a second went ~5 minutes (the time rule) between snapshots, and an agent held
    ~800 bytes for every run started since (1,000,000 records kept: 950-1,120 MB an agent,
    45 s from a restart to the first write, replaying them)."""
    h = Harness()
    node, host = node_for(h.state, tmp_path)
    jobs = [f"j{k:03d}" for k in range(40)]
    entries: list[Any] = [
        RegisterNode(at_us=T0, node_id="n1", raft_addr="n1:7000", http_addr="n1:8000"),
        PutJobs(at_us=T0, specs=tuple(job_doc(j) for j in jobs)),
        ClaimSlots(at_us=T0, leader="n1", term=1, claims=tuple(
            Claim(job=j, slot_us=slot(1), trigger="schedule", node="n1") for j in jobs)),
    ]
    weights = []
    for cmd in entries:
        node._apply(encode_command(cmd), h.index + 1)
        h.index += 1
        weights.append(h.state.entry_weight)
    ids = tuple(h.state.runs)
    for cmd in (StartRuns(at_us=slot(1), node="n1", runs=ids, started_us={r: slot(1) for r in ids},
                          lease_until_us=slot(1) + 5 * SEC),
                FinishRuns(at_us=slot(1) + 1000, node="n1", results=tuple(
                    {"run_id": r, "status": "succeeded", "started_us": slot(1), "finished_us": slot(1) + 1000,
                     "exit_code": None, "http_status": 200, "output": "", "error": None} for r in ids))):
        node._apply(encode_command(cmd), h.index + 1)
        h.index += 1
        weights.append(h.state.entry_weight)
    assert len(ids) == 40 and weights == [1, 40, 40, 40, 40]
    assert h.state.runs.status_counts() == {"succeeded": 40}
    # 161 so far, under the node's 500: the ninth entry of 40 claims more reaches it.
    asked = []
    for k in range(9):
        node._apply(encode_command(ClaimSlots(at_us=T0, leader="n1", term=1, claims=tuple(
            Claim(job=j, slot_us=slot(2 + k), trigger="schedule", node="n1") for j in jobs))), h.index + 1)
        h.index += 1
        asked.append(host.forced)
    assert asked == [0] * 8 + [1]
