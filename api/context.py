"""What the HTTP handlers are given: the agent's parts, behind one object."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from aiohttp import web

from raftlog import Space
from scheduler.base import RaftPort
from scheduler.service import Service
from scheduler.state import State

from .metrics import Metrics

__all__ = ["ApiContext", "CLOSING", "CTX", "Tokens", "as_reader", "reads_only"]


@dataclass(frozen=True, slots=True)
class Tokens:
    write: str | None = None  # --api-token: everything
    read: str | None = None  # --api-read-token: GET only, job secrets masked


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
    # The data directory's free space: writes are refused (507) under its floor. None: not checked.
    space: Space | None = None

    @property
    def state(self) -> State:
        return self.service.state

    @property
    def node(self) -> RaftPort:
        return self.service.node


CTX = web.AppKey("ctx", ApiContext)
"""Where the application keeps its ApiContext."""

CLOSING = web.AppKey("closing", asyncio.Event)
"""Set when the application shuts down: a long poll (``GET /v1/watch``) answers at once then,
rather than holding the shutdown for its timeout."""


# Who the request being served is. A context variable rather than request storage: aiohttp
# before 3.14 has no typed request key, and a string key warns. aiohttp serves each request
# in its own task, and the auth middleware resets the value when the request is done.
_READS_ONLY: ContextVar[bool] = ContextVar("raftcron_reads_only", default=False)


@contextmanager
def as_reader() -> Iterator[None]:
    """Serve what runs inside as for a read-only caller (the auth middleware, on the read token)."""
    token = _READS_ONLY.set(True)
    try:
        yield
    finally:
        _READS_ONLY.reset(token)


def reads_only() -> bool:
    """True while serving a caller authenticated by the read-only token: job secrets in its
    answers are masked (scheduler/redaction.py). Writers, and everyone on a cluster with no
    tokens at all, see them."""
    return _READS_ONLY.get()
