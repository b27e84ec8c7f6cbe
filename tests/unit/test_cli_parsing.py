from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest

from api import cli

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 4, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAFTCRON_SERVER", "RAFTCRON_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return cli.parse_args(list(argv))


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(list(argv))
    assert caught.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("argv", "handler", "expected"), [
    (["status"], cli.cmd_status, {}),
    (["get", "jobs", "-l", "team=a", "-l", "x=y", "--status", "paused", "--limit", "5"],
     cli.cmd_get, {"noun": "jobs", "labels": ["team=a", "x=y"], "status": "paused", "limit": 5}),
    (["get", "job", "nightly"], cli.cmd_get, {"noun": "jobs", "name": "nightly"}),
    (["get", "runs", "--job", "j", "--status", "failed", "--since", "1h"], cli.cmd_get,
     {"noun": "runs", "job": "j", "status": "failed", "since": "1h"}),
    (["get", "dead-letters"], cli.cmd_get, {"noun": "dead-letters"}),
    (["get", "member"], cli.cmd_get, {"noun": "members"}),
    (["describe", "job", "nightly"], cli.cmd_describe, {"noun": "job", "name": "nightly"}),
    (["describe", "run", "r1"], cli.cmd_describe, {"noun": "run", "name": "r1"}),
    (["apply", "-f", "a.yaml", "-f", "-"], cli.cmd_apply, {"filename": ["a.yaml", "-"]}),
    (["delete", "job", "nightly"], cli.cmd_delete, {"noun": "job", "name": "nightly"}),
    (["delete", "dead-letter", "r9"], cli.cmd_delete, {"noun": "dead-letter", "name": "r9"}),
    (["run", "nightly"], cli.cmd_run, {"name": "nightly", "wait": False, "wait_timeout": None}),
    (["run", "nightly", "--wait", "--timeout", "30"], cli.cmd_run,
     {"wait": True, "wait_timeout": 30.0}),
    (["pause", "nightly", "--note", "maintenance"], cli.cmd_pause,
     {"cli_verb": "pause", "name": "nightly", "note": "maintenance"}),
    (["resume", "nightly"], cli.cmd_pause, {"cli_verb": "resume", "note": None}),
    (["logs", "r1"], cli.cmd_logs, {"run_id": "r1"}),
    (["explain", "nightly", "--since", "2026-03-01T00:00:00Z"], cli.cmd_explain,
     {"name": "nightly", "since": "2026-03-01T00:00:00Z"}),
    (["replay", "r1"], cli.cmd_replay, {"run_id": "r1"}),
    (["cancel", "r1"], cli.cmd_cancel, {"run_id": "r1"}),
    (["members", "add", "--node-id", "n4", "--raft-addr", "h:7004", "--http-addr", "h:8004"],
     cli.cmd_members, {"action": "add", "node_id": "n4", "raft_addr": "h:7004",
                       "http_addr": "h:8004"}),
    (["members", "remove", "n4"], cli.cmd_members, {"action": "remove", "member": "n4"}),
])
def test_every_client_verb_parses(argv: list[str], handler: object,
                                  expected: dict[str, object]) -> None:
    args = parse(*argv)
    assert args.cli_handler is handler
    for key, value in expected.items():
        assert getattr(args, key) == value, key


def test_global_options_before_or_after_the_verb() -> None:
    before = parse("--server", "h1:1,h2:2", "--token", "t", "-o", "json", "--timeout", "3",
                   "get", "jobs")
    after = parse("get", "jobs", "--server", "h1:1,h2:2", "--token", "t", "-o", "json",
                  "--timeout", "3")
    for args in (before, after):
        assert (args.server, args.token, args.output, args.timeout) == ("h1:1,h2:2", "t",
                                                                       "json", 3.0)


def test_an_option_before_the_verb_survives_the_subcommand() -> None:
    args = parse("-o", "yaml", "members", "remove", "n1")
    assert args.output == "yaml"
    assert parse("members", "add", "--node-id", "n", "--raft-addr", "a", "--http-addr", "b",
                 "-o", "json").output == "json"


def test_run_timeout_is_the_wait_bound_and_the_global_one_the_request_timeout() -> None:
    args = parse("--timeout", "2", "run", "j", "--wait", "--timeout", "60")
    assert (args.timeout, args.wait_timeout) == (2.0, 60.0)


