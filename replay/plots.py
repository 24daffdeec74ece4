"""``python -m replay.plots kv RUN_DIR [RUN_DIR ...] --out FILE.png``: the KV-usage timeline
of finished runs with the capacity ``M`` marked; ``python -m replay.plots cache RUN_DIR ...``:
the prefix cache's hit ratio so far and occupancy over time, for runs with
``kv.prefix_cache=block_hash`` (the figures themselves live in
:mod:`replay.experiments.plots`).

Each folder must hold a finished run whose iteration table is the one the run wrote
(:func:`replay.storage.outputs.table_problem`); a missing, unfinished, failed or damaged run is
one ``error:`` line naming the folder and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from policies.labels import policy_label
from replay.config.cli import CommandParser, run_or_exit
from replay.errors import InputError
from replay.experiments.plots.common import plot_kv_timelines
from replay.experiments.plots.prefix_cache import plot_cache_timelines
from replay.storage.outputs import (
    NO_RESULT_STATUSES,
    ensure_writable_dir,
    read_summary,
    table_problem,
)

TABLE = "iterations.parquet"


def finished_run(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    """The summary and iteration table of the finished run in ``run_dir``, or an
    :class:`~replay.errors.InputError` saying why there is none to plot."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run folder")
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise InputError(f"{run_dir}: not a finished run (no summary.json)")
    summary = read_summary(summary_path)
    if summary is None:
        raise InputError(f"{summary_path}: not a whole JSON object (damaged, or a run "
                         f"interrupted while writing it)")
    if summary.get("status") in NO_RESULT_STATUSES:
        raise InputError(f"{run_dir}: the run failed, nothing to plot "
                         f"({summary.get('message', 'no message')})")
    if not isinstance(summary.get("kv_capacity"), int):
        raise InputError(f"{summary_path}: no kv_capacity (not the summary of a replay)")
    if TABLE not in (summary.get("output_files") or {TABLE: None}):
        raise InputError(f"{run_dir}: the run wrote no {TABLE} (output.iteration_table=false); "
                         f"run it again with output.iteration_table=true")
    problem = table_problem(run_dir, summary, (TABLE,))
    if problem:
        raise InputError(f"{run_dir}: {problem}; run it again")
    return summary, pd.read_parquet(run_dir / TABLE)


def main() -> None:
    parser = CommandParser(
        prog="python -m replay.plots", description="Plot run outputs.")
    sub = parser.add_subparsers(dest="figure", required=True)
    kv = sub.add_parser("kv", help="KV usage over time with M marked")
    kv.add_argument("runs", nargs="+", type=Path, help="run directories")
    kv.add_argument("--out", type=Path, default=Path("kv_timeline.png"))
    cache = sub.add_parser("cache", help="prefix-cache hit ratio and occupancy over time")
    cache.add_argument("runs", nargs="+", type=Path, help="run directories (cache on)")
    cache.add_argument("--out", type=Path, default=Path("cache_timeline.png"))
    args = parser.parse_args()
    ensure_writable_dir(args.out.parent)
    finished = [(run_dir, *finished_run(run_dir)) for run_dir in args.runs]
    labels = [run_label(summary) for _, summary, _ in finished]
    runs = []
    for (run_dir, summary, iterations), label in zip(finished, labels, strict=True):
        if labels.count(label) > 1:  # two runs of one policy: say which folder is which
            label += f", {run_dir.name}"
        if args.figure == "kv":
            runs.append((label, iterations, summary["kv_capacity"]))
            continue
        if summary.get("prefix_cache") is None or "cache_blocks" not in iterations:
            raise InputError(f"{run_dir}: the run had no prefix cache (kv.prefix_cache=none); "
                             f"run it with kv.prefix_cache=block_hash")
        runs.append((label, iterations, summary["kv"]["block_size"], summary["kv_capacity"]))
    plot = plot_kv_timelines if args.figure == "kv" else plot_cache_timelines
    print(plot(runs, args.out))


def run_label(summary: dict) -> str:
    """A run's line label: its policy as people name it, and its status."""
    policy = (summary.get("config") or {}).get("policy") or {}
    name = policy_label(policy) if "_target_" in policy else "policy not recorded"
    return f"{name} ({summary['status']})"


if __name__ == "__main__":
    run_or_exit(main)
