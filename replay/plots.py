"""``python -m replay.plots kv RUN_DIR [RUN_DIR ...] --out FILE.png``: the KV-usage timeline
of finished runs with the capacity ``M`` marked (the figures themselves live in
:mod:`replay.experiments.plots`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from replay.experiments.plots.common import load_run, plot_kv_timelines


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
    from replay.cli import run_or_exit

    run_or_exit(main)
