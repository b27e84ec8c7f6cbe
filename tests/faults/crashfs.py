"""A passthrough FUSE filesystem that can lose what was not fsynced, as a power loss does.

Run it in a process of its own (``python -m tests.faults.crashfs BACKING MOUNTPOINT CONTROL``)
through ``CrashFs``. Every file's content lives in the backing directory only up to its last
``fsync``/``fdatasync``: later writes and size changes are held in memory (reads see them, as
they see the page cache). On ``crash`` it drops everything unsynced except a prefix of random
length of each file's last unsynced write (a torn record), and from then on fails every write
and sync with EIO until it is unmounted (the machine is off: nothing written after the crash
may be acknowledged by a writer that is still running). A new ``CrashFs`` on the same backing directory is the machine after the
power came back.

Directory operations (create, rename, unlink, mkdir) reach the backing directory at once: a
rename of a file whose data was never synced leaves the new name holding only what was synced,
the harsh end of what a real filesystem allows.

The control socket speaks one line each way: ``crash`` answers ``ok DROPPED_BYTES TORN_FILES``;
``stats`` answers ``ok SYNCS PENDING_BYTES``.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def fuse_available() -> str | None:
    """None when a FUSE filesystem can be mounted here, else the reason it cannot."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse itself is missing
        return f"mfusepy cannot load: {exc}"
    return None


SECTOR = 512


def _torn_length(rng: random.Random, size: int) -> int:
    """How much of a write a crash keeps: whole sectors of a longer write (a disk writes a
    sector whole or not at all), any prefix of a write within one sector."""
    if size > SECTOR:
        return rng.randrange(1, (size + SECTOR - 1) // SECTOR) * SECTOR
    return rng.randrange(1, size) if size > 1 else 0


def _eio() -> OSError:
    from mfusepy import FuseOSError
    return FuseOSError(errno.EIO)


@dataclass
class _Image:
    """A file's content as its readers see it, and the writes not synced yet."""

    data: bytearray
    pending: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, bytes); (-1, b"") a size change


