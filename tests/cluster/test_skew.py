"""Clock skew seen from outside: one agent's wall clock offset with libfaketime, every-second
HTTP jobs to a local receiver, and the receiver's record judged against the promise that a
slot never fires before its instant, is never lost and never runs twice.

Run them alone with ``python -m pytest tests/cluster/test_skew.py`` (about 3 minutes). Each
case starts three agents under libfaketime at offset 0, waits for a leader, then gives the
node it picked by role (the leader, or a follower) its offset, so the roles are not left to
the election. A reference case with no offset runs first, in the same module, on the same
machine, and its lateness is the yardstick for the others. A run that fails its checks
while an election fell in its window is set aside and the case run once more (``RUNS``).
Every case's figures are printed at the end of the session ("cluster figures"), set-aside
runs included.

The receiver stamps each request with the test's own clock (the real one) and the slot it
names (``X-Raftcron-Slot``). Judged only by what it received and what the API says:

- early: a delivery stamped before its slot's instant, less ``EARLY_TOLERANCE``;
- missed: a slot of the window with no delivery at all;
- doubled: a second delivery of a slot (same ``Idempotency-Key``) that the ledger does not
  account for: of the attempts of a slot that reached the receiver, all but one must be
  ``lost`` or ``dead`` in the ledger (as ``tests/e2e/test_compose.py`` judges it), and no
  attempt may arrive twice;
- lateness: arrival minus instant of each slot's first delivery, p50 and p99 printed; judged by
  how many are later than ``SLOW`` against the reference (see there).

Needs libfaketime (Debian package ``faketime``). Without it the module skips, naming the
package; with ``CI`` set it fails instead, so CI cannot pass without running it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from .harness import REPORT, Cluster, Delivery, Node, Sink, job_doc, wait_for

pytestmark = pytest.mark.cluster

JOBS = [f"skew-{i}" for i in range(1, 6)]
EVERY_SECOND = "* * * * * *"  # six fields, seconds first: every whole second
WINDOW = 20  # slots per job judged in each case
# The receiver stamps a request after it has read its request line and headers, so its stamp
# can only err late, and the agents share the receiver's clock except for the offset a case
# gives one of them. What remains is float rounding of microsecond instants (1e-6 s); 2 ms
# covers it with room, and an early fire caused by skew is hundreds of ms or more.
EARLY_TOLERANCE = 0.002
# A slot arrives within milliseconds of its instant when all is well, so this long after the
# window's last instant every first delivery of the window has landed. A retry of an attempt
# lost near the end (a lease, 5 s, and more later) may land after the judgement; it could
# only be a duplicate the ledger accounts for, since a retry follows a `lost` record.
DRAIN = 2.0
# What "lateness as without skew" means here. Skew shows as a shift of whole seconds for every
# slot a skewed node runs (a follower 3 s behind fires a third of the slots 3 s late), while load
# on the shared two-core machine stretches the tail of any run, the reference's too, by a second
# or two for a few slots (p99 of 0.6-2.2 s has been seen for the reference on a busy machine).
# So a case fails when more of its deliveries are later than SLOW than the reference's were,
# by over SLOW_SHARE of the slots: a systematic shift fails it, a noisy tail does not. p50 and
# p99 are printed for the record.
SLOW = 2.5
SLOW_SHARE = 0.05
# Runs of a case at most. An election during the window (load on the shared machine can stall
# an agent past the 0.4-1 s election timeout) delays the slots due in the gap by seconds,
# which says nothing about skew; a run that fails while one fell in its window is printed,
# set aside and the case run once more on a fresh cluster; so is one that fails on lateness
# alone (seen: a reference with 17 of 100 slots over SLOW late in a slow minute, the case 25
# a minute later, no election). A skew bug shows in every run, so the second run still judges
# it; a run that passes is kept, election or not.
RUNS = 2


@dataclass(frozen=True, slots=True)
class Figures:
    case: str
    expected: int
    received: int
    early: int
    earliest_ms: float | None  # the most negative arrival - instant, when any was early
    missed: tuple[str, ...]
    doubled: tuple[str, ...]
    retried: int  # extra deliveries the ledger accounts for (a lost attempt retried)
    p50_ms: float
    p99_ms: float
    slow: int  # deliveries later than SLOW
    roles: str
    elections: int  # raft terms begun between the window's start and the judgement
    ran_skewed: int  # deliveries of attempts the skewed node ran
    claimed_skewed: int  # deliveries of attempts the skewed node claimed as leader
    logs: str  # where the agents' logs of this run are

    def line(self) -> str:
        earliest = f" (earliest {-self.earliest_ms:.0f} ms before its slot)" if self.earliest_ms is not None else ""
        return (f"{self.case}: {self.received}/{self.expected} slots received, early {self.early}{earliest}, "
                f"missed {len(self.missed)}, doubled {len(self.doubled)}, retried after loss {self.retried}, "
                f"lateness p50 {self.p50_ms:.0f} ms p99 {self.p99_ms:.0f} ms, {self.slow} over {SLOW:g} s; {self.roles}, "
                f"{self.elections} election(s) in the window; of the deliveries, {self.ran_skewed} ran on the "
                f"skewed node and {self.claimed_skewed} were claimed by it")


def _instant(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _received(sink: Sink, job: str, first: int, last: int) -> list[Delivery]:
    return [d for d in sink.of(job) if first <= _instant(d.headers["X-Raftcron-Slot"]) <= last]


def _complete(sink: Sink, first: int, last: int) -> bool:
    expected = set(range(first, last + 1))
    return all({round(_instant(d.headers["X-Raftcron-Slot"])) for d in _received(sink, job, first, last)} >= expected
               for job in JOBS)


def _term(c: Cluster) -> int:
    return int(c.leader().get("/v1/cluster")["term"])


def _judge(case: str, c: Cluster, sink: Sink, first: int, last: int, roles: str, skewed: Node | None,
           elections: int) -> Figures:
    leader = c.leader()
    expected_slots = set(range(first, last + 1))
    early: list[float] = []
    missed: list[str] = []
    doubled: list[str] = []
    lateness: list[float] = []
    retried = received = ran_skewed = claimed_skewed = 0
    for job in JOBS:
        got = _received(sink, job, first, last)
        runs = {r["id"]: r for r in c.runs(job, via=leader)}
        early += [d.at - _instant(d.headers["X-Raftcron-Slot"]) for d in got
                  if d.at < _instant(d.headers["X-Raftcron-Slot"]) - EARLY_TOLERANCE]
        by_key: dict[str, list[Delivery]] = {}
        for d in got:
            by_key.setdefault(d.headers["Idempotency-Key"], []).append(d)
        if skewed is not None:
            attempts = [runs.get(d.headers["X-Raftcron-Run-Id"]) or {} for d in got]
            ran_skewed += sum(r.get("node") == skewed.name for r in attempts)
            claimed_skewed += sum((r.get("claimed_by") or {}).get("leader") == skewed.name for r in attempts)
        slots = {round(_instant(ds[0].headers["X-Raftcron-Slot"])) for ds in by_key.values()}
        received += len(slots & expected_slots)
        missed += [f"{job}@{s}" for s in sorted(expected_slots - slots)]
        for key, ds in by_key.items():
            ds.sort(key=lambda d: d.at)
            lateness.append(ds[0].at - _instant(ds[0].headers["X-Raftcron-Slot"]))
            if len(ds) == 1:
                continue
            ids = [d.headers["X-Raftcron-Run-Id"] for d in ds]
            given_up = [i for i in set(ids) if (runs.get(i) or {}).get("status") in ("lost", "dead")]
            if len(set(ids)) < len(ids) or len(given_up) < len(ids) - 1:
                seen = ", ".join(f"{i} ({(runs.get(i) or {}).get('status', 'not in the ledger')})" for i in ids)
                doubled.append(f"{key}: {seen}")
            else:
                retried += len(ids) - 1
    assert lateness, f"{case}: the receiver got nothing in the window"
    return Figures(case=case, expected=len(JOBS) * len(expected_slots), received=received, early=len(early),
                   earliest_ms=min(early) * 1000 if early else None, missed=tuple(missed), doubled=tuple(doubled),
                   retried=retried, p50_ms=_percentile(lateness, 0.50) * 1000,
                   p99_ms=_percentile(lateness, 0.99) * 1000, slow=sum(late > SLOW for late in lateness), roles=roles, elections=elections,
                   ran_skewed=ran_skewed, claimed_skewed=claimed_skewed, logs=str(c.nodes[0].log_path.parent))


def _wait_offset(node: Node, offset: float) -> None:
    # The Date header is truncated to the second: a clock `offset` ahead reads in
    # (offset - 1, offset + the request's time].
    wait_for(f"{node.name}'s wall clock at {offset:+g} s", lambda: offset - 1.2 < node.clock_offset() < offset + 0.8, 10)


def _run_case(case: str, c: Cluster, sink: Sink, role: str | None, offset: float) -> Figures:
    """Skew the node with ``role`` by ``offset`` (None: no one), run the jobs for a window of
    WINDOW slots and judge what the receiver got."""
    c.wait_registered(timeout=30)
    leader = c.leader(timeout=30)
    setup_term = _term(c)
    skewed = None
    if role == "leader":
        skewed = leader
    elif role == "follower":
        skewed = next(n for n in c.nodes if n is not leader)
    if skewed is not None:
        skewed.set_clock_offset(offset)
    for n in c.nodes:
        _wait_offset(n, offset if n is skewed else 0.0)
    for job in JOBS:
        c.put_job(job_doc(job, sink.url(f"/{job}"), schedule=EVERY_SECOND))
    try:
        wait_for("every job delivered once (the cluster settled with its jobs)", lambda: all(sink.of(j) for j in JOBS), 20)
    except AssertionError as exc:
        message = f"{case}: {exc} (agents' logs in {c.nodes[0].log_path.parent})"
        if _term(c) != setup_term:
            raise _ElectionInSetup(message) from None
        raise AssertionError(message) from None
    # The term before the window's first slot is known: read after it, a stall of the machine that
    # ends in an election just before the window would be missed (the read waits out the election
    # and returns the new term), and the run would not be set aside as one with an election.
    term = _term(c)
    first = math.ceil(time.time()) + 1
    last = first + WINDOW - 1
    try:
        # Bounded by the window plus slack for slots a skewed node fires late: a slot still
        # missing then is reported as missed below, with the other figures.
        wait_for(f"every slot from {first} to {last} received, and {DRAIN}s past the last",
                 lambda: time.time() >= last + DRAIN and _complete(sink, first, last), last - time.time() + DRAIN + 15)
    except AssertionError:
        pass
    after = c.leader()
    roles = (f"{skewed.name} at {offset:+g} s as {role}, leader {leader.name} before and {after.name} after"
             if skewed is not None else f"no offset, leader {leader.name} before and {after.name} after")
    return _judge(case, c, sink, first, last, roles, skewed, _term(c) - term)


class _ElectionInSetup(AssertionError):
    """The jobs did not all fire before the window, and an election came after the clock was
    set: seen once in CI (the node given +30 s started an election at the jump and won it; the
    jobs made through it then had no slot within the wait). Set aside like a run with an
    election in the window; on the last run it fails the test."""


def _measure(tmp: Path, library: Path, case: str, role: str | None, offset: float,
             violations: Callable[[Figures], list[str]]) -> Figures:
    """The case's figures from its last run (see RUNS), each run on a fresh cluster and receiver."""
    for run in range(1, RUNS + 1):
        sink = Sink()
        c = Cluster.create(tmp / f"run{run}", 3, faketime=library)
        try:
            c.start()
            figures = _run_case(case, c, sink, role, offset)
        except _ElectionInSetup as exc:
            if run == RUNS:
                raise
            REPORT.append(f"(set aside: an election before the window) {exc}")
            print(REPORT[-1])
            continue
        finally:
            c.stop()
            sink.close()
        broken = violations(figures)
        # Run again only what noise can explain: an election in the window, or lateness alone
        # past the reference's (measured minutes earlier on the same shared machine). A promise
        # broken without an election (early, missed, doubled) is judged on this run.
        noise = figures.elections > 0 or not _broken_promises(figures)
        if run == RUNS or not broken or not noise:
            REPORT.append(figures.line())
            print(figures.line())
            return figures
        why = "with an election in the window" if figures.elections else "on lateness alone"
        REPORT.append(f"(set aside: failed {why}) {figures.line()}")
        print(REPORT[-1])
    raise AssertionError("unreachable: the last run returns")


