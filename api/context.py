"""What the HTTP handlers are given: the agent's parts, behind one object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from raftlog.node import RaftNode
from scheduler.service import Service
from scheduler.state import State

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
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> State:
        return self.service.state

    @property
    def node(self) -> RaftNode:
        return self.service.node


CTX = web.AppKey("ctx", ApiContext)
"""Where the application keeps its ApiContext."""
