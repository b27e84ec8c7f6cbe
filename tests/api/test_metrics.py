"""GET /metrics: a real single-node agent in this process runs an every-second job against a
local sink; the scrape then holds every metric family the dashboard and alerting rely on.

The counting rules themselves (replay ignored, one election per term, a deleted job's series
dropped) are checked on a bare ``Metrics`` fed hand-made applied entries.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from api.agent import Agent, AgentConfig
from api.metrics import DURATION_BUCKETS, MAX_JOB_SERIES, OTHER_JOBS, JobSeries, Metrics
from raftlog.fsm import ApplyContext
from raftlog.node import NodeStatus
from scheduler.commands import (
    Claim,
    ClaimSlots,
    DeleteJob,
    ExpireRuns,
    FinishRuns,
    Noop,
    PauseJob,
    PutJobs,
    encode_command,
)
from scheduler.runs import RUN_STATUSES
from scheduler.state import Applied, State

WRITE, READ = "w", "r"
FAMILIES = {
    "raftcron_runs": "counter", "raftcron_ledger_runs": "gauge", "raftcron_start_lateness_seconds": "histogram",
    "raftcron_run_duration_seconds": "histogram", "raftcron_leader": "gauge", "raftcron_term": "gauge",
    "raftcron_commit_index": "gauge", "raftcron_applied_index": "gauge", "raftcron_apply_lag": "gauge",
    "raftcron_elections": "counter", "raftcron_lease_expiries": "counter", "raftcron_retries": "counter",
    "raftcron_dead_letters": "gauge", "raftcron_alert_deliveries": "counter",
    "raftcron_api_request_duration_seconds": "histogram", "raftcron_worker_pending_reports": "gauge",
    "raftcron_worker_busy_attempts": "gauge", "raftcron_active_runs": "gauge", "raftcron_gc_frozen_objects": "gauge",
    "raftcron_runs_spilled_jobs": "gauge", "raftcron_runs_spilled_bytes": "gauge",
    "raftcron_worker_declined_attempts": "counter", "raftcron_worker_reserved_attempts": "counter",
    "raftcron_loop_handoff_queued": "gauge", "raftcron_loop_handoff_peak": "gauge",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(what: str, check: Callable[[], Awaitable[Any]], bound: float) -> Any:
    deadline = time.monotonic() + bound
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"waited {bound}s for {what}; last seen: {last!r:.300}")


class Node:
    def __init__(self, base: str, http: aiohttp.ClientSession) -> None:
        self.base, self.http = base, http

    async def call(self, method: str, path: str, token: str | None = WRITE, **kw: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(method, self.base + path, headers=headers, **kw) as resp:
            body = await resp.json() if resp.content_type == "application/json" else await resp.text()
            return resp.status, body


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    http_addr = f"127.0.0.1:{_free_port()}"
    agent = Agent(AgentConfig(node_id="n1", raft_addr=f"127.0.0.1:{_free_port()}", peers=(), http_addr=http_addr,
                              data_dir=tmp_path / "n1", secret="test", fsync=False, api_token=WRITE,
                              api_read_token=READ))
    await agent.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Node(f"http://{http_addr}", http)
    finally:
        await agent.stop()


@pytest_asyncio.fixture
async def sink() -> AsyncIterator[tuple[str, list[str]]]:
    hits: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        hits.append(request.headers.get("X-Raftcron-Run-Id", ""))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/hook")), hits
    finally:
        await server.close()


def _samples(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family: Any, sample: str, **labels: str) -> float:
    return float(sum(s.value for s in family.samples if s.name == sample and labels.items() <= s.labels.items()))


async def test_the_scrape_holds_every_family_after_a_run_succeeded(node: Node, sink: tuple[str, list[str]]) -> None:
    url, hits = sink

    async def registered() -> bool:
        status, body = await node.call("GET", "/v1/cluster")
        return status == 200 and body["leader"] is not None and any(m["node_id"] == "n1" for m in body["members"])

    await _until("n1 to lead and be registered", registered, 60)
    doc = {"name": "tick", "schedule": "@every 1s", "executor": "http", "http": {"url": url, "method": "POST"}}

    async def stored() -> bool:
        status, body = await node.call("PUT", "/v1/jobs/tick", json=doc)
        assert status in (200, 201, 503, 504), body
        return status in (200, 201)

    await _until("the job stored", stored, 60)

    async def succeeded() -> list[Any]:
        _, body = await node.call("GET", "/v1/jobs/tick/runs?status=succeeded")
        return list(body["items"])

    await _until("a succeeded run of tick", succeeded, 60)
    assert hits, "the sink was never called"

    status, text = await node.call("GET", "/metrics", token=READ)
    assert status == 200, text
    families = _samples(text)
    missing = {n for n in FAMILIES if n not in families}
    assert not missing, f"families missing from /metrics: {sorted(missing)}"
    wrong = {n: families[n].type for n, t in FAMILIES.items() if families[n].type != t}
    assert not wrong, f"families of the wrong type: {wrong}"
    assert _value(families["raftcron_runs"], "raftcron_runs_total", job="tick", status="succeeded") > 0
    assert _value(families["raftcron_runs"], "raftcron_runs_total", job="tick", status="claimed") > 0
    assert _value(families["raftcron_start_lateness_seconds"], "raftcron_start_lateness_seconds_count") > 0
    assert _value(families["raftcron_run_duration_seconds"], "raftcron_run_duration_seconds_count", job="tick") > 0
    assert _value(families["raftcron_leader"], "raftcron_leader") == 1
    assert _value(families["raftcron_loop_handoff_peak"], "raftcron_loop_handoff_peak") >= 1  # entries applied
    assert _value(families["raftcron_elections"], "raftcron_elections_total") >= 1
    assert _value(families["raftcron_term"], "raftcron_term") >= 1
    assert _value(families["raftcron_ledger_runs"], "raftcron_ledger_runs", status="succeeded") >= 1
    commit = _value(families["raftcron_commit_index"], "raftcron_commit_index")
    assert commit >= _value(families["raftcron_applied_index"], "raftcron_applied_index") > 0
    api = families["raftcron_api_request_duration_seconds"]
    assert _value(api, "raftcron_api_request_duration_seconds_count", route="/v1/jobs/{name}/runs", method="GET") > 0
    assert _value(api, "raftcron_api_request_duration_seconds_count", route="/v1/jobs/{name}", method="PUT") > 0


async def test_metrics_need_a_token_like_every_other_path(node: Node) -> None:
    status, body = await node.call("GET", "/metrics", token=None)
    assert status == 401, body
    status, body = await node.call("GET", "/metrics", token="nope")
    assert status == 401, body
    status, text = await node.call("GET", "/metrics", token=WRITE)
    assert status == 200 and "raftcron_leader" in text


# ---- the counting rules, on a bare Metrics ------------------------------------------------------


def _bare(max_jobs: int = MAX_JOB_SERIES) -> Metrics:
    status = NodeStatus(raft_addr="a", state="follower", leader="b", term=4, commit_index=9, applied_index=7,
                        has_quorum=True, raft_thread_alive=True)
    return Metrics(node_id="n1", state=State(), raft=lambda: status, max_jobs=max_jobs)


def test_the_workers_declined_and_reserved_attempts_are_counted() -> None:
    m = _bare()
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_worker_declined_attempts"], "raftcron_worker_declined_attempts_total") == 0
    m.worker = SimpleNamespace(busy=2, pending_reports=3, declined=5, reserved=7)  # type: ignore[assignment]
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_worker_declined_attempts"], "raftcron_worker_declined_attempts_total") == 5
    assert _value(fam["raftcron_worker_reserved_attempts"], "raftcron_worker_reserved_attempts_total") == 7
    assert _value(fam["raftcron_worker_busy_attempts"], "raftcron_worker_busy_attempts") == 2


def _run(rid: str, job: str, status: str, trigger: str = "schedule") -> dict[str, Any]:
    return {"id": rid, "job": job, "status": status, "trigger": trigger}


def test_counts_come_from_live_entries_only() -> None:
    m = _bare()
    claim = ClaimSlots(at_us=0, leader="n1", term=4, claims=(Claim(job="a", slot_us=0, trigger="retry"),))
    claimed = {"runs": [_run("r1", "a", "claimed", "retry"), _run("r2", "a", "skipped")], "refused": [], "cancelled": []}
    m.on_applied(Applied(claim, 5, claimed), replay=True)  # an entry of the journal read at start-up
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_runs"], "raftcron_runs_total") == 0
    m.on_applied(Applied(claim, 5, claimed), replay=False)
    m.on_applied(Applied(FinishRuns(at_us=0, node="n1", results=()), 6,
                         {"finished": [_run("r1", "a", "dead")], "stale": []}), replay=False)
    m.on_applied(Applied(ExpireRuns(at_us=0, leader="n1", term=4, runs=("r3",)), 7,
                         {"lost": [_run("r3", "b", "lost")]}), replay=False)
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="a", status="claimed") == 1
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="a", status="skipped") == 1
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="a", status="dead") == 1
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="b", status="lost") == 1
    assert _value(fam["raftcron_retries"], "raftcron_retries_total", job="a") == 1
    assert _value(fam["raftcron_lease_expiries"], "raftcron_lease_expiries_total", job="b") == 1
    assert _value(fam["raftcron_leader"], "raftcron_leader") == 0
    assert _value(fam["raftcron_apply_lag"], "raftcron_apply_lag") == 2
    m.on_applied(Applied(DeleteJob(at_us=0, name="a"), 8, {"deleted": "a", "runs": 2}), replay=False)
    fam = _samples(m.render().decode())
    assert not [s for s in fam["raftcron_runs"].samples if s.labels.get("job") == "a"], "a deleted job's series stay"
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="b", status="lost") == 1


def test_one_election_per_term_and_alert_outcomes() -> None:
    m = _bare()
    for index, term in enumerate((3, 3, 4, 6), start=1):  # term 3's barrier was proposed twice
        m.on_applied(Applied(Noop(at_us=0, node="n1", term=term), index, None), replay=False)
    m.alert_delivered("delivered")
    m.alert_delivered("failed")
    m.alert_delivered("delivered")
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_elections"], "raftcron_elections_total") == 3
    alerts = fam["raftcron_alert_deliveries"]
    assert _value(alerts, "raftcron_alert_deliveries_total", outcome="delivered") == 2
    assert _value(alerts, "raftcron_alert_deliveries_total", outcome="failed") == 1


# ---- per-job series: bounded ----------------------------------------------------------------------------


def _claimed(job: str, rid: str) -> Applied:
    claim = ClaimSlots(at_us=0, leader="n1", term=4, claims=(Claim(job=job, slot_us=0, trigger="schedule"),))
    return Applied(claim, 5, {"runs": [_run(rid, job, "claimed")], "refused": [], "cancelled": []})


def test_jobs_beyond_the_bound_share_one_series_and_a_deleted_job_frees_its_place() -> None:
    """Every job that ever ran had series of its own (prometheus_client children: ~7 KB and
    190 us a job the first time, +683 MB for 100,000 jobs); now at most ``max_jobs`` do."""
    m = _bare(max_jobs=2)
    for i, job in enumerate(("a", "b", "c", "d", "c")):
        m.on_applied(_claimed(job, f"r{i}"), replay=False)
    m.run_finished("d", "succeeded", 0.02)
    fam = _samples(m.render().decode())
    jobs = {s.labels["job"] for f in ("raftcron_runs", "raftcron_run_duration_seconds") for s in fam[f].samples}
    assert jobs == {"a", "b", OTHER_JOBS}
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job=OTHER_JOBS, status="claimed") == 3
    assert _value(fam["raftcron_run_duration_seconds"], "raftcron_run_duration_seconds_count", job=OTHER_JOBS) == 1
    assert _value(fam["raftcron_metrics_other_jobs"], "raftcron_metrics_other_jobs") == 2
    m.on_applied(Applied(DeleteJob(at_us=0, name="a"), 8, {"deleted": "a", "runs": 1}), replay=False)
    m.on_applied(_claimed("e", "r9"), replay=False)
    fam = _samples(m.render().decode())
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", job="e", status="claimed") == 1
    assert not [s for s in fam["raftcron_runs"].samples if s.labels.get("job") == "a"]


def test_many_jobs_keep_the_scrape_and_the_memory_bounded() -> None:
    m = _bare(max_jobs=100)
    for i in range(5000):
        m.on_applied(_claimed(f"job-{i}", f"r{i}"), replay=False)
        m.run_finished(f"job-{i}", "succeeded", 0.5)
    fam = _samples(m.render().decode())
    jobs = {s.labels["job"] for s in fam["raftcron_runs"].samples}
    assert len(jobs) == 101 and OTHER_JOBS in jobs
    assert _value(fam["raftcron_runs"], "raftcron_runs_total", status="claimed") == 5000
    assert _value(fam["raftcron_run_duration_seconds"], "raftcron_run_duration_seconds_count") == 5000
    assert len(m.jobs._rows) == 101


def test_duration_buckets_are_cumulative_with_the_bound_inclusive() -> None:
    m = _bare()
    for seconds in (0.005, 0.0051, 7200.0, -1.0):  # a negative reading (clock step) counts as 0
        m.run_finished("j", "succeeded", seconds)
    fam = _samples(m.render().decode())["raftcron_run_duration_seconds"]

    def bucket(le: str) -> float:
        return _value(fam, "raftcron_run_duration_seconds_bucket", job="j", le=le)

    assert bucket("0.005") == 2 and bucket("0.01") == 3 and bucket("3600.0") == 3 and bucket("+Inf") == 4
    assert _value(fam, "raftcron_run_duration_seconds_sum", job="j") == 0.005 + 0.0051 + 7200.0
    assert _value(fam, "raftcron_run_duration_seconds_count", job="j") == 4


def _families_as_the_library_makes_them(series: JobSeries) -> list[Any]:
    """The per-job families built with prometheus_client's metric families, the way the scrape
    made them before it wrote them itself: the reference ``JobSeries.text`` is held to."""
    runs = CounterMetricFamily("raftcron_runs", "Runs that entered a status (by job), from entries applied on "
                               "this node while it was live", labels=("job", "status"))
    retries = CounterMetricFamily("raftcron_retries", "Attempts claimed with trigger retry", labels=("job",))
    expiries = CounterMetricFamily("raftcron_lease_expiries", "Attempts lost: lease expired or their node "
                                   "restarted (ExpireRuns, ReportLost)", labels=("job",))
    durations = HistogramMetricFamily("raftcron_run_duration_seconds", "Attempt duration on this node", labels=("job",))
    bounds = [repr(float(b)) for b in DURATION_BUCKETS] + ["+Inf"]
    statuses = list(RUN_STATUSES)
    for job, row in series._rows.items():
        for k, status in enumerate(statuses):
            if row[k]:
                runs.add_metric((job, status), row[k])
        if row[len(statuses)]:
            retries.add_metric((job,), row[len(statuses)])
        if row[len(statuses) + 1]:
            expiries.add_metric((job,), row[len(statuses) + 1])
        counts = row[len(statuses) + 2:-1]
        if any(counts):
            durations.add_metric((job,), list(zip(bounds, accumulate(counts), strict=True)), row[-1])
    return [runs, retries, expiries, durations]


class _Listed:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


def _library_text(families: list[Any]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Listed(families))
    return generate_latest(registry).decode()


def test_the_per_job_series_are_written_as_prometheus_client_writes_them() -> None:
    """``JobSeries.text`` writes the scrape's per-job lines itself (prometheus_client took ~290 ms
    of the event loop for 2,000 jobs); they must be the library's, byte for byte: odd job names
    escaped, counts past the small ones, Go's exponent form, sums, jobs with only some series."""
    series = JobSeries(max_jobs=10)
    assert series.text() == _library_text(_families_as_the_library_makes_them(series))  # no job yet: headers only
    names = ["plain", 'quote"d', "back\\slash", "new\nline", "ünïcode-job", "only-retried", "only-lost"]
    for n, job in enumerate(names[:5]):
        for _ in range(3 + n):
            series.run(job, "succeeded")
        series.run(job, "failed")
        series.duration(job, 0.003 * (n + 1))
        series.duration(job, 42.5 + n)
        series.duration(job, 10_000.0)
    series.retry("only-retried")
    series.expiry("only-lost")
    series.run("plain", "claimed")
    series._rows["plain"][0] = 1023
    series._rows["quote\"d"][0] = 1024
    series._rows["back\\slash"][0] = 12_345_678  # Go writes 1.2345678e+07
    for i in range(20):  # past max_jobs: the rest under _other
        series.run(f"extra-{i}", "timed_out")
    assert OTHER_JOBS in series._rows
    assert series.text() == _library_text(_families_as_the_library_makes_them(series))


