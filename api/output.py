"""Rendering for the CLI: tables for people, JSON and YAML for scripts.

Tables are sized to a width (the terminal's, chosen by the caller): columns wider than
their share are cut with an ellipsis, widest first. Times in tables are short and local
(``14:03:22`` today, ``Mar 04 14:03`` this year, ``2024-03-04 14:03`` before);
``-o json`` and ``-o yaml`` print the resources exactly as the API answered them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
import yaml

__all__ = [
    "cluster_summary", "dead_letter_table", "describe_job", "describe_run",
    "explain_table", "format_duration_ms", "format_table", "job_table", "member_table",
    "names", "parse_time", "relative", "run_result", "run_table", "short_time", "to_json",
    "to_yaml",
]

ELLIPSIS = "…"
GAP = "  "
MIN_COLUMN = 4
Table = tuple[list[str], list[list[str]]]


def to_json(data: Any) -> str:
    """Indented JSON, UTF-8 as is. orjson, not the json module: with ``indent`` the json
    module falls back to its pure-Python encoder, 1.2 s of the 3.2 s that ``raftcron get jobs
    -l team=t3 -o json`` took over 10,000 jobs."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def to_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 width: int | None = None, ellipsis: str = ELLIPSIS) -> str:
    """Left-aligned columns; with ``width`` the widest columns are cut until a line fits."""
    cells = [[_one_line(c) for c in row] for row in rows]
    natural = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    widths = natural if width is None else _fit(natural, width - len(GAP) * (len(headers) - 1))
    lines = [_line(headers, widths, ellipsis)] + [_line(row, widths, ellipsis) for row in cells]
    return "\n".join(lines)


def _fit(natural: list[int], available: int) -> list[int]:
    """Cap every column at the largest width that lets the line fit (water filling)."""
    if sum(natural) <= available:
        return natural
    cap = max(natural)
    while cap > MIN_COLUMN and sum(min(w, cap) for w in natural) > available:
        cap -= 1
    return [min(w, cap) for w in natural]


def _line(cells: Sequence[str], widths: Sequence[int], ellipsis: str) -> str:
    parts = [_cut(cell, w, ellipsis).ljust(w) for cell, w in zip(cells, widths, strict=False)]
    return GAP.join(parts).rstrip()


def _cut(text: str, width: int, ellipsis: str) -> str:
    if len(text) <= width:
        return text
    keep = max(width - len(ellipsis), 0)
    return (text[:keep] + ellipsis)[:width]


def _one_line(value: Any) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.split()) if ("\n" in text or "\t" in text) else text


# --- time ---------------------------------------------------------------------------

def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 string as an aware datetime (naive input is taken as UTC)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def short_time(value: str | None, now: datetime, tz: tzinfo | None = None) -> str:
    """``14:03:22`` when on ``now``'s day, ``Mar 04 14:03`` this year, else the full date."""
    moment = parse_time(value)
    if moment is None:
        return value or "-"
    local, today = moment.astimezone(tz), now.astimezone(tz)
    if local.date() == today.date():
        return local.strftime("%H:%M:%S")
    if local.year == today.year:
        return local.strftime("%b %d %H:%M")
    return local.strftime("%Y-%m-%d %H:%M")


def relative(value: str | None, now: datetime) -> str:
    """``in 5m``, ``3h ago``; empty when ``value`` is not a time."""
    moment = parse_time(value)
    if moment is None:
        return ""
    seconds = int((moment - now).total_seconds())
    span = _span(abs(seconds))
    return f"in {span}" if seconds >= 0 else f"{span} ago"


