"""The ``raftcron`` command line (SPEC section 4), kubectl style: ``raftcron VERB [NOUN] ...``.

Exit codes: 0 ok, 1 an error from the cluster or no cluster reachable, 2 usage,
3 not found. Data goes to stdout, diagnostics to stderr as ``error: message``.

Global options may come before or after the verb: ``--server URL[,URL...]``
(``RAFTCRON_SERVER``, default ``http://127.0.0.1:8001``), ``--token`` (``RAFTCRON_TOKEN``),
``-o table|json|yaml|name`` and ``--timeout`` (seconds per HTTP request). One exception:
after ``run``, ``--timeout`` bounds ``--wait``; put the request timeout before the verb.

``agent`` and ``dev`` belong to ``api.agent`` and ``api.dev``; they are imported only when
that verb is used, so client commands never load pysyncobj.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from api import output
from api.batches import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, BatchOutcome, apply_in_batches, refusal_lines, split
from api.client import (
    DEFAULT_SERVER,
    Client,
    ClientError,
    NotFoundError,
    parse_servers,
)
from api.manifest import read_sources
from scheduler.duration import parse_duration
from scheduler.runs import FOLLOWS, RUN_STATUSES, TERMINAL, RunStatus, Trigger

__all__ = [
    "EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "build_parser",
    "completion_script", "follow_run", "main", "parse_args",
]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3
FORMATS = ("table", "json", "yaml", "name")
NOUNS = {"jobs": "jobs", "job": "jobs", "runs": "runs", "run": "runs",
         "dead-letters": "dead-letters", "dead-letter": "dead-letters",
         "members": "members", "member": "members"}
POLL_INTERVAL = 0.5
MAX_PAGE = 1000  # the API's cap on ?limit: every page is a round trip and a fresh scan on the server
DEFAULT_TIMEOUT = 10.0
SERVER_VERBS = {"agent": ("api.agent", "add_agent_arguments", "run_agent",
                          "run a cluster node (Raft, scheduler, executors, REST API)"),
                "dev": ("api.dev", "add_dev_arguments", "run_dev",
                        "run a local cluster on loopback; Ctrl-C stops it")}
_VALUE_OPTIONS = {"--server", "--token", "-o", "--output", "--timeout"}

Handler = Callable[["Context", argparse.Namespace], Awaitable[int]]
if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """A command line that parses but makes no sense (exit 2)."""


@dataclass(slots=True)
class Context:
    client: Client
    fmt: str
    now: datetime
    width: int | None

    def dump(self, data: Any) -> bool:
        """Print ``data`` when the output is json or yaml; False when a table is wanted."""
        if self.fmt == "json":
            print(output.to_json(data))
        elif self.fmt == "yaml":
            sys.stdout.write(output.to_yaml(data))
        else:
            return False
        return True

    def table(self, table: output.Table) -> None:
        headers, rows = table
        print(output.format_table(headers, rows, width=self.width, ellipsis=_ellipsis()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse exits 2 itself on bad usage)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    local = getattr(args, "cli_local", None)
    if local is not None:
        return int(local(args))
    try:
        client = Client(_servers(args), _token(args), _timeout(args))
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        return asyncio.run(_execute(args.cli_handler, client, args))
    except KeyboardInterrupt:
        return 130


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line; exits 2 (argparse) on bad usage."""
    argv = list(argv)
    verb = _find_verb(argv)
    parser = build_parser(load=[verb] if verb in SERVER_VERBS else [])
    args, extra = parser.parse_known_args(argv)
    # An unloadable agent/dev takes any arguments, so that its own error is the one shown.
    if extra and not getattr(args, "cli_stub", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


async def _execute(handler: Handler, client: Client, args: argparse.Namespace) -> int:
    ctx = Context(client, getattr(args, "output", None) or "table",
                  datetime.now(UTC), _table_width())
    async with client:
        try:
            return await handler(ctx, args)
        except UsageError as exc:
            return _fail(str(exc), EXIT_USAGE)
        except NotFoundError as exc:
            return _fail(exc.message, EXIT_NOT_FOUND)
        except ClientError as exc:
            _report(exc)
            return EXIT_ERROR


# --- settings -------------------------------------------------------------------------

def _servers(args: argparse.Namespace) -> list[str]:
    value = getattr(args, "server", None) or os.environ.get("RAFTCRON_SERVER") or DEFAULT_SERVER
    return parse_servers(value)


def _token(args: argparse.Namespace) -> str | None:
    return getattr(args, "token", None) or os.environ.get("RAFTCRON_TOKEN") or None


def _timeout(args: argparse.Namespace) -> float:
    value = getattr(args, "timeout", None)
    return DEFAULT_TIMEOUT if value is None else value


def _table_width() -> int | None:
    """The terminal's width; no limit when stdout is piped (unless COLUMNS says)."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _ellipsis() -> str:
    try:
        output.ELLIPSIS.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return "..."
    return output.ELLIPSIS


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _report(exc: ClientError, prefix: str = "") -> None:
    if exc.details:
        for detail in exc.details:
            field = detail.get("field") if isinstance(detail, dict) else None
            text = detail.get("message") if isinstance(detail, dict) else str(detail)
            print(f"error: {prefix}{field + ': ' if field else ''}{text}", file=sys.stderr)
    else:
        print(f"error: {prefix}{exc.message}", file=sys.stderr)
    if exc.code == "insufficient_storage":
        print("hint: the node's disk is nearly full; the write was refused, not lost. Free space in its "
              "--data-dir (or grow the disk) and run the command again.", file=sys.stderr)


def parse_since(value: str, now: datetime) -> str:
    """``1h30m`` (ago, in the job document's duration grammar) or an RFC 3339 time, as RFC 3339 UTC."""
    text = value.strip()
    # A bare number is no duration here: 20260301 is a date (ISO 8601 basic format).
    if not text.isdigit():
        try:
            seconds = parse_duration(text)
        except ValueError:
            pass
        else:
            moment = now - timedelta(seconds=seconds)
            return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if output.parse_time(text) is None:
        raise UsageError(f"not a time or duration: {value!r} (use RFC 3339 or e.g. 1h30m)")
    return text


# --- commands: cluster ------------------------------------------------------------------

async def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    cluster = await ctx.client.cluster()
    if not ctx.dump(cluster):
        print(output.cluster_summary(cluster, ctx.client.server, ctx.width))
    if not cluster.get("leader"):
        print("warning: the cluster has no leader now; writes will wait or fail",
              file=sys.stderr)
    return EXIT_OK


async def cmd_members(ctx: Context, args: argparse.Namespace) -> int:
    if args.action == "add":
        answer = await ctx.client.add_member(args.node_id, args.raft_addr, args.http_addr)
        done = "added"
    else:
        answer = await ctx.client.remove_member(args.member)
        done = "removed"
    if not ctx.dump(answer):
        print(f"member/{args.node_id if args.action == 'add' else args.member} {done}")
    return EXIT_OK


# --- commands: get and describe ---------------------------------------------------------

_FILTERS = {"labels": ("-l", {"jobs"}), "query": ("-q", {"jobs"}),
            "job": ("--job", {"runs", "dead-letters"}), "since": ("--since", {"runs"}),
            "until": ("--until", {"runs"}), "status": ("--status", {"jobs", "runs"})}


async def cmd_get(ctx: Context, args: argparse.Namespace) -> int:
    noun = args.noun
    for dest, (flag, nouns) in _FILTERS.items():
        if getattr(args, dest) and (noun not in nouns or args.name):
            raise UsageError(f"{flag} applies to: get {'|'.join(sorted(nouns))} (without a name)")
    if args.name:
        item = await _get_one(ctx, noun, args.name)
        if not ctx.dump(item):
            _print_items(ctx, noun, [item])
        return EXIT_OK
    items = await _get_many(ctx, noun, args)
    if not ctx.dump({"items": items}):
        if not items:
            print(f"no {noun} found", file=sys.stderr)
        else:
            _print_items(ctx, noun, items)
    return EXIT_OK


async def _get_one(ctx: Context, noun: str, name: str) -> dict[str, Any]:
    if noun == "jobs":
        return await ctx.client.get_job(name)
    if noun == "members":
        members = (await ctx.client.cluster()).get("members") or []
        for member in members:
            if member.get("node_id") == name:
                return dict(member)
        raise NotFoundError(404, "not_found", f"no member named {name!r}")
    return await ctx.client.get_run(name)


async def _get_many(ctx: Context, noun: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    client, limit = ctx.client, args.limit
    if noun == "members":
        members = (await client.cluster()).get("members") or []
        return list(members)[:limit] if limit is not None else list(members)
    if noun == "jobs":
        labels = [part for value in args.labels for part in value.split(",") if part]
        return await collect(lambda cursor, n: client.list_jobs(
            labels=labels, q=args.query, status=args.status, limit=n, cursor=cursor), limit)
    if noun == "dead-letters":
        return await collect(lambda cursor, n: client.list_dead_letters(
            job=args.job, limit=n, cursor=cursor), limit)
    since = parse_since(args.since, ctx.now) if args.since else None
    until = parse_since(args.until, ctx.now) if args.until else None
    if args.job and not (since or until):
        return await collect(lambda cursor, n: client.list_job_runs(
            args.job, status=args.status, limit=n, cursor=cursor), limit)
    return await collect(lambda cursor, n: client.list_runs(
        status=args.status, job=args.job, since=since, until=until, limit=n, cursor=cursor),
        limit)


async def collect(fetch: Callable[[str | None, int | None], Awaitable[dict[str, Any]]],
                  limit: int | None) -> list[dict[str, Any]]:
    """Follow ``next_cursor`` until ``limit`` items (all when None) are gathered."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        page = await fetch(cursor, MAX_PAGE if limit is None else min(limit - len(items), MAX_PAGE))
        items.extend(page.get("items") or [])
        cursor = page.get("next_cursor")
        if limit is not None and len(items) >= limit:
            return items[:limit]
        if not cursor or cursor in seen:
            return items
        seen.add(cursor)


def _print_items(ctx: Context, noun: str, items: list[dict[str, Any]]) -> None:
    if ctx.fmt == "name":
        for name in output.names(noun, items):
            print(name)
    elif noun == "jobs":
        ctx.table(output.job_table(items, ctx.now))
    elif noun == "runs":
        ctx.table(output.run_table(items, ctx.now))
    elif noun == "dead-letters":
        ctx.table(output.dead_letter_table(items, ctx.now))
    else:
        ctx.table(output.member_table(items))


async def cmd_describe(ctx: Context, args: argparse.Namespace) -> int:
    if args.noun == "run":
        run = await ctx.client.get_run(args.name)
        if not ctx.dump(run):
            print(output.describe_run(run, ctx.now))
        return EXIT_OK
    job = await ctx.client.get_job(args.name)
    runs = (await ctx.client.list_job_runs(args.name, limit=5)).get("items") or []
    if not ctx.dump({"job": job, "recent_runs": runs[:5]}):
        print(output.describe_job(job, runs[:5], ctx.now, width=ctx.width))
    return EXIT_OK


async def cmd_explain(ctx: Context, args: argparse.Namespace) -> int:
    since = parse_since(args.since, ctx.now) if args.since else None
    # explain takes no ?limit: the window is bounded by --since, --limit cuts it here
    items = await collect(lambda cursor, n: ctx.client.explain(
        args.name, since=since, cursor=cursor), args.limit)
    if not ctx.dump({"items": items}):
        if items:
            ctx.table(output.explain_table(items, ctx.now))
        else:
            print(f"no decisions recorded for job {args.name!r} in this window",
                  file=sys.stderr)
    return EXIT_OK


# --- commands: writes ------------------------------------------------------------------

async def cmd_apply(ctx: Context, args: argparse.Namespace) -> int:
    documents, errors = read_sources(args.filename, sys.stdin)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    batches, problems = split(documents, args.batch_size)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    def show(outcome: BatchOutcome) -> None:
        size = len(outcome.documents)
        if outcome.error is not None:
            print(f"batch {outcome.number}/{outcome.total}: {size} documents refused, none applied: "
                  f"{outcome.error.message}", file=sys.stderr)
            for line in refusal_lines(outcome.error, outcome.documents):
                print(f"error: {line}", file=sys.stderr)
            return
        answer = outcome.answer or {}
        changes = answer.get("changes", {})
        print(f"batch {outcome.number}/{outcome.total}: {size} documents: " + ", ".join(
            f"{changes.get(k, 0)} {k}" for k in ("created", "configured", "unchanged")), file=sys.stderr)
        if ctx.fmt not in ("json", "yaml"):
            for item in answer.get("items", []):
                print(f"job/{item['name']} {item['change']}")

    outcomes = await apply_in_batches(ctx.client, batches, show)
    ctx.dump({"items": [item for o in outcomes if o.answer for item in o.answer.get("items", [])]})
    failed = bool(errors or problems) or any(o.error is not None for o in outcomes)
    return EXIT_ERROR if failed else EXIT_OK


async def cmd_delete(ctx: Context, args: argparse.Namespace) -> int:
    if args.noun == "job":
        answer = await ctx.client.delete_job(args.name)
    else:
        answer = await ctx.client.delete_dead_letter(args.name)
    if not ctx.dump(answer):
        print(f"{args.noun}/{args.name} deleted")
    return EXIT_OK


async def cmd_pause(ctx: Context, args: argparse.Namespace) -> int:
    pause = args.cli_verb == "pause"
    call = ctx.client.pause_job if pause else ctx.client.resume_job
    job = await call(args.name, args.note)
    if not ctx.dump(job):
        print(f"job/{args.name} {'paused' if pause else 'resumed'}")
    return EXIT_OK


async def cmd_cancel(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client.cancel_run(args.run_id)
    if not ctx.dump(answer):
        print(f"run/{args.run_id} {answer.get('status') or 'cancelled'}")
    return EXIT_OK


async def cmd_replay(ctx: Context, args: argparse.Namespace) -> int:
    run_id = await ctx.client.replay_dead_letter(args.run_id)
    if not ctx.dump({"run_id": run_id}):
        print(run_id)
    return EXIT_OK


async def cmd_logs(ctx: Context, args: argparse.Namespace) -> int:
    run = await ctx.client.get_run(args.run_id)
    if not ctx.dump(run):
        text = str(run.get("output") or "")
        sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
    print(_run_line(run), file=sys.stderr)
    return EXIT_OK


def _run_line(run: dict[str, Any]) -> str:
    return (f"run/{run.get('id')} job={run.get('job')} attempt={run.get('attempt')} "
            f"status={run.get('status')} node={run.get('node') or '-'} "
            f"duration={output.format_duration_ms(run.get('duration_ms'))} "
            f"result={output.run_result(run)}")


# --- run and --wait ---------------------------------------------------------------------

class WaitTimeout(Exception):
    def __init__(self, run: dict[str, Any]) -> None:
        super().__init__(f"run/{run.get('id')} is still {run.get('status')}")
        self.run = run


async def cmd_run(ctx: Context, args: argparse.Namespace) -> int:
    run_id = await ctx.client.run_job(args.name)
    if not args.wait:
        if not ctx.dump({"run_id": run_id}):
            print(run_id)
        return EXIT_OK
    print(f"run/{run_id} submitted", file=sys.stderr)
    try:
        run = await follow_run(ctx.client, args.name, run_id, args.wait_timeout,
                               on_change=lambda r: print(
                                   f"run/{r.get('id')} attempt {r.get('attempt')}: "
                                   f"{r.get('status')}", file=sys.stderr))
    except WaitTimeout as exc:
        return _fail(f"gave up waiting after {args.wait_timeout:g}s: {exc}", EXIT_ERROR)
    if not ctx.dump(run):
        print(f"run/{run.get('id')} {run.get('status')} (attempt {run.get('attempt')}, "
              f"{output.run_result(run)}, {output.format_duration_ms(run.get('duration_ms'))})")
    return EXIT_OK if run.get("status") == RunStatus.SUCCEEDED else EXIT_ERROR


async def follow_run(client: Client, job: str, run_id: str, timeout: float | None,
                     on_change: Callable[[dict[str, Any]], None] = lambda run: None
                     ) -> dict[str, Any]:
    """Poll a run until it ends; through ``retrying`` and ``lost`` to the slot's next attempt."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    current, seen, delivery = run_id, None, None
    while True:
        run = await client.get_run(current)
        status = run.get("status")
        if (current, status) != seen:
            on_change(run)
            seen = (current, status)
        if status in TERMINAL:
            return run
        if status in FOLLOWS[Trigger.RETRY]:
            following = await _next_attempt(client, job, run)
            if following is not None:
                current = str(following["id"])
                continue
            if status == RunStatus.LOST:
                delivery = delivery or (await client.get_job(job)).get("spec", {}).get("delivery")
                if delivery == "at-most-once":
                    return run  # a lost at-most-once attempt is never retried
        if deadline is not None and loop.time() >= deadline:
            raise WaitTimeout(run)
        pause = POLL_INTERVAL if deadline is None else min(POLL_INTERVAL,
                                                           max(deadline - loop.time(), 0))
        await asyncio.sleep(pause)


async def _next_attempt(client: Client, job: str, run: dict[str, Any]) -> dict[str, Any] | None:
    page = await client.list_job_runs(job, limit=50)
    attempt = int(run.get("attempt") or 0)
    later = [r for r in page.get("items") or []
             if r.get("slot") == run.get("slot") and int(r.get("attempt") or 0) > attempt]
    return min(later, key=lambda r: int(r.get("attempt") or 0)) if later else None


# --- parser -----------------------------------------------------------------------------

def _find_verb(argv: Sequence[str]) -> str | None:
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in _VALUE_OPTIONS:
            skip = True
        elif not token.startswith("-"):
            return token
    return None


def _globals(timeout: bool = True) -> argparse.ArgumentParser:
    """Shared options; SUPPRESS keeps a subcommand from resetting what came before it."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("global options")
    group.add_argument("--server", default=argparse.SUPPRESS, metavar="URL[,URL...]",
                       help=f"API servers to try in order (env RAFTCRON_SERVER, "
                            f"default {DEFAULT_SERVER})")
    group.add_argument("--token", default=argparse.SUPPRESS,
                       help="API bearer token (env RAFTCRON_TOKEN)")
    group.add_argument("-o", "--output", default=argparse.SUPPRESS, choices=FORMATS,
                       help="table (default), json, yaml or name")
    if timeout:
        group.add_argument("--timeout", default=argparse.SUPPRESS, type=_positive,
                           metavar="SECONDS",
                           help=f"per-request timeout (default {DEFAULT_TIMEOUT:g})")
    return parent


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {value!r}")
    return number


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {value!r}")
    return number


def _batch_size(value: str) -> int:
    number = _count(value)
    if number > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_BATCH_SIZE}: {value!r}")
    return number


def _noun(value: str) -> str:
    return NOUNS.get(value, value)


def build_parser(load: Collection[str] = ()) -> argparse.ArgumentParser:
    """The full parser; ``load`` names the server verbs whose modules are imported."""
    parser = argparse.ArgumentParser(
        prog="raftcron", parents=[_globals()],
        description="raftcron: a distributed cron on Raft.",
        epilog="exit codes: 0 ok, 1 error from the cluster or none reachable, 2 usage, "
               "3 not found",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="cli_verb", metavar="VERB", required=True)
    for name, (module, add, run, text) in SERVER_VERBS.items():
        _add_server_verb(verbs, name, module, add, run, text, name in load)
    _add_client_verbs(verbs)
    completion = verbs.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(cli_local=_cmd_completion)
    return parser


def _verb(verbs: Subparsers, name: str, handler: Handler, text: str, *, timeout: bool = True
          ) -> argparse.ArgumentParser:
    sub = verbs.add_parser(name, help=text, description=text, parents=[_globals(timeout)])
    sub.set_defaults(cli_handler=handler)
    return sub


def _add_client_verbs(verbs: Subparsers) -> None:
    _add_read_verbs(verbs)
    _add_write_verbs(verbs)
    members = _verb(verbs, "members", cmd_members, "add or remove cluster members")
    actions = members.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a node", parents=[_globals()])
    add.add_argument("--node-id", required=True)
    add.add_argument("--raft-addr", required=True, metavar="HOST:PORT")
    add.add_argument("--http-addr", required=True, metavar="HOST:PORT")
    actions.add_parser("remove", help="remove a node", parents=[_globals()]
                       ).add_argument("member", metavar="NODE_ID")


def _add_read_verbs(verbs: Subparsers) -> None:
    _verb(verbs, "status", cmd_status, "cluster: leader, term, members, health")
    get = _verb(verbs, "get", cmd_get, "list jobs, runs, dead letters or members")
    get.add_argument("noun", type=_noun, choices=("jobs", "runs", "dead-letters", "members"))
    get.add_argument("name", nargs="?", help="one job name, run id or node id")
    get.add_argument("-l", "--selector", dest="labels", action="append", default=[],
                     metavar="K=V", help="jobs with this label (repeat or comma-separate)")
    get.add_argument("-q", "--query", help="jobs whose name or description contains this")
    get.add_argument("--status", help="jobs: active|paused|failing; runs: a run status")
    get.add_argument("--job", metavar="NAME", help="runs or dead letters of one job")
    get.add_argument("--since", metavar="T", help="runs after T (RFC 3339, or 1h = 1h ago)")
    get.add_argument("--until", metavar="T", help="runs before T")
    get.add_argument("--limit", type=_count, metavar="N", help="at most N items")

    describe = _verb(verbs, "describe", cmd_describe, "show one job (or run) in detail")
    describe.add_argument("noun", choices=("job", "run"))
    describe.add_argument("name")
    _verb(verbs, "logs", cmd_logs, "print a run's output (status line on stderr)"
          ).add_argument("run_id")
    explain = _verb(verbs, "explain", cmd_explain,
                    "what the scheduler decided for each slot, and why")
    explain.add_argument("name")
    explain.add_argument("--since", metavar="T", help="RFC 3339, or a duration ago (e.g. 6h)")
    explain.add_argument("--limit", type=_count, metavar="N", help="at most N decisions")


def _add_write_verbs(verbs: Subparsers) -> None:
    apply = _verb(verbs, "apply", cmd_apply, "create or update jobs from YAML or JSON")
    apply.add_argument("-f", "--filename", action="append", required=True,
                       metavar="FILE|DIR|-", help="a file, a directory or - for stdin; repeatable")
    apply.add_argument("--batch-size", type=_batch_size, default=DEFAULT_BATCH_SIZE, metavar="N",
                       help=f"documents per request, each batch applied whole or not at all "
                            f"(default {DEFAULT_BATCH_SIZE}, at most {MAX_BATCH_SIZE})")

    delete = _verb(verbs, "delete", cmd_delete, "delete a job (and its history) or a dead letter")
    delete.add_argument("noun", choices=("job", "dead-letter"))
    delete.add_argument("name")

    run = _verb(verbs, "run", cmd_run, "run a job now; prints the run id", timeout=False)
    run.add_argument("name")
    run.add_argument("--wait", action="store_true",
                     help="follow the run (and its retries); exit 0 only if it succeeded")
    run.add_argument("--timeout", dest="wait_timeout", type=_positive, metavar="SECONDS",
                     help="with --wait: give up after this long (exit 1)")

    for name, text in (("pause", "stop scheduling a job"), ("resume", "schedule it again")):
        sub = _verb(verbs, name, cmd_pause, text)
        sub.add_argument("name")
        sub.add_argument("--note", help="why (kept with the job)")
    _verb(verbs, "replay", cmd_replay, "run a dead letter again; prints the new run id"
          ).add_argument("run_id")
    _verb(verbs, "cancel", cmd_cancel, "cancel a claimed or running attempt"
          ).add_argument("run_id")


def _add_server_verb(verbs: Subparsers, name: str, module: str, add: str, run: str, text: str,
                     load: bool) -> None:
    sub = verbs.add_parser(name, help=text, description=text)
    problem = f"'raftcron {name}' was not loaded"
    if load:
        try:
            loaded = importlib.import_module(module)
            getattr(loaded, add)(sub)
            entry = getattr(loaded, run)
        except (ImportError, AttributeError) as exc:
            problem = f"'raftcron {name}' is not available in this installation ({exc})"
        else:
            sub.set_defaults(cli_local=entry)
            return
    sub.set_defaults(cli_local=lambda args: _fail(problem, EXIT_ERROR), cli_stub=True)


# --- completion -------------------------------------------------------------------------

def _cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(build_parser(load=SERVER_VERBS), args.shell))
    return EXIT_OK


def _words(parser: argparse.ArgumentParser) -> list[str]:
    words: list[str] = []
    for action in parser._actions:  # argparse has no public walk; _actions is stable
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.append(name)
                words += [w for w in _words(sub) if w.startswith("-") and w not in words]
        elif action.option_strings:
            words += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
        elif action.choices:
            words += [str(c) for c in action.choices]
    return list(dict.fromkeys(words))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash (or zsh, through bashcompinit) completion script derived from ``parser``."""
    top = [w for w in _words(parser) if not w.startswith("-") or w in _GLOBAL_WORDS]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    arms = "\n".join(f'        {name}) words="{" ".join(_words(sub))}" ;;'
                     for name, sub in subs.choices.items())
    script = _BASH.format(top=" ".join(top), arms=arms, formats=" ".join(FORMATS),
                          statuses=" ".join(RUN_STATUSES + ("active", "paused", "failing")),
                          value_options="|".join(sorted(_VALUE_OPTIONS)))
    if shell == "zsh":
        return "#compdef raftcron\nautoload -U +X bashcompinit && bashcompinit\n" + script
    return script


_GLOBAL_WORDS = {"--server", "--token", "-o", "--output", "--timeout", "--help", "-h"}
_BASH = """\
# raftcron completion; load it with: source <(raftcron completion bash)
_raftcron_jobs() {{
    raftcron get jobs -o name 2>/dev/null
}}
_raftcron() {{
    local cur prev verb words i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    verb=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            {value_options}) ((i++)) ;;
            -*) ;;
            *) verb="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$prev" in
        -o|--output) COMPREPLY=($(compgen -W "{formats}" -- "$cur")); return ;;
        -f|--filename|--data-dir) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --status) COMPREPLY=($(compgen -W "{statuses}" -- "$cur")); return ;;
        --job) COMPREPLY=($(compgen -W "$(_raftcron_jobs)" -- "$cur")); return ;;
    esac
    if [[ -z "$verb" ]]; then
        COMPREPLY=($(compgen -W "{top}" -- "$cur")); return
    fi
    if [[ "$cur" != -* ]]; then
        case "$verb:$prev" in
            run:run|pause:pause|resume:resume|explain:explain|describe:job|delete:job)
                COMPREPLY=($(compgen -W "$(_raftcron_jobs)" -- "$cur")); return ;;
        esac
    fi
    words=""
    case "$verb" in
{arms}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _raftcron raftcron
"""


if __name__ == "__main__":
    sys.exit(main())
