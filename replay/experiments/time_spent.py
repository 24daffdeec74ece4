"""Where the reproduction's time goes: per target and over the whole, from the targets'
manifests and their runs' summaries (the results page ``docs/results/time.md``).

A target's manifest (``outputs.json``) records its two phases, wall-clock: the runs phase
(its ``python -m replay`` commands, parallel jobs and studies included) and the figures
phase. Each run's summary records its own wall time and, inside it, the step loop, the
policy's decisions (LP solves of the LP-based policies included) and compiling; a study's
summary records its solver's time (hindsight optima, LP bounds). Summed over a target's
runs, these say how much of the runs phase was replaying, deciding, solving or compiling;
the runs phase's core-seconds (2 jobs or workers at a time) not inside any run are the
jobs' own overhead: starting processes, composing configs, writing run folders.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from replay.experiments.targets import MANIFEST

#: What a run's summary says it spent, in seconds: the whole run and the parts inside it.
RUN_SECONDS = ("wall_time_s", "loop_time_s", "decision_time_s", "compile_time_s")
#: The solver times a study's summary records, each as statistics over its trials.
STUDY_SOLVES = ("solve_time_s", "lp_time_s")
#: Jobs (or a study's trial workers) at a time: the launcher's and the studies' default.
PARALLEL = 2


def run_sums(runs_dir: Path) -> dict[str, float]:
    """Sums over every run summary under ``runs_dir``: :data:`RUN_SECONDS`, the studies'
    solver seconds (``sum_solve_s``) and the number of runs (``runs``)."""
    sums = {f"sum_{key}": 0.0 for key in RUN_SECONDS}
    sums["sum_solve_s"], sums["runs"] = 0.0, 0
    for path in runs_dir.rglob("summary.json"):
        summary = json.loads(path.read_text())
        sums["runs"] += 1
        for key in RUN_SECONDS:
            value = summary.get(key)
            if isinstance(value, int | float):
                sums[f"sum_{key}"] += value
        for key in STUDY_SOLVES:
            stats = summary.get(key)
            if isinstance(stats, dict) and stats.get("count") and math.isfinite(
                    stats.get("mean", math.nan)):
                sums["sum_solve_s"] += stats["count"] * stats["mean"]
    return sums


def target_times(targets: dict, outputs_root: Path) -> pd.DataFrame:
    """One row per target with a manifest under ``outputs_root``, in the targets' order:
    its phases (wall-clock) and the sums over its runs (recomputed from the runs' summaries
    where an older manifest lacks them)."""
    rows = []
    for name in targets:
        path = outputs_root / name / MANIFEST
        if not path.is_file():
            continue
        manifest = json.loads(path.read_text())
        phases = manifest.get("time") or {}
        sums = run_sums(outputs_root / name / "runs")
        runs_s = phases.get("runs_s", manifest["seconds"])
        inside = sums["sum_wall_time_s"]
        rows.append({
            "target": name, "series": name[0].upper(), "commit": manifest["commit"],
            "config": " ".join(manifest["config"]["overrides"]), "runs": sums["runs"],
            "total_s": manifest["seconds"], "runs_s": runs_s,
            "figures_s": phases.get("figures_s", 0.0), "replays_s": inside,
            "loops_s": sums["sum_loop_time_s"], "decisions_s": sums["sum_decision_time_s"],
            "solves_s": sums["sum_solve_s"], "compile_s": sums["sum_compile_time_s"],
            "outside_core_s": max(PARALLEL * runs_s - inside, 0.0)})
    return pd.DataFrame(rows)


def totals(rows: pd.DataFrame) -> dict:
    """What the page says of :func:`target_times`'s rows as a whole: sums per series and
    over all targets, the longest targets and their share, and the solver-bound studies'
    and the multiruns' parts (``None`` and empty where no target has run)."""
    if rows.empty:
        return {"whole": None, "series": None, "largest": None, "largest_share": 0.0}
    sums = ["runs", "total_s", "runs_s", "figures_s", "replays_s", "loops_s", "decisions_s",
            "solves_s", "compile_s", "outside_core_s"]
    series = rows.groupby("series")[sums].sum().reset_index()  # A, B, C, D
    series["targets"] = rows.groupby("series").size().to_numpy()
    solving, multiruns = rows[rows["solves_s"] > 0], rows[rows["runs"] > 1]
    whole = {**rows[sums].sum().to_dict(), "targets": len(rows), "runs": int(rows["runs"].sum()),
             "solver_targets": ", ".join(solving["target"]),
             "solver_targets_s": float(solving["total_s"].sum()),
             "multirun_runs": int(multiruns["runs"].sum()),
             "multirun_outside_core_s": float(multiruns["outside_core_s"].sum())}
    largest = rows.nlargest(min(5, len(rows)), "total_s")
    return {"whole": whole, "series": series.to_dict("records"),
            "largest": largest.to_dict("records"),
            "largest_share": largest["total_s"].sum() / rows["total_s"].sum()}
