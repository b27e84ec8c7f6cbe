"""A cluster-level alert (clock_skew) reaches the agent's default webhook, never a job's.

The alert sender runs against an in-process replica that applies each command
at once; the webhooks are aiohttp test servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from raftlog import Bridge
from scheduler.alert_sender import AlertSender
from scheduler.clock import SystemClock
from scheduler.commands import NodeClock, PutJob, RegisterNode
from scheduler.model import parse_job
from scheduler.service import Service
from scheduler.state import State
from tests.api.conftest import OneReplica


async def _receiver() -> tuple[TestServer, list[tuple[dict[str, Any], dict[str, str]]]]:
    got: list[tuple[dict[str, Any], dict[str, str]]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append((await request.json(), dict(request.headers)))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, got


async def test_clock_skew_alert_is_posted_to_the_default_webhook() -> None:
    state = State()
    node = OneReplica(state)
    clock = SystemClock()
    service = Service(state, node, Bridge(node, asyncio.get_running_loop()), clock, "n1")
    default, to_default = await _receiver()
    own, to_job = await _receiver()
    try:
        await service.propose(RegisterNode(at_us=1, node_id="n2", raft_addr="mem:2", http_addr="x"))
        job = {"name": "tick", "schedule": "@hourly", "executor": "http", "http": {"url": "http://sink.test/x"},
               "alerts": {"webhook": str(own.make_url("/hook")), "on": ["failure"]}}
        await service.propose(PutJob(at_us=1, spec=parse_job(job).to_doc()))
        await service.propose(NodeClock(at_us=2_000_000, node="n2", offset_us=3_000_000, error_us=4_000, skewed=True,
                                        leader="n1", term=1, reason="its clock is +3.000s from the leader's"))
        sender = AlertSender(service, clock, str(default.make_url("/hook")), lambda: "http://127.0.0.1:8001",
                             interval=0.01)
        task = asyncio.create_task(sender.run())
        try:
            for _ in range(500):
                if [a for a in state.alerts.values() if a["status"] == "delivered"]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"the clock_skew alert was not delivered within 5 s: {list(state.alerts.values())}")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert to_job == [], "a cluster-level alert is not a job's to receive"
        assert len(to_default) == 1
        body, headers = to_default[0]
        assert headers["X-Raftcron-Event"] == "clock_skew"
        assert body["event"] == "clock_skew" and body["job"] is None and body["node"] == "n2"
        assert body["error"] == "its clock is +3.000s from the leader's"
        assert body["details"]["offset_ms"] == 3000 and body["details"]["error_ms"] == 4
        assert body["link"] == "http://127.0.0.1:8001/ui/#/cluster"
        assert body["slot"] is None and body["run_id"] is None and body["idempotency_key"] is None
    finally:
        await default.close()
        await own.close()
