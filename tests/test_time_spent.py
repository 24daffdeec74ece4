"""The results page on time: per target, per series and over the whole, from manifests
and run summaries."""

from __future__ import annotations

import json
from pathlib import Path

from replay.experiments.report import write_time_page
from replay.experiments.targets import MANIFEST, Target
from replay.experiments.time_spent import target_times

TARGETS = {"a1": Target("a study", ("experiment=x",), multirun=False),
           "b1": Target("a sweep", ("experiment=y",)),
           "c9": Target("never run", ("experiment=z",))}


def write_target(root: Path, name: str, seconds: float, runs_s: float, summaries: list[dict],
                 overrides: tuple[str, ...] = ()) -> None:
    out = root / name
    for i, summary in enumerate(summaries):
        (out / "runs" / str(i)).mkdir(parents=True)
        (out / "runs" / str(i) / "summary.json").write_text(json.dumps(summary))
    (out / MANIFEST).write_text(json.dumps({
        "seconds": seconds, "commit": "abc1234", "time": {"runs_s": runs_s, "figures_s": 1.0},
        "config": {"overrides": [f"experiment={name}", *overrides]}}))


def outputs(root: Path, loop_scale: float = 1.0, overrides: tuple[str, ...] = ()) -> Path:
    write_target(root, "a1", 100.0, 99.0, [
        {"wall_time_s": 98.0, "solve_time_s": {"count": 10, "mean": 5.0},
         "lp_time_s": {"count": 10, "mean": 1.0}}], overrides)
    write_target(root, "b1", 50.0 * loop_scale, 48.0 * loop_scale, [
        {"wall_time_s": 10.0 * loop_scale, "loop_time_s": 4.0 * loop_scale,
         "decision_time_s": 1.0, "compile_time_s": 0.5} for _ in range(4)], overrides)
    return root


def test_each_target_row_sums_its_runs_and_keeps_its_phases(tmp_path):
    rows = target_times(TARGETS, outputs(tmp_path)).set_index("target")
    assert list(rows.index) == ["a1", "b1"]  # c9 never ran
    assert rows.loc["a1", "solves_s"] == 60.0 and rows.loc["a1", "runs"] == 1
    b1 = rows.loc["b1"]
    assert (b1["runs"], b1["replays_s"], b1["loops_s"], b1["decisions_s"], b1["compile_s"]) \
        == (4, 40.0, 16.0, 4.0, 2.0)
    assert b1["outside_core_s"] == 2 * 48.0 - 40.0  # two jobs at a time


def test_the_page_totals_the_series(tmp_path):
    after = outputs(tmp_path / "after")
    results = tmp_path / "results"
    results.mkdir()
    page = write_time_page(TARGETS, after, results, quick=False, version="test").read_text()
    assert "| **all** | 2 | 5 | **150** (2 min) |" in page
    assert "Not timed here (never run at full size, or failed): c9." in page
    assert "call a solver (a1) take\n100 s, 67 % of the total" in page
    assert "4 runs spent 56 core-seconds outside any run\n(14.00 s per run)" in page


