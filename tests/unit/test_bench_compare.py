"""bench.compare's verdicts: a ratio reads the right way round for each kind of measure."""

from __future__ import annotations

from typing import Any

from bench.compare import _ratio, _verdicts, markdown, summarise


def test_a_higher_rate_is_ahead_and_a_higher_latency_is_behind() -> None:
    assert _ratio(2000, 1000, higher_is_better=True) == {"ratio": 2.0, "verdict": "ahead by 2.00x"}
    assert _ratio(500, 1000, higher_is_better=True) == {"ratio": 0.5, "verdict": "behind by 2.00x"}
    assert _ratio(3.0, 1.5, higher_is_better=False) == {"ratio": 2.0, "verdict": "behind by 2.00x"}
    assert _ratio(0.5, 2.0, higher_is_better=False) == {"ratio": 0.25, "verdict": "ahead by 4.00x"}
    assert _ratio(1.02, 1.0, higher_is_better=False)["verdict"] == "level"
    assert _ratio(0.97, 1.0, higher_is_better=False)["verdict"] == "level"  # level either way round
    assert _ratio(None, 1.0, higher_is_better=True)["verdict"] == "not comparable"
    assert _ratio(95.0, 0.0, higher_is_better=True) == {"ratio": None, "verdict": "ahead"}  # the peer delivered none
    assert _ratio(0.0, 95.0, higher_is_better=True) == {"ratio": None, "verdict": "behind"}


def _writes(system: str, seq_p50: float, rates: list[float]) -> dict[str, Any]:
    return {"system": system, "idle_cores": 0.1, "sequential": {"p50": seq_p50, "p99": seq_p50 * 2},
            "throughput": [{"inflight": k, "rate": r, "server_cpu_ms_per_write": 1.0} for k, r in zip((1, 16, 64), rates, strict=True)]}


def _late(system: str, mode: str, p99: float, delivered: float) -> dict[str, Any]:
    return {"system": system, "mode": mode, "rate": 1000,
            "result": {"lateness": {"p50": p99 / 4, "p99": p99, "max": p99 * 2}, "delivery_ratio": delivered}}


def test_the_summary_takes_medians_per_system_and_compares_like_with_like() -> None:
    doc = {"writes": [_writes("raftcron", 0.004, [200, 900, 1200]), _writes("raftcron", 0.006, [300, 1100, 1400]),
                      _writes("etcd", 0.002, [500, 1800, 2800])],
           "failover": [{"system": "raftcron", "kills": [{"seconds": 0.6}, {"seconds": 0.8}]},
                        {"system": "etcd", "kills": [{"seconds": 1.2}, {"seconds": 1.4}]}],
           "lateness": [_late("raftcron", "aligned", 0.4, 1.0), _late("apscheduler", "aligned", 0.8, 0.5),
                        _late("raftcron", "spread", 0.02, 1.0), _late("apscheduler", "spread", 0.01, 0.999)]}
    rows = {r["measure"]: r for r in summarise(doc)}
    assert rows["sequential PUT p50"]["raftcron"] == 5.0 and rows["sequential PUT p50"]["verdict"] == "behind by 2.50x"
    assert rows["writes/s, 64 in flight"]["raftcron"] == 1300 and rows["writes/s, 64 in flight"]["ratio"] == 0.464
    assert rows["failover: kill -9 leader -> first write, median"]["verdict"] == "ahead by 1.86x"
    # APScheduler dropped half its slots: its lateness is of the other half, so no verdict on it
    assert rows["start lateness p99, 1,000/s aligned"]["verdict"] == "not comparable: delivered 100.0 % against 50.0 %"
    assert rows["slots delivered, 1,000/s aligned"]["verdict"] == "ahead by 2.00x"
    assert rows["start lateness p99, 1,000/s spread"]["verdict"] == "behind by 2.00x"
    assert rows["slots delivered, 1,000/s spread"]["verdict"] == "level"


def test_the_readme_table_joins_related_measures_in_one_row() -> None:
    doc = {"writes": [_writes("raftcron", 0.004, [200, 900, 1200]), _writes("etcd", 0.002, [500, 1800, 2800])],
           "lateness": [_late("raftcron", "aligned", 0.4, 0.6), _late("apscheduler", "aligned", 0.8, 0.9)]}
    table = markdown(summarise(doc))
    assert "| sequential PUT p50 / p99 (ms) | 4 / 8 | etcd 2 / 4 | 2.00 / 2.00 | behind by 2.00x / 2.00x |" in table
    assert ("| 1,000 jobs/s aligned: start lateness p50 / p99 / max (ms), slots delivered | 100 / 400 / 800 / 60.0 % "
            "| APScheduler 200 / 800 / 1,600 / 90.0 % | - / - / - / 0.67 "
            "| not comparable: delivered 60.0 % against 90.0 % / behind by 1.50x |") in table
    assert _verdicts(["ahead by 2.00x", "behind by 1.20x", "behind by 1.30x"]) == "ahead by 2.00x / behind by 1.20x / 1.30x"
