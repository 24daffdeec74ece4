"""docs/reproducing/harness.md D1: every policy on every workload, one table (CSV + Markdown) and a
heatmap of each policy's average latency over the best policy of its setting.

The table is read from the target's results table (:func:`replay.results.runs_under`);
each sweep folder under the target's ``runs/`` is a panel (``online_70b``, ``trace_7b``,
``offline``...). The gap to the LP lower bound is computable only in the offline panel
(unit time, every request at time 0): there Sorted-LP's first and only LP covers the
whole instance, so its ``lp_bound`` bounds every policy's total latency in rounds, and
``lp_gap = TEL / bound - 1``. Under Vidur timing, or with arrivals over time, the LP
(which counts rounds of unit length) bounds nothing and the column is empty.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from replay.experiments.plots.common import plt, policy_labels, save_figure
from replay.results import runs_under

#: Table columns: name -> column of the results table.
METRICS = {"mean_latency": "mean_latency", "p50_latency": "p50_latency",
           "p99_latency": "p99_latency", "mean_ttft": "mean_ttft", "p99_ttft": "p99_ttft",
           "mean_tbt": "mean_tbt", "p99_tbt": "p99_tbt",
           "throughput_tokens_per_s": "throughput_tokens_per_s", "evictions": "evictions",
           "decision_time_s": "decision_time_s"}
SETTING = ["panel", "model", "kv", "workload"]


def d1_table(runs_dir: Path) -> pd.DataFrame:
    """One row per run under ``runs_dir``: its setting, policy, status and metrics, plus the
    gap to the LP bound where it is computable."""
    runs = runs_under(runs_dir)
    table = pd.DataFrame({
        "panel": runs["run_dir"].map(lambda d: Path(d).relative_to(runs_dir.resolve()).parts[0]),
        "model": runs["config.model.name"], "kv": runs["kv.mode"],
        "kv_tokens": runs["kv_capacity"], "workload": runs["config.workload.name"],
        "timing": runs["timing.backend"],
        "policy": policy_labels(runs),
        "status": runs["status"], "n_requests": runs["n_requests"],
        "n_completed": runs["n_completed"], "tel": runs["tel"],
        **{name: runs[column] for name, column in METRICS.items()}})
    solves = runs.get("policy_info.lp_solves", pd.Series(np.nan, index=runs.index))
    bound = runs.get("policy_info.lp_bound", pd.Series(np.nan, index=runs.index))
    # A bound of the whole instance: unit time, all at time 0, one LP over every request.
    whole = (solves == 1) & (table["timing"] == "unit") & (runs["config.arrivals._target_"]
                                                          .str.endswith("AllAtOnce"))
    table["lp_bound"] = bound.where(whole)
    best_bound = table.groupby(SETTING)["lp_bound"].transform("max")
    table["lp_gap"] = (table["tel"] / best_bound - 1).where(table["status"] == "completed")
    return table.sort_values([*SETTING, "mean_latency"]).reset_index(drop=True)


def plot_d1(runs_dir: Path, out_dir: Path) -> list[Path]:
    """The D1 heatmap, average latency over the best policy's in each setting (runs that did
    not complete are marked, not coloured), with the whole table as its CSV."""
    table = d1_table(runs_dir)
    done = table["status"] == "completed"
    best = table[done].groupby(SETTING)["mean_latency"].transform("min")
    table["latency_over_best"] = (table["mean_latency"] / best.reindex(table.index)).where(done)
    columns = [" / ".join(str(v) for v in key) for key in
               table[SETTING].drop_duplicates().itertuples(index=False)]
    table["setting"] = table[SETTING].astype(str).agg(" / ".join, axis=1)
    grid = table.pivot_table(index="policy", columns="setting", values="latency_over_best",
                             aggfunc="first").reindex(columns=columns)
    status = table.pivot_table(index="policy", columns="setting", values="status",
                               aggfunc="first").reindex(index=grid.index, columns=columns)
    fig, ax = plt.subplots(figsize=(max(6.0, 2 + 0.45 * len(columns)), 2 + 0.4 * len(grid)))
    image = ax.imshow(np.log2(grid.to_numpy(dtype=float)), cmap="viridis_r", aspect="auto",
                      vmin=0, vmax=2)
    for (i, j), value in np.ndenumerate(grid.to_numpy(dtype=float)):
        state = status.iat[i, j]
        text = f"{value:.2f}" if np.isfinite(value) else ("-" if pd.isna(state) else state[:8])
        ax.text(j, i, text, ha="center", va="center", fontsize=5,
                color="white" if np.isfinite(value) and value > 2 else "black")
    ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=6)
    ax.set_yticks(range(len(grid)), grid.index, fontsize=7)
    fig.colorbar(image, ax=ax, label="log2(average latency / best in setting)")
    ax.set_title("D1: average latency over the best policy's\nin each panel / model / memory / "
                 "workload\n(- : not run there; a status: did not complete)", fontsize=9)
    return [save_figure(fig, out_dir / "d1_latency.png", table.drop(columns="setting"))]