def test_the_scrape_is_the_registry_then_the_per_job_series() -> None:
    m = _bare()
    m.on_applied(_claimed("a", "r1"), replay=False)
    m.run_finished("a", "succeeded", 0.2)
    whole = m.render().decode()
    per_job = _library_text(_families_as_the_library_makes_them(m.jobs))
    assert whole.endswith(per_job) and "raftcron_run_duration_seconds_bucket{job=\"a\",le=\"0.25\"} 1.0" in per_job
    assert whole[: -len(per_job)] == generate_latest(m.registry).decode()
    assert set(FAMILIES) <= set(_samples(whole))


def test_a_scrape_of_two_thousand_jobs_series_is_a_few_dozen_calls_a_job() -> None:
    """The scrape runs on the event loop. Through prometheus_client's families, 2,000 jobs' series
    (40,000 lines) were ~840 Python and C calls a job and ~290 ms in-process, during which the
    node answered nothing. Counted here, not timed: fewer than 100 calls a job."""
    m = _bare()
    for j in range(2000):
        for k in range(5):
            m.jobs.run(f"job-{j:05d}", "succeeded")
            m.run_finished(f"job-{j:05d}", "succeeded", 0.05 * k)
    calls = _calls_to_render(m)
    text = m.render().decode()
    assert text.count('raftcron_run_duration_seconds_count{job="job-') == 2000
    assert calls < 100 * 2000, calls


