"""The raft port against strangers: our own listener and connection in place of pysyncobj's.

pysyncobj 0.3.17's ``TcpServer`` and ``TcpConnection`` trust whatever reaches the port
until a frame fails to decrypt, and a stranger need not send one:

- the length prefix is believed before anything is authenticated, and the read buffer
  is ``bytes`` copied on every read, so one stranger announcing a large frame and
  trickling it made the raft thread spend seconds per tick (commits stopped, the
  leader lost its lease);
- a connection's timeout is checked only when something happens on it, so a silent or
  half-sent connection is never closed;
- ``accept`` failing with EMFILE (the descriptors taken by such connections) unbinds the
  listener for good: the node never hears from a peer again.

``GuardedTransport`` (pysyncobj's ``TCPTransport`` with our listener and connections,
handed to ``SyncObj`` as its ``transportClass``) keeps the wire format and the
handshake exactly as they are, so a node running this talks to one that does not.
What it adds:

- each connection (``connection.GuardedConnection``) holds frames to a small limit
  until it is authenticated and a large one after, closing on a larger length prefix
  before buffering any of it, and reads into a ``bytearray``;
- the listener sweeps its unauthenticated connections on every raft tick and closes
  each one older than the connection timeout, silent or not (a real peer finishes the
  handshake within a round trip), and holds at most ``max_pending`` of them (a new
  one beyond that closes the oldest);
- ``accept`` failing for want of descriptors or memory closes the oldest
  unauthenticated connection and pauses accepting (a short back-off, doubled while
  it keeps failing), and an aborted connection is skipped: the listener is never
  unbound while the node runs.

``raise_fd_limit`` raises this process's soft ``RLIMIT_NOFILE`` to its hard limit.
Every pysyncobj private name used here is listed in ``pysyncobj_names``.
"""

from __future__ import annotations

import errno
import functools
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from .connection import DEFAULT_LIMITS, Clock, FrameLimits, GuardedConnection, tune

__all__ = ["GuardedListener", "GuardedTransport", "raise_fd_limit"]

log = logging.getLogger("raftcron.raft")

MAX_PENDING = 64  # unauthenticated connections held at once
ACCEPTS_PER_EVENT = 64
BACKLOG = 128
BACKOFF_MIN = 0.01
BACKOFF_MAX = 0.5

# accept() failures that concern one waiting connection, not the listener: skip it.
# Any other (EMFILE, ENFILE, ENOBUFS, ENOMEM...) pauses accepting for a back-off.
_SKIP = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
_AGAIN = frozenset({errno.EAGAIN, errno.EWOULDBLOCK})


class _Throttled:
    """A warning logged at most once per ``every`` seconds, with how often it was due."""

    __slots__ = ("_clock", "_every", "_last", "_suppressed")

    def __init__(self, clock: Clock, every: float = 10.0) -> None:
        self._clock = clock
        self._every = every
        self._last = -float("inf")
        self._suppressed = 0

    def warn(self, message: str, *args: object) -> None:
        now = self._clock()
        if now - self._last < self._every:
            self._suppressed += 1
            return
        more = f" (and {self._suppressed} more like it)" if self._suppressed else ""
        self._last, self._suppressed = now, 0
        log.warning(message + more, *args)


