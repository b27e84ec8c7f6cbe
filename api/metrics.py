"""Prometheus metrics of one agent, in a registry of its own (never the global one).

Three kinds of source, each read where it is safe to:

- applied log entries (``on_applied``, called from the agent's ``_dispatch`` on
  the event loop): runs by job and status, retries, lease expiries, elections.
  Per-job series (``JobSeries``) are one small list per job, for at most
  ``max_jobs`` jobs; the jobs beyond are counted together as ``job="_other"``
  (no job name starts with ``_``).
  Entries replayed from this node's journal at start-up are not counted: they
  describe the past, and counting them again after a restart would show as a
  burst of activity that never happened;
- the worker's hooks (``run_started``, ``run_finished``) and the API's per-request
  hook (``observe_api``): histograms;
- scrape-time reads (``_ScrapeCollector``): raft status, ledger sizes, worker
  queues, computed when ``/metrics`` is served, so they are never stale;
- the trend (``Trend``): commit and applied index and the attempts ended, sampled
  every few seconds by the agent and kept for ten minutes, for the dashboard's
  cluster charts (``GET /v1/cluster/history``).

Every method here runs on the event loop, takes no lock a raft thread holds for
long and does no I/O, but ``render``, which ``GET /metrics`` runs on a thread of its own: it
reads what the loop and the raft thread change meanwhile as each of them reads the other's
(lengths, copies of tables taken in one step, counters whose next increment may or may not be
in a scrape).
"""

from __future__ import annotations

import gc
import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString as _go_float

from raftlog.bridge import Relay
from raftlog.node import NodeStatus
from scheduler.commands import (
    CancelRun,
    ClaimSlots,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    Noop,
    PauseJob,
    PutJob,
    PutJobs,
    ReportLost,
    StartRuns,
)
from scheduler.runs import RUN_STATUSES, RunStatus, Trigger
from scheduler.state import Applied, State

__all__ = ["CONTENT_TYPE", "LATENESS_BUCKETS", "MAX_JOB_SERIES", "OTHER_JOBS", "JobSeries", "Metrics", "WorkerGauges"]

