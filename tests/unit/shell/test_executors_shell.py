from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler.executors import (
    DISABLED_ERROR,
    OUTPUT_CAP,
    Attempt,
    OutcomeStatus,
    OutputTail,
    ShellExecutor,
)

SLOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def attempt(command: list[str] | str, *, timeout: float = 10.0, **spec: Any) -> Attempt:
    return Attempt(
        job="job",
        run_id="run-1",
        slot=SLOT,
        attempt=2,
        fencing_token=42,
        executor="shell",
        spec={"command": command, "env": {}, "cwd": None, **spec},
        timeout=timeout,
    )


async def wait_until(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


async def test_argv_command_is_not_parsed_by_a_shell() -> None:
    outcome = await ShellExecutor().run(attempt(["printf", "%s|%s", "a b", "$HOME"]))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.exit_code == 0
    assert outcome.error is None
    assert outcome.output == "a b|$HOME"


async def test_string_command_runs_in_sh_with_stderr_merged() -> None:
    outcome = await ShellExecutor().run(attempt("echo one; echo two >&2; echo three | tr a-z A-Z"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.output == "one\ntwo\nTHREE\n"


async def test_env_layers_base_then_job_then_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ONLY", "from-agent")
    monkeypatch.setenv("REPORT_DIR", "agent-value")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = {"REPORT_DIR": "/var/reports", "RAFTCRON_JOB": "forged", "RAFTCRON_FENCING_TOKEN": "1"}
    outcome = await ShellExecutor().run(attempt(["env"], env=env))
    seen = dict(line.split("=", 1) for line in outcome.output.splitlines() if "=" in line)
    assert "AGENT_ONLY" not in seen  # nothing of the agent's but PATH, HOME and LANG
    assert seen["PATH"] == "/usr/bin:/bin"
    assert seen["REPORT_DIR"] == "/var/reports"
    assert seen["RAFTCRON_IDEMPOTENCY_KEY"] == "job@2026-12-01T10:00:00Z"
    assert seen["RAFTCRON_RUN_ID"] == "run-1"
    assert seen["RAFTCRON_JOB"] == "job"
    assert seen["RAFTCRON_SLOT"] == "2026-12-01T10:00:00Z"
    assert seen["RAFTCRON_ATTEMPT"] == "2"
    assert seen["RAFTCRON_FENCING_TOKEN"] == "42"


async def test_cwd(tmp_path: Path) -> None:
    outcome = await ShellExecutor().run(attempt(["pwd", "-P"], cwd=str(tmp_path)))
    assert outcome.output.strip() == str(tmp_path.resolve())


async def test_stdin_is_dev_null() -> None:
    outcome = await ShellExecutor().run(attempt(["cat"], timeout=5))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.output == ""


async def test_non_zero_exit_fails_with_the_code() -> None:
    outcome = await ShellExecutor().run(attempt("echo partial; exit 3"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.exit_code == 3
    assert outcome.error == "exit code 3"
    assert outcome.output == "partial\n"


async def test_killed_by_signal_names_it() -> None:
    outcome = await ShellExecutor().run(attempt("kill -KILL $$"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == "killed by signal SIGKILL"
    assert outcome.exit_code == 128 + signal.SIGKILL


async def test_missing_executable_is_an_outcome() -> None:
    outcome = await ShellExecutor().run(attempt(["/nonexistent/report", "--full"]))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.exit_code is None
    assert outcome.error == "cannot run '/nonexistent/report': No such file or directory"


async def test_missing_cwd_is_an_outcome(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone")
    outcome = await ShellExecutor().run(attempt(["true"], cwd=missing))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == f"cannot change to directory {missing!r}: No such file or directory"


async def test_empty_command_is_an_outcome() -> None:
    outcome = await ShellExecutor().run(attempt("   "))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == "empty command"


async def test_disabled_executor_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    outcome = await ShellExecutor(allow=False).run(attempt(["touch", str(marker)]))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == DISABLED_ERROR
    assert not marker.exists()


async def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    command = f"echo $$ > {pidfile}; echo started; sleep 300 & sleep 300"
    began = time.monotonic()
    outcome = await ShellExecutor().run(attempt(command, timeout=1))
    assert time.monotonic() - began < 8  # 1 s timeout + at most 2 x 2 s grace + slack
    assert outcome.status is OutcomeStatus.TIMED_OUT
    assert outcome.error == "timed out after 1s"
    assert outcome.exit_code is None
    assert outcome.output == "started\n"
    pgid = read_pid(pidfile)
    assert pgid is not None
    await wait_until(lambda: group_gone(pgid), f"process group {pgid} (with a background sleep) to be gone")


async def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # An ignored signal stays ignored across exec, so both sh and sleep shrug off SIGTERM.
    command = f"trap '' TERM; echo $$ > {pidfile}; sleep 300 & sleep 300"
    began = time.monotonic()
    outcome = await ShellExecutor(kill_grace=0.3).run(attempt(command, timeout=0.5))
    assert time.monotonic() - began < 5
    assert outcome.status is OutcomeStatus.TIMED_OUT
    assert outcome.error == "timed out after 0.5s"
    pgid = read_pid(pidfile)
    assert pgid is not None
    await wait_until(lambda: group_gone(pgid), f"process group {pgid} to be gone after SIGKILL")


async def test_leftovers_are_stopped_when_the_command_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # The background sleep keeps the output pipe open; the attempt must still end now.
    command = f"echo $$ > {pidfile}; sleep 300 & echo done"
    began = time.monotonic()
    outcome = await ShellExecutor().run(attempt(command, timeout=60))
    assert time.monotonic() - began < 8
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.output == "done\n"
    pgid = read_pid(pidfile)
    assert pgid is not None
    await wait_until(lambda: group_gone(pgid), f"the background sleep of group {pgid} to be stopped")


async def test_cancellation_kills_the_group_and_propagates(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    command = f"echo $$ > {pidfile}; sleep 300 & sleep 300"
    task = asyncio.create_task(ShellExecutor().run(attempt(command, timeout=60)))
    await wait_until(lambda: read_pid(pidfile) is not None, "the command to write its pid")
    pgid = read_pid(pidfile)
    assert pgid is not None
    assert not group_gone(pgid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)
    await wait_until(lambda: group_gone(pgid), f"process group {pgid} to be gone after cancel")


async def test_large_output_keeps_the_tail() -> None:
    # About 2 MB of output; only the last OUTPUT_CAP bytes are kept.
    expected_size = sum(len(f"{i}\n") for i in range(1, 300_001)) + len("END\n")
    outcome = await ShellExecutor().run(attempt("seq 1 300000; echo END"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert len(outcome.output.encode()) == OUTPUT_CAP
    assert outcome.output.endswith("299999\n300000\nEND\n")
    assert outcome.extra["output_bytes"] == expected_size


def test_output_tail_memory_is_bounded() -> None:
    tail = OutputTail()
    chunk = b"x" * 65536
    for _ in range(1600):  # 100 MB
        tail.feed(chunk)
        assert tail.retained <= OUTPUT_CAP
    tail.feed(b"END")
    assert tail.total == 1600 * 65536 + 3
    assert tail.text().endswith("xEND")
    assert len(tail.text()) == OUTPUT_CAP


def test_output_tail_does_not_start_with_half_a_character() -> None:
    tail = OutputTail(cap=10)
    tail.feed("éééééééa".encode())  # 15 bytes: the last 10 start inside a character
    assert tail.text() == "ééééa"


def test_output_tail_stays_within_cap_after_replacement() -> None:
    tail = OutputTail(cap=12)
    tail.feed(b"\xff" * 100)  # each byte decodes to a 3-byte U+FFFD
    assert len(tail.text().encode()) <= 12
    assert tail.text() == "\ufffd" * 4
