from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import yaml

from api import output

NOW = datetime(2026, 3, 4, 12, 0, 0, tzinfo=UTC)

JOB = {
    "name": "nightly-report",
    "spec": {
        "name": "nightly-report", "description": "the report", "labels": {"team": "billing"},
        "schedule": "0 2 * * *", "timezone": "Europe/Berlin", "executor": "http",
        "http": {"url": "https://example.test/hook", "method": "POST"}, "timeout": "5m",
        "retries": {"max": 3, "backoff": "10s", "factor": 2, "max_backoff": "5m"},
        "concurrency": "forbid", "delivery": "at-least-once",
        "catchup": {"policy": "latest", "window": "1h"},
    },
    "version": 2, "created_at": "2026-03-01T10:00:00Z", "updated_at": "2026-03-04T11:00:00Z",
    "status": {
        "paused": False, "consecutive_failures": 1,
        "last_run": {"id": "r1", "status": "failed", "finished_at": "2026-03-04T01:00:05Z",
                     "http_status": 500},
        "next_slots": ["2026-03-05T01:00:00Z", "2026-03-06T01:00:00Z"],
    },
}

RUN = {"id": "r1", "job": "nightly-report", "slot": "2026-03-04T01:00:00Z", "attempt": 1,
       "trigger": "schedule", "status": "succeeded", "node": "n2", "duration_ms": 1530,
       "exit_code": None, "http_status": 204, "output": "all good\n", "error": None,
       "claimed_at": "2026-03-04T01:00:00Z", "started_at": "2026-03-04T01:00:00Z",
       "finished_at": "2026-03-04T01:00:01Z", "fencing_token": 42}


def test_table_without_width_keeps_everything_aligned() -> None:
    text = output.format_table(["A", "LONGER"], [["x", "1"], ["yyyy", "22"]])
    assert text.splitlines() == ["A     LONGER", "x     1", "yyyy  22"]


def test_table_cuts_the_widest_column_to_fit_with_an_ellipsis() -> None:
    rows = [["job", "a" * 100], ["j2", "short"]]
    text = output.format_table(["NAME", "REASON"], rows, width=40)
    lines = text.splitlines()
    assert all(len(line) <= 40 for line in lines)
    assert lines[1].endswith("…")
    assert lines[1].startswith("job   ")  # the narrow column is untouched
    assert lines[2] == "j2    short"


def test_table_cells_are_one_line_and_custom_ellipsis() -> None:
    text = output.format_table(["X"], [["two\nlines"], ["abcdefghij"]], width=6, ellipsis="...")
    assert text.splitlines() == ["X", "two...", "abc..."]


def test_short_time_today_this_year_and_older() -> None:
    assert output.short_time("2026-03-04T09:08:07Z", NOW, UTC) == "09:08:07"
    assert output.short_time("2026-01-02T03:04:05Z", NOW, UTC) == "Jan 02 03:04"
    assert output.short_time("2025-12-31T23:59:00Z", NOW, UTC) == "2025-12-31 23:59"
    assert output.short_time(None, NOW, UTC) == "-"
    assert output.short_time("garbage", NOW, UTC) == "garbage"


def test_short_time_uses_the_given_zone() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert output.short_time("2026-03-04T23:30:00Z", NOW, plus_two) == "Mar 05 01:30"


def test_relative_and_durations() -> None:
    assert output.relative("2026-03-04T12:05:00Z", NOW) == "in 5m"
    assert output.relative("2026-03-04T09:00:00Z", NOW) == "3h ago"
    assert output.relative("2026-03-04T12:01:30Z", NOW) == "in 1m30s"
    assert output.relative("2026-03-10T12:00:00Z", NOW) == "in 6d"
    assert output.format_duration_ms(250) == "250ms"
    assert output.format_duration_ms(1530) == "1.5s"
    assert output.format_duration_ms(125_000) == "2m05s"
    assert output.format_duration_ms(None) == "-"


def test_job_table_row() -> None:
    headers, rows = output.job_table([JOB], NOW, UTC)
    row = dict(zip(headers, rows[0], strict=False))
    assert row["NAME"] == "nightly-report"
    assert row["TIMEZONE"] == "Europe/Berlin"
    assert row["STATE"] == "active"
    assert row["LAST RUN"] == "failed 01:00:05"
    assert row["NEXT"] == "Mar 05 01:00"
    assert row["FAILURES"] == "1"


