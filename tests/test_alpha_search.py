"""A7's alpha search: the threshold logic by hand, and a tiny run of the study."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replay.experiments.studies.alpha_search import smallest_finishing
from tests.test_cli import run_cli


def test_smallest_finishing_distinguishes_first_success_from_stable_success():
    table = pd.DataFrame({
        "requeue": ["front"] * 7,
        "rate": [50] * 5 + [10] * 2,
        "alpha": [0.1, 0.2, 0.3, 0.4, 0.5, 0.1, 0.2],
        "status": ["livelock", "completed", "livelock", "completed", "completed",
                   "livelock", "livelock"],
    })
    found = smallest_finishing(table).set_index("rate")
    assert (found["requeue"] == "front").all()
    assert found.loc[50, "smallest_finishing_alpha"] == 0.2
    assert found.loc[50, "finishes_from_alpha"] == 0.4
    assert found.loc[10, ["smallest_finishing_alpha", "finishes_from_alpha"]].isna().all()


@pytest.mark.slow
def test_tiny_alpha_search_finds_a_livelock_and_a_finishing_alpha(tmp_path):
    # Up to alpha 0.6: under the refitted linear timing (d0..d4) no alpha up to 0.4 finishes
    # the 50/s runs of this tiny instance; 0.5 does.
    proc = run_cli("experiment=a7_small", "workload.n=120", "kv.tokens=1500",
                   "study.alpha_step=0.1", "study.alpha_stop=0.6", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    table = pd.read_csv(tmp_path / "alpha_search.csv")
    assert len(table) == 2 * 2 * 7  # requeue front/back x rates 50/10 x alpha 0..0.6
    assert sorted(table["requeue"].unique()) == ["back", "front"]
    assert set(table["status"]) == {"livelock", "completed"}
    assert summary["cycle_status"] == "livelock"
    assert all(row["finishes_from_alpha"] is not None for row in summary["smallest_alpha"])
