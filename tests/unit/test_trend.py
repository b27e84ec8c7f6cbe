"""api.metrics.Trend: the ten minutes of samples behind the dashboard's cluster charts."""

from __future__ import annotations

from api.metrics import Trend


def test_rates_are_taken_over_the_time_between_two_samples() -> None:
    t = Trend(every=5, span=600)
    t.add(1000.0, commit=10, applied=8, ended=0)
    t.add(1005.0, commit=60, applied=60, ended=20)
    first, second = t.view()
    assert first["runs_ended_per_s"] is None and first["apply_lag"] == 2
    assert second["runs_ended_per_s"] == 4.0 and second["apply_lag"] == 0


def test_a_sample_taken_at_the_read_comes_last_and_is_not_kept() -> None:
    t = Trend(every=5, span=600)
    t.add(1000.0, 1, 1, 0)
    rows = t.view((1002.5, 3, 2, 10))
    assert [r["at"] for r in rows] == [1000.0, 1002.5] and rows[-1]["runs_ended_per_s"] == 4.0
    assert [r["at"] for r in t.view()] == [1000.0]


def test_a_read_just_after_a_sample_shows_no_rate_rather_than_a_burst() -> None:
    t = Trend(every=5, span=600)
    t.add(1000.0, 1, 1, 0)
    t.add(1005.0, 2, 2, 5)
    rows = t.view((1005.02, 3, 3, 6))  # one run in 20 ms is not 50 a second
    assert rows[-1]["commit_index"] == 3 and rows[-1]["runs_ended_per_s"] is None
    assert rows[-2]["runs_ended_per_s"] == 1.0


def test_only_the_span_is_kept_and_a_clock_stepped_back_adds_nothing() -> None:
    t = Trend(every=5, span=60)
    for i in range(40):
        t.add(1000.0 + 5 * i, i, i, i)
    t.add(1000.0, 99, 99, 99)  # earlier than the last sample: dropped
    rows = t.view()
    assert len(rows) == 13 and rows[0]["at"] == 1000.0 + 5 * 27 and rows[-1]["commit_index"] == 39
    assert rows[-1]["at"] - rows[0]["at"] <= 60
