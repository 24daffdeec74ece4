"""EXPERIMENTS.md A7: alpha-protection's endless cycle, and the smallest alpha that escapes it.

For each arrival rate the study replays alpha-protection greedy (``ClearAll`` on
overflow) on the experiment's workload for every ``alpha`` on a grid, and
records each run's status. The smallest alpha that finishes is reported two
ways: the smallest finishing grid point, and the smallest from which every
larger grid point finishes too (finishing need not be monotone in alpha). The
KV timeline of ``show_alpha`` at the highest rate shows the cycle (its first
``show_seconds``; a livelocked run goes on for the whole livelock window).

Results are appended to ``alpha_search.csv`` as runs finish; a rerun in the
same directory skips the ``(rate, alpha)`` pairs already there.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from replay.errors import InputError  # noqa: E402
from replay.metrics import summarize  # noqa: E402
from replay.plots import plot_kv_timelines  # noqa: E402
from replay.run import build_and_run  # noqa: E402

COLUMNS = ["rate", "alpha", "status", "n_completed", "n_requests", "mean_latency",
           "evictions", "n_failed_attempts"]


def _replay(cfg: DictConfig, rate: float, alpha: float):
    run_cfg = cfg.copy()
    OmegaConf.update(run_cfg, "arrivals.rate", rate)
    OmegaConf.update(run_cfg, "policy.alpha", alpha)
    result, _, _ = build_and_run(run_cfg)
    return result


def smallest_finishing(table: pd.DataFrame) -> pd.DataFrame:
    """Per rate: the smallest finishing alpha, and the smallest from which all larger finish."""
    rows = []
    for rate, group in table.sort_values("alpha").groupby("rate"):
        done = (group["status"] == "completed").to_numpy()
        alphas = group["alpha"].to_numpy()
        tail_done = np.flip(np.logical_and.accumulate(np.flip(done)))
        rows.append({"rate": rate,
                     "smallest_finishing_alpha": alphas[done].min() if done.any() else None,
                     "finishes_from_alpha": alphas[tail_done].min() if tail_done.any() else None})
    return pd.DataFrame(rows)


def plot_alpha_search(table: pd.DataFrame, thresholds: pd.DataFrame, out: Path) -> Path:
    """Fraction of requests completed vs alpha, one line per rate, thresholds marked."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for rate, group in table.sort_values("alpha").groupby("rate"):
        line, = ax.plot(group["alpha"], group["n_completed"] / group["n_requests"], marker="o",
                        ms=3, label=f"rate {rate:g}/s")
        found = thresholds.loc[thresholds["rate"] == rate, "finishes_from_alpha"].iloc[0]
        if pd.notna(found):
            ax.axvline(found, color=line.get_color(), ls=":",
                       label=f"finishes from alpha = {found:g}")
    ax.set_xlabel("alpha")
    ax.set_ylabel("fraction of requests completed")
    ax.set_title("alpha-protection: livelock vs alpha (A7)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out


def run_study(cfg: DictConfig, out_dir: Path, rates: list[float], alpha_start: float,
              alpha_stop: float, alpha_step: float, show_alpha: float,
              show_seconds: float | None = None) -> dict:
    if not cfg.policy._target_.endswith("AlphaProtection"):
        raise InputError("alpha search: needs policy=protection")
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = np.round(np.arange(alpha_start, alpha_stop + alpha_step / 2, alpha_step), 4)
    csv_path = out_dir / "alpha_search.csv"
    table = pd.read_csv(csv_path) if csv_path.is_file() else pd.DataFrame(columns=COLUMNS)
    done = set(zip(table["rate"].astype(float), table["alpha"].astype(float), strict=True))
    todo = [(float(r), float(a)) for r in rates for a in grid if (float(r), float(a)) not in done]
    for rate, alpha in tqdm(todo, desc="alpha search", disable=not cfg.output.progress):
        summary = summarize(_replay(cfg, rate, alpha))
        row = {"rate": rate, "alpha": alpha, **{k: summary[k] for k in COLUMNS[2:]}}
        pd.DataFrame([row], columns=COLUMNS).to_csv(
            csv_path, mode="a", header=not csv_path.is_file(), index=False)
    table = pd.read_csv(csv_path)
    thresholds = smallest_finishing(table)
    thresholds.to_csv(out_dir / "smallest_alpha.csv", index=False)
    plot_alpha_search(table, thresholds, out_dir / "alpha_search.png")
    high = max(rates)
    cycle = _replay(cfg, high, show_alpha)
    plot_kv_timelines([(f"alpha-protection, alpha = {show_alpha}, rate {high}/s "
                        f"({cycle.status})", cycle.iterations, cycle.kv.tokens)],
                      out_dir / "kv_timeline_cycle.png", "The endless cycle (A7)",
                      until=show_seconds)
    summary = {"study": "alpha_search", "runs": len(table),
               "smallest_alpha": thresholds.to_dict(orient="records"),
               "cycle_status": cycle.status,
               "config": OmegaConf.to_container(cfg, resolve=True)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary
