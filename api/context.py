"""What the HTTP handlers are given: the agent's parts, behind one object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from scheduler.base import RaftPort
from scheduler.service import Service
from scheduler.state import State

from .metrics import Metrics

__all__ = ["ApiContext", "Tokens"]


@dataclass(frozen=True, slots=True)
class Tokens:
    write: str | None = None  # --api-token: everything
    read: str | None = None  # --api-read-token: GET only


@dataclass(slots=True, kw_only=True)
class ApiContext:
    service: Service
    node_id: str
    http_addr: str
    raft_addr: str
    live: Callable[[], set[str]]  # node ids this node sees as reachable (itself included)
    tokens: Tokens = field(default_factory=Tokens)
    max_body: int = 1 << 20
    # The agent's metrics; an app built without them (the API tests) makes its own on the
    # first scrape (routes/metrics.py), reading what the context has.
    metrics: Metrics | None = None

    @property
    def state(self) -> State:
        return self.service.state

    @property
    def node(self) -> RaftPort:
        return self.service.node


CTX = web.AppKey("ctx", ApiContext)
"""Where the application keeps its ApiContext."""
