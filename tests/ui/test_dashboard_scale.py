"""The dashboard over 100,000 jobs: the failing one is on the first screen, and a search by name
or by label finds it, each view in at most three API requests (the live watch aside).

A single real agent holds the jobs, made in bulk through POST /v1/jobs:batch; one job calls a
receiver that answers 500 and is run by hand once, so it is failing. Times are printed: from
asking for a view to its rows on screen, as a person would wait for them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, Sink, job_doc, wait_for
from tests.cluster.harness import http as call

from .conftest import Page

pytestmark = pytest.mark.cluster

JOBS = 100_000
BATCH = 2_000
FAILING = "payments-reconcile"
TEAMS = 50


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, Sink]]:
    failed_before = request.session.testsfailed
    cluster = Cluster.create(tmp_path_factory.mktemp("ui-100k"), 1).start()
    sink = Sink()
    try:
        node = cluster.nodes[0]
        wait_for("the single node registered", lambda: node.get("/v1/cluster")["members"][0]["node_id"] == "n1", 60)
        started = time.monotonic()
        for first in range(0, JOBS, BATCH):
            docs = [job_doc(f"job-{i:06d}", "http://127.0.0.1:9/x", "@manually", labels={"team": f"t{i % TEAMS}"},
                            description=f"generated job {i}") for i in range(first, first + BATCH)]
            status, body = call("POST", f"{node.url}/v1/jobs:batch", {"mode": "apply", "jobs": docs}, timeout=120)
            assert status == 200, body
        made = time.monotonic() - started
        cluster.put_job(job_doc(FAILING, sink.url("/fail"), "@manually", labels={"team": "payments"},
                                description="reconcile the day's payments"))
        assert call("POST", f"{node.url}/v1/jobs/{FAILING}/run")[0] == 202
        wait_for("the failing job's run failed", lambda: node.get(f"/v1/jobs/{FAILING}")["status"][
            "consecutive_failures"] >= 1, 60)
        print(f"\n{JOBS:,} jobs made in {made:.1f} s ({JOBS / made:,.0f}/s) through /v1/jobs:batch")
        yield cluster, sink
    finally:
        if request.session.testsfailed > failed_before:
            print(cluster.dump_logs())
        cluster.stop()
        sink.close()


async def _requests_for(page: Page, what: str, action: str, shown: str) -> tuple[float, list[str]]:
    """Run ``action`` (JS), wait until ``shown`` (JS) holds; the seconds it took and the API
    requests the page made meanwhile, the live watch aside."""
    await page.js("window.raftcronRequests.length = 0")
    started = time.monotonic()
    await page.js(action)
    await page.until(what, shown, bound=60)
    took = time.monotonic() - started
    asked = [p for p in await page.js("window.raftcronRequests") if not p.startswith("/v1/watch")]
    return took, asked


async def _key(page: Page, key: str, code: str, vk: int) -> None:
    """A key pressed and released, as the keyboard sends it."""
    await page.send("Input.dispatchKeyEvent", type="keyDown", key=key, code=code, text=key, windowsVirtualKeyCode=vk)
    await page.send("Input.dispatchKeyEvent", type="keyUp", key=key, code=code, windowsVirtualKeyCode=vk)


FAILING_ROW = f"!!document.querySelector('#results tr[data-job=\"{FAILING}\"] .box.s-failed')"


async def test_the_failing_job_among_100000_is_found_in_a_second(big: tuple[Cluster, Sink], page: Page,
                                                                  screenshot_dir: Path) -> None:
    cluster, _ = big
    url = cluster.nodes[0].url
    await page.goto(f"{url}/ui/#/cluster")
    await page.until("the cluster view", "document.body.innerText.includes('Commit index')")

    # Opened as is, the page shows what fails: one job of 100,001, with its failed run.
    took, asked = await _requests_for(page, "the failing-now view", "location.hash = '#/'",
                                      f"document.querySelector('h1').innerText.startsWith('Failing now (1 of {JOBS + 1:,})')"
                                      f" && {FAILING_ROW}")
    print(f"failing-now view of {JOBS + 1:,} jobs: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3, asked
    assert await page.js("document.querySelectorAll('#results tbody tr').length") == 1

    # All jobs, first page by name: 100 rows, one request.
    took, asked = await _requests_for(page, "the jobs view", "location.hash = '#/jobs'",
                                      "document.querySelectorAll('#results tbody tr').length === 100")
    print(f"all jobs, first page: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3, asked
    assert "job-000000" in await page.js("document.querySelector('#results tbody tr').innerText")

    # Search by name: type into the box as a person would ('/' first).
    await _key(page, "/", "Slash", 191)
    assert await page.js("document.activeElement.id") == "search"
    took, asked = await _requests_for(
        page, "the search result",
        "(() => { const s = document.querySelector('#search'); s.value = 'reconcile';"
        " s.dispatchEvent(new Event('input', { bubbles: true })); })()",
        f"document.querySelectorAll('#results tbody tr').length === 1 && {FAILING_ROW}")
    print(f"search 'reconcile' over {JOBS + 1:,} jobs: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3 and await page.js("location.hash") == "#/jobs?q=reconcile", asked
    assert await page.js("document.activeElement.id") == "search"  # the box kept its focus: typing goes on

    # By label, from a shared link.
    took, asked = await _requests_for(page, "the label filter", "location.hash = '#/jobs?label=team%3Dpayments'",
                                      f"document.querySelectorAll('#results tbody tr').length === 1 && {FAILING_ROW}")
    print(f"label team=payments over {JOBS + 1:,} jobs: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3, asked
    assert await page.js("document.querySelector('input[name=label]').value") == "team=payments"

    # A label that 2,000 jobs share, sorted by consecutive failures: pages of 100 and a next link.
    took, asked = await _requests_for(page, "a label's first page", "location.hash = '#/jobs?label=team%3Dt7&sort=failures'",
                                      "document.querySelectorAll('#results tbody tr').length === 100"
                                      " && !!document.querySelector('a[rel=next]')")
    print(f"label team=t7 (2,000 jobs) by failures: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3, asked

    # Runs across jobs: what failed.
    took, asked = await _requests_for(page, "the failed runs", "location.hash = '#/runs?status=failed'",
                                      f"[...document.querySelectorAll('#results tbody tr')].some("
                                      f"(tr) => tr.dataset.job === '{FAILING}')")
    print(f"failed runs across all jobs: {took * 1000:.0f} ms, requests {asked}")
    assert len(asked) <= 3, asked

    # j and k move through the rows; Enter opens the job.
    await page.js("location.hash = '#/jobs?status=failing'")
    await page.until("the failing list", FAILING_ROW)
    await page.js("document.activeElement.blur()")
    await _key(page, "j", "KeyJ", 74)
    assert await page.js("document.activeElement.textContent") == FAILING
    await page.send("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter", windowsVirtualKeyCode=13)
    await page.until("the job page", f"location.hash === '#/jobs/{FAILING}' && !!document.querySelector('.bar.s-failed')")

    await page.js("location.hash = '#/'")
    await page.until("the failing-now view again", FAILING_ROW)
    shot = await page.screenshot(screenshot_dir / "dashboard-100k.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    await page.js("location.hash = '#/jobs?label=team%3Dpayments'")
    await page.until("the label view", FAILING_ROW)
    await page.screenshot(screenshot_dir / "dashboard-phone.png", width=390, height=844)
    print("screenshots in", screenshot_dir)
