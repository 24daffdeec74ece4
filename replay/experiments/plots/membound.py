"""Figures of the memory-bound WAIT scenarios (issue 30 item 2: ``b1_wait_low_membound``,
``b1_wait_high_membound``, ``b2_nested_membound``), each a PNG plus the CSV behind it.

One figure per scenario: a row per KV budget M (``kv.tokens``) and a column per metric
(throughput, mean and p99 latency, evictions, recomputed tokens) against the total
arrival rate, one line per policy. Points are means over seeds with 95 % t-intervals
(``mean +- t(0.975, n - 1) * sd / sqrt(n)``; no interval from one seed).

**Recomputed tokens** are not in the run summaries; they are computed here from each
run's ``iterations.parquet`` and ``requests.parquet`` (:func:`recomputed_tokens`): the
token positions the executed iterations processed (prefill tokens plus one per decode
request) minus those a run without evictions would process (each started request's
prompt plus its generated tokens, less the one token its last prefill iteration emits).
Under ``preemption=recompute`` this is the ``s + generated`` every readmission prefills
again; under ``restart`` it also counts the decodes the eviction discarded. Failed
(overflowing) attempts are not counted: their time is charged but no token is processed.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from replay.experiments.plots.common import policy_labels, save_figure  # noqa: E402
from replay.results import runs_under  # noqa: E402

#: Metric column -> axis label (the per-time unit is seconds: these scenarios run timing=vidur).
METRICS = {"throughput": "throughput (output tokens/s)",
           "mean_latency": "mean latency (s)",
           "p99_latency": "p99 latency (s)",
           "evictions": "evictions per run",
           "recomputed_tokens": "recomputed tokens per run"}


def recomputed_tokens(run_dir: Path) -> float:
    """Token positions a run processed again because of evictions (see the module doc)."""
    run_dir = Path(run_dir)
    try:
        it = pd.read_parquet(run_dir / "iterations.parquet",
                             columns=["failed", "prefill_tokens", "decode_requests"])
        req = pd.read_parquet(run_dir / "requests.parquet",
                              columns=["start", "prompt_len", "tokens_generated"])
    except (FileNotFoundError, OSError):
        return math.nan
    executed = it[~it["failed"]]
    work = float(executed["prefill_tokens"].sum() + executed["decode_requests"].sum())
    started = req[req["start"].notna()]
    useful = float((started["prompt_len"] + started["tokens_generated"] - 1).sum())
    return work - useful


def membound_table(sweep_dir: Path) -> pd.DataFrame:
    """One row per run under ``sweep_dir``: policy, M, rate, seed and the five metrics."""
    runs = runs_under(sweep_dir)

    def column(key: str) -> pd.Series:
        return runs.get(key, pd.Series(np.nan, index=runs.index))

    rate = column("config.workload.total_rate").fillna(column("fluid.total_rate"))
    run_dirs = runs["run_dir"].astype(str)
    resolved = [Path(d) if Path(d).is_absolute() else sweep_dir / d for d in run_dirs]
    # A WAIT whose thresholds are fitted to a smaller B than the baselines' (its own
    # policy.batch_limit) is a different policy setting: say so in its label.
    own_b, shared_b = column("config.policy.batch_limit"), column("config.batch_limit")
    labels = [label if pd.isna(b) or b == shared else f"{label} (B = {int(b)})"
              for label, b, shared in zip(policy_labels(runs), own_b, shared_b, strict=True)]
    return pd.DataFrame({
        "policy": labels, "kv_tokens": column("kv_capacity"),
        "epsilon": column("config.policy.epsilon"),
        "total_rate": rate.astype(float), "seed": runs["config.seed"],
        "status": runs["status"], "n_requests": runs["n_requests"],
        "n_completed": runs["n_completed"], "throughput": runs["throughput_tokens_per_s"],
        "mean_latency": runs["mean_latency"], "p99_latency": runs["p99_latency"],
        "evictions": runs["evictions"],
        "recomputed_tokens": [recomputed_tokens(d) for d in resolved],
        # What the policy recorded of its own premises (policy_info): WAIT's condition (11)
        # and fluid batch memory m_pi, Nested WAIT's condition (12).
        "condition_11": column("policy_info.holds"),
        "m_pi": column("policy_info.m_pi"),
        "condition_12": column("policy_info.condition_12.holds"),
        "run": run_dirs})


def _t975(dof: int) -> float:
    try:
        from scipy.stats import t
        return float(t.ppf(0.975, dof))
    except ImportError:  # pragma: no cover - scipy ships with the project's environment
        return 1.96


#: A run's own recorded checks, kept per group of the figure's table: a condition holds for
#: the group when it holds in every run that recorded it; m_pi is the largest recorded.
RECORDED_CHECKS = ("condition_11", "condition_12", "m_pi")


def interval_stats(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean, 95 % t half-width and seed count of every metric per group, and the runs'
    recorded checks (:data:`RECORDED_CHECKS`; empty where no run recorded one)."""
    rows = []
    for key, part in table.groupby(by, sort=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["seeds"] = len(part)
        row["not_completed"] = int((part["status"] != "completed").sum())
        for metric in METRICS:
            values = part[metric].astype(float).dropna().to_numpy()
            n = values.size
            row[metric] = float(values.mean()) if n else math.nan
            row[f"{metric}_ci95"] = (_t975(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
                                     if n > 1 else 0.0)
        for check in RECORDED_CHECKS:
            recorded = part[check].dropna() if check in part else part.iloc[:0, 0]
            if recorded.empty:
                row[check] = None
            elif check == "m_pi":
                row[check] = float(recorded.astype(float).max())
            else:
                row[check] = bool(recorded.astype(bool).all())
        rows.append(row)
    return pd.DataFrame(rows)


def _row_title(rows: str, value: float) -> str:
    if rows == "kv_tokens":
        return f"M = {int(value):,} tokens ({value * 0.5 / 1024:.2g} GiB for 7B)"
    return f"{rows} = {value:g}"


def plot_membound(sweep_dir: Path, out_dir: Path, name: str,
                  saturation_rate: float | None = None, rows: str = "kv_tokens",
                  file: str = "membound.png") -> list[Path]:
    """Per M (or per value of ``rows``, e.g. ``epsilon``) a row of throughput, mean and
    p99 latency, evictions and recomputed tokens vs the total rate, one line per policy
    with 95 % intervals over seeds. With ``saturation_rate`` (the measured S) a top axis
    shows the rate as a fraction of S."""
    table = membound_table(Path(sweep_dir))
    table[rows] = table[rows].fillna(0.0) if rows == "epsilon" else table[rows]
    stats = interval_stats(table, [rows, "policy", "total_rate"])
    budgets = sorted(stats[rows].dropna().unique())
    fig, axes = plt.subplots(len(budgets), len(METRICS), squeeze=False,
                             figsize=(3.6 * len(METRICS), 3.0 * len(budgets) + 0.6))
    for row, m in zip(axes, budgets, strict=True):
        part = stats[stats[rows] == m]
        for policy, line in part.groupby("policy", sort=True):
            line = line.sort_values("total_rate")
            unfinished = int(line["not_completed"].sum())
            label = policy + (f" ({unfinished} runs did not complete)" if unfinished else "")
            for ax, metric in zip(row, METRICS, strict=True):
                ax.errorbar(line["total_rate"], line[metric], yerr=line[f"{metric}_ci95"],
                            marker="o", ms=3, capsize=3, label=label)
        for ax, axis_label in zip(row, METRICS.values(), strict=True):
            ax.set_title(_row_title(rows, m), fontsize=8)
            ax.set_xlabel("total arrival rate (requests/s)")
            ax.set_ylabel(axis_label)
            ax.set_ylim(0, None)
            if saturation_rate:
                top = ax.secondary_xaxis("top", functions=(lambda r: r / saturation_rate,
                                                           lambda f: f * saturation_rate))
                top.set_xlabel("rate / measured saturation rate S", fontsize=7)
        row[0].legend(fontsize=7)
    fig.suptitle(f"{name}: means over seeds with 95 % intervals"
                 + (f" (S = {saturation_rate:g} requests/s)" if saturation_rate else ""))
    return [save_figure(fig, Path(out_dir) / file, stats)]