class GuardedListener:
    """pysyncobj's ``TcpServer`` (``bind``, ``unbind``) that never gives up its port.

    ``tick`` runs on every raft tick: it sweeps unauthenticated connections and resumes
    accepting after a back-off."""

    def __init__(self, poller: Any, host: str, port: int, on_new_connection: Callable[[GuardedConnection], None],
                 *, send_buffer: int = 2**13, recv_buffer: int = 2**13, timeout: float = 3.5,
                 keepalive: tuple[int, int, int] | None = None, limits: FrameLimits = DEFAULT_LIMITS,
                 max_pending: int = MAX_PENDING, clock: Clock = time.monotonic,
                 socket_factory: Callable[[int, int], socket.socket] = socket.socket) -> None:
        self._poller = poller
        self._host = host
        self._port = int(port)
        self._on_new = on_new_connection
        self._send_buffer = send_buffer
        self._recv_buffer = recv_buffer
        self._timeout = timeout
        self._keepalive = keepalive
        self._limits = limits
        self._max_pending = max_pending
        self._clock = clock
        self._socket_factory = socket_factory
        self._sock: socket.socket | None = None
        self._fileno: int | None = None
        self._pending: list[GuardedConnection] = []  # unauthenticated, oldest first
        self._paused_until: float | None = None  # accepting paused (fd exhaustion) until then
        self._backoff = BACKOFF_MIN
        self._rebind_at: float | None = None  # the socket failed; bind again then
        self._warn_exhausted = _Throttled(clock)
        self._warn_evicted = _Throttled(clock)
        self.closed_unauthenticated = 0  # counts, for tests and logs
        self.accept_failures = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def accepting(self) -> bool:
        return self._fileno is not None and self._paused_until is None

    def bind(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = self._socket_factory(family, socket.SOCK_STREAM)
        try:
            tune(sock, self._send_buffer, self._recv_buffer)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self._host, self._port))
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._fileno = sock.fileno()
        self._rebind_at = None
        self._subscribe()

    def unbind(self) -> None:
        """Close the listening socket (the node is shutting down, or the socket failed)."""
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._paused_until = None

    def close_pending(self) -> None:
        for conn in self._pending:
            conn.disconnect()
        self._pending = []

    def _subscribe(self) -> None:
        if self._fileno is not None:
            self._poller.subscribe(self._fileno, self._on_event, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def tick(self) -> None:
        now = self._clock()
        self._sweep(now)
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._subscribe()
        if self._rebind_at is not None and now >= self._rebind_at:
            try:
                self.bind()
                log.warning("raft listener bound again on %s:%d", self._host, self._port)
            except OSError as exc:
                self._rebind_at = now + BACKOFF_MAX
                log.warning("raft listener could not bind again on %s:%d (%s); retrying",
                            self._host, self._port, exc)

    def _sweep(self, now: float) -> None:
        kept: list[GuardedConnection] = []
        for conn in self._pending:
            if conn.authenticated or conn.state == CONNECTION_STATE.DISCONNECTED:
                continue
            if now - conn.opened_at > self._timeout:
                self._close(conn)
                continue
            kept.append(conn)
        self._pending = kept

    def _close(self, conn: GuardedConnection) -> None:
        self.closed_unauthenticated += 1
        conn.disconnect()

    def _evict_oldest(self) -> bool:
        self._sweep(self._clock())
        if not self._pending:
            return False
        self._close(self._pending.pop(0))
        return True

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            return
        if event & POLL_EVENT_TYPE.ERROR:
            log.warning("raft listener on %s:%d reported an error; binding it again", self._host, self._port)
            self.unbind()
            self._rebind_at = self._clock() + BACKOFF_MIN
            return
        if event & POLL_EVENT_TYPE.READ:
            for _ in range(ACCEPTS_PER_EVENT):
                if not self._accept_one():
                    return

    def _accept_one(self) -> bool:
        """Accept one connection; False when there is nothing more to do this event."""
        sock = self._sock
        if sock is None:
            return False
        try:
            peer, _ = sock.accept()
        except OSError as exc:
            if exc.errno in _AGAIN:
                return False
            self.accept_failures += 1
            if exc.errno in _SKIP:
                return True
            self._pause(exc)
            return False
        self._backoff = BACKOFF_MIN
        try:
            tune(peer, self._send_buffer, self._recv_buffer)
            peer.setblocking(False)
        except OSError:
            peer.close()
            return True
        self._sweep(self._clock())
        while len(self._pending) >= self._max_pending:
            self._warn_evicted.warn("raft port: %d connections have not authenticated; closing the oldest",
                                    len(self._pending))
            self._close(self._pending.pop(0))
        conn = GuardedConnection(self._poller, socket=peer, timeout=self._timeout, sendBufferSize=self._send_buffer,
                                 recvBufferSize=self._recv_buffer, keepalive=self._keepalive, limits=self._limits,
                                 clock=self._clock)
        self._pending.append(conn)
        self._on_new(conn)
        return True

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors or memory: free one held by a stranger, stop accepting for a
        moment (the waiting connection keeps the socket readable, so carrying on would
        spin), and try again from ``tick``. The socket itself is fine: never unbind it."""
        freed = self._evict_oldest()
        self._warn_exhausted.warn("raft port: accept failed (%s); %s, accepting again in %.0f ms",
                                  exc.strerror or exc, "closed the oldest unauthenticated connection"
                                  if freed else "no unauthenticated connection to close", self._backoff * 1000)
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
        self._paused_until = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)


class GuardedTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with ``GuardedListener`` and ``GuardedConnection``."""

    def _createServer(self) -> None:  # noqa: N802 - pysyncobj's name
        conf = self._syncObj.conf
        address = conf.bindAddress or self._selfNode.address
        host, port = address.rsplit(":", 1)
        host = globalDnsResolver().resolve(host)
        if host is None:
            raise RuntimeError(f"cannot resolve the raft bind address {address}")
        self._server = GuardedListener(
            self._syncObj._poller, host, int(port), self._onNewIncomingConnection,
            send_buffer=conf.sendBufferSize, recv_buffer=conf.recvBufferSize, timeout=conf.connectionTimeout,
        )

    def addNode(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        super().addNode(node)
        if not self._shouldConnect(node):
            return
        # Replace the TcpConnection pysyncobj just made (never connected) with ours, wired the same way.
        conf = self._syncObj.conf
        conn = GuardedConnection(self._syncObj._poller, timeout=conf.connectionTimeout,
                                 sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
                                 keepalive=conf.tcp_keepalive)
        conn.encryptor = self._syncObj.encryptor
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        self._connections[node] = conn

    def _onTick(self) -> None:  # noqa: N802 - pysyncobj's name
        super()._onTick()
        server = self._server
        if isinstance(server, GuardedListener):
            server.tick()

    def destroy(self) -> None:
        super().destroy()
        server = self._server
        if isinstance(server, GuardedListener):
            server.close_pending()


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return (soft, hard) after.

    Each raft connection, HTTP client and journal file takes a descriptor; the usual soft
    limit (1,024, sometimes 256) is the first thing a crowd of connections exhausts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard
