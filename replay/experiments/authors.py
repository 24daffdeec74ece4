"""The WAIT authors' throughput metric, and a per-cap table of ``experiment=b1_authors``.

Their simulator (Luoxiaogan/vidur_or, ``vidur/events/batch_end_event.py``) adds the
number of requests in each batch to a running count at the batch's end, and their
drawing notebooks divide that count by the time: their "average throughput" at
horizon ``T`` is

    (sum over batches ending by T of the requests in the batch) / T

from time 0, with no warm-up and no trimmed tail. One unit per request per iteration:
a prefill iteration counts 1 as each decode does, so the unit is "tokens generated,
the first included" per second. Completion is not required: iterations of requests
that are later restarted (vLLM, Sarathi) or dropped (their WAIT's ``force_clear``)
count too. :func:`authors_throughput` computes it from our ``iterations.parquet``
(one row per iteration: ``start_time``, ``duration``, ``batch_size``; failed attempts,
which ran no batch, are left out). Ours, beside it in :func:`cap_table`, is the
completion-based rate in ``summary.json`` (tokens of completed requests per second of
the run, ``throughput_tokens_per_s``).

``python -m replay.experiments.authors SWEEP_DIR [--horizon T ...] [--out FILE.csv]``
prints and saves the per-cap table of a sweep (default ``outputs/sweeps/b1_authors``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from replay.outputs import read_summary

#: Their B1-high figure's horizon: the notebook plots T up to 140 s.
PUBLISHED_HORIZON_S = 140.0
POLICY_NAMES = {"policies.wait.Wait": "WAIT", "policies.nested_wait.NestedWait": "Nested WAIT",
                "policies.vllm.VLLMLike": "vLLM-like", "policies.sarathi.SarathiLike":
                "Sarathi-like"}


def authors_throughput(iterations: pd.DataFrame, horizon: float | None = None) -> float:
    """Requests in each batch summed over the batches that end by ``horizon``, divided by
    ``horizon`` (default: the end of the last batch, i.e. the run's span from time 0)."""
    ran = iterations
    if "failed" in ran.columns:
        ran = ran[~ran["failed"].astype(bool)]
    if ran.empty:
        return 0.0
    end = ran["start_time"].to_numpy(float) + ran["duration"].to_numpy(float)
    if horizon is None:
        horizon = float(end.max())
    if not horizon > 0:
        raise ValueError(f"authors_throughput: the horizon must be > 0, got {horizon}")
    return float(ran["batch_size"].to_numpy(np.int64)[end <= horizon].sum()) / horizon


def run_row(run_dir: Path, horizons=(PUBLISHED_HORIZON_S,)) -> dict | None:
    """One run's line of the per-cap table, or None if it has no summary or iterations."""
    summary = read_summary(run_dir / "summary.json")
    iterations_file = run_dir / "iterations.parquet"
    if summary is None or not iterations_file.is_file():
        return None
    config = summary.get("config", {})
    policy = config.get("policy", {})
    iterations = pd.read_parquet(iterations_file)
    row = {"policy": POLICY_NAMES.get(policy.get("_target_"), policy.get("_target_")),
           "cap": config.get("batch_limit"), "seed": config.get("seed"),
           "status": summary.get("status"),
           "n_requests": summary.get("n_requests"), "n_completed": summary.get("n_completed"),
           "makespan_s": summary.get("makespan"),
           "max_batch": int(iterations["batch_size"].max()) if len(iterations) else 0,
           "authors_at_end": authors_throughput(iterations)}
    for horizon in horizons:
        row[f"authors_at_{horizon:g}s"] = authors_throughput(iterations, horizon)
    row["ours_tokens_per_s"] = summary.get("throughput_tokens_per_s")
    row["ours_requests_per_s"] = summary.get("throughput_requests_per_s")
    row["mean_latency_s"] = summary.get("mean_latency")
    row["evictions"] = summary.get("evictions")
    row["run_dir"] = str(run_dir)
    return row


def cap_table(sweep_dir: Path, horizons=(PUBLISHED_HORIZON_S,)) -> pd.DataFrame:
    """Every finished run under ``sweep_dir``, one line each, by policy and cap."""
    rows = [row for summary in sorted(Path(sweep_dir).rglob("summary.json"))
            if (row := run_row(summary.parent, horizons)) is not None]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    return table.sort_values(["policy", "cap", "seed"], kind="stable").reset_index(drop=True)


def table_figure(runs_dir: Path, out_dir: Path) -> list[Path]:
    """A reproduction target's ``figures`` hook: their metric at the published horizon and
    ours (completed tokens per second) against the cap, one line per policy, saved as
    ``out_dir/b1_authors.png`` with the per-cap table as its CSV (none if no run finished)."""
    from replay.experiments.plots.common import plt, save_figure

    table = cap_table(Path(runs_dir))
    if table.empty:
        return []
    fig, (theirs, ours) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, rows in table.groupby("policy", sort=True):
        rows = rows.groupby("cap", as_index=False).mean(numeric_only=True)
        theirs.plot(rows["cap"], rows[f"authors_at_{PUBLISHED_HORIZON_S:g}s"], marker="o",
                    label=policy)
        ours.plot(rows["cap"], rows["ours_tokens_per_s"], marker="o", label=policy)
    theirs.set_ylabel(f"their throughput metric at T = {PUBLISHED_HORIZON_S:g} s\n"
                      f"(requests per batch summed at batch ends / T, 1/s)")
    ours.set_ylabel("ours: completed output tokens per second")
    for ax in (theirs, ours):
        ax.set_xlabel("cap (batch limit, requests)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("B1-high as the WAIT authors ran it (Llama-3-8B, one A100, decode flat past "
                 "the profile)")
    return [save_figure(fig, Path(out_dir) / "b1_authors.png",
                        table.drop(columns=["run_dir"]))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, nargs="?",
                        default=Path("outputs/sweeps/b1_authors"))
    parser.add_argument("--horizon", type=float, nargs="*", default=[PUBLISHED_HORIZON_S],
                        help="horizons T (seconds) at which to read their metric")
    parser.add_argument("--out", type=Path, default=None,
                        help="CSV (default SWEEP_DIR/authors_metric.csv)")
    args = parser.parse_args(argv)
    table = cap_table(args.sweep_dir, tuple(args.horizon))
    if table.empty:
        print(f"no finished runs under {args.sweep_dir}", file=sys.stderr)
        return 1
    out = args.out or args.sweep_dir / "authors_metric.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    shown = table.drop(columns=["run_dir"])
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(shown.round(1).to_string(index=False))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    from replay.cli import run_or_exit

    sys.exit(run_or_exit(main))
