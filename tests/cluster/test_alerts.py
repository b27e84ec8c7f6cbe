"""Alerts with a local HTTP sink as the webhook: one alert per state change,
recovery, missed after a full stop, and a leader kill between a failure and
its delivery neither loses nor repeats the alert."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from .harness import Cluster, Sink, http, job_doc, wait_for

pytestmark = pytest.mark.cluster


def _alerts(sink: Sink, path: str = "/alerts", ok_only: bool = True) -> list[dict[str, Any]]:
    return [json.loads(d.body) for d in sink.at(path) if not ok_only or d.answered == 200]


def _run_and_wait(c: Cluster, job: str) -> dict[str, Any]:
    def go() -> str | None:
        status, body = http("POST", f"{c.leader().url}/v1/jobs/{job}/run")
        return body["run_id"] if status == 202 else None

    run_id = wait_for(f"run of {job} accepted", go, 20)
    return wait_for(f"run {run_id} finished", lambda: (r := c.live()[0].get(f"/v1/runs/{run_id}"))["status"]
                    in ("succeeded", "failed", "timed_out", "dead") and r, 20)  # type: ignore[no-any-return]


def test_failure_alert_once_after_n_then_one_recovery(make_cluster, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered()
    doc = job_doc("flaky", sink.url("/fail"), schedule="@manually",
                  alerts={"webhook": sink.url("/alerts"), "on": ["failure", "recovery"], "after_failures": 2})
    c.put_job(doc)
    for _ in range(3):
        assert _run_and_wait(c, "flaky")["status"] == "failed"
    wait_for("the failure alert", lambda: _alerts(sink), 15)
    doc["http"] = {"url": sink.url("/ok"), "method": "POST"}
    c.put_job(doc)
    ok_run = _run_and_wait(c, "flaky")
    assert ok_run["status"] == "succeeded"
    wait_for("the recovery alert", lambda: any(a["event"] == "recovery" for a in _alerts(sink)), 15)
    assert _run_and_wait(c, "flaky")["status"] == "succeeded"  # a second success: no second recovery
    # Deliberate: the point is that no alert comes. The leader posts pending alerts every
    # 0.5 s, so 2 s without one (four rounds) is the observation; the API shows no pending
    # alerts that a wait could watch instead.
    time.sleep(2)
    events = Counter(a["event"] for a in _alerts(sink))
    assert events == {"failure": 1, "recovery": 1}, events
    failure = next(a for a in _alerts(sink) if a["event"] == "failure")
    assert failure["job"] == "flaky" and failure["run_id"] and failure["idempotency_key"].startswith("flaky@")
    assert failure["details"]["consecutive_failures"] == 2
    assert failure["link"] and failure["run_id"] in failure["link"]
    recovery = next(a for a in _alerts(sink) if a["event"] == "recovery")
    assert recovery["run_id"] == ok_run["id"]


def test_full_stop_past_the_window_sends_one_missed_alert(make_cluster, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered()
    c.put_job(job_doc("every-second", sink.url(), catchup={"policy": "latest", "window": "2s"},
                      alerts={"webhook": sink.url("/alerts"), "on": ["missed"]}))
    wait_for("first deliveries", lambda: len(sink.of("every-second")) >= 2, 15)
    for n in c.nodes:
        n.terminate()
    time.sleep(8)  # deliberate: the cluster stays down four times the catch-up window, the case under test
    for n in c.nodes:
        n.start()
    c.leader(timeout=30)
    wait_for("a missed alert", lambda: _alerts(sink), 20)
    time.sleep(3)  # deliberate: no second alert follows (six rounds of the leader's alert sender)
    alerts = _alerts(sink)
    assert [a["event"] for a in alerts] == ["missed"], alerts
    assert alerts[0]["details"]["count"] >= 3


def test_leader_killed_between_failure_and_alert(make_cluster, sink: Sink) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = make_cluster(3)
    c.wait_registered()
    sink.failing.add("/alerts")  # the webhook is down: the alert stays pending in the ledger
    c.put_job(job_doc("breaks", sink.url("/fail"), schedule="@manually",
                      alerts={"webhook": sink.url("/alerts"), "on": ["failure"]}))
    assert _run_and_wait(c, "breaks")["status"] == "failed"
    wait_for("a first, failed delivery attempt", lambda: _alerts(sink, ok_only=False), 15)
    old = c.leader()
    old.kill9()
    c.leader(among=[n for n in c.nodes if n is not old], timeout=20)
    sink.failing.discard("/alerts")
    wait_for("the alert delivered by the new leader", lambda: _alerts(sink), 30)
    time.sleep(3)  # deliberate: no repeat follows (six rounds of the leader's alert sender)
    delivered = _alerts(sink)
    assert len(delivered) == 1, delivered
    ids = {json.loads(d.body)["alert_id"] for d in sink.at("/alerts")}
    assert len(ids) == 1, "every attempt carries the same alert id"
