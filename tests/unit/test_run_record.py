"""The typed run record: plain strings in every record, applied or restored, and claims from
journals written before ``Claim.cause`` was split into ``upstream`` and ``request_key``."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from raftlog.codec import CodecError, encode
from scheduler.commands import CancelRun, Claim, ClaimSlots, ExpireRuns, decode_command, encode_command
from scheduler.state import Applied, State
from tests.unit.conftest import SEC, T0, Harness, slot

# A claim as entries carried it before the split: every field of the old Claim, ``cause`` included.
_OLD_CLAIM = {"job": "", "slot_us": 0, "trigger": "", "status": "claimed", "node": None, "attempt": 1,
              "reason": None, "retry_of": None, "cause": None, "not_before_us": None}


def _old_claim_slots(at_us: int, *claims: dict[str, Any]) -> bytes:
    """ClaimSlots bytes exactly as the old encoder wrote them."""
    return encode("claim_slots", {"at_us": at_us, "leader": "n1", "term": 1,
                                  "claims": [{**_OLD_CLAIM, **c} for c in claims], "cancel": [], "summaries": []})


def _upstream_done(h: Harness) -> str:
    """Jobs ``up`` and ``down`` (triggered by ``up``) and ``ask`` (manual); ``up`` ran: ``down`` is pending."""
    h.put("up")
    h.put("down", schedule=None, depends_on={"job": "up"})
    h.put("ask", schedule="@manually")
    run = h.claim_one("up", slot(1))
    h.finish("n1", run["id"], "succeeded", slot(1) + SEC)
    return str(run["id"])


def test_an_old_claim_slots_entry_decodes_its_cause_by_trigger() -> None:
    raw = _old_claim_slots(T0, {"job": "down", "slot_us": slot(1), "trigger": "dependency", "node": "n2",
                                "cause": "r10000"},
                           {"job": "ask", "slot_us": T0, "trigger": "manual", "node": "n1", "cause": "req-1"},
                           {"job": "up", "slot_us": slot(2), "trigger": "schedule", "node": "n1"})
    cmd = decode_command(raw)
    assert isinstance(cmd, ClaimSlots)
    assert [(c.upstream, c.request_key) for c in cmd.claims] == [("r10000", None), (None, "req-1"), (None, None)]


def _harness() -> Harness:
    h = Harness()
    h.node("n1")
    h.node("n2")
    return h


def test_replaying_an_old_journal_decides_the_same_as_the_new_encoding() -> None:
    old, new = _harness(), _harness()
    upstream = _upstream_done(old)
    assert _upstream_done(new) == upstream
    at = slot(1) + 2 * SEC
    old_out = old.apply(_old_claim_slots(
        at, {"job": "down", "slot_us": slot(1), "trigger": "dependency", "node": "n2", "cause": upstream},
        {"job": "ask", "slot_us": at, "trigger": "manual", "node": "n1", "cause": "req-1"},
        {"job": "ask", "slot_us": at, "trigger": "manual", "node": "n2", "cause": "req-1"}))  # a fan-out
    new_out = new.apply(encode_command(ClaimSlots(at_us=at, leader="n1", term=1, claims=(
        Claim(job="down", slot_us=slot(1), trigger="dependency", node="n2", upstream=upstream),
        Claim(job="ask", slot_us=at, trigger="manual", node="n1", request_key="req-1"),
        Claim(job="ask", slot_us=at, trigger="manual", node="n2", request_key="req-1")))))
    assert isinstance(old_out, Applied) and isinstance(new_out, Applied)
    assert [r["cause"] for r in old_out.result["runs"]] == [upstream, "req-1", "req-1"]
    assert old_out.result == new_out.result
    assert old.state.snapshot_bytes() == new.state.snapshot_bytes()
    # The old request key still deduplicates a request repeated in the new encoding.
    again = new.claim(Claim(job="ask", slot_us=at, trigger="manual", node="n1", request_key="req-1"), at_us=at)
    assert again["refused"][0]["reason"] == "this manual request was already recorded"


@pytest.mark.parametrize(("trigger", "field"), [("dependency", "upstream"), ("manual", "request_key")])
def test_a_claim_with_cause_and_its_new_field_is_malformed(trigger: str, field: str) -> None:
    raw = _old_claim_slots(T0, {"job": "ping", "slot_us": T0, "trigger": trigger, "cause": "x", field: "y"})
    with pytest.raises(CodecError, match=f"malformed claim: both 'cause' and '{field}' given"):
        decode_command(raw)


def test_records_hold_plain_strings_and_stay_untracked_by_the_collector(h: Any) -> None:
    """Statuses and triggers are the enums' values, never their members: a record of strings,
    numbers and None is skipped by the cyclic GC, which a million records need (runs.py)."""
    h.put("flaky", retries={"max": 1})
    upstream = _upstream_done(h)
    h.claim(Claim(job="down", slot_us=slot(1), trigger="dependency", node="n2", upstream=upstream),
            Claim(job="up", slot_us=slot(2), trigger="schedule", status="skipped", reason="test"),
            Claim(job="ask", slot_us=slot(2), trigger="manual", node="n1", request_key="k"), at_us=slot(2))
    first = h.claim_one("flaky", slot(3))
    h.start("n1", first["id"], at_us=slot(3))
    h.finish("n1", first["id"], "failed", slot(3) + SEC)
    h.claim_one("flaky", slot(3), trigger="retry", attempt=2, retry_of=first["id"], at_us=slot(3) + 2 * SEC)
    h.ok(CancelRun(at_us=slot(4), run_id=h.state.job_runs["ask"][0]))
    h.ok(ExpireRuns(at_us=slot(9), leader="n1", term=1, runs=tuple(h.state.job_runs["down"])))
    for state in (h.state, _restored(h.state)):
        assert {(r["status"], r["trigger"]) for r in state.runs.values()} == {
            ("succeeded", "schedule"), ("lost", "dependency"), ("skipped", "schedule"), ("cancelled", "manual"),
            ("retrying", "schedule"), ("claimed", "retry")}
        assert {(type(r["status"]), type(r["trigger"])) for r in state.runs.values()} == {(str, str)}
        assert [rid for rid, r in state.runs.items() if gc.is_tracked(r)] == []


def _restored(state: State) -> State:
    copy = State()
    copy.restore(state.snapshot_bytes())
    return copy


def test_claims_still_travel_with_one_cause_field_so_the_previous_release_reads_them() -> None:
    import msgpack

    cmd = ClaimSlots(at_us=T0, leader="n1", term=1, claims=(
        Claim(job="b", slot_us=T0, trigger="dependency", node="n1", upstream="r10000"),
        Claim(job="a", slot_us=T0, trigger="manual", node="n1", request_key="k1"),
    ))
    raw = encode_command(cmd)
    wire = msgpack.unpackb(raw, raw=False)["d"]["claims"]
    assert [(c["cause"], "upstream" in c, "request_key" in c) for c in wire] == [("r10000", False, False),
                                                                                ("k1", False, False)]
    assert decode_command(raw) == cmd
    with pytest.raises(ValueError, match="carries no upstream"):
        encode_command(ClaimSlots(at_us=T0, leader="n1", term=1, claims=(
            Claim(job="a", slot_us=T0, trigger="manual", node="n1", request_key="k", upstream="r1"),)))
