"""The command codec: every command round-trips; malformed bytes are refused, by name, without effect."""

from __future__ import annotations

import dataclasses
import zlib
from datetime import UTC, datetime
from typing import Any

import msgpack
import pytest

from raftlog.codec import CodecError, decode, encode, pack
from scheduler.commands import (
    APPLIES,
    COMMANDS,
    EXPIRE_SEEN,
    AlertResults,
    CancelRun,
    Claim,
    ClaimSlots,
    Command,
    DeleteDeadLetter,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    JobPlanning,
    NodeClock,
    Noop,
    NoteNextSlots,
    PauseJob,
    PutJob,
    PutJobs,
    RegisterNode,
    Rejected,
    RenewLeases,
    ReportLost,
    StartRuns,
    decode_command,
    encode_command,
)
from scheduler.instants import us

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
SPEC = {"name": "ping", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://example.test/hook"}}

SAMPLES: dict[str, Command] = {
    "noop": Noop(at_us=T0, node="n1", term=3),
    "register_node": RegisterNode(at_us=T0, node_id="n1", raft_addr="127.0.0.1:7001", http_addr="127.0.0.1:8001",
                                  tags={"zone": "a", "disk": "ssd"}, allow_shell=True),
    "put_job": PutJob(at_us=T0, spec={**SPEC, "labels": {"team": "billing"}, "retries": {"max": 3}},
                      expect_version=4),
    "put_jobs": PutJobs(at_us=T0, specs=(SPEC, {**SPEC, "name": "pong", "labels": {"team": "ops"}},
                                         {**SPEC, "name": "nested", "http": {"url": "https://x.test", "expect_status": [200, 204]}}),
                        create_only=True),
    "delete_job": DeleteJob(at_us=T0, name="ping"),
    "pause_job": PauseJob(at_us=T0, name="ping", paused=True, note="maintenance"),
    "claim_slots": ClaimSlots(
        at_us=T0, leader="n1", term=7,
        claims=(
            Claim(job="ping", slot_us=T0 + 60_000_000, trigger="schedule", node="n2"),
            Claim(job="ping", slot_us=T0, trigger="retry", status="claimed", node="n3", attempt=2,
                  reason=None, retry_of="r10000", request_key=None, not_before_us=T0 + 10_000_000),
            Claim(job="other", slot_us=T0, trigger="dependency", status="failed", reason="no live node",
                  upstream="r20001"),
        ),
        cancel=("r30000", "r30001"),
        summaries=({"job": "ping", "status": "missed", "count": 70, "first_us": 1, "last_us": 2, "reason": "gap"},),
    ),
    "start_runs": StartRuns(at_us=T0, node="n2", runs=("r1", "r2"), started_us={"r1": T0, "r2": T0 + 1},
                            lease_until_us=T0 + 5_000_000),
    "renew_leases": RenewLeases(at_us=T0, node="n2", runs=("r1",), lease_until_us=T0 + 9_000_000),
    "finish_runs": FinishRuns(at_us=T0, node="n2", results=(
        {"run_id": "r1", "status": "succeeded", "started_us": T0, "finished_us": T0 + 3, "exit_code": None,
         "http_status": 200, "output": "ok\n", "error": None},
        {"run_id": "r2", "status": "failed", "started_us": T0, "finished_us": T0 + 4, "exit_code": 2,
         "http_status": None, "output": "", "error": "exit 2"},
    )),
    "expire_runs": ExpireRuns(at_us=T0, leader="n1", term=7, runs=("r1", "r2"), reason="lease lapsed",
                              seen={"r1": 0, "r2": T0 + 5_000_000}),
    "report_lost": ReportLost(at_us=T0, node="n2", runs=("r1",)),
    "cancel_run": CancelRun(at_us=T0, run_id="r1", reason="operator"),
    "delete_dead_letter": DeleteDeadLetter(at_us=T0, run_id="r1"),
    "alert_results": AlertResults(at_us=T0, leader="n1", results=(
        {"id": "a1", "ok": True, "error": None}, {"id": "a2", "ok": False, "error": "HTTP 500"},
    )),
    "node_clock": NodeClock(at_us=T0, node="n2", offset_us=3_000_000, error_us=1_500, skewed=True, leader="n1",
                            term=7, reason="its clock is +3.000s from the leader's"),
    "job_planning": JobPlanning(at_us=T0, job="a", version=3, error="OverflowError: date value out of range",
                                leader="n1", term=7),
    "note_next_slots": NoteNextSlots(at_us=T0, leader="n1", term=7, slots=(
        {"job": "a", "version": 3, "created_us": T0, "from_us": T0, "slot_us": T0 + 60_000_000, "epoch": "1/2025b"},
        {"job": "b", "version": 1, "created_us": T0, "from_us": T0, "slot_us": None, "epoch": "1/2025b"},
    )),
}


def test_every_command_has_a_sample() -> None:
    # A new command without a sample here would escape the round-trip test.
    assert set(SAMPLES) == set(COMMANDS)
    for tag, cmd in SAMPLES.items():
        assert type(cmd) is COMMANDS[tag] and cmd.TAG == tag


@pytest.mark.parametrize("tag", sorted(COMMANDS))
def test_round_trip(tag: str) -> None:
    cmd = SAMPLES[tag]
    back = decode_command(encode_command(cmd))
    assert back == cmd
    assert type(back) is type(cmd)


@pytest.mark.parametrize("tag", sorted(COMMANDS))
def test_round_trip_with_defaults_only(tag: str) -> None:
    # Fields left at their defaults survive too (an encoded command names them all, but for
    # fields a later release added, see test_a_field_added_later_is_left_out_while_unset).
    cls = COMMANDS[tag]
    required = {
        "register_node": dict(node_id="n", raft_addr="a", http_addr="b"), "put_job": dict(spec=SPEC),
        "put_jobs": dict(specs=()),
        "delete_job": dict(name="x"), "pause_job": dict(name="x", paused=False),
        "claim_slots": dict(leader="n", term=1, claims=()),
        "start_runs": dict(node="n", runs=(), started_us={}, lease_until_us=0),
        "renew_leases": dict(node="n", runs=(), lease_until_us=0), "finish_runs": dict(node="n", results=()),
        "expire_runs": dict(leader="n", term=1, runs=()), "report_lost": dict(node="n", runs=()),
        "cancel_run": dict(run_id="r"), "delete_dead_letter": dict(run_id="r"),
        "alert_results": dict(leader="n", results=()),
        "node_clock": dict(node="n", offset_us=None, error_us=None, skewed=False, leader="n", term=1),
        "job_planning": dict(job="x", version=1, error=None, leader="n", term=1),
        "note_next_slots": dict(leader="n", term=1, slots=()),
    }.get(tag, {})
    cmd = cls(at_us=0, **required)  # type: ignore[arg-type]
    assert decode_command(encode_command(cmd)) == cmd


@pytest.mark.parametrize("tag", sorted(t for t, c in COMMANDS.items() if c.LATER))
def test_a_field_added_later_is_left_out_while_unset(tag: str) -> None:
    """An entry that leaves a later field unset is the entry an older release wrote and reads;
    set, it is named (a leader sets it only once every member announced it applies it)."""
    cls = COMMANDS[tag]
    sample = SAMPLES[tag]
    later = cls.LATER
    assert later and all(getattr(sample, name) for name in later)  # the sample sets them
    written = decode(encode_command(sample)).data
    assert later <= set(written)
    unset = dataclasses.replace(sample, **{name: type(getattr(sample, name))() for name in later})
    written = decode(encode_command(unset)).data
    assert not later & set(written)
    assert set(written) == {f.name for f in dataclasses.fields(cls)} - later
    assert decode_command(encode_command(unset)) == unset
    for name in later:  # optional on the wire: a default an older entry falls back to
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        assert field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Grown(Command):
    TAG = "grown"
    LATER = frozenset({"limit"})
    limit: int = 5


def test_a_later_field_is_left_out_only_at_its_default_not_whenever_falsy() -> None:
    assert "limit" not in decode(encode_command(_Grown(at_us=1))).data
    assert decode(encode_command(_Grown(at_us=1, limit=0))).data["limit"] == 0  # set, though falsy
    assert decode(encode_command(_Grown(at_us=1, limit=7))).data["limit"] == 7


def test_expire_runs_names_the_form_peers_must_announce() -> None:
    assert EXPIRE_SEEN in APPLIES and ExpireRuns.LATER == {"seen"}


def test_claims_come_back_as_a_tuple_of_claims() -> None:
    back = decode_command(encode_command(SAMPLES["claim_slots"]))
    assert isinstance(back, ClaimSlots)
    assert isinstance(back.claims, tuple) and all(isinstance(c, Claim) for c in back.claims)
    assert back.claims[1].retry_of == "r10000" and back.claims[2].upstream == "r20001"
    assert isinstance(back.cancel, tuple) and isinstance(back.summaries, tuple)


def test_encoding_is_deterministic() -> None:
    for cmd in SAMPLES.values():
        assert encode_command(cmd) == encode_command(decode_command(encode_command(cmd)))


# ---- refusals -------------------------------------------------------------------

MALFORMED: list[tuple[str, bytes, str]] = [
    ("unknown tag", encode("launch_missiles", {"at_us": 1}), "unknown command tag 'launch_missiles'"),
    ("newer envelope", encode("noop", {"at_us": 1}, version=2), "envelope version 2 is not understood"),
    ("not msgpack", b"\xc1\xc1\xc1", "not valid msgpack"),
    ("truncated", encode_command(SAMPLES["put_job"])[:-3], "not valid msgpack"),
    ("plain text", b"hello world", "not valid msgpack"),
    ("a string", pack("hello"), "not an envelope"),
    ("empty", b"", "not valid msgpack"),
    ("a list", pack([1, "noop", {}]), "not an envelope"),
    ("no data key", pack({"v": 1, "t": "noop"}), "not an envelope"),
    ("version as text", pack({"v": "1", "t": "noop", "d": {}}), "envelope version must be an integer"),
    ("version as bool", pack({"v": True, "t": "noop", "d": {}}), "envelope version must be an integer"),
    ("tag not a string", pack({"v": 1, "t": 5, "d": {}}), "tag must be a string"),
    ("data not a map", pack({"v": 1, "t": "noop", "d": [1]}), "data a map"),
    ("missing field", encode("delete_job", {"at_us": 1}), "command 'delete_job' lacks field 'name'"),
    ("missing at_us", encode("noop", {}), "lacks field 'at_us'"),
    ("unknown field", encode("delete_job", {"at_us": 1, "name": "x", "force": True}),
     "command 'delete_job' has unknown fields ['force']"),
    ("claim missing field", encode("claim_slots", {"at_us": 1, "leader": "n", "term": 1,
                                                   "claims": [{"job": "x", "trigger": "schedule"}]}),
     "malformed claim"),
    ("claim unknown field", encode("claim_slots", {"at_us": 1, "leader": "n", "term": 1,
                                                   "claims": [{"job": "x", "slot_us": 1, "trigger": "schedule",
                                                               "priority": 9}]}),
     "malformed claim"),
    ("claim not a map", encode("claim_slots", {"at_us": 1, "leader": "n", "term": 1, "claims": [7]}),
     "malformed claim"),
    ("specs not compressed", encode("put_jobs", {"at_us": 1, "specs": [SPEC]}), "must be compressed bytes"),
    ("specs not zlib", encode("put_jobs", {"at_us": 1, "specs": b"nope"}), "is not zlib data"),
    ("specs truncated", encode("put_jobs", {"at_us": 1, "specs": zlib.compress(pack([SPEC]))[:-4]}),
     "is truncated"),
    ("specs a bomb", encode("put_jobs", {"at_us": 1, "specs": zlib.compress(b"\x00" * (65 * 2**20), 1)}),
     "inflates beyond"),
    ("specs not maps", encode("put_jobs", {"at_us": 1, "specs": zlib.compress(pack([1, 2]))}),
     "field 'specs' must be"),
    ("specs not msgpack", encode("put_jobs", {"at_us": 1, "specs": zlib.compress(b"\xc1")}), "not valid msgpack"),
    ("claims not a list", encode("claim_slots", {"at_us": 1, "leader": "n", "term": 1, "claims": 7}),
     "malformed claim"),
    # Claims are read one at a time: the first malformed claim is the one the message names.
    ("first claim short, second not a map", encode("claim_slots", {"at_us": 1, "leader": "n", "term": 1,
                                                                   "claims": [{"job": "a"}, 5]}),
     "missing 2 required keyword-only arguments"),
    ("first claim unknown field, second cause twice", encode("claim_slots", {
        "at_us": 1, "leader": "n", "term": 1,
        "claims": [{"job": "a", "slot_us": 1, "trigger": "schedule", "bogus": 1},
                   {"job": "a", "slot_us": 2, "trigger": "manual", "cause": "k", "request_key": "k"}]}),
     "unexpected keyword argument 'bogus'"),
]


@pytest.mark.parametrize(("raw", "message"), [(raw, msg) for _, raw, msg in MALFORMED],
                         ids=[name for name, _, _ in MALFORMED])
def test_decode_refuses_with_a_message_naming_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_command(raw)
    assert message in str(info.value)


def test_newer_version_names_the_versions_understood() -> None:
    with pytest.raises(CodecError) as info:
        decode_command(encode("noop", {"at_us": 1}, version=2))
    assert "it reads version 1" in str(info.value)


# Envelopes well-formed but with fields of the wrong type: refused before they reach apply, so a
# command is never half applied (a slot recorded, then an exception on the next claim).
WRONG_TYPES: list[tuple[str, dict[str, Any], str]] = [
    ("claim slot as text", {"claims": [{"job": "ping", "slot_us": "soon", "trigger": "schedule", "node": "n1"}]},
     "slot_us"),
    ("claim job as number", {"claims": [{"job": 5, "slot_us": T0, "trigger": "schedule", "node": "n1"}]}, "job"),
    ("claim attempt as bool", {"claims": [{"job": "ping", "slot_us": T0, "trigger": "schedule", "node": "n1",
                                           "attempt": True}]}, "attempt"),
    ("claim node as number", {"claims": [{"job": "ping", "slot_us": T0, "trigger": "schedule", "node": 1}]}, "node"),
    ("claim not_before_us as float", {"claims": [{"job": "ping", "slot_us": T0, "trigger": "schedule", "node": "n1",
                                                  "not_before_us": 1.5}]}, "not_before_us"),
    ("claim cause as number", {"claims": [{"job": "ping", "slot_us": T0, "trigger": "manual", "node": "n1",
                                           "cause": 7}]}, "request_key"),
    ("term as text", {"term": "7"}, "term"),
    ("cancel not a list", {"cancel": "r1"}, "cancel"),
    ("summaries of numbers", {"summaries": [1, 2]}, "summaries"),
]
_GOOD_CLAIMS = {"at_us": T0, "leader": "n1", "term": 1,
                "claims": [{"job": "ping", "slot_us": T0 + 60_000_000, "trigger": "schedule", "node": "n1"}]}


@pytest.mark.parametrize(("override", "field_name"), [(o, f) for _, o, f in WRONG_TYPES],
                         ids=[n for n, _, _ in WRONG_TYPES])
def test_decode_refuses_wrong_types(override: dict[str, Any], field_name: str) -> None:
    data = dict(_GOOD_CLAIMS)
    if "claims" in override:
        data["claims"] = _GOOD_CLAIMS["claims"] + override["claims"]  # a good claim first
    else:
        data.update(override)
    with pytest.raises(CodecError) as info:
        decode_command(encode("claim_slots", data))
    assert field_name in str(info.value)


@pytest.mark.parametrize(("tag", "data", "field_name"), [
    ("start_runs", {"at_us": T0, "node": "n1", "runs": ["r1"], "started_us": ["r1", T0], "lease_until_us": T0},
     "started_us"),
    ("start_runs", {"at_us": T0, "node": "n1", "runs": ["r1"], "started_us": {"r1": "now"}, "lease_until_us": T0},
     "started_us"),
    # Lists and maps whose items are all of one exact type pass without a check per item;
    # an item of any other type is still checked, and refused.
    ("start_runs", {"at_us": T0, "node": "n1", "runs": ["r1", 5], "started_us": {}, "lease_until_us": T0}, "runs"),
    ("start_runs", {"at_us": T0, "node": "n1", "runs": ["r1"], "started_us": {"r1": True}, "lease_until_us": T0},
     "started_us"),
    ("start_runs", {"at_us": T0, "node": "n1", "runs": ["r1"], "started_us": {"r1": T0, "r2": 1.5},
                    "lease_until_us": T0}, "started_us"),
    ("expire_runs", {"at_us": T0, "leader": "n1", "term": 1, "runs": ["r1"], "seen": {"r1": None}}, "seen"),
    ("finish_runs", {"at_us": T0, "node": "n1", "results": ["r1"]}, "results"),
    ("put_job", {"at_us": T0, "spec": SPEC, "expect_version": "1"}, "expect_version"),
    ("pause_job", {"at_us": T0, "name": "ping", "paused": "yes"}, "paused"),
    ("register_node", {"at_us": T0, "node_id": "n9", "raft_addr": "a", "http_addr": "b", "tags": {"zone": 1}},
     "tags"),
    ("noop", {"at_us": 1.5}, "at_us"),
    ("noop", {"at_us": None}, "at_us"),
])
def test_decode_refuses_wrong_types_of_other_commands(tag: str, data: dict[str, Any], field_name: str) -> None:
    with pytest.raises(CodecError) as info:
        decode_command(encode(tag, data))
    assert f"{tag!r}" in str(info.value) and field_name in str(info.value)


def test_optional_fields_accept_null() -> None:
    cmd = decode_command(encode("put_job", {"at_us": T0, "spec": SPEC, "expect_version": None}))
    assert isinstance(cmd, PutJob) and cmd.expect_version is None
    cmd = decode_command(encode("pause_job", {"at_us": T0, "name": "ping", "paused": False, "note": None}))
    assert isinstance(cmd, PauseJob) and cmd.note is None


# ---- through State.apply: a Rejected value, the state untouched ---------------------------------------


@pytest.fixture
def busy(h: Any) -> Any:
    """A harness whose state holds a job, a running attempt and a claim."""
    assert h.put("ping").result["change"] == "created"
    run = h.claim_one("ping", T0 + 60_000_000)
    h.start("n1", run["id"], at_us=T0 + 60_000_000)
    h.claim_one("ping", T0 + 120_000_000, node="n2")
    return h


ALL_BAD = [raw for _, raw, _ in MALFORMED] + [
    encode("claim_slots", {**_GOOD_CLAIMS, "claims": _GOOD_CLAIMS["claims"] + o["claims"]})
    if "claims" in o else encode("claim_slots", {**_GOOD_CLAIMS, **o}) for _, o, _ in WRONG_TYPES
]


@pytest.mark.parametrize("raw", ALL_BAD, ids=[n for n, _, _ in MALFORMED] + [n for n, _, _ in WRONG_TYPES])
def test_apply_turns_malformed_bytes_into_a_rejection_without_effect(busy: Any, raw: bytes) -> None:
    before = busy.semantic()
    out = busy.apply(raw)  # never raises
    assert isinstance(out, Rejected)
    assert out.code == "invalid"
    assert f"entry {busy.index} refused" in out.message
    assert busy.semantic() == before
    assert busy.state.applied_index == busy.index  # the entry was consumed all the same


def test_apply_rejection_names_the_unknown_tag_and_version(busy: Any) -> None:
    out = busy.apply(encode("launch_missiles", {"at_us": 1}))
    assert isinstance(out, Rejected) and "'launch_missiles'" in out.message
    out = busy.apply(encode("noop", {"at_us": 1}, version=2))
    assert isinstance(out, Rejected) and "version 2" in out.message and "reads version 1" in out.message


def test_rejection_is_the_same_on_every_replica(make_harness: Any) -> None:
    a, b = make_harness(), make_harness()
    for raw in ALL_BAD:
        assert a.apply(raw) == b.apply(raw)
    assert a.state.snapshot_bytes() == b.state.snapshot_bytes()


def test_msgpack_of_a_command_is_a_versioned_envelope() -> None:
    body = msgpack.unpackb(encode_command(SAMPLES["delete_job"]), raw=False)
    assert body == {"v": 1, "t": "delete_job", "d": {"at_us": T0, "name": "ping"}}