@pytest.fixture(scope="module")
def reference(faketime_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Figures:
    """The same run with no offset: the yardstick for lateness, and a case of its own."""
    return _measure(tmp_path_factory.mktemp("skew-reference"), faketime_lib, "no skew (reference)", None, 0.0,
                    _broken_promises)


def _broken_promises(f: Figures) -> list[str]:
    return [what for what, broken in (
        (f"{f.early} deliveries before their slot", f.early),
        (f"slots never received: {list(f.missed)[:10]}", f.missed),
        (f"slots received twice without a lost attempt: {list(f.doubled)[:5]}", f.doubled)) if broken]


def _too_late(f: Figures, reference: Figures) -> list[str]:
    allowed = reference.slow + round(SLOW_SHARE * f.expected)
    if f.slow <= allowed:
        return []
    return [f"{f.slow} deliveries over {SLOW:g} s late, the reference had {reference.slow} (allowed {allowed})"]


def test_reference_without_skew(reference: Figures) -> None:
    broken = _broken_promises(reference)
    assert not broken, f"{'; '.join(broken)}: {reference.line()} (agents' logs in {reference.logs})"


@pytest.mark.parametrize(("role", "offset"), [("follower", 3.0), ("follower", -3.0), ("follower", 30.0), ("leader", 3.0)],
                         ids=["follower+3s", "follower-3s", "follower+30s", "leader+3s"])
def test_skewed_clock(tmp_path: Path, faketime_lib: Path, reference: Figures, role: str, offset: float) -> None:
    def violations(f: Figures) -> list[str]:
        return _broken_promises(f) + _too_late(f, reference)

    f = _measure(tmp_path, faketime_lib, f"{role} {offset:+g} s", role, offset, violations)
    broken = violations(f)
    assert not broken, f"{'; '.join(broken)}: {f.line()} (agents' logs in {f.logs})"
