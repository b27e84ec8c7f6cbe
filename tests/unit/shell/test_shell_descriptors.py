"""Each descriptor the shell executor opens is closed once, on both event loops.

uvloop's read-pipe transport closed the output pipe's descriptor and then the file object that
held it, a second ``close`` of the same number: one another thread had opened in between (a raft
socket, a journal file) would have been closed under it. The attempt runs in a child interpreter
under strace, and no ``close`` in it may answer EBADF.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.required import missing_tool

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from datetime import UTC, datetime
    import uvloop
    from scheduler.executors import Attempt, ShellExecutor

    async def main():
        ex = ShellExecutor(kill_grace=0.5)
        for i in range(3):
            attempt = Attempt(job="j", run_id=f"r{i}", slot=datetime(2026, 12, 1, tzinfo=UTC), attempt=1,
                              fencing_token=i + 1, executor="shell",
                              spec={"command": ["/bin/echo", "hi"], "env": {}, "cwd": None}, timeout=10.0)
            outcome = await ex.run(attempt)
            assert outcome.status.value == "succeeded" and outcome.output == "hi\\n", outcome
        print("ran")

    factory = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}[sys.argv[1]]
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
""")


def strace() -> str:
    found = shutil.which("strace")
    if found is None:
        missing_tool("strace is not installed (apt-get install strace)")
    return found


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_no_descriptor_is_closed_twice(loop: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    script = tmp_path / "attempts.py"
    script.write_text(SCRIPT)
    done = subprocess.run([strace(), "-f", "-e", "trace=close", "-o", str(trace), sys.executable, str(script), loop],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    closes = [line for line in trace.read_text().splitlines() if "close(" in line]
    assert len(closes) > 10  # the trace holds the closes
    assert [line for line in closes if "EBADF" in line] == []
