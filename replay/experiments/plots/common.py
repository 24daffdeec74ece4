"""Figures shared by the experiments (and the MC-SF ones), each saved as PNG next to the
CSV of its numbers. ``python -m replay.plots`` draws the KV-usage timeline of finished runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from policies.labels import policy_label  # noqa: E402
from replay.errors import InputError  # noqa: E402
from replay.results import nested, runs_under  # noqa: E402
from replay.storage.outputs import atomic_write, ensure_writable_dir  # noqa: E402


def save_figure(fig, out: Path, numbers: pd.DataFrame, index: bool = False) -> Path:
    """Save ``fig`` as ``out`` (PNG) and the ``numbers`` behind it next to it as CSV. The
    image grows to hold what lies outside the axes (a legend beside them)."""
    fig.tight_layout()
    ensure_writable_dir(out.parent)
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=150, format="png", bbox_inches="tight"))
    plt.close(fig)
    atomic_write(out.with_suffix(".csv"), lambda tmp: numbers.to_csv(tmp, index=index))
    return out


def legend_beside(ax, fontsize: float = 7) -> None:
    """The legend of ``ax`` to the right of it, where it cannot hide data (figures whose
    lines fill the axes, or whose legends are long)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)


def kv_timeline(iterations: pd.DataFrame) -> pd.DataFrame:
    """KV held over time: one row per step with its end time, peak KV and whether it failed."""
    return pd.DataFrame({
        "time": iterations["start_time"] + iterations["duration"],
        "kv_peak": iterations["kv_peak"],
        "kv_after": iterations["kv_after"],
        "failed": iterations["failed"],
    })


