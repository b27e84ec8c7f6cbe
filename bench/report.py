"""Markdown tables of the latest results in bench/results/*.json (for the README).

    python -m bench.report
"""

from __future__ import annotations

import json
from typing import Any

from .rig import RESULTS, pct


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _md(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join("-" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}")


def _loads(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}" if values else "-"


def api_writes() -> str:
    d = _load("api_writes")
    if not d:
        return ""
    rows = [[r["config"], r["target"], r["p50_ms"], r["p99_ms"], r["writes_per_s"],
             f"{r['load_p50_ms']} / {r['load_p99_ms']}", r["agent_cpu_ms_per_write"], _r2(r["cores_used_under_load"]),
             r["term_changes"], r["errors"], _loads(r["load_1m"])] for r in d["summary"]]
    return _md(["config", "target", "PUT p50 ms", "PUT p99 ms", "writes/s, 64 in flight", "p50 / p99 ms at 64 in flight",
                "agents' CPU ms per write", "cores used by the 3 agents", "term changes", "errors", "load avg 1m"], rows) + \
        f"\n\nMedians over {d['params']['repeat']} fresh clusters per configuration ({d['machine']['started_at']})."


def _r2(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def failover() -> str:
    d = _load("failover")
    if not d:
        return ""
    f, kills = d["failover"], d["kills"]
    el = d.get("elections", {})
    rows: list[list[Any]] = [
        ["kill -9 leader -> first committed write: median / p90 / max", f"{f['p50']:.2f} / {f['p90']:.2f} / {f['max']:.2f} s",
         "<= 1 s / - / <= 3 s"],
        ["kills (all with a write within 30 s)", f"{f['kills']} ({f['kills'] - f['no_write_within_bound']})", ">= 20"],
        ["term increments per failover (median)", pct(el.get("per_failover", []), 50), "1"],
        ["term increments while the killed node restarted and caught up (all kills)", el.get("caused_by_the_restarted_node"), "0"],
        ["restarted node back and caught up: median / max",
         f"{pct([k['restart_caught_up_s'] for k in kills], 50):.1f} / {max(k['restart_caught_up_s'] for k in kills):.1f} s", ""],
        [f"term changes, {d['params']['idle']:g} s idle", d["idle"]["term_changes"], "0"],
        [f"term changes, {d['params']['load']:g} s at 64 PUTs in flight ({d['write_load']['rate']:.0f} writes/s)",
         d["write_load"]["terms"]["term_changes"], "0"],
        ["load avg 1m during the kills", _loads([k["load"]["1m"] for k in kills]), ""],
    ]
    return _md(["measure", "value", "goal"], rows)


def cold_restart() -> str:
    d = _load("cold_restart")
    if not d:
        return ""
    rows = []
    for how, s in d["summary"].items():
        rs = [r for r in d["rounds"] if r["how"] == how]
        rows.append([how, len(rs), _f(s.get("first_http_answer_s_median")), _f(s["p50"]), _f(s["max"]),
                     _f(s["all_caught_up_s_median"]), f"{rs[0]['commit_index_before']}-{rs[-1]['commit_index_before']}",
                     _loads([r["load"]["1m"] for r in rs])])
    return _md(["stop", "rounds", "start -> API up s (median)", "start -> first write s (median)", "max s",
                "start -> all caught up s (median)", "log index at stop", "load avg 1m"], rows) + \
        f"\n\n{d['params']['jobs']} jobs, {d['params']['every']} of them `@every 1s`."


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def lateness() -> str:
    d = _load("lateness")
    if not d:
        return ""
    parts = []
    if "rates" in d:
        rows = [[r["rate"], r["p50_ms"], r["p99_ms"], ", ".join(str(x) for x in r["p99_ms_each"]), r["max_ms"],
                 f"{100 * r['delivered']:.1f}%" if r["delivered"] is not None else "-", r["doubled"],
                 r["apscheduler_p99_ms"], r["goal_p99_ms"], _r2(r["cores_used"]), _loads(r["load_1m"])]
                for r in d["rates"]["summary"]]
        parts.append(_md(["runs/s", "p50 ms", "p99 ms (median)", "p99 ms, each run", "max ms (median)",
                          "slots delivered by window end + 5 s", "slots delivered twice", "APScheduler p99 ms (issue)",
                          "goal p99 ms", "cores used by the 3 agents", "load avg 1m"], rows))
        cap = d["rates"]["sink_capacity"]
        parts.append(f"Sink: {cap['rate']}/s answered to 2 client processes in the same run (client-bound); "
                     f"{cap['sink_cpu_ms_per_request']} ms CPU per request, i.e. ~{cap['sink_capacity_if_cores_free']}/s "
                     f"on 2 free cores.")
    if "search" in d:
        s = d["search"]
        rows = [[x["rate"], x["seconds"], *(["aborted"] * 4 if "aborted" in x else [
            _ms(x["result"]["lateness"]["p50"]), _ms(x["result"]["lateness"]["p99"]), _ms(x["result"]["lateness"]["max"]),
            f"{100 * x['result']['delivery_ratio']:.1f}%"]), x["sustained"], x["load_before"]["1m"]] for x in s["runs"]]
        parts.append(_md(["runs/s", "window s", "p50 ms", "p99 ms", "max ms", "delivered", "sustained", "load avg 1m"], rows)
                     + f"\n\nHighest rate sustained for 60 s with p99 < 1 s: **{s['highest_sustained']}** runs/s.")
    if "kill" in d:
        rows = []
        for x in d["kill"]["runs"]:
            nk, led = x["near_kill"], x["ledger"]
            rows.append([x["kill"]["node"], f"{x['kill']['new_leader_seen_after_s']:.2f}", _ms(nk["lateness"]["p50"]),
                         _ms(nk["lateness"]["p99"]), _ms(nk["lateness"]["max"]), _ms(nk["lateness_first_attempts"]["p99"]),
                         _ms(nk["lateness_first_attempts"]["max"]), nk["first_delivered_by_a_retry"],
                         x["result"]["missing_slots"], x["result"]["doubled_slots"], led["slots_without_record"],
                         led["slots_succeeded_twice"], led["slots_with_retries"], x["load_before"]["1m"]])
        parts.append(_md(["killed", "survivors agree on a leader after s", "+-3 s p50 ms", "+-3 s p99 ms", "+-3 s max ms",
                          "+-3 s p99 ms, attempt 1", "+-3 s max ms, attempt 1", "+-3 s slots first run by a retry",
                          "window: slots never delivered", "window: delivered twice", "ledger: slots without a record",
                          "ledger: succeeded twice", "ledger: slots retried", "load avg 1m"], rows))
    return "\n\n".join(parts)


def main() -> None:
    for title, fn in (("api_writes", api_writes), ("failover", failover), ("cold_restart", cold_restart),
                      ("lateness", lateness)):
        text = fn()
        if text:
            print(f"### {title}\n\n{text}\n")


if __name__ == "__main__":
    main()
