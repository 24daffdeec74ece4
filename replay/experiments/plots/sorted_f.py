"""Figures of the Sorted-F experiments (docs/reproducing/sorted-f.md C2 and D2) from their sweeps.

Every figure is saved with the CSV of the numbers behind it
(:func:`replay.experiments.plots.common.save_figure`); error bars are standard errors
over seeds (C2) or 95 % normal confidence intervals (D2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from replay.experiments.plots.common import plt, save_figure, sweep_table


def _mean_se(table: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    grouped = table.groupby(keys, sort=True)[value]
    stats = grouped.agg(["mean", "std", "count"]).reset_index()
    stats["se"] = stats["std"] / np.sqrt(stats["count"])
    return stats


def plot_c2(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """C2: average latency and each scheduler's decision time vs n, mean ± s.e. over shuffles."""
    table = sweep_table(sweep_dir, {"n": "workload.n", "seed": "seed"},
                        {"decision_time_s": "decision_time_s", "lp_grid": "policy_info.lp_grid",
                         "lp_time_s": "policy_info.lp_time_total_s",
                         "decision_path": "engine_path.policy", "loop_time_s": "loop_time_s"})
    # A compiled decision runs inside the step loop and is not timed apart: its bound is the
    # whole loop's time (decisions, pricing and bookkeeping), marked in the legend.
    compiled = table["decision_path"] == "compiled"
    timed = table.copy()
    timed.loc[compiled, "decision_time_s"] = timed.loc[compiled, "loop_time_s"]
    timed.loc[compiled, "policy"] = timed.loc[compiled, "policy"] + " (loop time, upper bound)"
    done = table[table["status"] == "completed"]
    written = []
    for value, label, name, log, runs in (
            ("mean_latency", "average end-to-end latency (s)", "c2_latency.png", False, table),
            ("decision_time_s", "scheduler decision time per run (s, wall)",
             "c2_decision_time.png", True, timed)):
        stats = _mean_se(runs[runs["status"] == "completed"], ["policy", "n"], value)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for policy, line in stats.groupby("policy", sort=False):
            ax.errorbar(line["n"], line["mean"], yerr=line["se"], marker="o", ms=3, capsize=2,
                        label=policy)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("requests n (all at time 0)")
        ax.set_ylabel(label)
        grids = sorted({int(g) for g in done["lp_grid"].dropna()})
        ax.set_title(f"C2: mixed LMSYS + arXiv, Llama-2-70B TP2, Vidur linear regression\n"
                     f"({done['seed'].nunique()} shuffles; LP grid {grids[0] if grids else '-'}"
                     f"-{grids[-1] if grids else '-'} rounds)", fontsize=9)
        ax.legend(fontsize=7)
        written.append(save_figure(fig, out_dir / name, stats.merge(
            runs.groupby(["policy", "n"])["status"].agg(lambda s: (s != "completed").sum())
            .rename("unfinished_runs").reset_index(), on=["policy", "n"])))
    return written


def plot_d2(sweep_dir: Path, out_dir: Path, x: str, label: str) -> list[Path]:
    """D2: average latency (± 95 % CI over seeds) and evictions vs prediction quality."""
    table = sweep_table(sweep_dir, {x: f"prediction.{x}", "seed": "seed"},
                        {"prediction_error": "prediction.mean_relative_error"})
    done = table[table["status"] == "completed"]
    latency = _mean_se(done, ["policy", x], "mean_latency")
    evictions = _mean_se(done, ["policy", x], "evictions")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for policy, line in latency.groupby("policy", sort=False):
        left.errorbar(line[x], line["mean"], yerr=1.96 * line["se"], marker="o", ms=3,
                      capsize=2, label=policy)
    for policy, line in evictions.groupby("policy", sort=False):
        right.plot(line[x], line["mean"], marker="o", ms=3, label=policy)
    left.set_ylabel("average end-to-end latency (s), 95 % CI")
    right.set_ylabel("evictions per run (mean)")
    for ax in (left, right):
        ax.set_xlabel(label)
        ax.legend(fontsize=7)
    left.set_title(f"D2 on the C2 setup, n = {int(done['n_requests'].iloc[0])}, "
                   f"{done['seed'].nunique()} seeds", fontsize=9)
    numbers = latency.merge(evictions, on=["policy", x], suffixes=("_latency", "_evictions"))
    return [save_figure(fig, out_dir / f"d2_{x}.png", numbers)]
