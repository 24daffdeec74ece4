"""Figures of the WAIT experiments (docs/reproducing/wait.md), each a PNG plus the CSV behind it.

Every B run records its fluid benchmark (``summary["fluid"]``: the equilibrium of
its typed rates under the linear coefficients of its model and hardware), so the
figures mark ``Throughput*`` and the fluid stability boundary (load = 1) from the runs
themselves. Points are means over seeds with +- one standard deviation.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from replay.experiments.plots.common import legend_beside, policy_labels, save_figure  # noqa: E402
from replay.results import runs_under  # noqa: E402


def wait_table(sweep_dir: Path) -> pd.DataFrame:
    """One row per run under ``sweep_dir``: policy, seed, rates, B and the headline numbers."""
    runs = runs_under(sweep_dir)

    def column(key: str) -> pd.Series:
        return runs.get(key, pd.Series(np.nan, index=runs.index))

    rate = column("config.arrivals.rate")
    return pd.DataFrame({
        "policy": policy_labels(runs),
        "seed": runs["config.seed"], "batch_limit": column("config.batch_limit"),
        "total_rate": column("fluid.total_rate").fillna(rate),
        "load": column("fluid.load"), "throughput_star": column("fluid.throughput_star"),
        "status": runs["status"], "n_requests": runs["n_requests"],
        "n_completed": runs["n_completed"], "throughput": runs["throughput_tokens_per_s"],
        "requests_per_unit_time": column("throughput_requests_per_s"),
        "mean_latency": runs["mean_latency"], "mean_ttft": runs["mean_ttft"],
        "evictions": runs["evictions"], "time_unit": column("time_unit").fillna("seconds"),
        "run": runs["run_dir"]})


def _per_time(table: pd.DataFrame) -> str:
    """``s`` or ``round``: the time unit of a WAIT table's runs (B0 runs in unit time)."""
    units = set(table["time_unit"])
    return "round" if units == {"rounds"} else "s"


def _mean_std(table: pd.DataFrame, by: list[str], metrics: list[str]) -> pd.DataFrame:
    grouped = table.groupby(by, sort=True)[metrics]
    stats = grouped.mean().join(grouped.std().fillna(0.0), rsuffix="_std")
    stats["seeds"] = table.groupby(by).size()
    stats["not_completed"] = table[table["status"] != "completed"].groupby(by).size().reindex(
        stats.index, fill_value=0)
    return stats.reset_index()