def plot_kv_timelines(runs: Sequence[tuple[str, pd.DataFrame, int]], out: Path,
                      title: str = "KV cache usage", until: float | None = None,
                      time_unit: str = "seconds") -> Path:
    """Plot ``(label, iterations, M)`` timelines on one axis; save ``out`` (.png) and .csv.

    ``until`` limits the time axis (the CSV keeps every step); ``time_unit`` is the runs'
    (``seconds``, or ``rounds`` in unit time).
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
    ax.set_xlabel(f"time ({'s' if time_unit == 'seconds' else time_unit})")
    ax.set_ylabel("KV held (token slots)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, out, pd.concat(frames))


def largest_runs(sweep_dir: Path) -> list[Path]:
    """The summaries of a sweep's runs with the most requests (a sweep over ``workload.n``
    draws its first-n curves and KV timelines from its largest runs)."""
    paths = sorted(sweep_dir.glob("*/summary.json"))
    sizes = [json.loads(p.read_text())["n_requests"] for p in paths]
    return [p for p, n in zip(paths, sizes, strict=True) if n == max(sizes, default=0)]


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


def plot_latency_vs_n(sweep_dir: Path, out_dir: Path, points: int = 10) -> list[Path]:
    """The second A3 figure: the average latency of the first ``n`` requests of one run
    (the sweep's largest) vs ``n``, one figure per arrival rate, one line per policy with
    its least-squares slope in the legend. Not the paper's figure (see
    :func:`plot_latency_vs_n_runs`): under MC-SF it is flat by construction, since early
    long requests wait behind later short ones.

    The CSV keeps every point with ``n_completed``; the figure draws a point only when
    all of the first ``n`` requests completed, and a run that ended early (livelock)
    is named in the legend with how many requests it finished.
    """
    table = []
    for summary_path in largest_runs(sweep_dir):
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
            label = (f"{policy}: slope {slope:.3g} s/request" if np.isfinite(slope)
                     else f"{policy}: too few points for a slope")
            if status != "completed":
                label = (f"{policy}: {status} after {int(curve['n_completed'].max())} of "
                         f"{int(curve['n'].max())} completed")
            ax.plot(complete["n"], complete["mean_latency"], marker="o", ms=3, label=label)
        ax.set_xlabel("first n requests")
        ax.set_ylabel("average end-to-end latency (s)")
        ax.set_title(f"Average latency of the FIRST n requests of one run, rate {rate}/s")
        ax.legend(fontsize=7)
        written.append(save_figure(fig, out_dir / f"latency_of_first_n_rate{rate:g}.png", group))
    return written


#: The MC-SF journal paper's Figure 3: the other policies' latency grows about this many
#: times as fast with n as MC-SF's, by arrival rate (requests/s).
PAPER_A3_SLOPE_RATIO = {50: 3, 10: 8}


def plot_latency_vs_n_runs(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """docs/reproducing/mcsf.md A3 as the paper plots it: the average latency of a separate run of
    ``n`` requests vs ``n``, one figure per arrival rate, one line per policy with its
    least-squares slope and the slope's ratio to MC-SF's in the legend.

    A run that did not complete (livelock) is left out of its line and counted in the
    legend; the CSV keeps every run.
    """
    table = sweep_table(sweep_dir, {"n": "workload.n", "rate": "arrivals.rate"})
    written = []
    for rate, group in table.groupby("rate"):
        slopes = {}
        for policy, line in group.groupby("policy"):
            done = line[line["status"] == "completed"].sort_values("n")
            slopes[policy] = (np.polyfit(done["n"], done["mean_latency"], 1)[0]
                              if len(done) > 1 else np.nan)
        reference = slopes.get("MC-SF", np.nan)
        group = group.assign(slope=group["policy"].map(slopes),
                             slope_ratio_to_mcsf=group["policy"].map(slopes) / reference)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for policy, line in group.groupby("policy", sort=False):
            done = line[line["status"] == "completed"].sort_values("n")
            failed = len(line) - len(done)
            slope = slopes[policy]
            if np.isfinite(slope):
                label = f"{policy}: slope {slope:.3g} s/request"
                if np.isfinite(reference) and policy != "MC-SF":
                    label += f" ({slope / reference:.2g}x MC-SF's)"
            elif failed == len(line):
                label = f"{policy}: livelocked in all {failed} runs (no line)"
            else:
                label = f"{policy}: under two finished runs (no slope)"
            if failed and np.isfinite(slope):
                label += f"; {failed} of {len(line)} runs livelocked"
            ax.plot(done["n"], done["mean_latency"], marker="o", ms=3, label=label)
        ax.set_xlabel("requests n (a separate run for each n)")
        ax.set_ylabel("average end-to-end latency (s)")
        paper = PAPER_A3_SLOPE_RATIO.get(rate)
        ax.set_title(f"Average latency of runs of n requests, arrival rate {rate:g}/s"
                     + (f"\n(paper, Figure 3: the other policies' slopes about {paper:g}x "
                        f"MC-SF's)" if paper else ""), fontsize=10)
        ax.legend(fontsize=6)
        written.append(save_figure(fig, out_dir / f"latency_vs_n_runs_rate{rate:g}.png",
                                   group))
    return written


def plot_kv_of_sweep(sweep_dir: Path, out_dir: Path, policy: str = "MC-SF") -> list[Path]:
    """docs/reproducing/mcsf.md A5: KV usage over time of ``policy`` at every arrival rate of
    a sweep."""
    runs, units = [], set()
    for summary_path in largest_runs(sweep_dir):
        summary, _, iterations = load_run(summary_path.parent)
        if policy_label(summary["config"]["policy"]) == policy:
            rate = summary["config"]["arrivals"]["rate"]
            runs.append((f"{policy}, rate {rate}/s", iterations, summary["kv_capacity"]))
            units.add(summary.get("time_unit", "seconds"))
    return [plot_kv_timelines(runs, out_dir / "kv_timeline.png",
                              f"KV usage of {policy} (the largest run at each rate)",
                              time_unit=units.pop() if len(units) == 1 else "seconds")]


#: The Sorted-F paper's worked example (Section 3, Table 1): total latency in rounds.
PAPER_C3_TEL = {"MC-SF": 64, "Sorted-F": 45}


def plot_c3(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """C3: total end-to-end latency (TEL, rounds) of every policy in both arrival orders of
    the worked example, the paper's values marked where it gives them."""
    runs = runs_under(sweep_dir)
    groups = runs["config.workload.groups"].map(  # lists are kept as JSON in the table
        lambda g: json.loads(g) if isinstance(g, str) else g)
    first = groups.map(lambda g: g[0]["prompt_len"])
    table = pd.DataFrame({
        "policy": policy_labels(runs),
        "order": np.where(first > 1, "long prompt first", "short prompts first"),
        "tel": runs["tel"], "status": runs["status"],
        "run": runs["run_dir"].map(lambda d: Path(d).name)})
    table["paper_tel"] = table["policy"].map(
        lambda p: PAPER_C3_TEL.get("Sorted-F" if p.startswith("Sorted-F") else p))
    table = table.sort_values(["policy", "order"]).reset_index(drop=True)
    policies = list(table["policy"].unique())
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(policies)))
    for k, (order, part) in enumerate(table.groupby("order")):
        part = part.set_index("policy").reindex(policies)
        where = np.arange(len(policies)) + (k - 0.5) * 0.4
        ax.barh(where, part["tel"], 0.4, label=order)
        for y, value in zip(where, part["tel"], strict=True):
            ax.text(value, y, f" {value:g}", va="center", fontsize=8)
    paper = table.drop_duplicates("policy").set_index("policy")["paper_tel"].reindex(policies)
    marked = [i for i, v in enumerate(paper) if pd.notna(v)]
    ax.scatter(paper.iloc[marked], marked, marker="|", s=400, color="tab:red", zorder=3,
               label="paper (Section 3)")
    ax.set_yticks(range(len(policies)), policies)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12 * table["tel"].max())
    ax.set_xlabel("total end-to-end latency, TEL (rounds)")
    ax.set_title("C3: one request (63, 1) and 21 requests (1, 2), M = 64, unit time",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return [save_figure(fig, out_dir / "tel.png", table)]


#: The headline numbers every sweep table carries.
HEADLINE = ("status", "n_requests", "n_completed", "mean_latency", "p99_latency", "evictions")


def sweep_table(sweep_dir: Path, params: dict[str, str],
                results: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per run of a sweep, from its results table (:func:`replay.results.runs_under`):
    the ``params`` (column name -> dotted config key), the ``results`` (column name ->
    dotted summary key; missing -> None), the headline numbers and the policy's label."""
    runs = runs_under(sweep_dir)
    table = pd.DataFrame({name: runs[f"config.{key}"] for name, key in params.items()})
    for name, key in (results or {}).items():
        table[name] = runs.get(key)
    for key in HEADLINE:
        table[key] = runs[key]
    table["policy"] = policy_labels(runs)
    return table


def policy_labels(runs: pd.DataFrame) -> list[str]:
    """The legend label of every run of a results table."""
    return [policy_label(nested(row, "config.policy")) for _, row in runs.iterrows()]


#: The MC-SF journal paper's Table 1 (n = 1000, 50/s, 50 runs): mean and std of the
#: average latency in seconds, by this project's policy labels.
PAPER_TABLE_1 = {
    "MC-SF": (32.112, 0.354), "FCFS (MC-Benchmark)": (46.472, 0.310),
    "alpha-protection (0.3)": (51.933, 0.324), "alpha-protection (0.25)": (51.046, 0.351),
    "alpha/beta-clearing (0.2, 0.2)": (50.401, 0.343),
    "alpha/beta-clearing (0.2, 0.1)": (50.395, 0.360),
    "alpha/beta-clearing (0.1, 0.2)": (53.393, 1.457),
    "alpha/beta-clearing (0.1, 0.1)": (50.862, 0.946),
}


def seed_statistics(table: pd.DataFrame) -> pd.DataFrame:
    """Per policy: mean, std, max, min of the average latency over the completed seeds,
    the count of seeds that did not complete, the ratio to MC-SF's mean, and the
    paper's Table 1 next to it (with our mean over the paper's)."""
    done = table[table["status"] == "completed"]
    policies = sorted(table["policy"].unique())
    stats = (done.groupby("policy")["mean_latency"].agg(["mean", "std", "max", "min", "count"])
             .reindex(policies))
    stats["count"] = stats["count"].fillna(0).astype(int)
    stats["n_livelock"] = (table[table["status"] != "completed"].groupby("policy").size()
                           .reindex(policies, fill_value=0))
    stats["ratio_to_mcsf"] = stats["mean"] / stats["mean"].get("MC-SF", np.nan)
    stats["paper_mean"] = [PAPER_TABLE_1.get(p, (np.nan, np.nan))[0] for p in stats.index]
    stats["paper_std"] = [PAPER_TABLE_1.get(p, (np.nan, np.nan))[1] for p in stats.index]
    stats["paper_ratio_to_mcsf"] = stats["paper_mean"] / PAPER_TABLE_1["MC-SF"][0]
    stats["ours_over_paper"] = stats["mean"] / stats["paper_mean"]
    return stats


def plot_seed_statistics(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """docs/reproducing/mcsf.md A4: mean, std, max and min over seeds of each policy's average
    latency, one figure per requeue position when both were run.

    Only runs that completed enter the statistics; ``n_livelock`` counts the others.
    """
    table = sweep_table(sweep_dir, {"seed": "seed", "requeue": "engine.requeue",
                                    "rate": "arrivals.rate"})
    written = []
    for requeue, part in table.groupby("requeue"):
        stats = seed_statistics(part)
        name = "seed_statistics.png" if requeue == "front" else f"seed_statistics_{requeue}.png"
        written.append(_draw_seed_statistics(stats, out_dir / name, requeue,
                                             int(part["n_requests"].max()),
                                             float(part["rate"].iloc[0])))
    return written


def _draw_seed_statistics(stats: pd.DataFrame, out: Path, requeue: str, n_requests: int,
                          rate: float) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(stats.index, stats["mean"], yerr=stats["std"], capsize=4, color="tab:blue")
    ax.scatter(stats.index, stats["max"], marker="v", color="k", label="max over seeds")
    ax.scatter(stats.index, stats["min"], marker="^", color="k", label="min over seeds")
    for x, (_, row) in enumerate(stats.iterrows()):
        if row["n_livelock"]:
            ax.text(x, 0, f"{int(row['n_livelock'])} livelock", rotation=90, va="bottom",
                    ha="center", fontsize=7)
    ax.scatter(stats.index, stats["paper_mean"], marker="_", s=200, color="tab:red",
               label="paper's Table 1 mean")
    ax.set_ylabel("average latency (s), mean ± std over seeds")
    ax.set_title(f"n = {n_requests} at {rate:g}/s, cleared requests requeued at the {requeue} "
                 f"(paper: n = 1000 at 50/s)", fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    return save_figure(fig, out, stats, index=True)


#: The smallest alpha for which alpha-protection finishes (grid step 0.01), by arrival
#: rate (requests/s): MC-SF conference paper, 7.1 and 7.2 (the journal's 5.2 agrees).
PAPER_SMALLEST_ALPHA = {50: 0.21, 10: 0.24}


#: The MC-SF journal paper's Appendix, Figures 7-8 (50/s) and 10-11 (10/s): the range of
#: each alpha/beta-clearing parameter that gives the lowest average latency, by the swept
#: key's last part and arrival rate (requests/s).
PAPER_A6_BEST_RANGE = {("alpha", 50): (0.15, 0.25), ("alpha", 10): (0.10, 0.25),
                       ("beta", 50): (0.05, 0.25), ("beta", 10): (0.05, 0.20)}
PAPER_A6_FIGURE = {("alpha", 50): 7, ("beta", 50): 8, ("alpha", 10): 10, ("beta", 10): 11}

#: What the A6 axes mean.
_A6_AXIS = {"alpha": "protection level alpha (fraction of M kept free)",
            "beta": "clearing probability beta (per running request on overflow)"}


def plot_sensitivity(sweep_dir: Path, out_dir: Path, x: str, series: str) -> list[Path]:
    """docs/reproducing/mcsf.md A6: average latency vs the config value ``x``, one line per value of
    ``series``, one figure per arrival rate, the paper's best range shaded. Livelocked runs
    are left out of the lines, counted in the legend and listed in the CSV; a panel with no
    line of two finished points says so instead of drawing dots."""
    table = sweep_table(sweep_dir, {"x": x, "series": series, "rate": "arrivals.rate"})
    written = []
    short = {name: name.rsplit(".", 1)[-1] for name in (x, series)}
    for rate, group in table.groupby("rate"):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        drawn = 0
        for value, line in group.sort_values("x").groupby("series"):
            done = line[line["status"] == "completed"]
            failed = len(line) - len(done)
            label = f"{short[series]} = {value:g}"
            if failed == len(line):
                label += f": livelocked in all {failed} runs (no line)"
            elif failed:
                label += f" ({failed} of {len(line)} runs livelocked, left out)"
            ax.plot(done["x"], done["mean_latency"], marker="o", ms=3, label=label)
            drawn += len(done) > 1
        best = PAPER_A6_BEST_RANGE.get((short[x], int(rate)) if float(rate).is_integer()
                                       else None)
        if best:
            ax.axvspan(*best, color="tab:red", alpha=0.12, label=f"paper: lowest latency for "
                       f"{short[x]} in [{best[0]:g}, {best[1]:g}] (Figure "
                       f"{PAPER_A6_FIGURE[(short[x], int(rate))]})")
        if not drawn:
            ax.text(0.5, 0.5, f"no {short[series]} has two finished runs:\nno curve to draw "
                    f"(see the CSV)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(_A6_AXIS.get(short[x], short[x]))
        ax.set_ylabel("average end-to-end latency (s)")
        n = int(group["n_requests"].max())
        ax.set_title(f"alpha/beta-clearing, n = {n:,} at {rate:g}/s", fontsize=10)
        ax.set_ylim(0, None)
        ax.legend(fontsize=7)
        written.append(save_figure(fig, out_dir / f"latency_vs_{short[x]}_rate{rate:g}.png",
                                   group.rename(columns={"x": x, "series": series})))
    return written


def plot_timescale_variants(runs_dir: Path, out_dir: Path) -> list[Path]:
    """The A-series time scale: each variant's A4 mean latency per policy (one sweep per
    folder under ``runs_dir``) next to the paper's Table 1, and our mean over the paper's."""
    frames = []
    for variant in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        stats = seed_statistics(sweep_table(variant, {"seed": "seed"}))
        frames.append(stats.assign(variant=variant.name).reset_index())
    table = pd.concat(frames, ignore_index=True)
    variants = list(table["variant"].unique())
    policies = list(PAPER_TABLE_1)
    width = 0.8 / (len(variants) + 1)
    fig, ax = plt.subplots(figsize=(12, 4.8))
    where = np.arange(len(policies))
    ax.bar(where, [PAPER_TABLE_1[p][0] for p in policies], width, color="0.6",
           label="paper's Table 1")
    for k, variant in enumerate(variants, start=1):
        part = table[table["variant"] == variant].set_index("policy").reindex(policies)
        ax.bar(where + k * width, part["mean"], width, yerr=part["std"], capsize=2,
               label=f"{variant} (mean {np.nanmean(part['ours_over_paper']):.2f}x paper)")
    ax.set_xticks(where + width * len(variants) / 2, policies, rotation=25, fontsize=7,
                  ha="right")
    ax.set_ylabel("average latency (s), n = 1000 at 50/s")
    ax.set_title("A4's absolute latencies under each candidate explanation of the time scale")
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / "timescale.png", table)]

def load_run(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    if not (run_dir / "summary.json").is_file():
        raise InputError(f"{run_dir}: not a finished run (no summary.json)")
    summary = json.loads((run_dir / "summary.json").read_text())
    return (summary, pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"))