class _Ops:
    use_ns = True

    def __init__(self, backing: str, seed: int) -> None:
        self.root = backing
        self.images: dict[str, _Image] = {}
        self.mutex = threading.Lock()
        self.crashed = False
        self.syncs = 0
        self.rng = random.Random(seed)
        self.fh = 0

    def _b(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _image(self, path: str) -> _Image:
        img = self.images.get(path)
        if img is None:
            with open(self._b(path), "rb") as f:
                img = _Image(bytearray(f.read()))
            self.images[path] = img
        return img

    # ---- metadata --------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        from mfusepy import FuseOSError
        with self.mutex:
            try:
                st = os.lstat(self._b(path))
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from exc
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            img = self.images.get(path)
            if img is not None:
                attrs["st_size"] = len(img.data)
            attrs["st_blocks"] = (attrs["st_size"] + 511) // 512
            return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._b(path))]

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._b(path))
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                            "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def access(self, path: str, amode: int) -> int:
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._b(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._b(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._b(path))
        else:
            os.utime(self._b(path), ns=times)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._b(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._b(path))
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            os.unlink(self._b(path))
            self.images.pop(path, None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            os.rename(self._b(old), self._b(new))
            self.images.pop(new, None)
            img = self.images.pop(old, None)
            if img is not None:
                self.images[new] = img
        return 0

    # ---- files -----------------------------------------------------------------------------

    def _next_fh(self) -> int:
        self.fh += 1
        return self.fh

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self.mutex:
            fd = os.open(self._b(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.close(fd)
            self.images.pop(path, None)
            return self._next_fh()

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            if flags & os.O_TRUNC:
                self._truncate(path, 0)
            return self._next_fh()

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            img = self.images.get(path)
            if img is not None:
                return bytes(img.data[offset : offset + size])
            with open(self._b(path), "rb") as f:
                f.seek(offset)
                return f.read(size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            if self.crashed:
                raise _eio()
            img = self._image(path)
            end = offset + len(data)
            if end > len(img.data):
                img.data.extend(bytes(end - len(img.data)))
            img.data[offset:end] = data
            img.pending.append((offset, bytes(data)))
            return len(data)

    def _truncate(self, path: str, length: int) -> None:
        if self.crashed:
            raise _eio()
        img = self._image(path)
        if length < len(img.data):
            del img.data[length:]
        else:
            img.data.extend(bytes(length - len(img.data)))
        img.pending.append((-1, b""))

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._truncate(path, length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        from mfusepy import FuseOSError
        if mode != 0:
            raise FuseOSError(errno.EOPNOTSUPP)
        with self.mutex:
            if self.crashed:
                raise _eio()
            try:  # the space is taken on the backing filesystem, as a real fallocate takes it
                fd = os.open(self._b(path), os.O_WRONLY)
                try:
                    os.posix_fallocate(fd, offset, size)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from exc
            img = self._image(path)
            if offset + size > len(img.data):
                img.data.extend(bytes(offset + size - len(img.data)))
                img.pending.append((-1, b""))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            if self.crashed:
                raise _eio()
            img = self.images.pop(path, None)
            self.syncs += 1
            if img is not None and img.pending:
                with open(self._b(path), "r+b") as f:
                    f.write(img.data)
                    f.truncate(len(img.data))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # directory operations are applied to the backing directory at once

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        return 0

    # ---- the crash -------------------------------------------------------------------------

    def crash(self) -> tuple[int, int]:
        """Forget every unsynced write, keeping a torn prefix of each file's last one."""
        with self.mutex:
            dropped = torn = 0
            for path, img in self.images.items():
                writes = [(off, data) for off, data in img.pending if off >= 0]
                dropped += sum(len(d) for _, d in writes)
                if not writes:
                    continue
                offset, data = writes[-1]
                keep = _torn_length(self.rng, len(data))
                if keep and os.path.exists(self._b(path)):
                    with open(self._b(path), "r+b") as f:
                        f.seek(offset)
                        f.write(data[:keep])
                    torn += 1
            self.images.clear()
            self.crashed = True
            return dropped, torn

    def pending_bytes(self) -> int:
        with self.mutex:
            return sum(len(d) for img in self.images.values() for _, d in img.pending)


def _serve_control(ops: _Ops, control: str) -> None:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(control)
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn:
            line = conn.makefile("r").readline().strip()
            if line == "crash":
                dropped, torn = ops.crash()
                reply = f"ok {dropped} {torn}\n"
            elif line == "stats":
                reply = f"ok {ops.syncs} {ops.pending_bytes()}\n"
            else:
                reply = f"error unknown command {line!r}\n"
            conn.sendall(reply.encode())


def main(argv: list[str]) -> int:
    from mfusepy import FUSE

    backing, mountpoint, control = argv[:3]
    seed = int(argv[3]) if len(argv) > 3 else 0
    ops = _Ops(os.path.abspath(backing), seed)
    threading.Thread(target=_serve_control, args=(ops, control), daemon=True).start()
    # FUSE lists its callbacks by looking names up on the operations object; _Ops names only
    # the ones it implements, the rest answer ENOSYS from libfuse.
    FUSE(ops, mountpoint, foreground=True, fsname="crashfs")
    return 0


class CrashFs:
    """One mount of the crash filesystem, in a child process."""

    def __init__(self, backing: Path, mountpoint: Path, control: Path, log: Path, seed: int = 0) -> None:
        self.backing, self.mountpoint, self.control, self.log, self.seed = backing, mountpoint, control, log, seed
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self, timeout: float = 30.0) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.control.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults.crashfs", str(self.backing),
                                          str(self.mountpoint), str(self.control), str(self.seed)],
                                         cwd=Path(__file__).resolve().parents[2], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not (os.path.ismount(self.mountpoint) and self.control.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"crashfs did not mount {self.mountpoint} within {timeout}s: "
                                     f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        self.seed += 1

    def command(self, line: str, timeout: float = 30.0) -> list[str]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.control))
            s.sendall(line.encode() + b"\n")
            reply = s.makefile("r").readline().split()
        assert reply and reply[0] == "ok", f"crashfs {line}: {reply}"
        return reply[1:]

    def crash(self) -> tuple[int, int]:
        """Lose what was not synced; every later write and sync fails until ``unmount``.
        Answers the bytes dropped and the files left with a torn last write."""
        dropped, torn = (int(x) for x in self.command("crash"))
        return dropped, torn

    def unmount(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        tool = shutil.which("fusermount3") or "fusermount"
        if os.path.ismount(self.mountpoint):
            subprocess.run([tool, "-u", "-z", str(self.mountpoint)], check=False, capture_output=True, timeout=timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