def plot_wait_sweep(sweep_dir: Path, out_dir: Path, x: str, name: str,
                    tag: str = "") -> list[Path]:
    """Throughput and average latency vs ``x`` (``total_rate`` or ``batch_limit``) per policy.

    ``Throughput*`` (tokens/s of the fluid equilibrium) is drawn for every ``x``; on a
    rate axis the fluid model's stability boundary (load 1) is a vertical line, and so is,
    per policy, the largest rate the capacity study measured stable in simulation
    (:func:`measured_saturation`) when it has run.
    """
    table = wait_table(sweep_dir)
    per = _per_time(table)
    stats = _mean_std(table, ["policy", x], ["throughput", "mean_latency", "evictions",
                                             "throughput_star", "load"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = {}
    for policy, line in stats.groupby("policy"):
        unfinished = int(line["not_completed"].sum())
        label = policy + (f" ({unfinished} of {int(line['seeds'].sum())} runs did not "
                          f"complete; hollow)" if unfinished else "")
        bar = left.errorbar(line[x], line["throughput"], yerr=line["throughput_std"],
                            marker="o", ms=3, capsize=3, label=label)
        colors[policy] = bar[0].get_color()
        right.errorbar(line[x], line["mean_latency"], yerr=line["mean_latency_std"],
                       marker="o", ms=3, capsize=3, color=bar[0].get_color(), label=label)
        bad = line[line["not_completed"] > 0]
        for ax, metric in ((left, "throughput"), (right, "mean_latency")):
            ax.scatter(bad[x], bad[metric], s=60, facecolors="white",
                       edgecolors=bar[0].get_color(), zorder=3)
    star = stats.groupby(x)["throughput_star"].first()
    load = stats.groupby(x)["load"].first()
    over = load[load > 1]
    star_label = "Throughput* (fluid)"
    if x != "total_rate" and len(over) == len(load) and len(load):
        # On a batch axis the arrival rate is fixed: above the boundary Throughput* is the
        # offered decode rate, which no policy can reach.
        star_label = (f"Throughput* (fluid; load {over.min():.2g} > 1: above capacity, "
                      f"unattainable)")
    left.plot(star.index, star.values, "k--", lw=1, label=star_label)
    if x == "total_rate":
        boundary = (stats["total_rate"] / stats["load"]).median()
        for ax in (left, right):
            ax.axvline(boundary, color="gray", ls=":", label=f"fluid boundary, load 1 "
                       f"({boundary:,.0f}/{per})")
        saturation = measured_saturation(sweep_dir, "linear" if tag == "linear" else "vidur")
        for policy, rate in saturation.items():
            if policy in colors:
                for ax in (left, right):
                    ax.axvline(rate, color=colors[policy], ls="-.", lw=0.8,
                               label=f"{policy}: stable up to {rate:,.0f}/{per} (measured)")
        paper = _paper_rate(sweep_dir)
        if paper is not None:
            inside = stats[x].min() <= paper <= 1.1 * stats[x].max()
            for ax in (left, right):
                # Off the swept range the marker would squash the curves: name it instead.
                ax.axvline(paper if inside else np.nan, color="tab:red", ls="--", lw=1,
                           label=f"paper's setting ({paper:,.0f}/{per}"
                           + (")" if inside else ", off this axis)"))
    for ax, metric in ((left, f"throughput (tokens/{per})"),
                       (right, f"average latency ({'s' if per == 's' else 'rounds'})")):
        ax.set_xlabel({"total_rate": f"total arrival rate (requests/{per})",
                       "batch_limit": "batch limit B (requests in a batch)"}[x])
        ax.set_ylabel(metric)
        ax.set_ylim(0, None)
        legend_beside(ax)
    if stats[x].nunique() < 2:
        fig.text(0.5, 0.01, f"only one {x.replace('_', ' ')} was run: no curve",
                 ha="center", fontsize=8)
    fig.suptitle(name + ("" if stats["evictions"].fillna(0).any()
                         else " (no evictions in any run)"))
    return [save_figure(fig, out_dir / f"{x}_sweep{'_' + tag if tag else ''}.png", stats)]


def capacity_summary(target_dir: Path, timing: str = "vidur") -> pd.DataFrame:
    """The capacity study's per-scenario, per-policy saturation rates under ``timing``
    (target ``b_capacity`` beside the target folder ``target_dir``, quick or not); empty
    when that study has not run, or ran before it measured both timings."""
    quick = target_dir.name.endswith("-quick")
    found = target_dir.parent / ("b_capacity-quick" if quick else "b_capacity") / "runs" \
        / "capacity_summary.csv"
    if not found.is_file():
        return pd.DataFrame()
    summary = pd.read_csv(found)
    if not {"timing", "label"} <= set(summary.columns):
        return pd.DataFrame()
    return summary[summary["timing"] == timing]


def measured_saturation(sweep_dir: Path, timing: str) -> dict[str, float]:
    """Per policy label, the largest total rate the capacity study measured stable for this
    scenario under ``timing`` (:func:`capacity_summary`). A rate sweep's load axis is the
    fluid model's, which can call a rate stable that is not: this is what simulation says."""
    target_dir = sweep_dir.parent.parent  # {outputs}/<target>[-quick]/runs/<sweep>
    summary = capacity_summary(target_dir, timing)
    if summary.empty:
        return {}
    rows = summary[(summary["scenario"] == target_dir.name.removesuffix("-quick"))
                   & (summary["saturation_above"] > 0)]
    return dict(zip(rows["label"], rows["saturation_above"].astype(float), strict=True))


def _paper_rate(sweep_dir: Path) -> float | None:
    """The total arrival rate of the paper's setting: the ``paper`` sweep beside this one."""
    paper = sweep_dir.parent / "paper"
    if sweep_dir.name == "paper" or not paper.is_dir():
        return None
    try:
        rates = wait_table(paper)["total_rate"].dropna()
    except Exception:  # noqa: BLE001 - a missing or odd paper sweep only drops the marker
        return None
    return float(rates.median()) if len(rates) else None


def plot_policy_bars(sweep_dir: Path, out_dir: Path, name: str,
                     group: str = "total_rate") -> list[Path]:
    """Throughput (with ``Throughput*``), average latency and evictions per policy,
    one group of bars per value of ``group`` (e.g. the arrival rate)."""
    table = wait_table(sweep_dir)
    per = _per_time(table)
    stats = _mean_std(table, [group, "policy"], ["throughput", "mean_latency", "evictions",
                                                 "throughput_star", "requests_per_unit_time"])
    groups = list(stats[group].unique())
    policies = list(stats["policy"].unique())
    width = 0.8 / max(len(policies), 1)
    # A panel of zeros says nothing: with no eviction in any run, say so instead.
    metrics = [("throughput", f"throughput (tokens/{per})"),
               ("mean_latency", f"average latency ({'s' if per == 's' else 'rounds'})")]
    evictions = bool(stats["evictions"].fillna(0).any())
    if evictions:
        metrics.append(("evictions", "evictions per run"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 4), squeeze=False)
    axes = axes[0]
    for k, policy in enumerate(policies):
        part = stats[stats["policy"] == policy].set_index(group).reindex(groups)
        where = np.arange(len(groups)) + k * width
        unfinished = int(part["not_completed"].sum())
        label = policy + (f" ({unfinished} of {int(part['seeds'].sum())} runs did not "
                          f"complete)" if unfinished else "")
        for ax, (metric, _) in zip(axes, metrics, strict=True):
            ax.bar(where, part[metric].fillna(0), width, yerr=part[f"{metric}_std"],
                   capsize=3, label=label)
            for x, (_, row) in zip(where, part.iterrows(), strict=True):
                if row["not_completed"] and row["not_completed"] == row["seeds"]:
                    ax.text(x, 0, " did not complete", rotation=90, ha="center",
                            va="bottom", fontsize=7)
    stars = stats.groupby(group)["throughput_star"].first().reindex(groups)
    for i, value in enumerate(stars):
        if pd.notna(value):
            axes[0].hlines(value, i - 0.1, i + 0.9, colors="k", linestyles="--",
                           label="Throughput* (fluid)" if i == 0 else None)
    for ax, (_, label) in zip(axes, metrics, strict=True):
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{g:g}" if isinstance(g, float) else str(g) for g in groups])
        ax.set_xlabel({"total_rate": f"total arrival rate (requests/{per})"}.get(
            group, group.replace("_", " ")))
        ax.set_ylabel(label)
        ax.set_ylim(0, None)
        ax.set_xlim(-width, len(groups) - 1 + 0.8)
    legend_beside(axes[0])
    fig.suptitle(name + ("" if evictions else " (no evictions in any run)"))
    return [save_figure(fig, out_dir / "policies.png", stats)]
