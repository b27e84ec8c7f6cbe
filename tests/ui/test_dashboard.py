"""The dashboard in a real headless chromium, against a real 3-node cluster whose jobs call a
local sink: some succeed, one fails, one retries into the dead-letter list, one is paused.

Read-only views are checked on the DOM chromium dumps; the buttons are clicked through the
DevTools protocol and their effect is checked in the API. A second, single-node cluster with
an API token shows the page asking for the token and working once it is given.
"""

from __future__ import annotations

import http.client
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Cluster, Sink, job_doc, wait_for
from tests.cluster.harness import http as call

from .conftest import Chromium, Page

pytestmark = pytest.mark.cluster

OK, SLOW, FAILING, RETRIED, PAUSED = "backup-db", "export-report", "ping-partner", "sync-inventory", "nightly-cleanup"
HANGING = "reindex-search"  # run by hand once; the sink holds its call for minutes, so it stays running
JOBS = (OK, SLOW, FAILING, RETRIED, PAUSED, HANGING)


@dataclass
class Demo:
    cluster: Cluster
    sink: Sink

    @property
    def url(self) -> str:
        return self.cluster.nodes[0].url

    def runs(self, job: str) -> list[dict[str, Any]]:
        return self.cluster.runs(job, via=self.cluster.nodes[0])

    def count(self, job: str, status: str) -> int:
        return sum(1 for r in self.runs(job) if r["status"] == status)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Demo]:
    failed_before = request.session.testsfailed
    cluster = Cluster.create(tmp_path_factory.mktemp("ui-cluster"), 3).start()
    sink = Sink()
    try:
        cluster.wait_registered(timeout=30)
        docs = [
            job_doc(OK, sink.url("/hook"), "@every 1s", description="nightly database backup"),
            job_doc(SLOW, sink.url("/slow?s=2"), "@every 3s"),
            job_doc(FAILING, sink.url("/fail"), "@every 4s"),
            job_doc(RETRIED, sink.url("/fail"), "@every 3s", retries={"max": 1, "backoff": "1s"}),
            job_doc(PAUSED, sink.url("/hook"), "0 3 * * *", paused=True),
            job_doc(HANGING, sink.url("/slow?s=300"), "0 4 * * *", timeout="10m"),
        ]
        for doc in docs:
            cluster.put_job(doc)
        demo = Demo(cluster, sink)
        wait_for(f"{HANGING} run by hand", lambda: call("POST", f"{cluster.leader().url}/v1/jobs/{HANGING}/run")[0] == 202)
        wait_for("runs of every kind in the ledger", lambda: (
            demo.count(OK, "succeeded") >= 8 and demo.count(SLOW, "succeeded") >= 1
            and demo.count(FAILING, "failed") >= 1 and demo.count(HANGING, "running") == 1
            and cluster.nodes[0].get("/v1/dead-letters")["items"]), timeout=45, interval=0.25)
        yield demo
    finally:
        if request.session.testsfailed > failed_before:
            print(cluster.dump_logs())
        cluster.stop()
        sink.close()


def _leader(demo: Demo) -> str:
    return str(demo.cluster.leader().name)


def _boxes(dom: str) -> list[str]:
    """Statuses of the run boxes in the job strips (legend boxes are aria-hidden, not counted)."""
    return re.findall(r'<span class="box s-(\w+)" title="[^"]*" role="img"', dom)


def test_jobs_view_shows_leader_jobs_and_run_boxes(demo: Demo, browser: Chromium) -> None:
    dom = browser.dump(f"{demo.url}/ui/#/jobs")
    leader = _leader(demo)
    assert f"leader {leader} · term" in dom, dom[:3000]
    for name in JOBS:
        assert f'href="#/jobs/{name}">{name}</a>' in dom, f"job {name} not listed"
    boxes = _boxes(dom)
    assert boxes.count("succeeded") >= 8, boxes
    assert {"failed", "dead"} <= set(boxes) or {"failed", "retrying"} <= set(boxes), boxes
    assert "running" in boxes, boxes  # reindex-search's run, held by the sink
    assert '<span class="badge s-paused">paused</span>' in dom
    assert "<code>@every 1s</code>" in dom
    assert "no runs yet" in dom  # the paused job has none
    row = re.search(rf'href="#/jobs/{HANGING}">{HANGING}</a>((?:(?!</tr>).)*)</tr>', dom)
    assert row and '<span class="badge s-running">running</span>' in row.group(1), row


