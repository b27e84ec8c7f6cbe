"""Shell jobs are not the agent: a clean environment, another user, resource limits."""

from __future__ import annotations

import os
import pwd
import resource
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.executors import Attempt, OutcomeStatus, ShellExecutor
from scheduler.executors.shell import ShellUser, resolve_shell_user
from scheduler.model import ValidationFailed, parse_job
from scheduler.sections import SHELL_USER_PROCESSES, ShellLimits

SLOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
AGENT_SECRETS = {
    "RAFTCRON_SECRET": "the-cluster-secret-that-must-not-leak-0000",
    "RAFTCRON_API_TOKEN": "write-token-that-must-not-leak",
    "RAFTCRON_API_READ_TOKEN": "read-token-that-must-not-leak",
    "RAFTCRON_SECRET_FILE": "/run/raftcron-secret/secret",
    "AWS_SECRET_ACCESS_KEY": "some-other-agent-variable",
}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users and RLIMIT_NPROC need root")


def attempt(command: list[str] | str, *, timeout: float = 20.0, **spec: Any) -> Attempt:
    return Attempt(
        job="job", run_id="run-1", slot=SLOT, attempt=1, fencing_token=7, executor="shell",
        spec={"command": command, "env": {}, "cwd": None, **spec}, timeout=timeout,
    )


