"""Health, cluster status, membership and the OpenAPI document."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from scheduler.errors import Conflict, NotFound, ValidationFailed

from ..context import CLOSING, ApiContext
from ..routing import Param, Route
from ..views import iso
from .common import ctx_of, ok, read_json
from .metrics import metrics_of

__all__ = ["ROUTES", "cluster_view"]


async def _health(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    # caught_up: whether this node answers reads of the state (see NodeStatus.caught_up); the
    # process serves either way, so 200.
    return ok({"status": "ok", "node_id": ctx.node_id, "caught_up": ctx.node.status().caught_up})


def _node_of(ctx: ApiContext, raft_addr: str | None) -> dict[str, Any] | None:
    if raft_addr is None:
        return None
    for n in list(ctx.state.nodes.values()):
        if n["raft_addr"] == raft_addr:
            return {"node_id": n["node_id"], "raft_addr": n["raft_addr"], "http_addr": n["http_addr"]}
    return {"node_id": None, "raft_addr": raft_addr, "http_addr": None}


def cluster_view(ctx: ApiContext) -> dict[str, Any]:
    st = ctx.node.status()
    partners = {p.raft_addr: p for p in st.partners}
    registered = {n["raft_addr"]: n for n in list(ctx.state.nodes.values())}
    addrs = sorted({ctx.raft_addr, *partners, *registered})
    members = []
    for addr in addrs:
        reg = registered.get(addr, {})
        me = addr == ctx.raft_addr
        p = partners.get(addr)
        if me:
            role = st.state
        elif p is None:
            role = "removed"  # registered once, no longer in the raft configuration
        else:
            role = "leader" if addr == st.leader else ("follower" if st.leader else "unknown")
        lag = None
        if st.state == "leader" and p is not None and p.match_index is not None:
            lag = max(0, st.commit_index - p.match_index)
        # This member's wall clock minus the leader's (the cluster's time), and the bound on
        # that estimate's error; null while unknown.
        offset, error = (st.clock_offset, st.clock_error) if me else (
            (p.clock_offset, p.clock_error) if p is not None else (None, None))
        members.append({
            "node_id": reg.get("node_id"), "raft_addr": addr, "http_addr": reg.get("http_addr"),
            "role": role, "reachable": True if me else bool(p and p.connected), "lag": lag,
            "tags": reg.get("tags", {}), "allow_shell": reg.get("allow_shell", False),
            "in_configuration": me or p is not None,
            "clock_offset_ms": _ms(offset), "clock_error_ms": _ms(error),
            # Whether this member answers pre-vote, as the node answering here heard it.
            "prevote": st.prevote if me else bool(p and p.prevote),
        })
    return {
        "node_id": ctx.node_id, "leader": _node_of(ctx, st.leader), "term": st.term, "state": st.state,
        "commit_index": st.commit_index, "applied_index": st.applied_index, "has_quorum": st.has_quorum,
        "raft_thread_alive": st.raft_thread_alive, "caught_up": st.caught_up, "apply_lag": max(0, st.commit_index - st.applied_index),
        "seconds_without_leader": round(st.seconds_without_leader, 3),
        "last_snapshot_index": st.last_snapshot_index, "members": members,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


async def _cluster(request: web.Request, args: dict[str, Any]) -> web.Response:
    return ok(cluster_view(ctx_of(request)))


async def _history(request: web.Request, args: dict[str, Any]) -> web.Response:
    """This node's last ten minutes (the dashboard's cluster charts), with a sample taken now last."""
    ctx = ctx_of(request)
    metrics = metrics_of(ctx)
    trend = metrics.trend
    rows = trend.view(metrics.trend_point(time.time()))
    for r in rows:
        r["at"] = iso(int(r["at"] * 1_000_000))
    return ok({"node_id": ctx.node_id, "every_s": trend.every, "span_s": trend.span, "items": rows})


WATCH_BOUND = 25  # seconds a watch may wait, under the usual 30 s of proxies and load balancers


async def _watch(request: web.Request, args: dict[str, Any]) -> web.Response:
    """A long poll: answers once this node has applied past ``after`` (at once if it has), or
    after ``timeout`` seconds, with the cluster view (applied_index says where it stands). The
    dashboard waits on it instead of polling, so a view changes as soon as its data does."""
    ctx = ctx_of(request)
    closing = request.app[CLOSING]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (args.get("timeout") or 20)
    while ctx.state.applied_index <= args["after"] and not closing.is_set() and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return ok(cluster_view(ctx))


async def _openapi(request: web.Request, args: dict[str, Any]) -> web.Response:
    from ..app import openapi_document

    return ok(openapi_document())


async def _members(request: web.Request, args: dict[str, Any]) -> web.Response:
    return ok({"items": cluster_view(ctx_of(request))["members"], "next_cursor": None})


async def _add_member(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    body = await read_json(request)
    problems = []
    if not isinstance(body, dict):
        raise ValidationFailed([{"field": "$", "message": "must be an object"}])
    if not _host_port(body.get("raft_addr")):
        # pysyncobj raises on a port that is not a number: that was answered 500.
        problems.append({"field": "raft_addr", "message": "is required, as host:port (port 1-65535)"})
    unknown = set(body) - {"node_id", "raft_addr", "http_addr"}
    problems += [{"field": k, "message": "unknown field"} for k in sorted(unknown)]
    if problems:
        raise ValidationFailed(problems)
    if any(p.raft_addr == body["raft_addr"] for p in ctx.node.status().partners) or body["raft_addr"] == ctx.raft_addr:
        raise Conflict(f"{body['raft_addr']} is a member already")
    await ctx.service.add_member(body["raft_addr"])
    return ok({"added": body["raft_addr"]}, 201)


def _host_port(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    host, _, port = value.rpartition(":")
    return bool(host.strip("[]")) and port.isascii() and port.isdigit() and 0 < int(port) < 65536


async def _remove_member(request: web.Request, args: dict[str, Any]) -> web.Response:
    ctx = ctx_of(request)
    key = args["member"]
    addr = next((n["raft_addr"] for n in list(ctx.state.nodes.values()) if n["node_id"] == key), key)
    if addr == ctx.raft_addr:
        raise Conflict("a node cannot remove itself; ask another member")
    if not any(p.raft_addr == addr for p in ctx.node.status().partners):
        raise NotFound(f"no member {key!r}")
    await ctx.service.remove_member(addr)
    return ok({"removed": addr})


ROUTES = [
    Route("GET", "/v1/health", _health, "200 while the process serves", responses={200: "Health"},
          tag="cluster", public=True),
    Route("GET", "/v1/cluster", _cluster, "Leader, term, commit index, members", responses={200: "Cluster"},
          tag="cluster"),
    Route("GET", "/v1/cluster/history", _history, "This node's last ten minutes, a sample every five seconds "
          "(kept in memory, empty after a restart): commit and applied index, apply lag, attempts ended per "
          "second across the cluster", responses={200: "ClusterHistory"}, tag="cluster"),
    Route("GET", "/v1/watch", _watch, "Wait until this node has applied past `after` (or `timeout` seconds), "
          "then answer its cluster status", params=(
              Param("after", type="integer", required=True, minimum=0, description="an applied_index seen before"),
              Param("timeout", type="integer", minimum=1, maximum=WATCH_BOUND, description="seconds, default 20")),
          responses={200: "Cluster"}, tag="cluster"),
    Route("GET", "/v1/members", _members, "Members with role and reachability", responses={200: "MemberList"},
          tag="cluster"),
    Route("POST", "/v1/members", _add_member, "Add a member (start it first with --peers naming the cluster)",
          body="MemberAdd", responses={201: "Object", 409: "Error"}, write=True, tag="cluster"),
    Route("DELETE", "/v1/members/{member}", _remove_member, "Remove a member by node id or raft address",
          params=(Param("member", "path", required=True),), responses={200: "Object", 404: "Error", 409: "Error"},
          write=True, tag="cluster"),
    # SPEC 3: with --api-token set, every path but /v1/health needs the token.
    Route("GET", "/openapi.json", _openapi, "This document", responses={200: "Object"}, tag="cluster"),
]
