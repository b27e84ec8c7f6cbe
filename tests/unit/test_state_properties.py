"""Property tests: random command sequences keep replicas byte-identical and the ledger's invariants true.

Steps are generated abstractly (indexes into whatever runs, jobs and triggers exist) and turned into
commands against one replica's state just before they are applied, so retries, replays, dependency
claims and the rest name real runs often enough to exercise every transition. The same bytes go to
a second replica, and, from a snapshot taken half way, to a third.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.codec import encode
from raftlog.fsm import ApplyContext
from scheduler.commands import (
    CancelRun,
    Claim,
    ClaimSlots,
    Command,
    DeleteDeadLetter,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    PauseJob,
    PutJob,
    RegisterNode,
    Rejected,
    RenewLeases,
    ReportLost,
    StartRuns,
    encode_command,
)
from scheduler.instants import us
from scheduler.ledger import ACTIVE, MAX_CLAIMS_PER_ENTRY
from scheduler.state import State

T0 = us(datetime(2026, 1, 1, tzinfo=UTC))
SEC = 1_000_000
MIN = 60 * SEC
NAMES = ("a", "b", "c")
NODES = ("n1", "n2", "n9")  # n9 never registers
_BASE = {"schedule": "* * * * *", "executor": "http", "http": {"url": "https://example.test/hook"}}
VARIANTS: list[dict[str, Any]] = [
    {},
    {"retries": {"max": 1, "backoff": "1s"}, "history": {"keep": 3}, "delivery": "at-most-once"},
    {"concurrency": "forbid", "target": {"count": 2}, "history": {"keep": 2}},
    {"retries": {"max": 2, "backoff": "2s", "factor": 3}, "history": {"keep": 4, "max_age": "1m"}, "paused": False},
]


def job_spec(name: str, variant: int) -> dict[str, Any]:
    spec: dict[str, Any] = {**_BASE, "name": name, **VARIANTS[variant]}
    if name == "b":
        spec["depends_on"] = {"job": "a", "on": "any"}
    elif name == "c":
        spec["depends_on"] = {"job": "a", "on": "failure"}
        del spec["schedule"]
    return spec


pick = st.integers(min_value=0, max_value=50)
name_i = st.sampled_from((0, 1, 2, 0, 1, 2, 3))  # 3: a job that does not exist
node = st.sampled_from(("n1", "n2", "n1", "n2", "n1", "n2", "n9"))
reporter = st.sampled_from(("owner", "owner", "owner", "n1", "n2", "n9"))  # owner: the node of the first run named
claim_spec = st.tuples(
    st.sampled_from((-1, 0, 1, 1, 1, 2, 2, 3)),  # slot: minutes after the job's last decided one (<= 0: decided)
    st.sampled_from(["schedule", "schedule", "schedule", "schedule", "catchup", "manual", "retry", "retry",
                     "replay", "dependency", "dependency", "bogus"]),
    st.sampled_from(["claimed", "claimed", "claimed", "claimed", "skipped", "missed", "failed"]),
    node,
    pick,
)
entry = st.tuples(name_i, st.lists(claim_spec, min_size=1, max_size=5))  # one entry: mostly one job's claims
runs = st.lists(pick, min_size=1, max_size=3)
outcome = st.sampled_from(["succeeded", "failed", "failed", "timed_out"])


def weighted(*pairs: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    return st.one_of(*[strategy for weight, strategy in pairs for _ in range(weight)])


steps = weighted(
    (2, st.tuples(st.just("job"), st.sampled_from(("put", "put", "put", "pause", "resume", "delete")), name_i,
                  st.integers(0, len(VARIANTS) - 1))),
    (1, st.tuples(st.just("claim"), st.lists(entry, min_size=1, max_size=2), st.lists(pick, max_size=2),
                  st.booleans())),
    (3, st.tuples(st.just("claim"), entry.map(lambda e: [e]), st.just([]), st.just(False))),
    (2, st.tuples(st.just("start"), reporter, runs)),
    (1, st.tuples(st.just("renew"), reporter, runs)),
    (3, st.tuples(st.just("finish"), reporter, runs, outcome, st.integers(0, 3))),
    (1, st.tuples(st.just("expire"), runs)),
    (1, st.tuples(st.just("lost"), reporter, runs)),
    (1, st.tuples(st.just("cancel"), pick)),
    (1, st.tuples(st.just("delete_dead"), pick)),
    (1, st.tuples(st.just("garbage"), st.binary(max_size=24))),
    (1, st.tuples(st.just("mistyped"), st.sampled_from(["claim_slots", "start_runs", "finish_runs", "put_job"]),
                  st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3),
                            st.lists(st.integers(-2**63, 2**63), max_size=2),
                            st.dictionaries(st.text(max_size=2), st.integers(-2**63, 2**63), max_size=2)))),
    (1, st.tuples(st.just("tick"), st.integers(0, 15))),
)


class Driver:
    """Turns abstract steps into commands against ``state`` (the first replica)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.now = T0

    def run_id(self, k: int) -> str:
        """Mostly a live attempt, sometimes any run, now and then one that does not exist."""
        ids = list(self.state.active) if k % 3 and self.state.active else list(self.state.runs)
        return ids[k % len(ids)] if ids and k < 47 else f"r-none{k}"

    def reporter(self, who: str, runs: tuple[str, ...]) -> str:
        if who != "owner":
            return who
        run = self.state.runs.get(runs[0]) if runs else None
        return (run["node"] if run else None) or "n1"

    def command(self, step: tuple[Any, ...]) -> Command | bytes:
        kind = step[0]
        self.now += 7 * SEC
        if kind == "job":
            verb, name = step[1], NAMES[step[2]] if step[2] < len(NAMES) else "ghost"
            if verb == "put":
                return PutJob(at_us=self.now, spec=job_spec(name, step[3]) if name != "ghost" else {"name": "Bad!"})
            if verb == "delete":
                return DeleteJob(at_us=self.now, name=name)
            return PauseJob(at_us=self.now, name=name, paused=verb == "pause", note="n" if verb == "pause" else None)
        if kind == "claim":
            claims = tuple(self.claim(job_i, *c) for job_i, specs in step[1] for c in specs)
            summaries = ({"job": claims[0].job, "status": "missed", "count": 3, "first_us": T0,
                          "last_us": T0 + MIN, "reason": "gap"},) if step[3] else ()
            return ClaimSlots(at_us=self.now, leader="n1", term=1, claims=claims,
                              cancel=tuple(self.run_id(k) for k in step[2]), summaries=summaries)
        if kind in ("start", "renew", "finish", "lost"):
            runs = tuple(self.run_id(k) for k in step[2])
            who = self.reporter(step[1], runs)
            if kind == "start":
                runs = tuple(dict.fromkeys(runs))
                return StartRuns(at_us=self.now, node=who, runs=runs, started_us={r: self.now for r in runs[:1]},
                                 lease_until_us=self.now + 5 * SEC)
            if kind == "renew":
                return RenewLeases(at_us=self.now, node=who, runs=runs, lease_until_us=self.now + 5 * SEC)
            if kind == "lost":
                return ReportLost(at_us=self.now, node=who, runs=runs)
            # A result may repeat (resubmitted after an unknown outcome): finished_us is per run.
            results = tuple({"run_id": r, "status": step[3], "started_us": self.now - SEC,
                             "finished_us": T0 + len(r) * SEC + step[4], "exit_code": step[4], "http_status": None,
                             "output": "x" * (step[4] * 4000), "error": None} for r in runs)
            return FinishRuns(at_us=self.now, node=who, results=results)
        if kind == "expire":
            return ExpireRuns(at_us=self.now, leader="n1", term=1, runs=tuple(self.run_id(k) for k in step[1]))
        if kind == "cancel":
            return CancelRun(at_us=self.now, run_id=self.run_id(step[1]))
        if kind == "delete_dead":
            dead = list(self.state.dead)
            return DeleteDeadLetter(at_us=self.now, run_id=dead[step[1] % len(dead)] if dead else "r-none")
        if kind == "garbage":
            return bytes(step[1])
        if kind == "mistyped":
            good: dict[str, dict[str, Any]] = {
                "claim_slots": {"at_us": self.now, "leader": "n1", "term": 1,
                                "claims": [{"job": "a", "slot_us": self.now, "trigger": "schedule", "node": "n1"},
                                           {"job": "a", "slot_us": step[2], "trigger": "schedule", "node": "n1"}]},
                "start_runs": {"at_us": self.now, "node": "n1", "runs": list(self.state.active)[:2],
                               "started_us": step[2], "lease_until_us": self.now},
                "finish_runs": {"at_us": self.now, "node": "n1", "results": [
                    {"run_id": r, "status": "succeeded", "finished_us": self.now} for r in list(self.state.active)[:1]
                ] + [step[2]]},
                "put_job": {"at_us": self.now, "spec": job_spec("a", 0), "expect_version": step[2]},
            }
            return encode(step[1], good[step[1]])
        if kind == "tick":
            self.now += step[1] * MIN
            return RegisterNode(at_us=self.now, node_id="n1", raft_addr="n1:7000", http_addr="n1:8000")
        raise AssertionError(kind)

    def claim(self, job_i: int, offset: int, trigger: str, status: str, node: str, k: int) -> Claim:
        job = NAMES[job_i] if job_i < len(NAMES) else "ghost"
        node_or_none = node if status == "claimed" else None
        if trigger in ("retry", "replay"):
            waiting = [rid for rid in self.state.active if self.state.runs[rid]["status"] in ("retrying", "lost")]
            source = list(self.state.dead) if trigger == "replay" else waiting
            source = source if source or k % 4 else list(self.state.runs)  # now and then, any run
            if source:
                prev = self.state.runs[source[k % len(source)]]
                return Claim(job=prev["job"], slot_us=prev["slot_us"], trigger=trigger, status=status,
                             node=node_or_none, attempt=prev["attempt"] + 1, retry_of=prev["id"])
        if trigger == "dependency":
            deps = list(self.state.pending_deps.values())
            if deps:
                d = deps[k % len(deps)]
                return Claim(job=d["job"], slot_us=d["slot_us"], trigger="dependency", status=status,
                             node=node_or_none, upstream=d["upstream"])
        if trigger in ("retry", "replay", "dependency") and k % 4:
            trigger = "schedule"  # nothing to follow up: mostly a plain slot instead
        cause = f"req-{k % 3}" if trigger == "manual" else None
        rec = self.state.jobs.get(job)
        last = rec["last_slot_us"] if rec is not None and rec["last_slot_us"] is not None else T0
        # Slots sit on minute boundaries, as a cron job's do, whatever instant the job was last reset to.
        return Claim(job=job, slot_us=T0 + ((last - T0) // MIN + offset) * MIN, trigger=trigger, status=status,
                     node=node_or_none, request_key=cause)


def check_invariants(s: State) -> None:
    # Invariant 2: a (job, slot) decided twice only inside one entry (a fan-out). Claims voided by a
    # pause or an edit (cancelled) leave the slot to be decided again under the new spec.
    entries: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r in s.runs.values():
        if r["trigger"] in ("schedule", "catchup") and r["status"] != "cancelled":
            entries[(r["job"], r["slot_us"])].add(r["token"] // MAX_CLAIMS_PER_ENTRY)
    doubled = {k: v for k, v in entries.items() if len(v) > 1}
    assert not doubled, f"slots decided by more than one entry: {doubled}"
    for rid in s.active:
        assert rid in s.runs and s.runs[rid]["status"] in ACTIVE, (rid, s.runs.get(rid))
    for rid in s.dead:
        assert rid in s.runs and s.runs[rid]["status"] == "dead", (rid, s.runs.get(rid))
    assert set(s.job_runs) <= set(s.jobs), (set(s.job_runs), set(s.jobs))
    listed = [rid for ids in s.job_runs.values() for rid in ids]
    assert len(listed) == len(set(listed)) and set(listed) == set(s.runs), "job_runs and runs disagree"
    for name, ids in s.job_runs.items():
        assert all(s.runs[rid]["job"] == name for rid in ids)
        job = s.job(name)
        assert job is not None
        held = sum(1 for rid in ids if rid in s.active or rid in s.dead)
        assert len(ids) <= job.history.keep + held, (name, len(ids), job.history.keep, held)
    for key, dep in s.pending_deps.items():
        assert dep["job"] in s.jobs and key == f"{dep['job']}|{dep['upstream']}"


def _setup() -> list[bytes]:
    return [encode_command(RegisterNode(at_us=T0, node_id=n, raft_addr=f"{n}:7000", http_addr=f"{n}:8000"))
            for n in ("n1", "n2")] + [encode_command(PutJob(at_us=T0, spec=job_spec(n, 0))) for n in NAMES]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=15, max_size=40))
