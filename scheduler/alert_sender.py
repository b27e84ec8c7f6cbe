"""Delivers pending alerts; runs only on the leader, beside the leader loop.

Each delivery's outcome is committed (``AlertResults``), so a new leader sends
exactly the alerts still pending. The one window left is a leader that posted
an alert and died before committing that it did: the next leader posts it
again, with the same ``X-Raftcron-Alert-Id`` header so a receiver can drop it.

Payload (JSON, POST to the job's ``alerts.webhook`` or the agent's
``--alert-webhook``; a cluster-level alert, ``job`` null, always to the
latter)::

    {"alert_id", "event", "job", "run_id", "slot", "status", "error", "attempt",
     "node", "idempotency_key", "link", "at", "details": {...}}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from .clock import Clock
from .commands import AlertResults
from .errors import RaftcronError
from .instants import format_instant, from_us, us
from .redaction import scrub_urls, shown_webhook
from .service import Service

__all__ = ["AlertSender", "payload"]

log = logging.getLogger("raftcron.alerts")


def payload(alert: dict[str, Any], link_base: str | None) -> dict[str, Any]:
    slot = from_us(alert["slot_us"]) if alert.get("slot_us") is not None else None
    return {
        "alert_id": alert["id"], "event": alert["event"], "job": alert["job"], "run_id": alert["run_id"],
        "slot": format_instant(slot) if slot else None, "status": alert["run_status"], "error": alert["error"],
        "attempt": alert["attempt"], "node": alert["node"],
        "idempotency_key": f"{alert['job']}@{format_instant(slot)}" if slot else None,
        "link": _link(alert, link_base),
        "at": format_instant(from_us(alert["created_us"])), "details": dict(alert.get("extra") or {}),
    }


def _link(alert: dict[str, Any], base: str | None) -> str | None:
    if not base:
        return None
    if alert["run_id"]:
        return f"{base}/ui/#/runs/{alert['run_id']}"
    return f"{base}/ui/#/jobs/{alert['job']}" if alert["job"] is not None else f"{base}/ui/#/cluster"


class AlertSender:
    def __init__(self, service: Service, clock: Clock, default_webhook: str | None,
                 link_base: Callable[[], str | None], *, interval: float = 0.5, timeout: float = 5.0,
                 on_delivery: Callable[[str], None] | None = None) -> None:
        self.svc = service
        self.clock = clock
        self.default_webhook = default_webhook
        self.link_base = link_base
        self.interval = interval
        self.timeout = timeout
        self.on_delivery = on_delivery

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session:
            while self.svc.node.is_leader():
                try:
                    await self._round(session)
                except RaftcronError as exc:
                    log.warning("alert outcomes not committed yet: %s", exc)
                await self.clock.sleep(self.interval)

    async def _round(self, session: aiohttp.ClientSession) -> None:
        now = us(self.clock.now())
        due = [a for a in list(self.svc.state.alerts.values()) if a["status"] == "pending" and a["next_us"] <= now]
        if not due:
            return
        results = await asyncio.gather(*(self._deliver(session, a) for a in due[:64]))
        await self.svc.propose(AlertResults(at_us=us(self.clock.now()), leader=self.svc.node_id,
                                            results=tuple(results)))

    async def _deliver(self, session: aiohttp.ClientSession, alert: dict[str, Any]) -> dict[str, Any]:
        job = self.svc.state.job(alert["job"]) if alert["job"] is not None else None
        url = (job.alerts.webhook if job is not None else None) or self.default_webhook
        if not url:
            return {"id": alert["id"], "ok": False, "skip": True, "error": "no webhook configured"}
        body = payload(alert, self.link_base())
        headers = {"X-Raftcron-Alert-Id": alert["id"], "X-Raftcron-Event": alert["event"]}
        try:
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                ok = 200 <= resp.status < 300
                error = None if ok else f"webhook answered {resp.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # The exception may quote the hook's URL, whose path is the secret of Slack-style hooks.
            ok, error = False, scrub_urls(f"webhook unreachable: {type(exc).__name__}: {exc}", shown_webhook)
        log.info("alert %s (%s of %s) to %s: %s", alert["id"], alert["event"], alert["job"] or f"node {alert['node']}",
                 shown_webhook(url), "delivered" if ok else error)
        if self.on_delivery is not None:
            self.on_delivery("delivered" if ok else "failed")
        return {"id": alert["id"], "ok": ok, "error": error}
