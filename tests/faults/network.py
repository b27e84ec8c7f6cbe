"""Each agent in its own network namespace, and the faults of the links between them.

Layout: namespace ``rcf<tag>n<i>`` holds one end of a veth pair (``eth0``, 10.77.<b+i>.2/24);
the other end (``rcf<tag>h<i>``, 10.77.<b+i>.1) stays in the test's namespace, which routes
between the nodes' subnets. A routed hub rather than a bridge: every packet from one node to
another then crosses this namespace's ``forward`` hook exactly once, where one nft table cuts
links per direction and drops a share of packets, and where the delayer queues them. The test
process reaches each API directly over its veth (output hook, never faulted), and the agents
reach the receiver bound on 10.77.<b>.1 (input hook, never faulted).

Delay without netem: this kernel is built without ``sch_netem`` (``tc qdisc add ... netem``
answers "Specified qdisc kind is unknown") and without nft's ``queue`` expression, but with the
xtables NFQUEUE target. So the delay is an NFQUEUE rule (added with iptables-nft into a chain
named by us) and :class:`Delayer`, a reader on a netlink socket that holds each forwarded
packet for its drawn delay before it accepts it. Loss is nft's ``numgen random``.

Everything made here is named with the tag and removed by :meth:`Network.close`, also after a
failed setup. Needs root, ``ip``, ``nft`` and ``iptables``: :func:`missing_tools` says what lacks.
"""

from __future__ import annotations

import heapq
import os
import random
import select
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1


