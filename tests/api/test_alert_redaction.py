"""The alert sender never prints a webhook's path or query: neither in its log line nor in the
delivery error it commits (Slack-style hooks carry their secret in the path).

The sender runs against an in-process replica that applies each command at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from raftlog import Bridge
from scheduler.alert_sender import AlertSender
from scheduler.clock import SystemClock
from scheduler.commands import NodeClock, RegisterNode
from scheduler.service import Service
from scheduler.state import State
from tests.api.conftest import OneReplica

SECRET = "T0/B0/s3cr3tH00K"


async def _one_failed_delivery(webhook: str) -> dict[str, Any]:
    """Raise a cluster-level alert, let the sender try ``webhook`` once; the alert after it."""
    state = State()
    node = OneReplica(state)
    clock = SystemClock()
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")
    await service.propose(RegisterNode(at_us=1, node_id="n2", raft_addr="mem:2", http_addr="x"))
    await service.propose(NodeClock(at_us=2_000_000, node="n2", offset_us=3_000_000, error_us=4_000, skewed=True,
                                    leader="n1", term=1, reason="its clock is +3.000s from the leader's"))
    sender = AlertSender(service, clock, webhook, lambda: None, interval=0.01, timeout=5.0)
    task = asyncio.create_task(sender.run())
    try:
        for _ in range(1000):
            tried = [a for a in state.alerts.values() if a["attempts"] > 0]
            if tried:
                return dict(tried[0])
            await asyncio.sleep(0.01)
        raise AssertionError(f"no delivery attempt within 10 s: {list(state.alerts.values())}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("webhook", [
    # Refused: the error names only the host, the log line used to print the whole URL.
    f"http://127.0.0.1:9/services/{SECRET}?token=Q5",
    # aiohttp refuses this URL and quotes it whole in the exception.
    f"http:///services/{SECRET}?token=Q5",
])
async def test_a_failed_delivery_prints_no_hook_path(webhook: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="raftcron.alerts")
    alert = await _one_failed_delivery(webhook)
    assert alert["status"] == "pending" and alert["last_error"], alert
    lines = [r.getMessage() for r in caplog.records if r.name == "raftcron.alerts"]
    assert any(alert["id"] in line and "/***" in line for line in lines), lines
    for text in (alert["last_error"], *lines):
        assert "s3cr3t" not in text and "Q5" not in text, text