def test_run_and_member_tables() -> None:
    headers, rows = output.run_table([RUN], NOW, UTC)
    row = dict(zip(headers, rows[0], strict=False))
    assert (row["STATUS"], row["RESULT"], row["DURATION"]) == ("succeeded", "http 204", "1.5s")
    members = [{"node_id": "n1", "role": "leader", "reachable": True, "raft_addr": "h:7001",
                "http_addr": "h:8001", "tags": {"zone": "a", "b": "2"}, "allow_shell": True}]
    headers, rows = output.member_table(members)
    assert rows[0] == ["n1", "leader", "yes", "h:7001", "h:8001", "yes", "b=2,zone=a"]


def test_names_for_minus_o_name() -> None:
    assert output.names("jobs", [JOB]) == ["nightly-report"]
    assert output.names("runs", [RUN]) == ["r1"]
    assert output.names("members", [{"node_id": "n3"}]) == ["n3"]


def test_describe_job_shows_next_slots_in_its_zone_and_utc() -> None:
    text = output.describe_job(JOB, [RUN], NOW, UTC)
    assert "Schedule:     0 2 * * * (Europe/Berlin)" in text
    assert "Executor:     http POST https://example.test/hook" in text
    assert "Labels:       team=billing" in text
    # 01:00 UTC is 02:00 in Berlin (CET) in March before the DST switch
    assert "2026-03-05 02:00:00 CET" in text
    assert "2026-03-05 01:00:00 UTC" in text
    assert "(in 13h)" in text
    assert "Recent runs:" in text and "r1" in text.split("Recent runs:")[1]


def test_describe_job_shows_the_history_it_keeps() -> None:
    aged = {**JOB, "spec": {**JOB["spec"], "history": {"keep": 10, "max_age": "30d"}}}
    assert "History:      keep 10, max age 30d" in output.describe_job(aged, [], NOW, UTC)
    counted = {**JOB, "spec": {**JOB["spec"], "history": {"keep": 10}}}
    assert "History:      keep 10\n" in output.describe_job(counted, [], NOW, UTC)


def test_describe_job_without_runs_or_slots() -> None:
    bare = {"name": "x", "spec": {"schedule": "@manually"}, "status": {}}
    text = output.describe_job(bare, [], NOW, UTC)
    assert "Next slots:\n  (none)" in text
    assert text.endswith("Recent runs:\n  (none)")


def test_describe_run_and_cluster_summary() -> None:
    text = output.describe_run(RUN, NOW, UTC)
    assert "Status:    succeeded" in text
    assert text.endswith("Output:\n  all good")
    cluster = {"node_id": "n1", "leader": {"node_id": "n2", "http_addr": "h:8002",
                                           "raft_addr": "h:7002"},
               "term": 4, "commit_index": 10, "applied_index": 9, "raft_thread_alive": True,
               "members": [{"node_id": "n1", "role": "follower", "reachable": True},
                           {"node_id": "n2", "role": "leader", "reachable": False}]}
    summary = output.cluster_summary(cluster, "http://h:8001")
    assert "Leader:        n2 (http h:8002, raft h:7002)" in summary
    assert "Commit index:  10 (applied 9)" in summary
    assert "Members:       2 (1 reachable)" in summary


def test_json_and_yaml_round_trip_the_resource() -> None:
    assert json.loads(output.to_json(JOB)) == JOB
    assert yaml.safe_load(output.to_yaml(JOB)) == JOB
    assert output.to_json({"a": 1}) == '{\n  "a": 1\n}'


def test_json_output_is_indented_unescaped_utf8_and_keeps_the_key_order() -> None:
    doc = {"z": "Zürich ✓", "a": [], "m": {}, "n": None, "f": 1.5}
    text = output.to_json(doc)
    assert text == '{\n  "z": "Zürich ✓",\n  "a": [],\n  "m": {},\n  "n": null,\n  "f": 1.5\n}'
    assert json.loads(text) == doc
