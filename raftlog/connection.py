"""One raft connection that holds against strangers: pysyncobj's ``TcpConnection`` with
the same interface and wire format, plus frame limits, a ``bytearray`` read buffer and the
notion of an authenticated connection (see ``listener`` for why, and for the listener and
transport that use it).

- until a connection is authenticated, every frame it announces must fit in
  ``PREAUTH_FRAME_LIMIT`` bytes, and after that in ``FRAME_LIMIT``; a larger length
  prefix closes the connection as soon as its four bytes arrive, before any of the
  frame is buffered. A real peer's frames before that point are the two of the
  handshake, its random key and then its address: measured 232 and 272 bytes with
  the 4-byte prefix, for a 127.0.0.1 address (592 for a 253-character host name, its
  frame stored, not compressed; see ``STORE_BELOW`` and ``tests/unit/test_raft_listener.py``), under 1 KiB;
- a connection is authenticated once a frame decrypted with the cluster secret
  carried the random key this end chose for it (pysyncobj's handshake: a dialled
  peer's first answer carries it, an accepting end's second frame does). A first
  frame alone proves nothing: one captured on the wire can be replayed;
- the read buffer is a ``bytearray`` consumed from the front (amortised constant
  cost per byte; pysyncobj's ``bytes`` buffer is copied whole on every read), and one
  read event takes at most ``READ_PER_EVENT`` bytes so one busy connection cannot
  hold the raft thread.

Every pysyncobj private name used here is listed in ``pysyncobj_names``.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj import pickle as _pickle
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, set_keepalive

from .trace import mark

__all__ = ["DEFAULT_LIMITS", "FRAME_LIMIT", "PREAUTH_FRAME_LIMIT", "Clock", "FrameLimits", "GuardedConnection", "tune"]

log = logging.getLogger("raftcron.raft")

PREAUTH_FRAME_LIMIT = 1024
# Batches and snapshot chunks pysyncobj sends stay near appendEntriesBatchSizeBytes (64 KiB)
# and our commands are capped far below; 64 MiB is room for any real frame, yet a bound.
FRAME_LIMIT = 64 * 2**20
READ_PER_EVENT = 2**20

# pysyncobj's wire format is a zlib stream (it compresses at level 3). Level 0 writes the same
# format with the bytes stored as they are, which every reader (pysyncobj's, and our releases
# that compressed) takes alike. A frame under ``STORE_BELOW`` bytes of pickle is stored: an
# AppendEntries of one job's entry pickles to ~670 bytes, of which compressing took off a
# quarter for ~20-25 us of the sender's CPU against ~3 us stored, on every frame (on the
# leader's raft thread, one frame per follower per write). A larger one (a batch of entries, a
# snapshot chunk) is compressed at level 1, a little faster than level 3 for about its size: a
# 64 KiB snapshot chunk of job records pickles to ~77 KiB and compresses to ~12 KiB in 0.43 ms
# (0.05 ms stored). Stored, a snapshot sent to a follower would also sit in the leader's send
# buffer at six times the size (pysyncobj sends its chunks without waiting for the wire).
STORE_BELOW = 4096
BULK_ZLIB_LEVEL = 1


def _zlib(pickled: bytes) -> bytes:
    return zlib.compress(pickled, 0 if len(pickled) < STORE_BELOW else BULK_ZLIB_LEVEL)


_HEADER = struct.Struct("i")  # pysyncobj's prefix: a native int, as it packs it
_AGAIN = frozenset({errno.EAGAIN, errno.EWOULDBLOCK})

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class FrameLimits:
    preauth: int = PREAUTH_FRAME_LIMIT
    authenticated: int = FRAME_LIMIT
    read_per_event: int = READ_PER_EVENT


DEFAULT_LIMITS = FrameLimits()


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
                 limits: FrameLimits = DEFAULT_LIMITS, clock: Clock = time.monotonic,
                 socket_factory: Callable[[int, int], socket.socket] = socket.socket) -> None:
        self.sendRandKey: bytes | None = None  # noqa: N815 - pysyncobj's attribute names
        self.recvRandKey: bytes | None = None  # noqa: N815
        self.recvLastTimestamp = 0  # noqa: N815
        self.encryptor: Any = None
        self.authenticated = False
        self._clock = clock
        self._limits = limits
        self._socket_factory = socket_factory  # for outgoing connections
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
        try:
            sock = self._socket_factory(family, socket.SOCK_STREAM)
        except OSError as exc:
            # Out of descriptors (EMFILE) most likely: pysyncobj would raise out of its tick;
            # a failed attempt instead, retried after connectionRetryTime like any other.
            log.warning("raft: cannot open a connection to %s:%d: %s", host, port, exc)
            return False
        self._sock = sock
        try:
            tune(sock, self._send_buffer, self._recv_buffer)
            self._set_keepalive()
            sock.setblocking(False)
        except OSError:
            sock.close()
            self._sock = None
            return False
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
        data = _zlib(_pickle.dumps(message))
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(time.monotonic()))
        self._wbuf += _HEADER.pack(len(data))
        self._wbuf += data
        mark("tx")  # before the send: a peer may read it before this thread runs again
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
                mark("rx")
                message = self._decode(bytes(memoryview(buf)[start + _HEADER.size:end]))  # one copy
                start = end
                if message is _INVALID:
                    self.disconnect()
                    return False
                if self._on_message is not None:
                    self._on_message(message)
                if self._state == CONNECTION_STATE.DISCONNECTED or buf is not self._rbuf:
                    # Closed by the callback, or closed and connected again (pysyncobj reconnects
                    # in its disconnect handler): the rest of this buffer is the old socket's.
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


def tune(sock: socket.socket, send_buffer: int, recv_buffer: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