def test_settings_fall_back_to_environment_then_defaults(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    args = parse("status")
    assert cli._servers(args) == ["http://127.0.0.1:8001"]
    assert cli._token(args) is None
    assert cli._timeout(args) == cli.DEFAULT_TIMEOUT
    monkeypatch.setenv("RAFTCRON_SERVER", "a:1, https://b:2/")
    monkeypatch.setenv("RAFTCRON_TOKEN", "secret")
    assert cli._servers(args) == ["http://a:1", "https://b:2"]
    assert cli._token(args) == "secret"
    assert cli._servers(parse("status", "--server", "c:3")) == ["http://c:3"]


@pytest.mark.parametrize("argv", [
    ["get", "jobs", "--bogus"],
    ["get", "widgets"],
    ["get"],
    ["describe", "job"],
    ["describe", "member", "x"],
    ["apply"],
    ["delete", "run", "x"],
    ["run"],
    ["run", "j", "--timeout", "soon"],
    ["get", "runs", "--limit", "0"],
    ["status", "-o", "xml"],
    ["members"],
    ["members", "add", "--node-id", "n4"],
    ["completion", "fish"],
    ["frobnicate"],
    [],
])
def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert "usage:" in usage_error(capsys, *argv)


def test_filter_that_does_not_apply_is_a_usage_error(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    # The check runs before any request, so no server is needed.
    assert cli.main(["get", "runs", "-l", "team=a", "--server", "127.0.0.1:9"]) == 2
    assert "error: -l applies to: get jobs" in capsys.readouterr().err


def test_malformed_server_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--server", "ftp://h:1"]) == 2
    assert "error: not a server URL: 'ftp://h:1'" in capsys.readouterr().err


def test_parse_since_accepts_durations_and_times() -> None:
    assert cli.parse_since("1h30m", NOW) == "2026-03-04T10:30:00Z"
    assert cli.parse_since("2d", NOW) == "2026-03-02T12:00:00Z"
    assert cli.parse_since("2026-03-01T00:00:00+01:00", NOW) == "2026-03-01T00:00:00+01:00"
    with pytest.raises(cli.UsageError):
        cli.parse_since("yesterday", NOW)


def test_agent_and_dev_are_wired_to_their_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        calls.append(args)
        return 7

    for verb, module in (("agent", "api.agent"), ("dev", "api.dev")):
        fake = types.ModuleType(module)
        setattr(fake, f"add_{verb}_arguments",
                lambda p, required=verb == "agent": p.add_argument("--node-id",
                                                                   required=required))
        setattr(fake, f"run_{verb}", run)
        monkeypatch.setitem(sys.modules, module, fake)
    assert cli.main(["agent", "--node-id", "n1"]) == 7
    assert calls[-1].node_id == "n1"
    assert cli.main(["dev"]) == 7
    with pytest.raises(SystemExit) as caught:
        cli.main(["agent", "--nope"])
    assert caught.value.code == 2


def test_a_missing_agent_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "api.agent", None)  # makes the import fail
    assert cli.main(["agent", "--node-id", "n1", "--peers", ""]) == 1
    assert "error: 'raftcron agent' is not available" in capsys.readouterr().err


def test_client_verbs_do_not_import_the_server_side() -> None:
    code = ("import sys; from api import cli; cli.parse_args(['get', 'jobs']); "
            "print(sorted(m for m in ('pysyncobj', 'api.agent', 'api.dev') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_find_verb_skips_global_option_values() -> None:
    assert cli._find_verb(["--server", "agent", "-o", "json", "dev", "x"]) == "dev"
    assert cli._find_verb(["--server=h", "agent"]) == "agent"
    assert cli._find_verb(["-o", "json"]) is None


def test_completion_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert zsh.startswith("#compdef raftcron\n") and "bashcompinit" in zsh
    assert cli.main(["completion", "bash"]) == 0
    bash_script = capsys.readouterr().out
    assert "complete -F _raftcron raftcron" in bash_script
    assert "dead-letters" in bash_script and "--wait" in bash_script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(("line", "expected"), [
    ("raftcron ge", "get"),
    ("raftcron get d", "dead-letters"),
    ("raftcron -o json get --li", "--limit"),
    ("raftcron get jobs -o ya", "yaml"),
    ("raftcron run j --wa", "--wait"),
    ("raftcron members re", "remove"),
])
def test_bash_completion_completes(capsys: pytest.CaptureFixture[str], line: str,
                                   expected: str) -> None:
    script = cli.completion_script(cli.build_parser(), "bash")
    words = line.split(" ")
    program = (script + f"\nCOMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
               '_raftcron; printf "%s\\n" "${COMPREPLY[@]}"\n')
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                            timeout=30, check=True)
    assert result.stdout.split() == [expected]


def test_a_full_disk_is_reported_with_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    cli._report(cli.ClientError(507, "insufficient_storage", "the data directory of node n1 has 1.0 MiB free"))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: the data directory of node n1 has 1.0 MiB free"
    assert err[1].startswith("hint: the node's disk is nearly full; the write was refused, not lost.")
    cli._report(cli.ClientError(503, "unavailable", "no leader"))
    assert "hint" not in capsys.readouterr().err


async def test_listing_everything_asks_for_the_largest_page_and_follows_every_cursor() -> None:
    asked: list[tuple[str | None, int | None]] = []

    async def fetch(cursor: str | None, n: int | None) -> dict[str, object]:
        asked.append((cursor, n))
        page = int(cursor or 0)
        return {"items": [{"name": f"j{page}-{i}"} for i in range(3)], "next_cursor": str(page + 1) if page < 2 else None}

    items = await cli.collect(fetch, None)
    assert len(items) == 9
    assert asked == [(None, cli.MAX_PAGE), ("1", cli.MAX_PAGE), ("2", cli.MAX_PAGE)]
    assert cli.MAX_PAGE == 1000  # the API's own cap: fewer round trips for a long list
    asked.clear()
    assert len(await cli.collect(fetch, 4)) == 4
    assert asked == [(None, 4), ("1", 1)]
