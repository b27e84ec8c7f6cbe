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

- until a connection is authenticated, every frame it announces must fit in
  ``PREAUTH_FRAME_LIMIT`` bytes, and after that in ``FRAME_LIMIT``; a larger length
  prefix closes the connection as soon as its four bytes arrive, before any of the
  frame is buffered. A real peer's frames before that point are the two of the
  handshake, its random key and then its address: measured 232 and 272 bytes with
  the 4-byte prefix, for a 127.0.0.1 address (252 for a 253-character host name, which
  compresses well; see ``tests/unit/test_raft_listener.py``), well under 1 KiB;
- a connection is authenticated once a frame decrypted with the cluster secret
  carried the random key this end chose for it (pysyncobj's handshake: a dialled
  peer's first answer carries it, an accepting end's second frame does). A first
  frame alone proves nothing: one captured on the wire can be replayed;
- the read buffer is a ``bytearray`` consumed from the front (amortised constant
  cost per byte), and one read event takes at most ``READ_PER_EVENT`` bytes so one
  busy connection cannot hold the raft thread;
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
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import pickle as _pickle
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, set_keepalive
from pysyncobj.transport import TCPTransport

__all__ = ["DEFAULT_LIMITS", "FRAME_LIMIT", "PREAUTH_FRAME_LIMIT", "FrameLimits", "GuardedConnection", "GuardedListener",
           "GuardedTransport", "raise_fd_limit"]

log = logging.getLogger("raftcron.raft")

PREAUTH_FRAME_LIMIT = 1024
# Batches and snapshot chunks pysyncobj sends stay near appendEntriesBatchSizeBytes (64 KiB)
# and our commands are capped far below; 64 MiB is room for any real frame, yet a bound.
FRAME_LIMIT = 64 * 2**20
READ_PER_EVENT = 2**20
MAX_PENDING = 64  # unauthenticated connections held at once
ACCEPTS_PER_EVENT = 64
BACKLOG = 128
BACKOFF_MIN = 0.01
BACKOFF_MAX = 0.5

_HEADER = struct.Struct("i")  # pysyncobj's prefix: a native int, as it packs it
# accept() failures that say "not now" rather than "this socket is broken".
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_SKIP = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
_AGAIN = frozenset({errno.EAGAIN, errno.EWOULDBLOCK})

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class FrameLimits:
    preauth: int = PREAUTH_FRAME_LIMIT
    authenticated: int = FRAME_LIMIT
    read_per_event: int = READ_PER_EVENT


DEFAULT_LIMITS = FrameLimits()


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


