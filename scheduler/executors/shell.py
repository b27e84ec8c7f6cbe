"""The shell executor: one attempt is one process group on this node.

The child leads its own session (``start_new_session=True``), so everything it
forks stays in a group we can signal as a whole. The attempt ends when the
child exits; whatever it left running in its group is then stopped too, so no
attempt outlives its run record (``concurrency: forbid`` depends on that).
Stopping is SIGTERM to the group, then SIGKILL after a grace period.

A shell job is not the agent: the child gets a clean environment (PATH, HOME and
LANG, the job's ``env``, the identity variables of SPEC section 2, nothing else of the
agent's, whose environment may hold the cluster secret and the API tokens), runs as
the ``--shell-user`` when one is given (``ShellUser``), and has the job's
``shell.limits`` set by ``setrlimit`` before it executes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import resource
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler.fields import Fields, Problems
from scheduler.sections import SHELL_USER_PROCESSES, ShellLimits, parse_shell_limits

from .base import OUTPUT_CAP, Attempt, Outcome, OutcomeStatus, identity

__all__ = ["ShellExecutor", "ShellUser", "OutputTail", "DISABLED_ERROR", "DEFAULT_PATH", "resolve_shell_user"]

DISABLED_ERROR = "shell executor disabled on this node (start it with --allow-shell)"

# Header name -> env var name, SPEC section 2; identity() is the single source of values.
_ENV_NAMES = {
    "Idempotency-Key": "RAFTCRON_IDEMPOTENCY_KEY",
    "X-Raftcron-Run-Id": "RAFTCRON_RUN_ID",
    "X-Raftcron-Job": "RAFTCRON_JOB",
    "X-Raftcron-Slot": "RAFTCRON_SLOT",
    "X-Raftcron-Attempt": "RAFTCRON_ATTEMPT",
    "X-Raftcron-Fencing-Token": "RAFTCRON_FENCING_TOKEN",
}

_POLL = 0.05  # seconds between checks whether a signalled group has gone
_READ_SIZE = 64 * 1024  # bytes read from the output pipe at a time

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DEFAULT_LANG = "C.UTF-8"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellUser:
    """Who shell jobs run as: resolved once at start, so a child never reads /etc/passwd."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, as initgroups(3) would set them
    home: str


