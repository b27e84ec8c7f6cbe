"""The cluster secret: refused when weak, read from a file, generated once for a compose cluster."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

import pytest

from api.agent import add_agent_arguments, config_from_args
from api.secretfile import MIN_SECRET_BYTES, PLACEHOLDER, check_secret, ensure_secret_file, main, read_secret_file
from raftlog import MissingSecret

ROOT = Path(__file__).resolve().parents[2]
GOOD = "0123456789abcdef" * 4


def args(*extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_agent_arguments(p)
    return p.parse_args(["--node-id", "n1", "--raft-addr", "127.0.0.1:1", *extra])


def test_the_placeholder_is_the_one_in_env_example() -> None:
    assert f"RAFTCRON_SECRET={PLACEHOLDER}" in (ROOT / ".env.example").read_text()


@pytest.mark.parametrize("secret", ["s", "x" * (MIN_SECRET_BYTES - 1), "é" * 15])
def test_a_short_secret_is_refused(secret: str) -> None:
    with pytest.raises(ValueError, match=f"at least {MIN_SECRET_BYTES} are required"):
        config_from_args(args("--secret", secret))


def test_the_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match="placeholder from .env.example"):
        config_from_args(args("--secret", PLACEHOLDER))


def test_32_bytes_are_enough_counted_in_utf8() -> None:
    check_secret("x" * MIN_SECRET_BYTES, "--secret")
    check_secret("é" * 16, "--secret")  # 32 bytes, 16 characters


def test_no_secret_at_all_is_refused() -> None:
    with pytest.raises(MissingSecret, match="--secret or --secret-file"):
        config_from_args(args())


def test_the_secret_comes_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(GOOD + "\n")
    assert config_from_args(args("--secret-file", str(path))).secret == GOOD


def test_a_given_secret_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(GOOD)
    other = "f" * 40
    assert config_from_args(args("--secret", other, "--secret-file", str(path))).secret == other


def test_the_file_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="at least 32"):
        read_secret_file(path)
    with pytest.raises(ValueError, match="cannot read it"):
        read_secret_file(tmp_path / "missing")


def test_the_secret_file_is_generated_once_private_and_random(tmp_path: Path) -> None:
    path = tmp_path / "vol" / "secret"
    assert ensure_secret_file(path) is True
    first = read_secret_file(path)
    assert len(first) == 64 and int(first, 16) >= 0
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_secret_file(path) is False
    assert read_secret_file(path) == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]  # no temporary left behind
    other = tmp_path / "other" / "secret"
    ensure_secret_file(other)
    assert read_secret_file(other) != first


def test_nodes_starting_together_agree_on_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    barrier = threading.Barrier(8)
    wrote: list[bool] = []

    def start() -> None:
        barrier.wait()
        wrote.append(ensure_secret_file(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert wrote.count(True) == 1 and len(wrote) == 8
    assert len(read_secret_file(path)) == 64


def test_the_init_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "secret"
    assert main([str(path)]) == 0
    assert "generated a new cluster secret" in capsys.readouterr().out
    assert main([str(path)]) == 0
    assert "keeping the cluster secret" in capsys.readouterr().out
    assert main([]) == 2


def test_a_shell_user_needs_a_root_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match="needs the agent to run as root"):
        config_from_args(args("--secret", GOOD, "--shell-user", "nobody"))


def test_a_secret_on_the_command_line_is_warned_about(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("RAFTCRON_SECRET", raising=False)
    config_from_args(args("--secret", GOOD))
    assert "/proc/<pid>/cmdline" in caplog.text
    caplog.clear()
    monkeypatch.setenv("RAFTCRON_SECRET", GOOD)
    config_from_args(args())
    assert "cmdline" not in caplog.text
