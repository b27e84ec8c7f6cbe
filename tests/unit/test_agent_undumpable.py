"""The agent's environment is not readable by a process of its own user (a shell job run
without ``--shell-user``): ``/proc/<agent>/environ`` held the cluster secret and the tokens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster.harness import ROOT

NOBODY = 65534
# The parent stands for the agent as an unprivileged user, the child for a shell job of the
# same user. What the parent imports is loaded before it drops root (the interpreter's files
# may be root's only); dropping root clears the dumpable flag, which a process started as that
# user would have: set again first.
PARENT = """
import ctypes, os, subprocess, sys
from api.agent import undumpable
os.setgid(65534)
os.setuid(65534)
ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)
if sys.argv[1] == "guarded":
    undumpable()
child = subprocess.run(["/bin/sh", "-c", "cat /proc/$PPID/environ"], capture_output=True)
sys.stdout.write("read" if b"RAFTCRON_SECRET=s3cret" in child.stdout else "refused")
"""


def _as_nobody(mode: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "RAFTCRON_SECRET": "s3cret", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PARENT, mode], capture_output=True, env=env, cwd="/",
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="needs Linux and root, to run the agent and its job as an unprivileged user")
def test_a_job_of_the_agents_user_cannot_read_the_agents_environment() -> None:
    assert _as_nobody("plain") == "read"  # what the job could do before
    assert _as_nobody("guarded") == "refused"