def _span(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s" if sec and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    return f"{hours // 24}d"


def format_duration_ms(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if value < 1000:
        return f"{int(value)}ms"
    if value < 60_000:
        return f"{value / 1000:.1f}s"
    return _span(int(value // 1000))


# --- resource tables ----------------------------------------------------------------

def job_table(jobs: Sequence[dict[str, Any]], now: datetime, tz: tzinfo | None = None) -> Table:
    headers = ["NAME", "SCHEDULE", "TIMEZONE", "EXECUTOR", "STATE", "LAST RUN", "NEXT",
               "FAILURES"]
    rows = []
    for job in jobs:
        spec, status = job.get("spec") or {}, job.get("status") or {}
        last = status.get("last_run") or None
        last_text = (f"{last.get('status', '?')} {short_time(_run_time(last), now, tz)}"
                     if last else "-")
        slots = status.get("next_slots") or []
        rows.append([
            str(job.get("name", "")), str(spec.get("schedule", "")),
            str(spec.get("timezone", "UTC")), str(spec.get("executor", "")),
            "paused" if status.get("paused", spec.get("paused")) else "active",
            last_text, short_time(slots[0], now, tz) if slots else "-",
            str(status.get("consecutive_failures", 0)),
        ])
    return headers, rows


def _run_time(run: dict[str, Any]) -> str | None:
    for key in ("finished_at", "started_at", "claimed_at", "slot"):
        if run.get(key):
            return str(run[key])
    return None


def run_table(runs: Sequence[dict[str, Any]], now: datetime, tz: tzinfo | None = None) -> Table:
    headers = ["ID", "JOB", "SLOT", "ATTEMPT", "TRIGGER", "STATUS", "NODE", "DURATION",
               "RESULT"]
    rows = [[
        str(run.get("id", "")), str(run.get("job", "")), short_time(run.get("slot"), now, tz),
        str(run.get("attempt", "")), str(run.get("trigger", "")), str(run.get("status", "")),
        str(run.get("node") or "-"), format_duration_ms(run.get("duration_ms")),
        run_result(run),
    ] for run in runs]
    return headers, rows


def run_result(run: dict[str, Any]) -> str:
    """``exit 0``, ``http 204`` or the error; ``-`` when nothing is known yet."""
    if run.get("error"):
        return str(run["error"])
    if run.get("exit_code") is not None:
        return f"exit {run['exit_code']}"
    if run.get("http_status") is not None:
        return f"http {run['http_status']}"
    return "-"


def dead_letter_table(runs: Sequence[dict[str, Any]], now: datetime,
                      tz: tzinfo | None = None) -> Table:
    headers = ["ID", "JOB", "SLOT", "ATTEMPT", "FINISHED", "ERROR"]
    rows = [[
        str(run.get("id", "")), str(run.get("job", "")), short_time(run.get("slot"), now, tz),
        str(run.get("attempt", "")), short_time(run.get("finished_at"), now, tz),
        run_result(run),
    ] for run in runs]
    return headers, rows


def member_table(members: Sequence[dict[str, Any]]) -> Table:
    headers = ["NODE", "ROLE", "REACHABLE", "RAFT", "HTTP", "SHELL", "TAGS"]
    rows = [[
        str(m.get("node_id", "")), str(m.get("role", "unknown")),
        "yes" if m.get("reachable") else "no", str(m.get("raft_addr", "")),
        str(m.get("http_addr", "")), "yes" if m.get("allow_shell") else "no",
        format_tags(m.get("tags")),
    ] for m in members]
    return headers, rows


def explain_table(items: Sequence[dict[str, Any]], now: datetime,
                  tz: tzinfo | None = None) -> Table:
    headers = ["SLOT", "DECISION", "RUN", "TERM", "LEADER", "AT", "REASON"]
    rows = [[
        short_time(item.get("slot"), now, tz), str(item.get("decision", "")),
        str(item.get("run_id") or "-"), str(item.get("term", "")),
        str(item.get("leader") or "-"), short_time(item.get("at"), now, tz),
        str(item.get("reason", "")),
    ] for item in items]
    return headers, rows


def format_tags(tags: Any) -> str:
    if not isinstance(tags, dict) or not tags:
        return "-"
    return ",".join(f"{k}={v}" for k, v in sorted(tags.items()))


def names(noun: str, items: Sequence[dict[str, Any]]) -> list[str]:
    """The identifiers ``-o name`` prints, one a line."""
    key = {"jobs": "name", "members": "node_id"}.get(noun, "id")
    return [str(item.get(key, "")) for item in items]


# --- describe and status ------------------------------------------------------------

def describe_job(job: dict[str, Any], runs: Sequence[dict[str, Any]], now: datetime,
                 tz: tzinfo | None = None, width: int | None = None) -> str:
    """``describe job``: the spec in short, next slots in the job's zone and UTC, last runs."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    fields = [("Name", job.get("name")), ("Description", spec.get("description") or None),
              ("Labels", format_tags(spec.get("labels")))]
    fields += _spec_fields(spec)
    last = status.get("last_run")
    fields += [
        ("State", "paused" if status.get("paused", spec.get("paused")) else "active"),
        ("Failures", f"{status.get('consecutive_failures', 0)} consecutive"),
        ("Last run", _last_run(last, now, tz) if last else "-"),
        ("Version", job.get("version")),
        ("Created", _stamp(job.get("created_at"), now, tz)),
        ("Updated", _stamp(job.get("updated_at"), now, tz)),
    ]
    lines = [f"{label + ':':<13} {value}" for label, value in fields if value is not None]
    lines.append("Next slots:")
    zone = _zone(spec.get("timezone"))
    slots = status.get("next_slots") or []
    lines += [f"  {_slot_line(slot, zone, now)}" for slot in slots] or ["  (none)"]
    lines.append("Recent runs:")
    if runs:
        headers, rows = run_table(runs, now, tz)
        table = format_table(headers, rows, None if width is None else width - 2)
        lines += ["  " + line for line in table.splitlines()]
    else:
        lines.append("  (none)")
    return "\n".join(lines)


def _spec_fields(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    retries = spec.get("retries") or {}
    catchup = spec.get("catchup") or {}
    target = spec.get("target") or {}
    depends = spec.get("depends_on") or None
    alerts = spec.get("alerts") or None
    return [
        ("Schedule", f"{spec.get('schedule', '-')} ({spec.get('timezone') or 'UTC'})"),
        ("Window", _window(spec)),
        ("Executor", _executor(spec)),
        ("Timeout", spec.get("timeout")),
        ("Retries", f"max {retries.get('max', 0)}, backoff {retries.get('backoff', '-')} "
                    f"x{retries.get('factor', 1)} up to {retries.get('max_backoff', '-')}"
         if retries else None),
        ("Concurrency", spec.get("concurrency")),
        ("Delivery", spec.get("delivery")),
        ("Catch-up", f"{catchup.get('policy', '-')} within {catchup.get('window', '-')}"
         if catchup else None),
        ("Target", f"{format_tags(target.get('tags'))}, count {target.get('count', 1)}"
         if target else None),
        ("Depends on", f"{depends.get('job')} (on {depends.get('on', 'success')})"
         if isinstance(depends, dict) else None),
        ("Alerts", f"{alerts.get('webhook', '-')} on {','.join(alerts.get('on') or [])}"
         if isinstance(alerts, dict) else None),
        ("History", _history_line(spec.get("history")) if spec.get("history") else None),
    ]


def _window(spec: dict[str, Any]) -> str | None:
    start, end = spec.get("starts_at"), spec.get("ends_at")
    if not start and not end:
        return None
    return f"{start or '-'} .. {end or '-'}"


def _executor(spec: dict[str, Any]) -> str:
    kind = spec.get("executor", "-")
    if kind == "http" and isinstance(spec.get("http"), dict):
        http = spec["http"]
        return f"http {http.get('method', 'POST')} {http.get('url', '-')}"
    if kind == "shell" and isinstance(spec.get("shell"), dict):
        command = spec["shell"].get("command")
        text = shlex.join(command) if isinstance(command, list) else str(command)
        cwd = spec["shell"].get("cwd")
        return f"shell {text}" + (f" (in {cwd})" if cwd else "")
    return str(kind)


def _last_run(run: dict[str, Any], now: datetime, tz: tzinfo | None) -> str:
    when = _run_time(run)
    return (f"{run.get('id', '?')} {run.get('status', '?')} at {short_time(when, now, tz)}"
            f" ({run_result(run)})")


def _stamp(value: Any, now: datetime, tz: tzinfo | None) -> str | None:
    if not value:
        return None
    return f"{value} ({relative(str(value), now)})"


def _zone(name: Any) -> tzinfo:
    try:
        return ZoneInfo(str(name)) if name else UTC
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _slot_line(slot: str, zone: tzinfo, now: datetime) -> str:
    moment = parse_time(slot)
    if moment is None:
        return str(slot)
    local = moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")
    utc = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{local:<27} = {utc}  ({relative(slot, now)})"


def cluster_summary(cluster: dict[str, Any], server: str, width: int | None = None) -> str:
    """``raftcron status``: who answered, the leader, Raft progress and the members."""
    leader = cluster.get("leader")
    members = cluster.get("members") or []
    reachable = sum(1 for m in members if m.get("reachable"))
    leader_text = (f"{leader.get('node_id')} (http {leader.get('http_addr')}, "
                   f"raft {leader.get('raft_addr')})" if leader else "none (election?)")
    thread = cluster.get("raft_thread_alive")
    lines = [
        f"Server:        {server} (node {cluster.get('node_id', '?')})",
        f"Leader:        {leader_text}",
        f"Term:          {cluster.get('term', '?')}",
        (f"Commit index:  {cluster.get('commit_index', '?')} "
         f"(applied {cluster.get('applied_index', '?')})"),
    ]
    if thread is not None:
        lines.append(f"Raft thread:   {'alive' if thread else 'DEAD'}")
    lines.append(f"Members:       {len(members)} ({reachable} reachable)")
    headers, rows = member_table(members)
    lines += ["  " + line for line in
              format_table(headers, rows, None if width is None else width - 2).splitlines()]
    return "\n".join(lines)


def describe_run(run: dict[str, Any], now: datetime, tz: tzinfo | None = None) -> str:
    """``describe run``: every field but the output, then the output."""
    fields = [("ID", run.get("id")), ("Job", run.get("job")), ("Slot", run.get("slot")),
              ("Attempt", run.get("attempt")), ("Trigger", run.get("trigger")),
              ("Status", run.get("status")), ("Node", run.get("node") or "-"),
              ("Fencing", run.get("fencing_token"))]
    fields += [(label, _stamp(run.get(key), now, tz)) for label, key in
               (("Claimed", "claimed_at"), ("Started", "started_at"), ("Finished", "finished_at"))]
    fields += [("Duration", format_duration_ms(run.get("duration_ms"))),
               ("Result", run_result(run))]
    lines = [f"{label + ':':<10} {value}" for label, value in fields if value is not None]
    output = str(run.get("output") or "")
    lines.append("Output:" + ("" if output else " (none)"))
    lines += ["  " + line for line in output.splitlines()]
    return "\n".join(lines)


def _history_line(history: Any) -> str:
    line = f"keep {history.get('keep')}"
    if history.get("max_age"):
        line += f", max age {history['max_age']}"
    return line
