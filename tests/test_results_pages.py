"""The generated results pages (replay/experiments/report.py) on a constructed outputs folder:
the verdict column is one sentence, each claim prints its parts with the tolerance, the
index counts verdicts per series and lists the claims that differ, and a figure whose
numbers are empty is withheld with the reason said in its place."""

import json
from pathlib import Path

import pandas as pd

from replay.experiments.report import write_results_pages
from replay.experiments.targets import MANIFEST, TARGETS

TWO = {name: TARGETS[name] for name in ("a1", "a2")}


def _target(root: Path, name: str, trials: pd.DataFrame) -> None:
    out = root / name
    out.mkdir(parents=True)
    trials.to_csv(out / "ratio_hist.csv", index=False)
    (out / "ratio_hist.png").write_bytes(b"\x89PNG not really")
    (out / MANIFEST).write_text(json.dumps({
        "figures": ["ratio_hist.png"], "commit": "abc1234", "date": "2026-01-01 00:00 UTC",
        "config": {"overrides": [f"experiment={name}"]}, "seconds": 1.0, "ran": 1,
        "reused": 0, "failed": 0, "quick": False}))


def test_pages_print_parts_count_verdicts_and_withhold_empty_figures(tmp_path):
    outputs = tmp_path / "outputs"
    # a1: no trial proven optimal, so its histogram is empty; a2: 12 proven trials whose
    # mean ratio 1.2 is far from the paper's 1.047.
    _target(outputs, "a1", pd.DataFrame(columns=["trial", "status", "ratio", "ratio_fcfs"]))
    _target(outputs, "a2", pd.DataFrame({"trial": range(12), "status": "optimal",
                                         "ratio": 1.2, "ratio_fcfs": 1.5}))
    results = tmp_path / "results"
    write_results_pages(TWO, outputs, results, quick=False)
    page = (results / "mcsf.md").read_text()
    # The verdict table: one sentence per claim.
    row = next(line for line in page.splitlines() if line.startswith("| [a2](#a2)"))
    assert "**differs**" in row
    assert row.split("|")[-2].strip() == ("Mean of MC-SF / OPT is 1.2 against the paper's "
                                          "1.047 (1.15x), outside ± 0.02.")
    # The claim's parts table in the target's section, with the tolerance column.
    a2 = page.split("\n## a2\n")[1]
    assert "| kind " in a2 and "| tolerance " in a2 and "± 0.02" in a2
    assert "12 trials proven optimal" in a2
    # The empty figure is not published; the page says why instead.
    a1 = page.split("\n## a1\n")[1].split("\n## ")[0]
    assert "ratio_hist.png is not shown: no trial was proven optimal" in a1
    assert "![a1" not in a1 and not (results / "figures" / "a1" / "ratio_hist.png").exists()
    assert (results / "figures" / "a2" / "ratio_hist.png").is_file()
    # The index counts the verdicts per series and lists the claims that differ.
    index = (results / "index.md").read_text()
    assert "| [A: MC-SF](mcsf.md) | 2 | 0 | 0 | 0 | 1 | 0 | 1 | 0 |" in index
    assert "- [a2](mcsf.md#a2), " in index and "**differs**" in index
    assert "[a1](mcsf.md#a1)" not in index  # not measured is not a difference
