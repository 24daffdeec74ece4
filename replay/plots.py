"""Figures shared by the experiments, each saved as PNG next to the CSV of its numbers.

``python -m replay.plots kv RUN_DIR [RUN_DIR ...] --out FILE.png`` draws the KV-usage
timeline of one or more runs (EXPERIMENTS.md A5, A7) with the capacity ``M`` marked.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def save_figure(fig, out: Path, numbers: pd.DataFrame, index: bool = False) -> Path:
    """Save ``fig`` as ``out`` (PNG) and the ``numbers`` behind it next to it as CSV."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    plt.close(fig)
    numbers.to_csv(out.with_suffix(".csv"), index=index)
    return out


def kv_timeline(iterations: pd.DataFrame) -> pd.DataFrame:
    """KV held over time: one row per step with its end time, peak KV and whether it failed."""
    return pd.DataFrame({
        "time": iterations["start_time"] + iterations["duration"],
        "kv_peak": iterations["kv_peak"],
        "kv_after": iterations["kv_after"],
        "failed": iterations["failed"],
    })


def plot_kv_timelines(runs: Sequence[tuple[str, pd.DataFrame, int]], out: Path,
                      title: str = "KV cache usage", until: float | None = None) -> Path:
    """Plot ``(label, iterations, M)`` timelines on one axis; save ``out`` (.png) and .csv.

    ``until`` limits the time axis (the CSV keeps every step).
    """
    fig, ax = plt.subplots(figsize=(8, 4))
    frames = []
    capacities = set()
    for label, iterations, capacity in runs:
        timeline = kv_timeline(iterations)
        ok = timeline[~timeline["failed"]]
        ax.plot(ok["time"], ok["kv_peak"], lw=0.8, label=label)
        failed = timeline[timeline["failed"]]
        if len(failed):
            ax.scatter(failed["time"], failed["kv_peak"], marker="x", s=12,
                       label=f"{label}: overflow ({len(failed)})")
        capacities.add(capacity)
        frames.append(timeline.assign(run=label, kv_capacity=capacity))
    for capacity in sorted(capacities):
        ax.axhline(capacity, color="k", ls="--", lw=1, label=f"M = {capacity:,}")
    if until is not None:
        ax.set_xlim(0, until)
    ax.set_xlabel("time")
    ax.set_ylabel("KV held (token slots)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, out, pd.concat(frames))


def latency_of_first_n(requests: pd.DataFrame, ns: Sequence[int]) -> pd.DataFrame:
    """Average end-to-end latency over the first ``n`` arrivals, for each ``n`` (A3).

    ``n_completed`` says how many of those ``n`` finished (fewer after a livelock;
    the average then covers only the finished ones).
    """
    ordered = requests.sort_values(["arrival", "request_id"], kind="stable")
    rows = []
    for n in ns:
        head = ordered.iloc[:n]
        done = head[head["completed"]]
        rows.append({"n": n, "mean_latency": done["latency"].mean() if len(done) else np.nan,
                     "n_completed": len(done)})
    return pd.DataFrame(rows)


def policy_label(policy_cfg: dict) -> str:
    """A legend label for a resolved ``policy`` config, e.g. ``alpha/beta-clearing (0.2, 0.1)``."""
    name = policy_cfg["_target_"].rsplit(".", 1)[-1]
    overflow = policy_cfg.get("overflow", {}).get("_target_", "")
    if name == "AlphaProtection":
        if overflow.endswith("ClearEachWithProb"):
            return f"alpha/beta-clearing ({policy_cfg['alpha']}, {policy_cfg['overflow']['beta']})"
        return f"alpha-protection ({policy_cfg['alpha']})"
    return {"MCSF": "MC-SF", "FCFSLookahead": "FCFS (MC-Benchmark)"}.get(name, name)


def plot_latency_vs_n(sweep_dir: Path, out_dir: Path, points: int = 10) -> list[Path]:
    """EXPERIMENTS.md A3: average latency of the first ``n`` requests vs ``n``, one figure
    per arrival rate, one line per policy with its least-squares slope in the legend.

    The CSV keeps every point with ``n_completed``; the figure draws a point only when
    all of the first ``n`` requests completed, and a run that ended early (livelock)
    is named in the legend with how many requests it finished.
    """
    table = []
    for summary_path in sorted(sweep_dir.glob("*/summary.json")):
        summary, requests, _ = load_run(summary_path.parent)
        n_total = summary["n_requests"]
        ns = np.linspace(n_total / points, n_total, points).round().astype(int)
        curve = latency_of_first_n(requests, ns)
        curve["policy"] = policy_label(summary["config"]["policy"])
        curve["rate"] = summary["config"]["arrivals"]["rate"]
        curve["status"] = summary["status"]
        table.append(curve)
    data = pd.concat(table, ignore_index=True)
    written = []
    for rate, group in data.groupby("rate"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for policy, curve in group.groupby("policy", sort=False):
            # A point is drawn only if all of the first n requests finished: an average over
            # the survivors of a livelock would look deceptively good.
            complete = curve[curve["n_completed"] == curve["n"]]
            slope = (np.polyfit(complete["n"], complete["mean_latency"], 1)[0]
                     if len(complete) > 1 else np.nan)
            status = curve["status"].iloc[0]
            label = f"{policy}: slope {slope:.3g}"
            if status != "completed":
                label = (f"{policy}: {status} after {int(curve['n_completed'].max())} of "
                         f"{int(curve['n'].max())} completed")
            ax.plot(complete["n"], complete["mean_latency"], marker="o", ms=3, label=label)
        ax.set_xlabel("first n requests")
        ax.set_ylabel("average end-to-end latency (s)")
        ax.set_title(f"Average latency vs n, arrival rate {rate}/s")
        ax.legend(fontsize=7)
        written.append(save_figure(fig, out_dir / f"latency_vs_n_rate{rate:g}.png", group))
    return written


def plot_kv_of_sweep(sweep_dir: Path, out_dir: Path, policy: str = "MC-SF") -> list[Path]:
    """EXPERIMENTS.md A5: KV usage over time of ``policy`` at every arrival rate of a sweep."""
    runs = []
    for summary_path in sorted(sweep_dir.glob("*/summary.json")):
        summary, _, iterations = load_run(summary_path.parent)
        if policy_label(summary["config"]["policy"]) == policy:
            rate = summary["config"]["arrivals"]["rate"]
            runs.append((f"{policy}, rate {rate}/s", iterations, summary["kv_capacity"]))
    return [plot_kv_timelines(runs, out_dir / "kv_timeline.png", f"KV usage of {policy}")]


def plot_metric_bars(sweep_dir: Path, out_dir: Path, metric: str = "tel") -> list[Path]:
    """One bar per run of a sweep (labelled by its overrides) showing ``metric``."""
    rows = [{"run": p.parent.name, metric: json.loads(p.read_text())[metric]}
            for p in sorted(sweep_dir.glob("*/summary.json"))]
    table = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(12, 1 + 0.4 * len(table)))
    ax.barh(table["run"], table[metric])
    ax.tick_params(axis="y", labelsize=6)
    for y, value in enumerate(table[metric]):
        ax.text(value, y, f" {value:g}", va="center")
    ax.set_xlabel(metric)
    return [save_figure(fig, out_dir / f"{metric}.png", table)]


def _select(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config[key]
    return config


def sweep_table(sweep_dir: Path, params: dict[str, str]) -> pd.DataFrame:
    """One row per run of a sweep: its summary's headline numbers and the ``params``
    (column name -> dotted config key) read from its resolved config."""
    rows = []
    for summary_path in sorted(sweep_dir.glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        row = {name: _select(summary["config"], key) for name, key in params.items()}
        row.update({k: summary[k] for k in ("status", "n_requests", "n_completed",
                                            "mean_latency", "p99_latency", "evictions")})
        row["policy"] = policy_label(summary["config"]["policy"])
        rows.append(row)
    return pd.DataFrame(rows)


def plot_seed_statistics(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """EXPERIMENTS.md A4: mean, std, max and min over seeds of each policy's average latency.

    Only runs that completed enter the statistics; ``n_livelock`` counts the others.
    """
    table = sweep_table(sweep_dir, {"seed": "seed"})
    done = table[table["status"] == "completed"]
    policies = sorted(table["policy"].unique())
    stats = (done.groupby("policy")["mean_latency"].agg(["mean", "std", "max", "min", "count"])
             .reindex(policies))
    stats["count"] = stats["count"].fillna(0).astype(int)
    stats["n_livelock"] = (table[table["status"] != "completed"].groupby("policy").size()
                           .reindex(policies, fill_value=0))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(stats.index, stats["mean"], yerr=stats["std"], capsize=4, color="tab:blue")
    ax.scatter(stats.index, stats["max"], marker="v", color="k", label="max over seeds")
    ax.scatter(stats.index, stats["min"], marker="^", color="k", label="min over seeds")
    for x, (_, row) in enumerate(stats.iterrows()):
        if row["n_livelock"]:
            ax.text(x, 0, f"{int(row['n_livelock'])} livelock", rotation=90, va="bottom",
                    ha="center", fontsize=7)
    ax.set_ylabel("average latency (s), mean +- std over seeds")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / "seed_statistics.png", stats, index=True)]


def plot_sensitivity(sweep_dir: Path, out_dir: Path, x: str, series: str) -> list[Path]:
    """EXPERIMENTS.md A6: average latency vs the config value ``x``, one line per value of
    ``series``, one figure per arrival rate. Livelocked runs are left out of the lines and
    listed in the CSV."""
    table = sweep_table(sweep_dir, {"x": x, "series": series, "rate": "arrivals.rate"})
    written = []
    short = {name: name.rsplit(".", 1)[-1] for name in (x, series)}
    for rate, group in table.groupby("rate"):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for value, line in group.sort_values("x").groupby("series"):
            done = line[line["status"] == "completed"]
            failed = len(line) - len(done)
            label = f"{short[series]} = {value:g}" + (f" ({failed} livelocked)" if failed else "")
            ax.plot(done["x"], done["mean_latency"], marker="o", ms=3, label=label)
        ax.set_xlabel(short[x])
        ax.set_ylabel("average end-to-end latency (s)")
        ax.set_title(f"alpha/beta-clearing, arrival rate {rate:g}/s")
        ax.legend(fontsize=8)
        written.append(save_figure(fig, out_dir / f"latency_vs_{short[x]}_rate{rate:g}.png",
                                   group.rename(columns={"x": x, "series": series})))
    return written


def load_run(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return (summary, pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot run outputs.")
    sub = parser.add_subparsers(dest="figure", required=True)
    kv = sub.add_parser("kv", help="KV usage over time with M marked")
    kv.add_argument("runs", nargs="+", type=Path, help="run directories")
    kv.add_argument("--out", type=Path, default=Path("kv_timeline.png"))
    args = parser.parse_args()
    runs = []
    for run_dir in args.runs:
        summary, _, iterations = load_run(run_dir)
        label = f"{run_dir.name} ({summary['status']})"
        runs.append((label, iterations, summary["kv_capacity"]))
    print(plot_kv_timelines(runs, args.out))


if __name__ == "__main__":
    main()
