"""The one judge of every fault test: what the receiver got against what the API says.

It reads nothing else: not the agents' logs, not their data directories, not the harness's
idea of what happened. A test runs its jobs through a window of slots, injects its faults,
and hands the checker the receiver, the cluster (for API reads), the jobs and their
delivery modes, the window, the fault intervals, the lease and the writes the API
acknowledged. The verdict lists every broken promise of README's Guarantees:

- every slot of the window delivered (``at-least-once``), or at most once (``at-most-once``);
- a slot delivered twice only when the ledger shows a ``lost`` attempt of it whose life
  overlapped a fault and that started within half a lease of the fault's start (a node cut
  off for longer leaves its attempts unstarted), and never for ``at-most-once``;
- no attempt of a slot in the window left ``claimed``, ``running`` or ``retrying``;
- the fencing tokens of a slot's attempts strictly increasing with the attempt number, in the
  ledger and in what the receiver got, and each delivery's token the ledger's for its run;
- no delivery before its slot (the receiver's arrival time against ``X-Raftcron-Slot``);
- every acknowledged write present, with the fields that were written.

A node answers reads from its own replica, which may trail the leader (README): one just
restarted serves its snapshot's state until a leader has told it what is committed. With
``barrier=S`` the checker first writes a job of its own (``BARRIER``) and then reads only
from nodes that show it: entries apply in log order, so such a node has applied every write
acknowledged before the check began.

Jobs must not be edited inside the window: the expected slots are computed from the job's
current document (its schedule anchored at its creation), as the planner computes them.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from scheduler.instants import us
from scheduler.model import parse_job
from scheduler.planner import upcoming

UNSETTLED = frozenset({"claimed", "running", "retrying"})
# The receiver's arrival stamp and a slot instant are read off the same machine's wall clock,
# so an early delivery is early by any margin; this only absorbs the stamp's float rounding.
EARLY_TOLERANCE = 0.000_5
# A fault's start and end are stamped by the test around the command that made it; a node
# notices a cut a little later than the stamp says, by up to a network round trip and a tick.
FAULT_TOLERANCE = 0.5
BARRIER = "fault-checker-barrier"


class ApiNode(Protocol):
    @property
    def url(self) -> str: ...


class ApiCluster(Protocol):
    def live(self) -> Sequence[ApiNode]: ...


class Receiver(Protocol):
    def of(self, job: str) -> Sequence[Any]: ...  # deliveries with .at (epoch s) and .headers


@dataclass(frozen=True, slots=True)
class Expect:
    name: str
    delivery: str = "at-least-once"  # or "at-most-once", as the job document says


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lateness: list[float] = field(default_factory=list)  # first delivery of each slot minus the slot, seconds

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        c = self.counts
        late = sorted(self.lateness)
        p50 = late[len(late) // 2] * 1000 if late else math.nan
        p99 = late[max(0, math.ceil(0.99 * len(late)) - 1)] * 1000 if late else math.nan
        worst = late[-1] * 1000 if late else math.nan
        return (f"{c['slots']} slots, {c['delivered']} delivered ({c['deliveries']} deliveries), "
                f"{c['missing']} missing, {c['doubled']} doubled ({c['doubled_allowed']} after a lost attempt "
                f"in a fault), {c['lost']} lost attempts, {c['retries']} retries, {c['early']} early, "
                f"{c['unsettled']} unsettled, {c['acknowledged']} acknowledged writes checked; lateness "
                f"p50 {p50:.0f} ms p99 {p99:.0f} ms max {worst:.0f} ms; {len(self.violations)} violation(s)")

    def report(self) -> str:
        shown = self.violations[:30]
        more = len(self.violations) - len(shown)
        return "\n".join([self.line(), *shown, *([f"... and {more} more"] if more > 0 else [])])


def check(receiver: Receiver, cluster: ApiCluster, jobs: Iterable[Expect], window: tuple[float, float], *,
          faults: Iterable[tuple[float, float]] = (), lease: float = 5.0,
          acknowledged: Mapping[str, Mapping[str, Any]] | None = None, settle_timeout: float = 90.0,
          barrier: float | None = None) -> Verdict:
    """Judge the slots of ``jobs`` due in ``window`` (epoch seconds, both ends included).
    ``barrier``: seconds to wait for the barrier write and for each node to show it (none: read
    from whichever node answers)."""
    api = _Api(cluster)
    verdict = Verdict()
    if barrier is not None and not api.barrier(barrier, verdict):
        return verdict
    fault_list = sorted(faults)
    for expect in jobs:
        runs = _settled_runs(api, expect.name, window[1], settle_timeout, verdict)
        if runs is None:
            continue
        _judge_job(verdict, api, expect, window, fault_list, lease, runs, receiver.of(expect.name))
    for name, fields in (acknowledged or {}).items():
        verdict.counts["acknowledged"] += 1
        _judge_write(verdict, api, name, fields)
    return verdict


# ---- reading the API -----------------------------------------------------------------


class _Api:
    """GETs against whichever live node answers: during and after faults some do not."""

    def __init__(self, cluster: ApiCluster) -> None:
        self.cluster = cluster
        self.fresh: set[str] | None = None  # after a barrier: the nodes that showed it

    def nodes(self) -> list[ApiNode]:
        return [n for n in self.cluster.live() if self.fresh is None or n.url in self.fresh]

    def barrier(self, timeout: float, verdict: Verdict) -> bool:
        """Write ``BARRIER`` through any node, then keep the nodes that show that write; false
        (with a violation) when none does within ``timeout`` seconds."""
        mark = f"barrier {time.time_ns()}"  # a new description each time: a change, so an entry
        doc = {"name": BARRIER, "description": mark, "schedule": "@manually", "executor": "http",
               "http": {"url": "http://127.0.0.1:9/barrier"}}
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        while not self._put(doc, errors):
            if time.monotonic() > deadline:
                verdict.violations.append(f"the checker's barrier write was not acknowledged within {timeout:.0f}s: "
                                          f"{errors[-3:]}")
                return False
            time.sleep(0.5)
        self.fresh = set()
        pending = {n.url for n in self.cluster.live()}
        while pending and time.monotonic() < deadline:
            for url in sorted(pending):
                if self._shows(url, mark):
                    pending.discard(url)
                    self.fresh.add(url)
            if pending:
                time.sleep(0.2)
        if not self.fresh:
            verdict.violations.append(f"no node showed the checker's barrier write within {timeout:.0f}s")
            return False
        return True

    def _put(self, doc: dict[str, Any], errors: list[str]) -> bool:
        for node in self.cluster.live():
            req = urllib.request.Request(f"{node.url}/v1/jobs/{BARRIER}", data=json.dumps(doc).encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    if resp.status in (200, 201):
                        return True
            except urllib.error.HTTPError as exc:
                errors.append(f"{node.url}: {exc.code}")
            except OSError as exc:
                errors.append(f"{node.url}: {exc}")
        return False

    @staticmethod
    def _shows(url: str, mark: str) -> bool:
        try:
            with urllib.request.urlopen(f"{url}/v1/jobs/{BARRIER}", timeout=5) as resp:
                return json.loads(resp.read())["spec"].get("description") == mark
        except (OSError, ValueError, KeyError):
            return False

    def get(self, path: str) -> tuple[int, Any]:
        errors: list[str] = []
        for _ in range(3):
            for node in self.nodes():
                try:
                    with urllib.request.urlopen(node.url + path, timeout=10) as resp:
                        return resp.status, json.loads(resp.read())
                except urllib.error.HTTPError as exc:
                    if exc.code < 500:
                        return exc.code, None
                    errors.append(f"{node.url}: {exc.code}")
                except (OSError, ValueError) as exc:
                    errors.append(f"{node.url}: {exc}")
            time.sleep(0.5)
        raise AssertionError(f"no live node answered GET {path}: {errors[-6:]}")

    def runs(self, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(1000):
            status, body = self.get(f"/v1/jobs/{job}/runs?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
            if status != 200:
                raise AssertionError(f"GET runs of {job}: {status}")
            items += body["items"]
            cursor = body["next_cursor"]
            if not cursor:
                return items
        raise AssertionError(f"runs of {job}: more than 1,000 pages")


def _settled_runs(api: _Api, job: str, until: float, timeout: float, verdict: Verdict) -> list[dict[str, Any]] | None:
    """The job's runs once no attempt of a slot up to ``until`` is claimed, running or retrying
    (bounded by ``timeout``; what is still unsettled then is a violation)."""
    deadline = time.monotonic() + timeout
    while True:
        status, _ = api.get(f"/v1/jobs/{job}")
        if status == 404:
            verdict.violations.append(f"{job}: the job is gone (404)")
            return None
        runs = api.runs(job)
        open_ = [r for r in runs if _unsettled(r) and _epoch(r["slot"]) <= until]
        if not open_:
            return runs
        if time.monotonic() > deadline:
            verdict.counts["unsettled"] += len(open_)
            for r in open_[:10]:
                verdict.violations.append(f"{job} slot {r['slot']}: attempt {r['attempt']} still {_state(r)} "
                                          f"{timeout:g}s after the window (run {r['id']}, node {r['node']})")
            return runs
        time.sleep(0.5)


def _state(run: Mapping[str, Any]) -> str:
    return "lost and never retried" if run["status"] == "lost" else str(run["status"])


def _unsettled(run: Mapping[str, Any]) -> bool:
    """An attempt still in flight, or a ``lost`` one whose retry is due but not yet claimed."""
    if run["status"] in UNSETTLED:
        return True
    return run["status"] == "lost" and run.get("retry_at") is not None and run.get("retried_by") is None


# ---- judging ---------------------------------------------------------------------------


def _expected_slots(api: _Api, job: str, window: tuple[float, float]) -> list[str]:
    status, view = api.get(f"/v1/jobs/{job}")
    if status != 200:
        raise AssertionError(f"GET /v1/jobs/{job}: {status}")
    spec = parse_job(view["spec"])
    anchor = us(_dt(view["created_at"]))
    first, last = max(round(window[0] * 1e6), anchor), round(window[1] * 1e6)
    out: list[str] = []
    after = first - 1
    for _ in range(100_000):
        batch = upcoming(spec, anchor, after, 100)
        for slot in batch:
            if us(slot) > last:
                return out
            out.append(_key(slot.timestamp()))
        if len(batch) < 100:
            return out
        after = us(batch[-1])
    raise AssertionError(f"{job}: more than 100,000 slots in the window")


def _judge_job(verdict: Verdict, api: _Api, expect: Expect, window: tuple[float, float],
               faults: list[tuple[float, float]], lease: float, runs: list[dict[str, Any]],
               deliveries: Sequence[Any]) -> None:
    job = expect.name
    expected = _expected_slots(api, job, window)
    by_slot: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_slot[_key(_epoch(r["slot"]))].append(r)
    got: dict[str, list[Any]] = defaultdict(list)
    for d in deliveries:
        got[_key(_epoch(d.headers["X-Raftcron-Slot"]))].append(d)
    oldest = min((int(_key(_epoch(r["slot"]))) for r in runs), default=None)
    if expected and oldest is not None and oldest > int(expected[0]):
        verdict.violations.append(f"{job}: the ledger's oldest run is of {_iso(oldest)}, after the window's first "
                                  f"slot {_iso(int(expected[0]))}: history trimmed (raise history.keep)")
    for slot in expected:
        verdict.counts["slots"] += 1
        _judge_slot(verdict, job, slot, expect.delivery, by_slot.get(slot, []), got.get(slot, []), faults, lease)


def _judge_slot(verdict: Verdict, job: str, slot: str, delivery: str, runs: list[dict[str, Any]],
                got: list[Any], faults: list[tuple[float, float]], lease: float) -> None:
    counts, where = verdict.counts, f"{job} slot {_iso(int(slot))}"
    instant = int(slot) / 1e6
    counts["deliveries"] += len(got)
    counts["lost"] += sum(r["status"] == "lost" for r in runs)
    counts["retries"] += sum(r["trigger"] == "retry" for r in runs)
    if got:
        counts["delivered"] += 1
        verdict.lateness.append(min(d.at for d in got) - instant)
    elif delivery == "at-least-once":
        counts["missing"] += 1
        statuses = ", ".join(f"attempt {r['attempt']} {r['status']}" for r in runs) or "no run recorded"
        verdict.violations.append(f"{where}: never received ({statuses})")
    early = [d for d in got if d.at < instant - EARLY_TOLERANCE]
    if early:
        counts["early"] += len(early)
        verdict.violations.append(f"{where}: received {instant - min(d.at for d in early):.3f}s before its instant")
    if len(got) > 1:
        counts["doubled"] += 1
        if delivery == "at-most-once":
            verdict.violations.append(f"{where}: at-most-once job received {len(got)} times")
        elif _excused(runs, faults, lease):
            counts["doubled_allowed"] += 1
        else:
            statuses = ", ".join(f"attempt {r['attempt']} {r['status']}" for r in runs)
            verdict.violations.append(f"{where}: received {len(got)} times without a lost attempt started in a "
                                      f"fault's first half lease ({statuses})")
    _judge_tokens(verdict, where, runs, got)


def _excused(runs: list[dict[str, Any]], faults: list[tuple[float, float]], lease: float) -> bool:
    """A second delivery is the documented cost of a lost attempt: one whose life (start to the
    lease's end) overlapped a fault and that started within half a lease of the fault's start."""
    for r in runs:
        if r["status"] != "lost":
            continue
        started = _epoch(r["started_at"] or r["slot"])
        ended = _epoch(r["lease_expires_at"]) if r.get("lease_expires_at") else math.inf
        for begin, end in faults:
            if started <= begin + lease / 2 + FAULT_TOLERANCE and ended >= begin - FAULT_TOLERANCE \
                    and started <= end + FAULT_TOLERANCE:
                return True
    return False


def _judge_tokens(verdict: Verdict, where: str, runs: list[dict[str, Any]], got: list[Any]) -> None:
    ordered = sorted(runs, key=lambda r: r["attempt"])
    tokens = [r["fencing_token"] for r in ordered if r["fencing_token"] is not None]
    if any(b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
        verdict.violations.append(f"{where}: fencing tokens not increasing over attempts: {tokens}")
    ledger = {r["id"]: r["fencing_token"] for r in runs}
    for d in got:
        rid, token = d.headers.get("X-Raftcron-Run-Id"), d.headers.get("X-Raftcron-Fencing-Token")
        if rid in ledger and token is not None and ledger[rid] is not None and int(token) != ledger[rid]:
            verdict.violations.append(f"{where}: run {rid} delivered with token {token}, the ledger says {ledger[rid]}")
        elif rid not in ledger:
            verdict.violations.append(f"{where}: delivery of run {rid}, which the ledger does not know")
    seen = sorted((int(d.headers["X-Raftcron-Attempt"]), int(d.headers["X-Raftcron-Fencing-Token"])) for d in got)
    if any(b[0] > a[0] and b[1] <= a[1] for a, b in zip(seen, seen[1:], strict=False)):
        verdict.violations.append(f"{where}: a later attempt reached the receiver with a token not above "
                                  f"an earlier one's: {seen}")


def _judge_write(verdict: Verdict, api: _Api, name: str, fields: Mapping[str, Any]) -> None:
    status, view = api.get(f"/v1/jobs/{name}")
    if status != 200:
        verdict.violations.append(f"acknowledged write {name}: GET answers {status}")
        return
    spec = view["spec"]
    wrong = {k: (v, spec.get(k)) for k, v in fields.items() if spec.get(k) != v}
    if wrong:
        verdict.violations.append(f"acknowledged write {name}: fields differ (written, stored): {wrong}")


# ---- instants ----------------------------------------------------------------------------


def _dt(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _epoch(text: str) -> float:
    return _dt(text).timestamp()


def _iso(key_us: int) -> str:
    return datetime.fromtimestamp(key_us / 1e6, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _key(epoch: float) -> str:
    """A slot's identity: its instant to the microsecond (the ledger's resolution)."""
    return f"{round(epoch * 1e6)}"