def test_random_command_sequences(seq: list[tuple[Any, ...]]) -> None:
    a, b = State(), State()
    driver = Driver(a)
    log = _setup()
    for i, raw in enumerate(log, start=1):
        assert a.apply(raw, ApplyContext(i)) == b.apply(raw, ApplyContext(i))
    half = len(seq) // 2
    c: State | None = None
    for n, step in enumerate(seq):
        if n == half:  # a third replica joins from a snapshot and follows the rest of the log
            c = State()
            c.restore(a.snapshot_bytes())
        cmd = driver.command(step)
        raw = cmd if isinstance(cmd, bytes) else encode_command(cmd)
        log.append(raw)
        index = len(log)
        malformed = step[0] in ("garbage", "mistyped")
        before = _semantic(a) if malformed else b""
        out_a = a.apply(raw, ApplyContext(index))  # never raises
        out_b = b.apply(raw, ApplyContext(index))
        assert out_a == out_b
        if c is not None:
            assert c.apply(raw, ApplyContext(index)) == out_a
        assert not (isinstance(out_a, Rejected) and out_a.code == "internal"), out_a
        if malformed and isinstance(out_a, Rejected):
            assert _semantic(a) == before, f"a refused entry changed the state: {out_a}"
        check_invariants(a)
    assert a.snapshot_bytes() == b.snapshot_bytes()
    assert c is not None and c.snapshot_bytes() == a.snapshot_bytes()
    # Replaying the whole log into a fresh replica gives the same bytes again.
    d = State()
    for i, raw in enumerate(log, start=1):
        d.apply(raw, ApplyContext(i))
    assert d.snapshot_bytes() == a.snapshot_bytes()


def _semantic(s: State) -> bytes:
    copy = State()
    copy.restore(s.snapshot_bytes())
    copy.applied_index = 0
    return copy.snapshot_bytes()
