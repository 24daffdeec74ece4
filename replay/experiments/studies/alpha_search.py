"""docs/reproducing/mcsf.md A7: alpha-protection's endless cycle, and the smallest alpha that
escapes it.

For each arrival rate and requeue position of cleared requests (docs/model.md, requeueing:
``front`` or ``back``) the study replays alpha-protection greedy (``ClearAll``
on overflow) on the experiment's workload for every ``alpha`` on a grid, and
records each run's status. The smallest alpha that finishes is reported two
ways: the smallest finishing grid point, and the smallest from which every
larger grid point finishes too (finishing need not be monotone in alpha). The
KV timeline of ``show_alpha`` at the highest rate shows the cycle (its first
``show_seconds``; a livelocked run goes on for the whole livelock window).

Results are appended to ``alpha_search.csv`` as runs finish (``workers``
processes); a rerun in the same directory skips the ``(requeue, rate, alpha)``
triples already there (rows written before the requeue column existed count as
``front``).
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from replay.engine.metrics import summarize  # noqa: E402
from replay.errors import InputError  # noqa: E402
from replay.experiments.plots.common import (  # noqa: E402
    PAPER_SMALLEST_ALPHA,
    legend_beside,
    plot_kv_timelines,
    save_figure,
)
from replay.run import build_and_run  # noqa: E402
from replay.storage.outputs import (  # noqa: E402
    append_row,
    atomic_write_text,
    drop_partial_last_row,
    summary_json,
)

COLUMNS = ["requeue", "rate", "alpha", "status", "n_completed", "n_requests", "mean_latency",
           "evictions", "n_failed_attempts"]


def _replay(cfg: DictConfig, rate: float, alpha: float, requeue: str = "front"):
    run_cfg = cfg.copy()
    OmegaConf.update(run_cfg, "arrivals.rate", rate)
    OmegaConf.update(run_cfg, "policy.alpha", alpha)
    OmegaConf.update(run_cfg, "engine.requeue", requeue)
    result, _, _ = build_and_run(run_cfg)
    return result


def _row(cfg: DictConfig, requeue: str, rate: float, alpha: float) -> dict:
    summary = summarize(_replay(cfg, rate, alpha, requeue))
    return {"requeue": requeue, "rate": rate, "alpha": alpha,
            **{k: summary[k] for k in COLUMNS[3:]}}


def smallest_finishing(table: pd.DataFrame) -> pd.DataFrame:
    """Per requeue position and rate: the smallest finishing alpha, and the smallest from
    which all larger grid points finish."""
    rows = []
    for (requeue, rate), group in table.sort_values("alpha").groupby(["requeue", "rate"]):
        done = (group["status"] == "completed").to_numpy()
        alphas = group["alpha"].to_numpy()
        tail_done = np.flip(np.logical_and.accumulate(np.flip(done)))
        rows.append({"requeue": requeue, "rate": rate,
                     "smallest_finishing_alpha": alphas[done].min() if done.any() else None,
                     "finishes_from_alpha": alphas[tail_done].min() if tail_done.any() else None})
    return pd.DataFrame(rows)


def plot_alpha_search(table: pd.DataFrame, thresholds: pd.DataFrame, out: Path) -> Path:
    """Fraction of requests completed vs alpha, one line per (requeue, rate), our thresholds
    (dotted) and the paper's smallest alpha per rate (dashed, "paper") marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    colors = {}
    for (requeue, rate), group in table.sort_values("alpha").groupby(["requeue", "rate"]):
        color = colors.setdefault(rate, f"C{len(colors)}")
        label = f"rate {rate:g}/s, requeue {requeue}"
        found = thresholds.loc[(thresholds["rate"] == rate)
                               & (thresholds["requeue"] == requeue), "finishes_from_alpha"].iloc[0]
        if pd.notna(found):
            ax.axvline(found, color=color, ls=":", lw=1)
            label += f": finishes from alpha = {found:g}"
        else:
            label += ": no grid alpha finishes"
        ax.plot(group["alpha"], group["n_completed"] / group["n_requests"], marker="o",
                ms=3, color=color, ls="-" if requeue == "front" else "--", label=label)
    for rate, alpha in PAPER_SMALLEST_ALPHA.items():
        if rate in colors:
            ax.axvline(alpha, color=colors[rate], ls="--", lw=2, alpha=0.5,
                       label=f"paper: rate {rate:g}/s finishes from alpha = {alpha:g}")
    ax.set_xlabel("protection level alpha (fraction of M kept free)")
    ax.set_ylabel("fraction of requests completed")
    ax.set_ylim(0, 1.05)
    n = int(table["n_requests"].max())
    ax.set_title(f"alpha-protection: livelock vs alpha, n = {n:,} (A7)", fontsize=10)
    legend_beside(ax)
    return save_figure(fig, out, table)


def run_study(cfg: DictConfig, out_dir: Path, rates: list[float], alpha_start: float,
              alpha_stop: float, alpha_step: float, show_alpha: float,
              show_seconds: float | None = None, requeues: list[str] = ("front",),
              workers: int = 1) -> dict:
    started = time.perf_counter()  # the study's whole time, as a replay records it
    if not cfg.policy._target_.endswith("AlphaProtection"):
        raise InputError("alpha search: needs policy=protection")
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = np.round(np.arange(alpha_start, alpha_stop + alpha_step / 2, alpha_step), 4)
    csv_path = out_dir / "alpha_search.csv"
    drop_partial_last_row(csv_path)
    table = pd.read_csv(csv_path) if csv_path.is_file() else pd.DataFrame(columns=COLUMNS)
    if "requeue" not in table:
        table.insert(0, "requeue", "front")
        table.to_csv(csv_path, index=False)
    done = set(zip(table["requeue"], table["rate"].astype(float), table["alpha"].astype(float),
                   strict=True))
    todo = [(q, float(r), float(a)) for q in requeues for r in rates for a in grid
            if (q, float(r), float(a)) not in done]
    rows = Parallel(n_jobs=workers, return_as="generator_unordered")(
        delayed(_row)(cfg, *item) for item in todo)
    for row in tqdm(rows, total=len(todo), desc="alpha search", disable=not cfg.output.progress):
        append_row(csv_path, row, COLUMNS)
    table = pd.read_csv(csv_path)
    table = table[table["requeue"].isin(requeues) & table["rate"].isin(rates)]
    thresholds = smallest_finishing(table)
    thresholds.to_csv(out_dir / "smallest_alpha.csv", index=False)
    plot_alpha_search(table, thresholds, out_dir / "alpha_search.png")
    high = max(rates)
    cycle = _replay(cfg, high, show_alpha, requeues[0])
    plot_kv_timelines([(f"alpha-protection, alpha = {show_alpha}, rate {high}/s, requeue "
                        f"{requeues[0]} ({cycle.status})", cycle.iterations, cycle.kv.tokens)],
                      out_dir / "kv_timeline_cycle.png", "The endless cycle (A7)",
                      until=show_seconds)
    summary = {"study": "alpha_search", "runs": len(table),
               "smallest_alpha": thresholds.to_dict(orient="records"),
               "cycle_status": cycle.status, "length_unit": cfg.workload.get("length_unit"),
               "config": OmegaConf.to_container(cfg, resolve=True)}
    summary["wall_time_s"] = time.perf_counter() - started
    atomic_write_text(out_dir / "summary.json", summary_json(summary) + "\n")
    return summary