def seen_env(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def nobody() -> ShellUser:
    entry = pwd.getpwnam("nobody")
    return ShellUser(name="nobody", uid=entry.pw_uid, gid=entry.pw_gid, groups=(entry.pw_gid,), home=entry.pw_dir)


def shell_doc(**shell: Any) -> dict[str, Any]:
    return {"name": "j", "schedule": "@hourly", "executor": "shell", "shell": {"command": "true", **shell}}


def problems(doc: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ValidationFailed) as exc:
        parse_job(doc)
    return list(exc.value.details)


# ---- the environment -----------------------------------------------------------------------


async def test_a_job_sees_none_of_the_agents_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in AGENT_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    outcome = await ShellExecutor().run(attempt(["env"], env={"MINE": "job-value"}))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    seen = seen_env(outcome.output)
    for value in AGENT_SECRETS.values():
        assert value not in outcome.output
    assert set(seen) == {
        "PATH", "HOME", "LANG", "MINE", "RAFTCRON_IDEMPOTENCY_KEY", "RAFTCRON_RUN_ID", "RAFTCRON_JOB",
        "RAFTCRON_SLOT", "RAFTCRON_ATTEMPT", "RAFTCRON_FENCING_TOKEN",
    } | ({"PWD"} & set(seen))  # some `env` builds add PWD
    assert seen["LANG"] == "en_US.UTF-8" and seen["MINE"] == "job-value"


async def test_sane_defaults_when_the_agent_has_no_path_home_or_lang(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PATH", "HOME", "LANG"):
        monkeypatch.delenv(name, raising=False)
    outcome = await ShellExecutor().run(attempt(["/usr/bin/env"]))
    seen = seen_env(outcome.output)
    assert seen["PATH"].split(":")[-1] == "/bin" and "/usr/bin" in seen["PATH"].split(":")
    assert seen["HOME"] == "/" and seen["LANG"] == "C.UTF-8"


async def test_the_job_may_set_path_but_not_the_identity() -> None:
    outcome = await ShellExecutor().run(attempt(["/usr/bin/env"], env={"PATH": "/opt/x/bin"}))
    assert seen_env(outcome.output)["PATH"] == "/opt/x/bin"


async def test_children_get_the_usual_umask_not_the_agents() -> None:
    old = os.umask(0o077)
    try:
        outcome = await ShellExecutor().run(attempt("umask"))
    finally:
        os.umask(old)
    assert outcome.output.strip() == "0022"


# ---- the user --------------------------------------------------------------------------------


@as_root
async def test_a_shell_user_runs_the_job_with_its_ids_home_and_cwd() -> None:
    user = nobody()
    outcome = await ShellExecutor(user=user).run(attempt('id -u; id -g; echo "$HOME"; pwd'))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    uid, gid, home, cwd = outcome.output.split("\n")[:4]
    assert (int(uid), int(gid), home) == (user.uid, user.gid, user.home)
    assert cwd == (user.home if os.path.isdir(user.home) else "/")


@as_root
async def test_a_shell_user_cannot_read_the_agents_private_files(tmp_path: Any) -> None:
    private = tmp_path / "raft.journal"
    private.write_text("job secrets")
    private.chmod(0o600)
    tmp_path.chmod(0o755)
    outcome = await ShellExecutor(user=nobody()).run(attempt(["cat", str(private)]))
    assert outcome.status is OutcomeStatus.FAILED
    assert "Permission denied" in outcome.output


@as_root
async def test_a_shell_users_job_is_stopped_on_timeout() -> None:
    outcome = await ShellExecutor(user=nobody(), kill_grace=0.5).run(attempt("sleep 30", timeout=0.5))
    assert outcome.status is OutcomeStatus.TIMED_OUT


def test_resolve_shell_user_refuses_unknown_users_and_root() -> None:
    with pytest.raises(ValueError, match="no such user"):
        resolve_shell_user("no-such-user-here")
    with pytest.raises(ValueError, match="is root"):
        resolve_shell_user("root")


@as_root
def test_resolve_shell_user_by_name_and_by_uid() -> None:
    by_name = resolve_shell_user("nobody")
    assert resolve_shell_user(str(by_name.uid)) == by_name
    assert by_name.gid in by_name.groups


def test_resolve_shell_user_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match="needs the agent to run as root"):
        resolve_shell_user("nobody")


# ---- the limits ------------------------------------------------------------------------------


async def test_limits_are_set_in_the_child() -> None:
    limits = {"processes": 77, "memory": "256Mi", "cpu": "2m", "open_files": 99}
    script = "ulimit -n; ulimit -t; cat /proc/self/limits"
    outcome = await ShellExecutor().run(attempt(script, limits=limits))
    lines = outcome.output.splitlines()
    assert lines[0] == "99" and lines[1] == "120"
    table = {line[:26].strip(): line[26:].split() for line in lines[2:]}
    assert table["Max processes"][:2] == ["77", "77"]
    assert table["Max data size"][:2] == [str(256 << 20)] * 2


async def test_default_limits_apply_to_a_job_without_any() -> None:
    outcome = await ShellExecutor().run(attempt("ulimit -n; cat /proc/self/limits"))
    lines = outcome.output.splitlines()
    table = {line[:26].strip(): line[26:].split() for line in lines[1:]}
    default = ShellLimits()
    assert int(lines[0]) <= default.open_files
    assert int(table["Max data size"][0]) <= default.memory


async def test_the_process_limit_defaults_to_none_as_the_agents_user() -> None:
    # RLIMIT_NPROC counts every process and thread of the user: as the agent's own user a
    # default would count the agent and whatever else that user runs.
    outcome = await ShellExecutor().run(attempt("cat /proc/self/limits"))
    table = {line[:26].strip(): line[26:].split() for line in outcome.output.splitlines()}
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    assert table["Max processes"][:2] == [_limit_text(soft), _limit_text(hard)]


@as_root
async def test_the_process_limit_defaults_to_1024_as_a_shell_user() -> None:
    outcome = await ShellExecutor(user=nobody()).run(attempt("cat /proc/self/limits"))
    table = {line[:26].strip(): line[26:].split() for line in outcome.output.splitlines()}
    assert table["Max processes"][:2] == [str(SHELL_USER_PROCESSES)] * 2 == ["1024"] * 2


def _limit_text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


async def test_a_memory_hog_is_bounded_by_memory() -> None:
    hog = "import sys; b = bytearray(512 << 20); print('allocated', len(b))"
    outcome = await ShellExecutor().run(attempt(["python3", "-c", hog], limits={"memory": "64Mi"}))
    assert outcome.status is OutcomeStatus.FAILED
    assert "MemoryError" in outcome.output and "allocated" not in outcome.output


FORKER = """
import os, time
n = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as exc:
    print("refused after", n, exc.strerror)
print("forked", n)
"""


@as_root
async def test_a_fork_bomb_is_bounded_by_processes() -> None:
    # 200 forks against a limit of 20 processes of the job's user: the kernel refuses
    # the fork past the limit; the group (sleepers included) is stopped after the job.
    outcome = await ShellExecutor(user=nobody(), kill_grace=1.0).run(
        attempt(["python3", "-c", FORKER], limits={"processes": 20}, timeout=20)
    )
    assert "refused after" in outcome.output, outcome
    forked = int(outcome.output.split("forked")[-1].split()[0])
    assert forked < 20, outcome.output


# ---- the document ------------------------------------------------------------------------------


def test_limits_parse_sizes_and_durations_and_round_trip() -> None:
    job = parse_job(shell_doc(limits={"processes": 10, "memory": "512Mi", "cpu": "1m30s", "open_files": 64}))
    assert job.shell is not None
    assert job.shell.limits == ShellLimits(processes=10, memory=512 << 20, cpu=90, open_files=64)
    doc = job.to_doc()
    assert doc["shell"]["limits"] == {"processes": 10, "memory": 512 << 20, "cpu": 90, "open_files": 64}
    assert parse_job(doc) == job


@pytest.mark.parametrize(("memory", "expected"), [(1 << 20, 1 << 20), ("2G", 2 * 10**9), ("1Gi", 1 << 30),
                                                 ("300M", 300 * 10**6), (3.0 * (1 << 20), 3 << 20)])
def test_memory_sizes(memory: Any, expected: int) -> None:
    job = parse_job(shell_doc(limits={"memory": memory}))
    assert job.shell is not None and job.shell.limits.memory == expected


def test_default_limits_stay_out_of_the_document() -> None:
    job = parse_job(shell_doc())
    assert job.shell is not None and job.shell.limits == ShellLimits()
    assert "limits" not in job.to_doc()["shell"]
    assert parse_job(shell_doc(limits={})).to_doc() == job.to_doc()


@pytest.mark.parametrize(("limits", "field", "message"), [
    ({"processes": 0}, "shell.limits.processes", "must be"),
    ({"processes": "many"}, "shell.limits.processes", "must be an integer"),
    ({"processes": 2.5}, "shell.limits.processes", "must be an integer"),
    ({"open_files": -1}, "shell.limits.open_files", "must be"),
    ({"memory": 0}, "shell.limits.memory", "positive"),
    ({"memory": "lots"}, "shell.limits.memory", "size like 512Mi"),
    ({"memory": "12Xi"}, "shell.limits.memory", "size like 512Mi"),
    ({"memory": True}, "shell.limits.memory", "positive number of bytes"),
    ({"memory": 1000}, "shell.limits.memory", "at least 1Mi"),
    ({"memory": "2048Ti"}, "shell.limits.memory", "at most 1Pi"),
    ({"cpu": "0s"}, "shell.limits.cpu", "longer than 0s"),
    ({"cpu": "soon"}, "shell.limits.cpu", ""),
    ({"threads": 3}, "shell.limits.threads", "unknown field"),
])
def test_invalid_limits_name_their_field(limits: dict[str, Any], field: str, message: str) -> None:
    found = problems(shell_doc(limits=limits))
    assert [p["field"] for p in found] == [field], found
    assert message in found[0]["message"]


def test_limits_must_be_an_object() -> None:
    assert problems(shell_doc(limits=[1, 2])) == [{"field": "shell.limits", "message": "must be an object, not a list"}]