def missing_tools() -> list[str]:
    """What this module needs and the machine lacks (empty when it can run)."""
    missing = [t for t in ("ip", "nft", "iptables") if shutil.which(t) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def run(*args: str, input_: str | None = None) -> str:
    proc = subprocess.run(list(args), input=input_, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(kind: int, flags: int, queue: int, attrs: bytes, family: int = socket.AF_UNSPEC) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body


class Delayer:
    """Holds every packet of NFQUEUE ``queue`` for ``delay() `` seconds, then accepts it.

    Packets may overtake each other (a later one drawn a shorter delay), as with netem's jitter;
    TCP puts them back in order. Bound in the test's namespace, where the forward hook queues.
    """

    def __init__(self, queue: int) -> None:
        self.queue = queue
        self.mean, self.jitter = 0.0, 0.0
        self.held = 0  # packets delayed so far
        self._rng = random.Random(queue)
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._sock.bind((0, 0))
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)) +
                     _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 20_000)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"delayer-{queue}", daemon=True)
        self._thread.start()

    def set(self, mean: float, jitter: float) -> None:
        self.mean, self.jitter = mean, jitter

    def _config(self, attrs: bytes) -> None:
        self._sock.send(_message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, self.queue, attrs))
        reply = self._sock.recv(65536)
        length, kind = struct.unpack_from("=IH", reply)
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", reply, 16)
            if errno:
                raise OSError(-errno, f"NFQUEUE {self.queue} config: {os.strerror(-errno)}")

    def _verdict(self, packet_id: int) -> None:
        self._sock.send(_message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, self.queue,
                                 _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))))

    def _ids(self, data: bytes) -> list[int]:
        ids, offset = [], 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                pos, end = offset + 20, offset + length
                while pos + 4 <= end:
                    alen, atype = struct.unpack_from("=HH", data, pos)
                    if alen < 4:
                        break
                    if atype & 0x7FFF == NFQA_PACKET_HDR:
                        ids.append(struct.unpack_from("!I", data, pos + 4)[0])
                    pos += (alen + 3) & ~3
            offset += (length + 3) & ~3
        return ids

    def _loop(self) -> None:
        due: list[tuple[float, int]] = []
        while not self._stop.is_set():
            timeout = max(0.0, min(0.05, due[0][0] - time.monotonic())) if due else 0.05
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if ready:
                try:
                    data = self._sock.recv(1 << 20)
                except OSError:  # ENOBUFS when we fall behind: the kernel dropped some, as a loss
                    data = b""
                now = time.monotonic()
                for packet_id in self._ids(data):
                    delay = max(0.0, self.mean + self._rng.uniform(-self.jitter, self.jitter))
                    heapq.heappush(due, (now + delay, packet_id))
                    self.held += 1
            now = time.monotonic()
            while due and due[0][0] <= now:
                self._verdict(heapq.heappop(due)[1])
        for _, packet_id in due:  # let nothing wait on a reader that is gone
            self._verdict(packet_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@dataclass
class Network:
    """``size`` namespaces with one address each; links faulted by direction (``cut``), by share
    of packets lost (``lossy``) and by delay (``slow``)."""

    size: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100_000}")
    base: int = 0
    cuts: set[tuple[int, int]] = field(default_factory=set)
    loss: int = 0  # percent of forwarded packets dropped
    delayer: Delayer | None = None
    _made: list[tuple[str, ...]] = field(default_factory=list)  # undo commands, last first

    def __post_init__(self) -> None:
        if not self.base:
            self.base = 1 + (os.getpid() % 50) * 5  # 10.77.<base..base+size>, one /24 per node

    @property
    def table(self) -> str:
        return f"rcf{self.tag}"

    @property
    def chain(self) -> str:
        return f"RCF{self.tag}"

    @property
    def queue(self) -> int:
        return 7000 + int(self.tag) % 50_000

    def ns(self, i: int) -> str:
        return f"rcf{self.tag}n{i}"

    def address(self, i: int) -> str:
        return f"10.77.{self.base + i}.2"

    @property
    def host(self) -> str:
        """The test namespace's address the agents reach the receiver on."""
        return f"10.77.{self.base}.1"

    def setup(self) -> Network:
        try:
            for i in range(self.size):
                ns, hostend = self.ns(i), f"rcf{self.tag}h{i}"
                run("ip", "netns", "add", ns)
                self._made.append(("ip", "netns", "del", ns))
                run("ip", "link", "add", hostend, "type", "veth", "peer", "name", f"rcf{self.tag}p{i}")
                self._made.append(("ip", "link", "del", hostend))
                run("ip", "link", "set", f"rcf{self.tag}p{i}", "netns", ns)
                run("ip", "-n", ns, "link", "set", f"rcf{self.tag}p{i}", "name", "eth0")
                run("ip", "addr", "add", f"10.77.{self.base + i}.1/24", "dev", hostend)
                run("ip", "link", "set", hostend, "up")
                run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                run("ip", "-n", ns, "link", "set", "lo", "up")
                run("ip", "-n", ns, "link", "set", "eth0", "up")
                run("ip", "-n", ns, "route", "add", "default", "via", f"10.77.{self.base + i}.1")
            # Docker leaves the filter table's FORWARD policy at DROP: our chain, first in
            # FORWARD, accepts what passes between our nodes (after the delayer's queue, if any).
            run("iptables", "-w", "10", "-N", self.chain)
            self._made.append(("iptables", "-w", "10", "-X", self.chain))
            run("iptables", "-w", "10", "-I", "FORWARD", "1", "-j", self.chain)
            self._made.append(("iptables", "-w", "10", "-D", "FORWARD", "-j", self.chain))
            self._made.append(("iptables", "-w", "10", "-F", self.chain))
            run("iptables", "-w", "10", "-A", self.chain, "-i", f"rcf{self.tag}h+", "-o", f"rcf{self.tag}h+",
                "-j", "ACCEPT")
            run("nft", "add", "table", "inet", self.table)
            self._made.append(("nft", "delete", "table", "inet", self.table))
            self._apply()
        except BaseException:
            self.close()
            raise
        return self

    def _apply(self) -> None:
        """Write the nft table from ``cuts`` and ``loss`` in one transaction."""
        hosts = f"rcf{self.tag}h*"
        rules = [f"add rule inet {self.table} links ip saddr {self.address(a)} ip daddr {self.address(b)} drop"
                 for a, b in sorted(self.cuts)]
        if self.loss:
            rules.append(f'add rule inet {self.table} links iifname "{hosts}" numgen random mod 100 < {self.loss} drop')
        script = "\n".join([
            f"add chain inet {self.table} links {{ type filter hook forward priority -10; policy accept; }}",
            f"flush chain inet {self.table} links", *rules]) + "\n"
        run("nft", "-f", "-", input_=script)

    def cut(self, src: int, dst: int) -> None:
        """Drop every packet from node ``src`` to node ``dst`` (one direction)."""
        self.cuts.add((src, dst))
        self._apply()

    def isolate(self, i: int) -> None:
        self.cuts |= {(i, j) for j in range(self.size) if j != i} | {(j, i) for j in range(self.size) if j != i}
        self._apply()

    def heal(self) -> None:
        self.cuts.clear()
        self._apply()

    def lossy(self, percent: int) -> None:
        self.loss = percent
        self._apply()

    def slow(self, mean: float, jitter: float) -> None:
        """Delay every packet between nodes by ``mean`` +- ``jitter`` seconds (0: no delay)."""
        if self.delayer is None and mean > 0:
            self.delayer = Delayer(self.queue)
            run("iptables", "-w", "10", "-I", self.chain, "1", "-j", "NFQUEUE", "--queue-num", str(self.queue),
                "--queue-bypass")
        if self.delayer is not None:
            self.delayer.set(mean, jitter)

    def calm(self) -> None:
        """Every link whole again: no cut, no loss, no delay."""
        self.cuts.clear()
        self.loss = 0
        self._apply()
        if self.delayer is not None:
            self.delayer.set(0.0, 0.0)

    def close(self) -> None:
        errors = []
        for cmd in reversed(self._made):
            try:
                run(*cmd)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))
        self._made.clear()
        if self.delayer is not None:
            self.delayer.close()
            self.delayer = None
        if errors:
            raise RuntimeError("network cleanup: " + "; ".join(errors))
