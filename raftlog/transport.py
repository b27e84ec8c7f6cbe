"""Our own traffic on pysyncobj's raft links: keepalives, per-peer batches, the clock exchange.

pysyncobj hands every message to its transport's ``send`` and ignores any message
type it has no handler for, so messages of our own ride its links (pickled and
encrypted with the cluster secret like its own). A peer is sent one of our types
only after it announced, in its keepalive, that it reads it: a node of an older
release is never sent what it cannot read. Every pysyncobj private name used here
is listed in ``pysyncobj_names``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from .clock import ClockSync

__all__ = ["BATCH", "KEEPALIVE", "_BatchingSends", "send_keepalives"]

log = logging.getLogger("raftcron.raft")

BATCH = "rc_batch"
# What this release reads besides pysyncobj's own types: ``batch`` (``rc_batch``),
# ``clock`` (``rc_clock_req`` / ``rc_clock_resp``, see raftlog.clock), ``prevote``
# (``rc_prevote_req`` / ``rc_prevote_resp``, see raftlog.prevote). A node also lists there
# the entry forms its state machine applies (``applies``, see ``NodeConfig.applies``).
KEEPALIVE: dict[str, Any] = {"type": "rc_keepalive", "batch": 1, "clock": 1, "prevote": 1}


class _BatchingSends:
    """Mixed into the SyncObj subclass: its transport's ``send`` replaced by ``_rc_send``."""

    _rc_batch: dict[Any, list[Any]] | None
    _rc_batch_peers: set[str]  # ids of the peers that read batches
    _rc_transport_send: Callable[[Any, Any], Any]

    def _rc_take_send(self, transport: Any) -> None:
        self._rc_transport_send = transport.send
        transport.send = self._rc_send

    def _rc_send(self, node: Any, message: Any) -> bool:
        """The transport's send while this node takes commands from its queue.

        There a follower forwards each submitted command to the leader as its own message
        and the leader answers each with its own (``apply_command`` / ``_response``): under
        load dozens per tick, each pickled, Fernet-encrypted and sent, and decrypted and
        unpickled on the other side. Messages to a peer that announced it reads batches (in
        its keepalive) are collected here and sent as one at the end of the same call,
        before anything else this tick sends, so the order on the link is unchanged."""
        batch = self._rc_batch
        if batch is not None and node.id in self._rc_batch_peers:
            batch.setdefault(node, []).append(message)
            return True
        return bool(self._rc_transport_send(node, message))

    def _rc_flush(self) -> None:
        batch, self._rc_batch = self._rc_batch, None
        for node, messages in (batch or {}).items():
            one = messages[0] if len(messages) == 1 else {"type": BATCH, "messages": messages}
            self._rc_transport_send(node, one)


def send_keepalives(transport: Any, nodes: Iterable[Any], clock: ClockSync | None,
                    keepalive: dict[str, Any] = KEEPALIVE) -> None:
    """Keep every link read from, follower-to-follower ones included, and time each peer's clock.

    pysyncobj closes a connection when it *sends* on it and has read nothing
    for ``connectionTimeout``. Links between followers carry no traffic, so
    after a leader died the first vote request a survivor sent closed that
    link instead of reaching its peer, and every failover cost a second
    election round. A small message pysyncobj ignores (no handler matches
    its type) keeps the links alive, and says what this node reads. A peer that
    said it reads the clock exchange is sent a request right after it. ``keepalive`` is
    the message (a node with pre-vote off leaves ``prevote`` out of it).
    """
    for node in nodes:
        try:
            transport.send(node, keepalive)
            if clock is not None and node.id in clock.peers:
                transport.send(node, clock.request(node.id))
        except Exception:  # noqa: BLE001 - best effort; the next round tries again
            log.debug("keepalive to %s failed", node, exc_info=True)
