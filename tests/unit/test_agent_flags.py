"""Agent flags that bound what one node holds open or keeps, or what it writes: checked, with the flag named."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from api.agent import AgentConfig, add_agent_arguments, config_from_args, loop_factory
from api.metrics import MAX_JOB_SERIES
from scheduler.executors.http import CONNECTIONS_PER_HOST
from scheduler.state import SNAPSHOT_VERSION

SECRET = "0123456789abcdef" * 4


def config(*extra: str) -> AgentConfig:
    p = argparse.ArgumentParser()
    add_agent_arguments(p)
    return config_from_args(p.parse_args(["--node-id", "n1", "--raft-addr", "127.0.0.1:1", "--secret", SECRET, *extra]))


def test_defaults() -> None:
    cfg = config()
    assert cfg.http_connections_per_host == CONNECTIONS_PER_HOST
    assert cfg.metrics_max_jobs == MAX_JOB_SERIES


def test_given_values_and_zero_are_taken() -> None:
    cfg = config("--http-connections-per-host", "0", "--metrics-max-jobs", "50000")
    assert cfg.http_connections_per_host == 0 and cfg.metrics_max_jobs == 50000


def test_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTCRON_HTTP_CONNECTIONS_PER_HOST", "8")
    monkeypatch.setenv("RAFTCRON_METRICS_MAX_JOBS", "10")
    cfg = config()
    assert cfg.http_connections_per_host == 8 and cfg.metrics_max_jobs == 10


@pytest.mark.parametrize(("flag", "value"), [("--http-connections-per-host", "-1"), ("--http-connections-per-host", "many"),
                                             ("--metrics-max-jobs", "1.5"), ("--metrics-max-jobs", "-3")])
def test_bad_values_are_refused_naming_the_flag_and_its_variable(flag: str, value: str) -> None:
    env = "RAFTCRON_" + flag.removeprefix("--").upper().replace("-", "_")
    with pytest.raises(ValueError, match=f"^{flag} \\({env}\\): expected a whole number, 0 or more, got '{value}'$"):
        config(flag, value)



def test_the_snapshot_format_defaults_to_the_newest_and_takes_an_older_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config().snapshot_format == SNAPSHOT_VERSION == 4
    assert config("--snapshot-format", "1").snapshot_format == 1
    monkeypatch.setenv("RAFTCRON_SNAPSHOT_FORMAT", "1")
    assert config().snapshot_format == 1


@pytest.mark.parametrize("value", ["5", "0", "two", ""])
def test_an_unknown_snapshot_format_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ValueError, match=r"^--snapshot-format \(RAFTCRON_SNAPSHOT_FORMAT\): expected one of 1, 2, 3, 4, got "):
        config("--snapshot-format", value)


def test_the_event_loop_defaults_to_uvloop_and_takes_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config().event_loop == "uvloop"
    assert config("--event-loop", "asyncio").event_loop == "asyncio"
    assert config("--event-loop", " ASYNCIO ").event_loop == "asyncio"
    monkeypatch.setenv("RAFTCRON_EVENT_LOOP", "asyncio")
    assert config().event_loop == "asyncio"


@pytest.mark.parametrize("value", ["trio", "", "uv loop"])
def test_an_unknown_event_loop_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ValueError, match=r"^--event-loop \(RAFTCRON_EVENT_LOOP\): expected one of uvloop, asyncio, got "):
        config("--event-loop", value)


@pytest.mark.parametrize(("name", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_the_loop_made_is_the_one_named(name: str, module: str) -> None:
    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__.partition(".")[0]

    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        assert runner.run(kind()) == module