def test_a_running_run_is_shown_running(demo: Demo, browser: Chromium) -> None:
    runs = demo.runs(HANGING)
    assert runs and all(r["status"] == "running" for r in runs), runs
    dom = browser.dump(f"{demo.url}/ui/#/jobs/{HANGING}")
    shown = re.findall(r'<tr [^>]*data-run="(\w+)"><td>[^<]*</td><td><span class="badge s-(\w+)">', dom)
    assert shown == [(r["id"], "running") for r in runs], shown
    assert 'class="bar s-running"' in dom


def test_job_page_has_chart_runs_explain_and_actions(demo: Demo, browser: Chromium) -> None:
    dom = browser.dump(f"{demo.url}/ui/#/jobs/{OK}")
    assert f"<h1>{OK} " in dom
    assert 'class="chart runs-chart"' in dom
    assert len(re.findall(r'<rect [^>]*class="bar s-succeeded"', dom)) >= 8
    assert len(re.findall(r'data-run="r\w+"', dom)) >= 8
    assert "scheduled run, claimed by leader" in dom  # the explain list
    for label in ("Pause", "Run now"):
        assert f">{label}</button>" in dom


def test_a_run_link_opens_its_output_and_error(demo: Demo, browser: Chromium) -> None:
    ok = next(r for r in demo.runs(OK) if r["status"] == "succeeded")
    dom = browser.dump(f"{demo.url}/ui/#/jobs/{OK}/runs/{ok['id']}")
    assert f'aria-label="Run {ok["id"]}"' in dom
    assert "<pre>ok</pre>" in dom and "HTTP 200" in dom
    bad = next(r for r in demo.runs(FAILING) if r["status"] == "failed")
    dom = browser.dump(f"{demo.url}/ui/#/jobs/{FAILING}/runs/{bad['id']}")
    assert '<pre class="err">' in dom and "HTTP 500" in dom


def test_cluster_and_dead_letter_views(demo: Demo, browser: Chromium) -> None:
    dom = browser.dump(f"{demo.url}/ui/#/cluster")
    leader = _leader(demo)
    assert f"<dt>Leader</dt><dd>{leader}</dd>" in dom
    assert dom.count(">reachable</span>") == 3 and "unreachable" not in dom
    for n in ("n1", "n2", "n3"):
        assert f"<td>{n}</td>" in dom
    assert "<dt>Commit index</dt>" in dom and "<dt>Term</dt>" in dom
    dom = browser.dump(f"{demo.url}/ui/#/dead")
    assert f'href="#/jobs/{RETRIED}">{RETRIED}</a>' in dom
    assert ">Replay</button>" in dom


def _epoch_ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def _ordered(pairs: list[tuple[float, float]], what: str) -> None:
    """(datum, drawn position) pairs: no larger datum is drawn short of a smaller one (beyond the
    0.1 px the page rounds to), the largest datum is drawn furthest, and the smallest least far."""
    for a, b in itertools.combinations(pairs, 2):
        lo, hi = (a, b) if a[0] < b[0] else (b, a)
        if lo[0] != hi[0]:
            assert hi[1] >= lo[1] - 0.11, f"{what}: {hi} is drawn short of {lo}"
    drawn = [d for _, d in pairs]
    assert max(pairs)[1] >= max(drawn) - 0.11 and min(pairs)[1] <= min(drawn) + 0.11, (what, pairs)


MARKS = """[...document.querySelectorAll('svg.runs-chart [data-run]')].map((e) => ({run: e.dataset.run,
  tag: e.tagName, cls: e.getAttribute('class'), cx: +e.getAttribute('cx'), cy: +e.getAttribute('cy'),
  x: +e.getAttribute('x'), height: +e.getAttribute('height'), late: e.dataset.latenessMs}))"""


