"""One duration grammar (job document, agent options, CLI) and one instant formatter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api import cli
from scheduler.alert_sender import payload
from scheduler.duration import format_duration, parse_duration
from scheduler.executors import Attempt, identity
from scheduler.instants import format_instant, us
from scheduler.model import parse_job
from scheduler.schedule import parse_schedule

NOW = datetime(2026, 3, 4, 12, 0, 0, tzinfo=UTC)
JOB = {"name": "ping", "schedule": "* * * * *", "executor": "http", "http": {"url": "https://example.test/hook"}}


@pytest.mark.parametrize(("text", "seconds"), [
    ("1.5h", 5400), ("0.5m", 30), ("1.5h30m", 7200), ("0.25d", 21600), ("2.0s", 2), ("1.1h", 3960),
    ("1h30m", 5400), ("90", 90),
])
def test_numbers_may_carry_a_fraction_when_the_total_is_whole_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(("text", "why"), [
    ("1.5s", "whole number of seconds"), ("0.1m1.5s", "whole number of seconds"),
    ("5ms", "invalid duration"), ("1500ms", "invalid duration"), ("30m1h", "invalid duration"),
    ("1h1h", "invalid duration"), ("1.h", "invalid duration"), (".5h", "invalid duration"),
    ("1.5", "invalid duration"),
])
def test_sub_second_totals_and_other_grammars_are_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


def test_a_job_document_takes_a_fractional_duration_and_writes_it_canonically() -> None:
    job = parse_job(dict(JOB, timeout="1.5h", retries={"max": 1, "backoff": "0.5m"}))
    assert job.timeout == 5400 and job.retries.backoff == 30
    assert job.to_doc()["timeout"] == "1h30m" and job.to_doc()["retries"]["backoff"] == "30s"
    assert parse_schedule("@every 1.5m").expr == "@every 1m30s"


@pytest.mark.parametrize("text", ["1h30m", "1.5h", "2d", "0.5m", "1.5s", "5ms", "30m1h", "1h1h", "3x"])
def test_the_cli_reads_durations_with_the_documents_grammar(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError:
        with pytest.raises(cli.UsageError, match="not a time or duration"):
            cli.parse_since(text, NOW)
    else:
        assert cli.parse_since(text, NOW) == format_instant(NOW - timedelta(seconds=seconds))


def test_a_bare_number_since_is_a_basic_format_date_not_seconds() -> None:
    assert cli.parse_since("20260301", NOW) == "20260301"


@pytest.mark.parametrize("slot", [datetime(2026, 12, 1, 10, tzinfo=UTC),
                                  datetime(2026, 12, 1, 10, 0, 0, 500, tzinfo=UTC)])
def test_identity_headers_and_alerts_write_instants_as_the_job_document_does(slot: datetime) -> None:
    attempt = Attempt(job="ping", run_id="r1", slot=slot, attempt=1, fencing_token=7, executor="http",
                      spec={}, timeout=1.0)
    text = format_instant(slot)
    assert text == ("2026-12-01T10:00:00Z" if not slot.microsecond else "2026-12-01T10:00:00.000500Z")
    assert identity(attempt)["X-Raftcron-Slot"] == text
    assert identity(attempt)["Idempotency-Key"] == f"ping@{text}"
    alert = {"id": "a1", "event": "dead", "job": "ping", "run_id": "r1", "slot_us": us(slot), "run_status": "dead",
             "error": None, "attempt": 1, "node": "n1", "created_us": us(slot)}
    sent = payload(alert, None)
    assert sent["slot"] == sent["at"] == text and sent["idempotency_key"] == f"ping@{text}"