def resolve_shell_user(name: str) -> ShellUser:
    """The user ``name`` (or a numeric uid); ``ValueError`` saying why it cannot be used."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError) as exc:
        raise ValueError(f"--shell-user {name!r}: no such user") from exc
    if entry.pw_uid == 0:
        raise ValueError(f"--shell-user {name!r} is root: name an unprivileged user")
    if os.geteuid() != 0:
        raise ValueError(
            f"--shell-user {name!r} needs the agent to run as root (it switches to that user for "
            f"every shell job), but it runs as uid {os.geteuid()}"
        )
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return ShellUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class OutputTail:
    """The last ``cap`` bytes of a stream, kept in bounded memory however long it runs."""

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self._cap = cap
        self._buf = bytearray()
        self.total = 0  # bytes seen, so a reader can tell the tail was cut

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._buf += chunk[-self._cap :]
        if len(self._buf) > self._cap:
            del self._buf[: -self._cap]

    @property
    def retained(self) -> int:
        return len(self._buf)

    def text(self, encoding: str = "utf-8") -> str:
        """The tail decoded with ``errors='replace'``, at most ``cap`` bytes once utf-8 encoded."""
        data = bytes(self._buf)
        if self.total > len(data) and encoding == "utf-8":
            # The cut may have split a character: drop its orphaned continuation bytes.
            data = data[_continuation_prefix(data) :]
        text = data.decode(encoding, errors="replace")
        encoded = text.encode("utf-8")
        if len(encoded) <= self._cap:
            return text
        # Replacement characters (3 bytes each) or a non-utf-8 charset can grow the text.
        return encoded[-self._cap :].decode("utf-8", errors="ignore")


def _continuation_prefix(data: bytes) -> int:
    n = 0
    while n < min(3, len(data)) and data[n] & 0xC0 == 0x80:
        n += 1
    return n


class _OutputPipe:
    """The read end of the child's merged stdout/stderr, fed into an ``OutputTail`` as it comes.

    Read by the loop's ``add_reader``, not a read-pipe transport: we own the descriptor and close
    it once. (uvloop's read-pipe transport closes the descriptor and then the file object holding
    it again: a descriptor another thread opened in between would be closed under it.)
    ``eof`` is done once every writer has closed its end, or once ``close`` was called.
    """

    def __init__(self, fd: int, tail: OutputTail, loop: asyncio.AbstractEventLoop) -> None:
        os.set_blocking(fd, False)
        self._fd: int | None = fd
        self._tail = tail
        self._loop = loop
        self.eof: asyncio.Future[None] = loop.create_future()
        try:
            loop.add_reader(fd, self._readable)
        except BaseException:
            self.close()
            raise

    def _readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, _READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # nothing more can be read from it: as at the end
        if data:
            self._tail.feed(data)
        else:
            self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)
        if not self.eof.done():
            self.eof.set_result(None)


class _Process:
    """A child started by ``subprocess.Popen`` and reaped on the event loop.

    asyncio's own subprocesses are not used: the agent's loop may be uvloop, whose spawn takes
    no ``user``, ``group``, ``extra_groups`` or ``umask``, and ``--shell-user`` needs all four.
    Popen starts the child (fork and exec on the loop's thread, as asyncio's spawn does too); a
    pidfd (Linux 5.3 and later) tells the loop when it has exited, and ``Popen.poll`` reaps it.
    Where no pidfd can be opened, a thread of its own waits for the child instead.
    """

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._popen = popen
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = None
        try:
            try:
                self._pidfd = os.pidfd_open(popen.pid)
            except (AttributeError, OSError):
                threading.Thread(target=self._wait_in_thread, name=f"raftcron-reap-{popen.pid}", daemon=True).start()
            else:
                loop.add_reader(self._pidfd, self._reap)
        except BaseException:
            # Nothing would ever reap it: stop its group and reap it here, then say why.
            with contextlib.suppress(OSError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
            raise

    @classmethod
    def spawn(cls, argv: list[str], **popen: Any) -> _Process:
        return cls(subprocess.Popen(argv, **popen), asyncio.get_running_loop())

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: killed by that signal), else None."""
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def _reap(self) -> None:
        code = self._popen.poll()
        if code is None or self._pidfd is None:
            return  # readable but not yet waitable: the next wake-up takes it
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        self._exited.set_result(code)

    def _wait_in_thread(self) -> None:
        code = self._popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, code)

    def _settle(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


class _Child:
    """A started attempt: the process, and the read end of its output pipe."""

    def __init__(
        self,
        proc: _Process,
        pipe: _OutputPipe,
        tail: OutputTail,
    ) -> None:
        self.proc = proc
        self.pipe = pipe
        self.tail = tail

    @property
    def pgid(self) -> int:
        # start_new_session: the child leads its own session and group, so pgid == pid.
        return self.proc.pid


class ShellExecutor:
    """Runs ``shell`` jobs; with ``allow=False`` (no ``--allow-shell``) every attempt fails.

    ``kill_grace`` is how long a group has between SIGTERM and SIGKILL, and how
    long output is awaited from stragglers that escaped the group.
    """

    def __init__(
        self,
        allow: bool = True,
        *,
        user: ShellUser | None = None,
        kill_grace: float = 2.0,
        now: Callable[[], datetime] = _utcnow,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._allow = allow
        self._user = user
        self._grace = kill_grace
        self._now = now
        self._stopping: set[asyncio.Task[None]] = set()
        self._base_env = _base_environment(os.environ if environ is None else environ, user)

    async def run(self, attempt: Attempt) -> Outcome:
        started = self._now()
        if not self._allow:
            return self._failed(started, DISABLED_ERROR)
        spawned = await self._spawn(attempt)
        if isinstance(spawned, str):
            return self._failed(started, spawned)
        child = spawned
        timed_out = False
        try:
            async with asyncio.timeout(attempt.timeout):
                await child.proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            # Every way out, cancellation (concurrency: replace, operator cancel) included.
            await self._finish(child)
        if timed_out:
            return self._timed_out(started, child, attempt.timeout)
        return self._exited(started, child)

    async def _spawn(self, attempt: Attempt) -> _Child | str:
        """Start the child, or say in one line why it could not start."""
        spec = attempt.spec
        argv = _argv(spec.get("command"))
        if not argv:
            return "empty command"
        cwd: str | None = spec.get("cwd")
        user = self._user
        if cwd is None and user is not None:
            # The agent's own directory (its data) is not the job's to read.
            cwd = user.home if os.path.isdir(user.home) else "/"
        tail = OutputTail()
        # Our own pipe rather than asyncio's PIPE: a straggler that escaped the group
        # may hold the write end forever, and we must be able to close our end.
        read_fd, write_fd = os.pipe()
        try:
            pipe = _OutputPipe(read_fd, tail, asyncio.get_running_loop())
        except BaseException:
            os.close(write_fd)
            raise
        try:
            proc = _Process.spawn(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                env=_environment(self._base_env, attempt),
                cwd=cwd,
                start_new_session=True,
                # subprocess switches the user in the child between fork and exec (setgroups,
                # setregid, setreuid), before preexec_fn runs.
                user=user.uid if user is not None else None,
                group=user.gid if user is not None else None,
                extra_groups=list(user.groups) if user is not None else None,
                preexec_fn=_limiter(_limits(spec.get("limits")), as_user=user is not None),
                # The agent's umask (0o077) keeps its own files private; a job gets the usual one.
                umask=0o022,
            )
        except BaseException as exc:
            pipe.close()
            if isinstance(exc, (OSError, ValueError, subprocess.SubprocessError)):
                return _spawn_error(exc, argv[0], cwd)
            raise
        finally:
            os.close(write_fd)  # the child holds its copy; EOF comes when all writers exit
        return _Child(proc, pipe, tail)

    async def _finish(self, child: _Child) -> None:
        # Cancelled again while stopping? The stop must still run to its end or the group
        # outlives the attempt; keep a reference so the task is not garbage-collected.
        task = asyncio.ensure_future(self._stop_and_collect(child))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        await asyncio.shield(task)

    async def _stop_and_collect(self, child: _Child) -> None:
        """Stop what is left of the group, collect the last output, close the pipe."""
        try:
            await self._stop_group(child)
            await asyncio.wait([child.pipe.eof], timeout=self._grace)
        finally:
            child.pipe.close()

    async def _stop_group(self, child: _Child) -> None:
        # After the leader is reaped its pid could in theory be reused; the kernel keeps
        # it reserved while any process still has it as its pgid, which is the case
        # whenever there is something left to signal.
        if not _signal_group(child.pgid, signal.SIGTERM):
            return
        _signal_group(child.pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        if await _group_gone(child.pgid, self._grace):
            return
        _signal_group(child.pgid, signal.SIGKILL)
        # SIGKILL cannot be ignored, but a process in uninterruptible sleep dies late: bound it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._grace):
                await child.proc.wait()

    def _exited(self, started: datetime, child: _Child) -> Outcome:
        code = child.proc.returncode
        assert code is not None  # proc.wait() returned
        error: str | None = None
        if code < 0:
            error = f"killed by signal {_signal_name(-code)}"
            code = 128 - code  # what a shell reports as $?, and Kubernetes as exitCode
        elif code > 0:
            error = f"exit code {code}"
        return Outcome(
            status=OutcomeStatus.SUCCEEDED if error is None else OutcomeStatus.FAILED,
            started_at=started,
            finished_at=self._now(),
            exit_code=code,
            output=child.tail.text(),
            error=error,
            extra={"output_bytes": child.tail.total},
        )

    def _timed_out(self, started: datetime, child: _Child, timeout: float) -> Outcome:
        return Outcome(
            status=OutcomeStatus.TIMED_OUT,
            started_at=started,
            finished_at=self._now(),
            output=child.tail.text(),
            error=f"timed out after {timeout:g}s",
            extra={"output_bytes": child.tail.total},
        )

    def _failed(self, started: datetime, error: str) -> Outcome:
        return Outcome(status=OutcomeStatus.FAILED, started_at=started, finished_at=self._now(), error=error)


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        return ["/bin/sh", "-c", command] if command.strip() else []
    return [str(part) for part in command or []]


def _base_environment(agent: Mapping[str, str], user: ShellUser | None) -> dict[str, str]:
    """PATH, HOME and LANG, and nothing else of the agent's: its environment may hold the
    cluster secret and the API tokens (RAFTCRON_SECRET, RAFTCRON_API_TOKEN, ...)."""
    if user is not None:
        home = user.home
    else:
        home = agent.get("HOME") or "/"
    return {"PATH": agent.get("PATH") or DEFAULT_PATH, "HOME": home, "LANG": agent.get("LANG") or _DEFAULT_LANG}


def _environment(base: Mapping[str, str], attempt: Attempt) -> dict[str, str]:
    """The base, then the job's env, then the identity, which nothing overrides."""
    env = dict(base)
    env.update({str(k): str(v) for k, v in (attempt.spec.get("env") or {}).items()})
    env.update({_ENV_NAMES[name]: value for name, value in identity(attempt).items()})
    return env


def _limits(doc: Any) -> ShellLimits:
    """The job's ``limits`` as stored (validated at put); the defaults when it has none."""
    if not isinstance(doc, dict):
        return ShellLimits()
    problems = Problems()
    limits = parse_shell_limits(Fields({"limits": doc}, "", ("limits",), problems))
    return limits if not problems else ShellLimits()


def _limiter(limits: ShellLimits, *, as_user: bool) -> Callable[[], None]:
    """The preexec_fn setting ``limits`` in the child; the values are worked out here, in the
    parent, so the child (forked from a threaded process) only makes setrlimit calls."""
    wanted: list[tuple[int, int]] = [
        (resource.RLIMIT_DATA, limits.memory),
        (resource.RLIMIT_NOFILE, limits.open_files),
    ]
    processes = limits.processes if limits.processes is not None else (SHELL_USER_PROCESSES if as_user else None)
    if processes is not None:
        wanted.append((resource.RLIMIT_NPROC, processes))
    if limits.cpu is not None:
        wanted.append((resource.RLIMIT_CPU, limits.cpu))
    settings: list[tuple[int, int]] = []
    for which, value in wanted:
        _, hard = resource.getrlimit(which)
        # Only ever lower: never above the agent's own hard limit (an unprivileged agent
        # could not raise it, and a root one must not).
        settings.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard)))

    def set_limits() -> None:
        for which, value in settings:
            resource.setrlimit(which, (value, value))

    return set_limits


def _spawn_error(exc: OSError | ValueError | subprocess.SubprocessError, executable: str, cwd: str | None) -> str:
    if not isinstance(exc, OSError):  # an env name with '=' or a NUL byte; a limit the child could not set
        return f"cannot start {executable!r}: {exc}"
    reason = exc.strerror or str(exc)
    # subprocess reports a failed chdir with the cwd as the filename.
    if cwd is not None and exc.filename == cwd:
        return f"cannot change to directory {cwd!r}: {reason}"
    return f"cannot run {executable!r}: {reason}"


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the group (0: only check it exists); False once nothing of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a member changed its uid (setuid binary): it exists, we cannot signal it
    return True


async def _group_gone(pgid: int, within: float) -> bool:
    # No pidfd exists for a process group, so poll; signal 0 only checks existence.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while _signal_group(pgid, 0):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL)
    return True


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
