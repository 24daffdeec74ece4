"""Reproduce the papers' figures: ``python -m replay.reproduce TARGET... [--quick] [--force]``.

Each target runs its experiment config through ``python -m replay`` (a Hydra multirun
where it sweeps), then draws its figures (PNG plus the CSV of the numbers behind
them) into ``outputs/reproduce/<target>/``. A target whose outputs are newer than
every config file is skipped (make-like); inside a target, finished runs are
reused by the runs' own resume check, so an interrupted target continues where
it stopped. ``--quick`` runs a scaled-down version (seconds) into
``outputs/reproduce/<target>-quick/``; ``all`` runs every target.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from replay.plots import (
    plot_kv_of_sweep,
    plot_latency_vs_n,
    plot_metric_bars,
    plot_seed_statistics,
    plot_sensitivity,
)
from replay.run import CONFIG_DIR


def study_figures(run_dir: Path, out_dir: Path) -> list[Path]:
    """A study draws its own figures into its run directory; these are its outputs."""
    return sorted(run_dir.glob("*.png"))

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    description: str
    overrides: tuple[str, ...]
    quick: tuple[str, ...] = ()
    multirun: bool = True
    figures: tuple[Callable[[Path, Path], list[Path]], ...] = ()
    needs_data: bool = False  # reads traces or Vidur profiles from the data directory


#: Quick A3-based runs: few requests, a small M so memory binds, and a cheap Vidur grid
#: (trains in seconds) so the quick run still goes through the Vidur backend.
A3_QUICK = ("kv.tokens=1500",
            "timing.random_forest_grid={num_estimators:[8],max_depth:[8],min_samples_split:[2]}",
            "timing.k_fold_cv_splits=2")

TARGETS: dict[str, Target] = {
    "c3": Target(
        "C3 worked example: TEL of FCFS (both tie orders) and MC-SF, unit time, M = 64",
        ("experiment=c3_example", "policy=fcfs,mcsf",
         "workload.groups=[{count:1,prompt_len:63,output_len:1},"
         "{count:21,prompt_len:1,output_len:2}],[{count:21,prompt_len:1,output_len:2},"
         "{count:1,prompt_len:63,output_len:1}]"),
        figures=(plot_metric_bars,)),
    "a3_small": Target(
        "A3 (scaled down) + A5: latency vs n for the seven policy settings, KV of MC-SF",
        ("experiment=a3_small",), quick=("workload.n=120", "kv.tokens=1500"),
        figures=(plot_latency_vs_n, plot_kv_of_sweep)),
    "a3": Target(
        "A3 + A5: 10,000 LMSYS conversations at 50/s and 10/s, Llama-2-70B on 2 x A100 with "
        "Vidur timing, M = 16,492: latency vs n for the eight policy settings, KV of MC-SF",
        ("experiment=a3",),
        quick=(*A3_QUICK, "workload.n=150"),
        figures=(plot_latency_vs_n, plot_kv_of_sweep), needs_data=True),
    "a4": Target(
        "A4: n = 1,000 at 50/s on the A3 setup, 50 seeds per policy setting: mean, std, max, "
        "min of the average latency",
        ("experiment=a4",), quick=(*A3_QUICK, "workload.n=100", "seed=0,1,2"),
        figures=(plot_seed_statistics,), needs_data=True),
    **{f"a6_{x}": Target(
        f"A6: alpha/beta-clearing's average latency vs {x} on the A3 setup, both demands",
        (f"experiment=a6_{x}",), quick=(*A3_QUICK, "workload.n=150", quick_grid),
        figures=(partial(plot_sensitivity, x=keys[0], series=keys[1]),), needs_data=True)
       for x, keys, quick_grid in (
           ("alpha", ("policy.alpha", "policy.overflow.beta"), "policy.alpha=0.1,0.3"),
           ("beta", ("policy.overflow.beta", "policy.alpha"), "policy.overflow.beta=0.1,0.3"))},
    "a7_small": Target(
        "A7 (scaled down): alpha-protection's endless cycle at alpha = 0.15, smallest alpha "
        "that finishes per demand level",
        ("experiment=a7_small",), quick=("workload.n=120", "kv.tokens=1500",
                                         "study.alpha_step=0.1"),
        multirun=False, figures=(study_figures,)),
    **{name: Target(
        f"{label}: MC-SF and FCFS against the hindsight optimum, 200 seeded trials "
        f"(histograms of TEL/OPT over proven trials and TEL/lower bound over all)",
        (f"experiment={experiment}",), quick=("study.quick=true",), multirun=False,
        figures=(study_figures,))
       for name, label, experiment in (
           ("a1s", "A1s (offline, n ~ U{5..12})", "mcsf_vs_opt_offline_small"),
           ("a2s", "A2s (online, T ~ U{5..12})", "mcsf_vs_opt_online_small"),
           ("a1", "A1 (offline, n ~ U{40..60})", "mcsf_vs_opt_offline"),
           ("a2", "A2 (online, T ~ U{40..60})", "mcsf_vs_opt_online"))},
}


def newest_config_mtime() -> float:
    return max(p.stat().st_mtime for p in CONFIG_DIR.rglob("*.yaml"))


def run_target(name: str, quick: bool = False, force: bool = False,
               outputs_root: Path = REPO / "outputs" / "reproduce") -> list[Path]:
    target = TARGETS[name]
    out_dir = outputs_root / (f"{name}-quick" if quick else name)
    stamp = out_dir / "outputs.txt"
    if not force and stamp.is_file() and stamp.stat().st_mtime > newest_config_mtime():
        outputs = [Path(line) for line in stamp.read_text().split()]
        if all(p.is_file() for p in outputs):
            print(f"{name}: up to date ({stamp})")
            return outputs
    runs_dir = out_dir / "runs"
    overrides = [*target.overrides, *(target.quick if quick else ())]
    if target.multirun:
        command = ["-m", *overrides, f"hydra.sweep.dir={runs_dir}"]
    else:
        command = [*overrides, f"hydra.run.dir={runs_dir}"]
    print(f"{name}: {target.description}\n  python -m replay {' '.join(command)}", flush=True)
    subprocess.run([sys.executable, "-m", "replay", *command], cwd=REPO, check=True)
    outputs = [p for figure in target.figures for p in figure(runs_dir, out_dir)]
    stamp.write_text("\n".join(str(p) for p in outputs) + "\n")
    for path in outputs:
        print(f"  wrote {path} (+ .csv)")
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", choices=[*TARGETS, "all"])
    parser.add_argument("--quick", action="store_true", help="scaled-down version")
    parser.add_argument("--force", action="store_true", help="redraw even if up to date")
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs" / "reproduce",
                        help="where target folders go")
    args = parser.parse_args()
    names = list(TARGETS) if "all" in args.targets else args.targets
    for name in names:
        run_target(name, args.quick, args.force, args.outputs)


if __name__ == "__main__":
    main()
