"""Plots of a bench.compare run, drawn from its JSON (matplotlib, PNG).

- ``lateness-cdf.png``: for each mode and rate, the share of the window's slots started
  within a given lateness, raftcron against APScheduler (a curve that stops below 1 is the
  share never delivered);
- ``writes.png``: writes/s against writes in flight, and the servers' CPU per write, raftcron
  against etcd;
- ``failover.png``: writes completed per 100 ms around each kill -9 of the leader, every kill
  faint and their median bold, raftcron against etcd.

    python -m bench.plots docs/bench/compare.json     # redraws beside the JSON
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

COLOURS = {"raftcron": "#1f6fb4", "etcd": "#d9731a", "apscheduler": "#d9731a"}
LABELS = {"raftcron": "raftcron (3 agents)", "etcd": "etcd 3.4 (3 members)", "apscheduler": "APScheduler 3 (1 process)"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _caption(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return (f"{m['cpus']} CPUs, one run {m['started_at'][:16].replace('T', ' ')}, load 1m {m['load_at_start']['1m']}"
            f" -> {m.get('load_at_end', {}).get('1m', '?')}, commit {m['commit']}")


def lateness_cdf(doc: dict[str, Any], out: Path) -> Path | None:
    runs = [r for r in doc.get("lateness", []) if "result" in r and r["result"].get("lateness_quantiles")]
    if not runs:
        return None
    plt = _plt()
    modes = [m for m in ("spread", "aligned") if any(r["mode"] == m for r in runs)]
    rates = sorted({r["rate"] for r in runs})
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(len(modes), len(rates), figsize=(3.6 * len(rates), 3.2 * len(modes) + 0.4), squeeze=False,
                             sharey=True, sharex=True)
    for i, mode in enumerate(modes):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            for r in runs:
                if r["mode"] != mode or r["rate"] != rate:
                    continue
                res = r["result"]
                qs = [max(q * 1000, 0.1) for q in res["lateness_quantiles"]]
                if len(qs) < 2:
                    continue
                share = res["delivery_ratio"] or 0.0
                ys = [share * n / (len(qs) - 1) for n in range(len(qs))]
                ax.plot(qs, ys, color=COLOURS[r["system"]], label=LABELS[r["system"]], linewidth=1.6)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(0, 1.02)
            ax.grid(True, which="both", alpha=0.25)
            ax.set_title(f"{rate:,} jobs/s, {mode}", fontsize=10)
            if i == len(modes) - 1:
                ax.set_xlabel("start lateness, ms (log)")
            if j == 0:
                ax.set_ylabel("share of the slots started")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Start lateness, the same receiver and window\n" + _caption(doc), fontsize=9)
    return _save(plt, fig, out / "lateness-cdf.png")


def writes(doc: dict[str, Any], out: Path) -> Path | None:
    runs = doc.get("writes", [])
    if not runs:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for system in ("raftcron", "etcd"):
        mine = [r for r in runs if r["system"] == system]
        if not mine:
            continue
        levels = [t["inflight"] for t in mine[0]["throughput"]]
        for r in mine:  # each run as points, the median as the line
            left.scatter(levels, [t["rate"] for t in r["throughput"]], color=COLOURS[system], s=12, alpha=0.5)
            known = [(lv, t["server_cpu_ms_per_write"]) for lv, t in zip(levels, r["throughput"], strict=True)
                     if t["server_cpu_ms_per_write"] is not None]
            right.scatter([k for k, _ in known], [v for _, v in known], color=COLOURS[system], s=12, alpha=0.5)
        med = [statistics.median(r["throughput"][i]["rate"] for r in mine) for i in range(len(levels))]
        cpu_levels, cpu = [], []
        for i, lv in enumerate(levels):
            vals = [r["throughput"][i]["server_cpu_ms_per_write"] for r in mine
                    if r["throughput"][i]["server_cpu_ms_per_write"] is not None]
            if vals:
                cpu_levels.append(lv)
                cpu.append(statistics.median(vals))
        seq = statistics.median(r["sequential"]["p50"] for r in mine) * 1000
        left.plot(levels, med, color=COLOURS[system], marker="o", label=f"{LABELS[system]}; sequential p50 {seq:.1f} ms")
        right.plot(cpu_levels, cpu, color=COLOURS[system], marker="o", label=LABELS[system])
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 16, 64], ["1", "16", "64"])
        ax.set_xlabel("writes in flight")
        ax.grid(True, alpha=0.25)
        ax.set_ylim(bottom=0)
    left.set_ylabel("writes/s (fsync on)")
    right.set_ylabel("server CPU ms per write (3 processes)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle("Writes of a job document, the same client\n" + _caption(doc), fontsize=9)
    return _save(plt, fig, out / "writes.png")


def failover(doc: dict[str, Any], out: Path) -> Path | None:
    runs = doc.get("failover", [])
    systems = [s for s in ("raftcron", "etcd") if any(r["system"] == s for r in runs)]
    if not systems:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(systems), figsize=(5.2 * len(systems), 3.6), sharey=True, squeeze=False)
    for ax, system in zip(axes[0], systems, strict=True):
        kills = [k for r in runs if r["system"] == system for k in r["kills"]]
        if not kills:
            continue
        start = kills[0]["timeline_from_s"]
        n = min(len(k["writes_per_100ms"]) for k in kills)
        xs = [start + 0.1 * i for i in range(n)]
        for k in kills:
            ax.plot(xs, k["writes_per_100ms"][:n], color=COLOURS[system], alpha=0.18, linewidth=0.8)
        ax.plot(xs, [statistics.median(k["writes_per_100ms"][i] for k in kills) for i in range(n)],
                color=COLOURS[system], linewidth=2, label="median of the kills")
        firsts = [k["seconds"] for k in kills if "seconds" in k]
        ax.axvline(0, color="black", linewidth=1)
        if firsts:
            ax.axvline(statistics.median(firsts), color="grey", linestyle="--", linewidth=1,
                       label=f"first write again, median {statistics.median(firsts):.2f} s")
        ax.set_title(f"{LABELS[system]}: {len(kills)} kills of the leader", fontsize=10)
        ax.set_xlabel("seconds from kill -9")
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("writes completed per 100 ms")
    fig.suptitle("Failover\n" + _caption(doc), fontsize=9)
    return _save(plt, fig, out / "failover.png")


def render(doc: dict[str, Any], out: Path) -> list[Path]:
    return [p for p in (lateness_cdf(doc, out), writes(doc, out), failover(doc, out)) if p is not None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, help="a bench.compare result (compare.json)")
    a = p.parse_args()
    for path in render(json.loads(a.json.read_text()), a.json.parent):
        print(path)


if __name__ == "__main__":
    main()