class GuardedConnection:
    """pysyncobj's ``TcpConnection``, same interface and wire format, with frame limits,
    a ``bytearray`` buffer and the notion of an authenticated connection.

    The camelCase names are pysyncobj's interface (its transport calls them)."""

    def __init__(self, poller: Any, onMessageReceived: Callable[[Any], None] | None = None,  # noqa: N803
                 onConnected: Callable[[], None] | None = None,  # noqa: N803
                 onDisconnected: Callable[[], None] | None = None,  # noqa: N803
                 socket: socket.socket | None = None, timeout: float = 10.0,  # noqa: A002 - pysyncobj's keyword
                 sendBufferSize: int = 2**13, recvBufferSize: int = 2**13,  # noqa: N803
                 keepalive: tuple[int, int, int] | None = None,
                 limits: FrameLimits = DEFAULT_LIMITS, clock: Clock = time.monotonic) -> None:
        self.sendRandKey: bytes | None = None  # noqa: N815 - pysyncobj's attribute names
        self.recvRandKey: bytes | None = None  # noqa: N815
        self.recvLastTimestamp = 0  # noqa: N815
        self.encryptor: Any = None
        self.authenticated = False
        self._clock = clock
        self._limits = limits
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._last_read = clock()
        self.opened_at = clock()
        self._timeout = timeout
        self._poller = poller
        self._keepalive = keepalive
        self._on_message = onMessageReceived
        self._on_connected = onConnected
        self._on_disconnected = onDisconnected
        self._send_buffer = sendBufferSize
        self._recv_buffer = recvBufferSize
        self._sock = socket
        self._fileno: int | None = None
        self._state = CONNECTION_STATE.DISCONNECTED
        if socket is not None:
            self._fileno = socket.fileno()
            self._state = CONNECTION_STATE.CONNECTED
            self._set_keepalive()
            self._poller.subscribe(self._fileno, self._process,
                                   POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)

    # ---- pysyncobj's TcpConnection interface -------------------------------------

    @property
    def state(self) -> int:
        return int(self._state)

    def setOnConnectedCallback(self, onConnected: Callable[[], None] | None) -> None:  # noqa: N802, N803
        self._on_connected = onConnected

    def setOnMessageReceivedCallback(self, onMessageReceived: Callable[[Any], None] | None) -> None:  # noqa: N802, N803
        self._on_message = onMessageReceived

    def setOnDisconnectedCallback(self, onDisconnected: Callable[[], None] | None) -> None:  # noqa: N802, N803
        self._on_disconnected = onDisconnected

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:  # noqa: N802
        return len(self._wbuf)

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        self._state = CONNECTION_STATE.DISCONNECTED
        self._fileno = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock = sock
        _tune(sock, self._send_buffer, self._recv_buffer)
        self._set_keepalive()
        sock.setblocking(False)
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self.authenticated = False
        self._last_read = self.opened_at = self._clock()
        try:
            sock.connect((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                sock.close()
                self._sock = None
                return False
        self._fileno = sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self._poller.subscribe(self._fileno, self._process,
                               POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        return True

    def send(self, message: Any) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib.compress(_pickle.dumps(message), 3)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(time.monotonic()))
        self._wbuf += _HEADER.pack(len(data))
        self._wbuf += data
        self._try_send()

    def disconnect(self) -> None:
        notify = self._on_disconnected is not None and self._state != CONNECTION_STATE.DISCONNECTED
        self.sendRandKey = None
        self.recvRandKey = None
        self.recvLastTimestamp = 0
        self.authenticated = False
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        self._wbuf = bytearray()
        self._rbuf = bytearray()
        self._state = CONNECTION_STATE.DISCONNECTED
        if notify and self._on_disconnected is not None:
            self._on_disconnected()

    # ---- events -----------------------------------------------------------------------

    def _set_keepalive(self) -> None:
        if self._sock is not None and self._keepalive is not None:
            set_keepalive(self._sock, *self._keepalive)

    def _process(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if event & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        if self._timed_out():
            return
        sock = self._sock
        if sock is None:
            return
        if event & (POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE):
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            if self._state == CONNECTION_STATE.CONNECTING:
                if self._on_connected is not None:
                    self._on_connected()
                if self._state == CONNECTION_STATE.DISCONNECTED:
                    return
                self._state = CONNECTION_STATE.CONNECTED
                self._last_read = self._clock()
                return
        if event & POLL_EVENT_TYPE.WRITE:
            self._try_send()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            if self._wbuf:
                mask |= POLL_EVENT_TYPE.WRITE
            self._poller.subscribe(descr, self._process, mask)
        if event & POLL_EVENT_TYPE.READ:
            self._read()

    def _timed_out(self) -> bool:
        # pysyncobj's rule for a connection in use: nothing read for the timeout closes it.
        if self._clock() - self._last_read > self._timeout:
            self.disconnect()
            return True
        return False

    def _try_send(self) -> None:
        if self._timed_out():
            return
        while self._wbuf and self._sock is not None:
            try:
                sent = self._sock.send(self._wbuf)
            except OSError as exc:
                if exc.errno not in _AGAIN:
                    self.disconnect()
                return
            if sent <= 0:
                return
            del self._wbuf[:sent]

    def _read(self) -> None:
        """Read what the socket holds, up to ``read_per_event`` bytes, handing on every
        complete frame as soon as it is in, so the next frame's prefix is judged by the
        limit that applies to it (a peer's first raft messages may follow its handshake
        in the same read)."""
        taken = 0
        while taken < self._limits.read_per_event:
            sock = self._sock
            if sock is None:
                return
            try:
                chunk = sock.recv(self._recv_buffer)
            except OSError as exc:
                if exc.errno not in _AGAIN:
                    self.disconnect()
                return
            if not chunk:
                self.disconnect()
                return
            taken += len(chunk)
            self._last_read = self._clock()
            self._rbuf += chunk
            if not self._deliver():
                return

    def _deliver(self) -> bool:
        """Hand on every complete frame in the buffer; False once the connection closed."""
        buf = self._rbuf
        start = 0
        try:
            while len(buf) - start >= _HEADER.size:
                (length,) = _HEADER.unpack_from(buf, start)
                limit = self._limits.authenticated if self.authenticated else self._limits.preauth
                if length < 0 or length > limit:
                    # A stranger's is routine (debug); a peer's means a release or a bug to look at.
                    log.log(logging.WARNING if self.authenticated else logging.DEBUG,
                            "raft connection closed: a frame of %d bytes announced (limit %d%s)",
                            length, limit, "" if self.authenticated else ", not authenticated")
                    self.disconnect()
                    return False
                end = start + _HEADER.size + length
                if len(buf) < end:
                    break
                message = self._decode(bytes(buf[start + _HEADER.size:end]))
                start = end
                if message is _INVALID:
                    self.disconnect()
                    return False
                if self._on_message is not None:
                    self._on_message(message)
                if self._state == CONNECTION_STATE.DISCONNECTED:
                    return False
        finally:
            if start and buf is self._rbuf:
                del buf[:start]
        return True

    def _decode(self, data: bytes) -> Any:
        keyed = self.recvRandKey is not None
        try:
            if self.encryptor:
                stamp = self.encryptor.extract_timestamp(data)
                if stamp < self.recvLastTimestamp:
                    return _INVALID
                self.recvLastTimestamp = stamp
                data = self.encryptor.decrypt(data)
            message = _pickle.loads(zlib.decompress(data))
            if keyed:
                key, message = message
                if key != self.recvRandKey:
                    return _INVALID
        except Exception:  # noqa: BLE001 - anything a stranger's bytes raise closes the connection
            return _INVALID
        if keyed or not self.encryptor:
            self.authenticated = True
        return message


_INVALID = object()


def _tune(sock: socket.socket, send_buffer: int, recv_buffer: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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
            _tune(sock, self._send_buffer, self._recv_buffer)
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
            _tune(peer, self._send_buffer, self._recv_buffer)
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