async def test_the_job_chart_draws_each_run_where_its_slot_lateness_and_duration_put_it(
        demo: Demo, page: Page, screenshot_dir: Path) -> None:
    node = demo.cluster.nodes[0]
    for job in (OK, SLOW, FAILING):
        # Runs that had ended before the page loaded do not change: the page draws them as read here.
        runs = {r["id"]: r for r in node.get(f"/v1/jobs/{job}/runs?limit=200")["items"]
                if r["status"] in ("succeeded", "failed", "dead") and r["started_at"]}
        await page.goto(f"{node.url}/ui/#/jobs/{job}")
        await page.until(f"{job}'s chart", "document.querySelectorAll('svg.runs-chart [data-run]').length >= 2")
        marks = await page.js(MARKS)
        dots = {m["run"]: m for m in marks if m["tag"] == "circle" and m["run"] in runs}
        bars = {m["run"]: m for m in marks if m["tag"] == "rect" and m["run"] in runs}
        assert len(dots) >= 2 and dots.keys() == bars.keys(), (job, len(dots), len(bars))
        for rid, m in dots.items():
            r = runs[rid]
            assert f"s-{r['status']}" in m["cls"].split() and f"s-{r['status']}" in bars[rid]["cls"].split(), (r, m)
            late = _epoch_ms(r["started_at"]) - _epoch_ms(r["slot"])
            assert abs(float(m["late"]) - late) < 1.5, (r, m)  # the lateness drawn is started minus slot
        _ordered([(_epoch_ms(runs[i]["slot"]), dots[i]["cx"]) for i in dots], "slot -> x")
        _ordered([(float(dots[i]["late"]), -dots[i]["cy"]) for i in dots], "lateness -> height")
        _ordered([(runs[i]["duration_ms"], bars[i]["height"]) for i in bars], "duration -> bar height")
    failed = [m for m in marks if "s-failed" in m["cls"].split()]
    assert failed, "the failing job's failed runs are drawn in the failed colour"
    await page.goto(f"{node.url}/ui/#/jobs/{SLOW}")
    await page.until("the chart", "document.querySelectorAll('svg.runs-chart [data-run]').length >= 2")
    await page.screenshot(screenshot_dir / "job-chart.png", 1100, 760)


async def test_the_cluster_page_charts_the_nodes_last_minutes(demo: Demo, page: Page, screenshot_dir: Path) -> None:
    node = demo.cluster.nodes[0]
    hist = node.get("/v1/cluster/history")
    assert hist["every_s"] == 5 and len(hist["items"]) >= 2, hist  # the demo has run for more than 5 s
    assert [s["commit_index"] for s in hist["items"]] == sorted(s["commit_index"] for s in hist["items"]), hist
    # The samples the node kept (the last is taken at the read), less the oldest, which may age
    # out of the ten minutes before the page reads them again.
    now = _epoch_ms(hist["items"][-1]["at"])
    stored = [s for s in hist["items"][:-1] if _epoch_ms(s["at"]) > now - (hist["span_s"] - 30) * 1000]
    await page.goto(f"{node.url}/ui/#/cluster")
    await page.until("the trend charts", "document.querySelectorAll('svg.trend[data-key=commit_index] .point').length >= 2")
    drawn = await page.js("""Object.fromEntries([...document.querySelectorAll('svg.trend')].map((s) => [s.dataset.key,
      [...s.querySelectorAll('.point')].map((p) => ({at: p.dataset.at, v: +p.dataset.value, cx: +p.getAttribute('cx'),
      cy: +p.getAttribute('cy')}))]))""")
    assert set(drawn) == {"commit_index", "apply_lag", "runs_ended_per_s"}, drawn.keys()
    commits = {p["at"]: p for p in drawn["commit_index"]}
    for s in stored:  # every sample the node kept is drawn, at its value
        assert s["at"] in commits and commits[s["at"]]["v"] == s["commit_index"], (s, drawn["commit_index"])
    points = drawn["commit_index"]
    assert points[-1]["v"] > points[0]["v"], points  # jobs ran: the log grew
    _ordered([(_epoch_ms(p["at"]), p["cx"]) for p in points], "time -> x")
    _ordered([(p["v"], -p["cy"]) for p in points], "commit index -> height")
    rates = drawn["runs_ended_per_s"]
    assert rates and max(p["v"] for p in rates) > 0, rates  # a job runs every second
    _ordered([(p["v"], -p["cy"]) for p in rates], "runs ended per second -> height")
    await page.screenshot(screenshot_dir / "cluster-charts.png", 1100, 700)