def _calls_to_render(m: Metrics) -> int:
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        m.render()
    finally:
        sys.setprofile(None)
    return calls


def test_a_scrape_does_not_walk_the_jobs() -> None:
    """The paused jobs are an index (``Store.paused_jobs``): a scrape counted them over every
    job, 0.3 s of an agent's event loop at 100,000 jobs while run records filled."""
    status = NodeStatus(raft_addr="a", state="leader", leader="a", term=1, commit_index=1, applied_index=1,
                        has_quorum=True, raft_thread_alive=True)

    def scrape_calls(jobs: int) -> int:
        state = State()
        state.apply(encode_command(PutJobs(at_us=0, specs=tuple(
            {"name": f"j{k}", "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"},
             "paused": k % 2 == 0} for k in range(jobs)))), ApplyContext(index=1))
        m = Metrics(node_id="n1", state=state, raft=lambda: status)
        _calls_to_render(m)  # the first scrape makes what is made once
        return _calls_to_render(m)

    assert scrape_calls(3000) - scrape_calls(30) < 100


def test_the_jobs_gauge_counts_paused_jobs_from_the_index() -> None:
    state = State()
    for i, cmd in enumerate([
        PutJobs(at_us=0, specs=tuple({"name": f"j{k}", "schedule": "@hourly", "executor": "http",
                                      "http": {"url": "http://sink.test/x"}, "paused": k == 1} for k in range(3))),
        PauseJob(at_us=1, name="j2", paused=True),
        PauseJob(at_us=2, name="j1", paused=False),
        DeleteJob(at_us=3, name="j0"),
    ], start=1):
        state.apply(encode_command(cmd), ApplyContext(index=i))
    status = NodeStatus(raft_addr="a", state="leader", leader="a", term=1, commit_index=4, applied_index=4,
                        has_quorum=True, raft_thread_alive=True)
    fam = _samples(Metrics(node_id="n1", state=state, raft=lambda: status).render().decode())["raftcron_jobs"]
    assert _value(fam, "raftcron_jobs", status="paused") == 1 and _value(fam, "raftcron_jobs", status="active") == 1


async def test_the_scrape_is_rendered_off_the_event_loop(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape of a node holding 100,000 jobs is ~45 ms in-process, more on a busy agent: the
    loop answers other requests meanwhile rather than hold them for it."""
    loop_thread = threading.get_ident()
    rendered_on: list[int] = []
    render = Metrics.render

    def recorded(self: Metrics) -> bytes:
        rendered_on.append(threading.get_ident())
        return render(self)

    monkeypatch.setattr(Metrics, "render", recorded)
    status, body = await node.call("GET", "/metrics", token=READ)
    assert status == 200 and "raftcron_leader" in body
    assert rendered_on and loop_thread not in rendered_on