log = logging.getLogger("raftcron.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "raftcron_"
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
API_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


MAX_JOB_SERIES = 2000
"""Jobs with series of their own on one node (the first this many it counts since it started);
the rest share ``job="_other"``. prometheus_client's labelled children cost 190 us and ~7 KB
a job the first time one ran (counters by status and a duration histogram: +683 MB for
100,000 jobs, measured in-process), paid inside the burst of slots that first runs them; a
scrape of 100,000 jobs' series would be millions of lines. The bound is ``--metrics-max-jobs``."""
OTHER_JOBS = "_other"

_STATUS_AT: dict[str, int] = {status: i for i, status in enumerate(RUN_STATUSES)}
_RETRIES = len(RUN_STATUSES)
_EXPIRIES = _RETRIES + 1
_BUCKETS_AT = _EXPIRIES + 1  # duration bucket counts (not cumulative), the last for +Inf
_SUM = _BUCKETS_AT + len(DURATION_BUCKETS) + 1
_WIDTH = _SUM + 1


class JobSeries:
    """Runs by job and status, retries, lease expiries and run durations by job: a list of
    numbers per job (about 0.4 KB), written as text when scraped (``text``)."""

    def __init__(self, max_jobs: int = MAX_JOB_SERIES) -> None:
        if max_jobs < 0:
            raise ValueError(f"max_jobs must be 0 or more, not {max_jobs}")
        self.max_jobs = max_jobs
        self._rows: dict[str, list[float]] = {}
        self._other: set[str] = set()  # jobs counted under OTHER_JOBS

    def _row(self, job: str) -> list[float]:
        row = self._rows.get(job)
        if row is not None:
            return row
        if job in self._other or len(self._rows) - (OTHER_JOBS in self._rows) >= self.max_jobs:
            if not self._other:
                log.warning("per-job metrics: %d jobs have series of their own (--metrics-max-jobs); the runs of "
                            "further jobs are counted under job=%r", self.max_jobs, OTHER_JOBS)
            self._other.add(job)
            job = OTHER_JOBS
            row = self._rows.get(job)
            if row is not None:
                return row
        row = self._rows[job] = [0] * _SUM + [0.0]
        return row

    def run(self, job: str, status: str) -> None:
        self._row(job)[_STATUS_AT[status]] += 1

    def retry(self, job: str) -> None:
        self._row(job)[_RETRIES] += 1

    def expiry(self, job: str) -> None:
        self._row(job)[_EXPIRIES] += 1

    def duration(self, job: str, seconds: float) -> None:
        row = self._row(job)
        row[_BUCKETS_AT + bisect_left(DURATION_BUCKETS, seconds)] += 1
        row[_SUM] += seconds

    def forget(self, job: str) -> None:
        """A deleted job's series go with it (its share of ``_other`` stays: that is a sum)."""
        self._rows.pop(job, None)
        self._other.discard(job)

    @property
    def folded(self) -> int:
        """Jobs counted under ``_other`` now."""
        return len(self._other)

    def text(self) -> str:
        """The per-job families in Prometheus's text format: the lines ``generate_latest`` writes
        for the same samples put in prometheus_client's metric families (``runs``, ``retries``,
        ``lease_expiries``, ``run_duration_seconds``; tests compare the two byte for byte), made
        here a job at a time, its label written once. Through the families, 2,000 jobs took
        ~290 ms of the event loop at each scrape (40,000 lines, each sample a dict of labels
        sorted, validated and escaped); written here, ~22 ms."""
        runs: list[str] = [_header(_RUNS_NAME, _RUNS_HELP, "counter")]
        retries: list[str] = [_header(_RETRIES_NAME, _RETRIES_HELP, "counter")]
        expiries: list[str] = [_header(_EXPIRIES_NAME, _EXPIRIES_HELP, "counter")]
        durations: list[str] = [_header(_DURATIONS_NAME, _DURATIONS_HELP, "histogram")]
        statuses = tuple(_STATUS_AT.items())
        for job, row in list(self._rows.items()):  # the loop adds rows while a scrape's thread reads
            label = f'{{job="{_label_value(job)}"'
            for status, i in statuses:
                if row[i]:
                    runs.append(f'{_RUNS_NAME}{label},status="{status}"}} {_number(row[i])}\n')
            if row[_RETRIES]:
                retries.append(f"{_RETRIES_NAME}{label}}} {_number(row[_RETRIES])}\n")
            if row[_EXPIRIES]:
                expiries.append(f"{_EXPIRIES_NAME}{label}}} {_number(row[_EXPIRIES])}\n")
            counts = row[_BUCKETS_AT:_SUM]
            if any(counts):
                cumulative = list(accumulate(counts))
                durations += [f'{_BUCKET_NAME}{label},le="{le}"}} {_number(n)}\n' for le, n in zip(_LE, cumulative, strict=True)]
                durations.append(f"{_COUNT_NAME}{label}}} {_number(cumulative[-1])}\n")
                durations.append(f"{_SUM_NAME}{label}}} {_float_text(row[_SUM])}\n")
        return "".join(runs + retries + expiries + durations)


_RUNS_HELP = "Runs that entered a status (by job), from entries applied on this node while it was live"
_RETRIES_HELP = "Attempts claimed with trigger retry"
_EXPIRIES_HELP = "Attempts lost: lease expired or their node restarted (ExpireRuns, ReportLost)"
_DURATIONS_HELP = "Attempt duration on this node"
_RUNS_NAME, _RETRIES_NAME, _EXPIRIES_NAME = PREFIX + "runs_total", PREFIX + "retries_total", PREFIX + "lease_expiries_total"
_DURATIONS_NAME = PREFIX + "run_duration_seconds"
_BUCKET_NAME, _COUNT_NAME, _SUM_NAME = (_DURATIONS_NAME + s for s in ("_bucket", "_count", "_sum"))
_LE = tuple(repr(float(b)) for b in DURATION_BUCKETS) + ("+Inf",)  # as prometheus_client writes bucket bounds


def _header(name: str, doc: str, kind: str) -> str:
    help_text = doc.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def _label_value(value: str) -> str:
    """A label's value escaped as the text format asks (backslash, newline, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _float_text(n: float) -> str:
    return cast(str, _go_float(n))  # type: ignore[no-untyped-call]


_NUMBERS = [_float_text(n) for n in range(1024)]  # the counts most series hold, written once


def _number(n: float) -> str:
    """A sample's value as prometheus_client writes it (Go's float format: ``3.0``, ``1.234567e+06``)."""
    if type(n) is int and 0 <= n < len(_NUMBERS):
        return _NUMBERS[n]
    return _float_text(n)


class WorkerGauges(Protocol):
    """What the metrics read of the worker at scrape time."""

    @property
    def busy(self) -> int: ...

    @property
    def pending_reports(self) -> int: ...

    declined: int
    reserved: int


TREND_EVERY_S = 5.0
TREND_SPAN_S = 600.0


class Trend:
    """This node's last ``span`` seconds, one sample every ``every`` seconds, in memory only: the
    commit and applied index, and how many attempts had ended by then (finished with a result,
    lost, or cancelled while held; counted from the entries this node applied, so the whole
    cluster's). A node's trend starts empty at its start; it is nobody's record, ``/metrics`` and
    the ledger are."""

    def __init__(self, every: float = TREND_EVERY_S, span: float = TREND_SPAN_S) -> None:
        self.every, self.span = every, span
        self._samples: deque[tuple[float, int, int, int]] = deque(maxlen=int(span / every) + 1)

    def add(self, at: float, commit: int, applied: int, ended: int) -> None:
        """``at``: epoch seconds. A sample older than the last is dropped (a clock stepped back)."""
        if self._samples and at <= self._samples[-1][0]:
            return
        self._samples.append((at, commit, applied, ended))

    def view(self, now: tuple[float, int, int, int] | None = None) -> list[dict[str, Any]]:
        """The samples oldest first, with ``now`` (a sample taken at the read) appended when given;
        each sample's rate is over the time since the one before: null for the first, and for
        ``now`` when it comes less than half an interval after the last (a handful of runs over a
        few milliseconds would read as a burst that never was)."""
        rows = list(self._samples)
        fresh = now is not None and (not rows or now[0] > rows[-1][0])
        if now is not None and fresh:
            rows.append(now)
        rows = [r for r in rows if r[0] >= rows[-1][0] - self.span] if rows else rows
        out: list[dict[str, Any]] = []
        for i, (at, commit, applied, ended) in enumerate(rows):
            prev = rows[i - 1] if i else None
            gap = at - prev[0] if prev is not None else 0.0
            short = fresh and i == len(rows) - 1 and gap < self.every / 2
            out.append({
                "at": at, "commit_index": commit, "applied_index": applied, "apply_lag": max(0, commit - applied),
                "runs_ended_per_s": round((ended - prev[3]) / gap, 3) if prev is not None and gap > 0 and not short else None,
            })
        return out


class Metrics:
    def __init__(self, *, node_id: str, state: State, raft: Callable[[], NodeStatus],
                 worker: WorkerGauges | None = None, unplanned: Callable[[], int] | None = None,
                 max_jobs: int = MAX_JOB_SERIES, relay: Relay | None = None) -> None:
        self.node_id = node_id
        self.state = state
        self.raft = raft
        self.worker = worker
        self.unplanned = unplanned
        self.relay = relay
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.jobs = JobSeries(max_jobs)
        self.elections = Counter(PREFIX + "elections", "Leader changes observed (one per term whose leader "
                                 "committed its barrier)", registry=r)
        self.job_writes = Counter(PREFIX + "job_writes", "Job documents written, from entries applied on this "
                                  "node while it was live, by command (put_job, put_jobs: a batch) and change "
                                  "(created, configured, unchanged)", ("command", "change"), registry=r)
        self.job_batches = Counter(PREFIX + "job_batches", "Batches of job documents applied (POST /v1/jobs:batch)",
                                   registry=r)
        self.alert_deliveries = Counter(PREFIX + "alert_deliveries", "Alert deliveries by outcome",
                                        ("outcome",), registry=r)
        self.lateness = Histogram(PREFIX + "start_lateness_seconds", "Seconds from a slot to its attempt's start "
                                  "on this node", buckets=LATENESS_BUCKETS, registry=r)
        self.api = Histogram(PREFIX + "api_request_duration_seconds", "API handler latency by route and method",
                             ("route", "method"), buckets=API_BUCKETS, registry=r)
        self._api_children: dict[tuple[str, str], Histogram] = {}
        r.register(_ScrapeCollector(self))
        self._last_term: int | None = None
        self.trend = Trend()
        self.runs_ended = 0  # attempts ended (any way), cluster-wide, from entries applied while live

    # ---- hooks ---------------------------------------------------------------------

    def run_started(self, job: str, lateness_s: float) -> None:
        """``Worker.on_start``. A worker wakes at the slot by the cluster's time as it estimates it; a wake a hair early reads 0."""
        self.lateness.observe(max(0.0, lateness_s))

    def run_finished(self, job: str, status: str, duration_s: float) -> None:
        """``Worker.on_finish``."""
        self.jobs.duration(job, max(0.0, duration_s))

    def observe_api(self, route: str, method: str, seconds: float) -> None:
        """Called by the app for each request a route handled (unmatched paths are not: unbounded labels)."""
        child = self._api_children.get((route, method))
        if child is None:  # labels() validates and locks on every call; routes are a fixed few
            child = self._api_children[(route, method)] = self.api.labels(route, method)
        child.observe(seconds)

    def alert_delivered(self, outcome: str) -> None:
        """For the alerts module: one delivery attempt ended with ``outcome`` (e.g. delivered, failed)."""
        self.alert_deliveries.labels(outcome).inc()

    def render(self) -> bytes:
        """The scrape: the registry's families, then the per-job ones (``JobSeries.text``), last as
        they were when the registry's collector listed them."""
        return bytes(generate_latest(self.registry)) + self.jobs.text().encode()

    def trend_point(self, at: float) -> tuple[float, int, int, int]:
        st = self.raft()
        return (at, st.commit_index, st.applied_index, self.runs_ended)

    def sample_trend(self, at: float) -> None:
        """The agent calls this every ``trend.every`` seconds."""
        self.trend.add(*self.trend_point(at))

    # ---- applied entries ---------------------------------------------------------------

    def on_applied(self, applied: Applied, replay: bool) -> None:
        if replay:
            return
        try:
            self._count(applied)
        except Exception:  # noqa: BLE001 - a metrics bug must not break the dispatch of an entry
            log.exception("metrics could not count entry %d", applied.index)

    def _count(self, applied: Applied) -> None:
        cmd, result = applied.command, applied.result
        match cmd:
            case Noop():
                if cmd.term != self._last_term:  # a barrier re-proposed in one term is one election
                    self._last_term = cmd.term
                    self.elections.inc()
            case ClaimSlots():
                for run in result["runs"]:
                    self.jobs.run(run["job"], run["status"])
                    if run["trigger"] == Trigger.RETRY:
                        self.jobs.retry(run["job"])
                self._by_id(result["cancelled"], RunStatus.CANCELLED)
            case StartRuns():
                self._by_id(result["started"], RunStatus.RUNNING)
            case FinishRuns():
                self.runs_ended += len(result["finished"])
                for run in result["finished"]:
                    self.jobs.run(run["job"], run["status"])
            case ExpireRuns() | ReportLost():
                self.runs_ended += len(result["lost"])
                for run in result["lost"]:
                    self.jobs.run(run["job"], run["status"])
                    self.jobs.expiry(run["job"])
            case CancelRun():
                run = result["cancelled"]
                if run.get("status") == RunStatus.CANCELLED:
                    self.jobs.run(run["job"], RunStatus.CANCELLED)
                    self.runs_ended += 1
            case PutJob():
                self.job_writes.labels("put_job", result["change"]).inc()
                self._by_id(result.get("cancelled") or (), RunStatus.CANCELLED)
            case PutJobs():
                for item in result["items"]:
                    self.job_writes.labels("put_jobs", item["change"]).inc()
                self.job_batches.inc()
                self._by_id(result["cancelled"], RunStatus.CANCELLED)
            case PauseJob():
                self._by_id(result.get("cancelled") or (), RunStatus.CANCELLED)
            case DeleteJob():
                self._forget(cmd.name)

    def _by_id(self, run_ids: Any, status: str) -> None:
        for rid in run_ids:
            if status == RunStatus.CANCELLED:
                self.runs_ended += 1
            run = self.state.runs.get(rid)
            if run is not None:
                self.jobs.run(run["job"], status)

    def _forget(self, job: str) -> None:
        """A deleted job's series go with it, or a churn of job names would grow the scrape forever."""
        self.jobs.forget(job)


class _ScrapeCollector:
    """Gauges read when /metrics is served."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        st = m.raft()
        info = GaugeMetricFamily(PREFIX + "node_info", "This agent (value 1)", labels=("node_id",))
        info.add_metric((m.node_id,), 1)
        yield info
        yield _gauge("leader", "1 while this node is the raft leader", 1 if st.state == "leader" else 0)
        yield _gauge("term", "Current raft term", st.term)
        yield _gauge("commit_index", "Raft commit index", st.commit_index)
        yield _gauge("applied_index", "Raft index applied to the state machine", st.applied_index)
        yield _gauge("apply_lag", "Committed entries not yet applied on this node",
                     max(0, st.commit_index - st.applied_index))
        yield _gauge("has_quorum", "1 while this node sees a majority", 1 if st.has_quorum else 0)
        yield _clock_offsets(st, m.state)
        state = m.state
        by_status = state.runs.status_counts()
        ledger = GaugeMetricFamily(PREFIX + "ledger_runs", "Runs held in the ledger now, by status",
                                   labels=("status",))
        for status in RUN_STATUSES:
            ledger.add_metric((status,), by_status.get(status, 0))
        yield ledger
        jobs = GaugeMetricFamily(PREFIX + "jobs", "Jobs in the store, by status", labels=("status",))
        paused = len(state.paused_jobs())
        jobs.add_metric(("active",), max(0, len(state.jobs) - paused))  # two reads while the raft thread writes
        jobs.add_metric(("paused",), paused)
        yield jobs
        yield _gauge("leader_unplanned_jobs", "On the leader, jobs whose next slot it has not planned yet since "
                     "it took office (0 once every job's is known, and on followers)",
                     m.unplanned() if m.unplanned is not None else 0)
        relay = m.relay
        yield _gauge("loop_handoff_queued", "Applied entries, role changes and settled writes the raft thread "
                     "handed to the event loop that it has not taken yet", relay.queued if relay is not None else 0)
        yield _gauge("loop_handoff_peak", "The most ever queued at once for the event loop since this agent "
                     "started: how far the loop fell behind the raft thread (each queued entry keeps its "
                     "result in memory until taken)", relay.peak if relay is not None else 0)
        yield _gauge("gc_frozen_objects", "Objects moved out of the collector's walks (the state restored or "
                     "long-lived after a slow full collection)", gc.get_freeze_count())
        spilled, spilled_bytes = state.runs.spilled()
        yield _gauge("runs_spilled_jobs", "Jobs whose run history this node keeps in its spill file, out of memory "
                     "(read back when needed)", spilled)
        yield _gauge("runs_spilled_bytes", "Bytes of run history this node keeps in its spill file", spilled_bytes)
        yield _gauge("dead_letters", "Runs in the dead-letter list", len(state.dead))
        yield _gauge("active_runs", "Ledger runs claimed, running or awaiting a retry", len(state.active))
        w = m.worker
        yield _gauge("worker_pending_reports", "Starts and results this worker has not had committed yet",
                     w.pending_reports if w is not None else 0)
        yield _gauge("worker_busy_attempts", "Attempts executing on this node", w.busy if w is not None else 0)
        yield CounterMetricFamily(
            PREFIX + "worker_declined_attempts", "Attempts claimed for this node that it did not start: no word "
            "from a leader, no trusted clock, or past the late limit while the leader does not name what it saw "
            "in expiries or with too little of its lease left; the leader counts them lost and retries them",
            value=w.declined if w is not None else 0)
        yield CounterMetricFamily(
            PREFIX + "worker_reserved_attempts", "Attempts this node came to past the late limit (a burst or a "
            "stall) and held until their start committed: run then, or declined if the leader took them back first",
            value=w.reserved if w is not None else 0)
        yield _gauge("metrics_other_jobs", f"Jobs whose runs are counted under job={OTHER_JOBS!r}: beyond "
                     "--metrics-max-jobs jobs with series of their own on this node", m.jobs.folded)


def _clock_offsets(st: NodeStatus, state: State) -> GaugeMetricFamily:
    """Each member's wall clock minus the leader's, for the members with a known offset."""
    family = GaugeMetricFamily(PREFIX + "clock_offset_seconds", "A member's wall clock minus the leader's "
                               "(the cluster's time), as estimated by this node", labels=("node",))
    ids = {n["raft_addr"]: n["node_id"] for n in list(state.nodes.values())}
    offsets = [(st.raft_addr, st.clock_offset), *((p.raft_addr, p.clock_offset) for p in st.partners)]
    for addr, offset in offsets:
        if offset is not None:
            family.add_metric((ids.get(addr, addr),), offset)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)