def test_screenshots(demo: Demo, browser: Chromium, screenshot_dir: Path) -> None:
    for name, fragment in (("dashboard", "#/jobs"), ("job", f"#/jobs/{OK}"), ("cluster", "#/cluster"), ("dead", "#/dead")):
        path = browser.screenshot(f"{demo.url}/ui/{fragment}", screenshot_dir / f"{name}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_the_buttons_pause_resume_run_and_replay(demo: Demo, page: Page) -> None:
    node = demo.cluster.nodes[1]  # a follower or the leader: writes reach the leader either way
    await page.goto(f"{node.url}/ui/#/jobs/{PAUSED}")
    await page.click("button", "Resume")
    wait_for("the job resumed", lambda: not node.get(f"/v1/jobs/{PAUSED}")["status"]["paused"], 10)
    await page.until("the Pause button after the refresh", "document.body.innerText.includes('resumed nightly-cleanup')")
    await page.click("button", "Run now")
    wait_for("the manual run succeeded", lambda: any(
        r["trigger"] == "manual" and r["status"] == "succeeded" for r in demo.runs(PAUSED)), 15)
    await page.until("the manual run in the table", "!!document.querySelector('tr[data-run] .s-succeeded')")
    await page.click("button", "Pause")
    wait_for("the job paused again", lambda: node.get(f"/v1/jobs/{PAUSED}")["status"]["paused"], 10)
    await page.click("tr[data-run] td:nth-child(7) code", demo.runs(PAUSED)[0]["id"])
    await page.until("the run's output", "!!document.querySelector('.detail pre') && location.hash.includes('/runs/')")

    dead = node.get("/v1/dead-letters")["items"][0]
    await page.goto(f"{node.url}/ui/#/dead")
    await page.click(f'button[aria-label="Replay {dead["job"]} slot {dead["slot"]}"]', "Replay")
    wait_for("a replay of the dead letter", lambda: any(
        r["trigger"] == "replay" and r["retry_of"] == dead["id"] for r in demo.runs(dead["job"])), 10)


async def test_a_token_cluster_asks_for_the_token(tmp_path: Path, page: Page) -> None:
    c = Cluster.create(tmp_path / "secured", 1, extra=["--api-token", "s3cret", "--api-read-token", "look"]).start()
    try:
        node = c.nodes[0]
        wait_for("the single node serving", lambda: node.get("/v1/health"), 20)
        wait_for("it registered", lambda: call("GET", f"{node.url}/v1/cluster", token="look")[1]["members"][0][
            "node_id"] == "n1", 20)
        # the page is public, its data is not
        status, _ = call("GET", f"{node.url}/v1/jobs")
        assert status == 401
        assert call("GET", f"{node.url}/metrics")[0] == 401
        conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=5)
        conn.request("GET", "/ui")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Location")) == (302, "/ui/")
        resp.read()
        for path, kind in (("/ui/", "text/html"), ("/ui/static/app.js", "text/javascript"),
                           ("/ui/static/style.css", "text/css")):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200 and resp.getheader("Content-Type", "").startswith(kind), (path, resp.status)
            assert body and "default-src 'self'" in resp.getheader("Content-Security-Policy", "")
        conn.close()

        await page.goto(f"{node.url}/ui/#/cluster")
        await page.until("the token form", "!document.querySelector('#token').hidden")
        await page.js("document.querySelector('#token-input').value = 'look'")
        await page.click("button", "Use token")
        await page.until("the cluster view with the read token", "document.body.innerText.includes('Commit index')")
        assert await page.js("localStorage.getItem('raftcron.token')") == "look"
        assert await page.js("document.querySelector('#token').hidden") is True
    finally:
        c.stop()
