"""The fluid boundary of the refitted linear timing against simulation: WAIT below and above
it, and the capacity study (quick)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replay.config import compose_config
from replay.run import build_and_run
from tests.conftest import DATA_DIR, REPO

# WAIT on B1-low's types under the refitted linear timing (the model's linear_timing), with
# thresholds of about 50 per stage (fluid thresholds at B = 1500): at load 0.9 its admission
# outpaces the arrivals, so the queueing delay settles; at load 1.1 nothing can keep up.
WAIT = ["experiment=b1_wait_low", "timing=linear", "policy=wait", "policy.thresholds=fluid",
        "batch_limit=1500", "seed=1"]


def mean_queueing_delay(load: float, horizon: int) -> tuple[float, dict]:
    result, _, _ = build_and_run(compose_config(
        [*WAIT, f"workload.load={load}", f"workload.duration_s={horizon}"]))
    assert result.status == "completed"
    assert result.requests["evictions"].sum() == 0
    done = result.requests
    return float((done["start"] - done["arrival"]).mean()), result.fluid


@pytest.mark.slow
def test_wait_on_the_refitted_linear_timing_is_stable_below_load_1_only():
    below = {h: mean_queueing_delay(0.9, h) for h in (10, 30)}
    fluid = below[10][1]
    assert fluid["load"] == pytest.approx(0.9)
    assert fluid["coefficients"]["d3"] > 0 and fluid["coefficients"]["d4"] > 0
    assert fluid["load_terms"]["d3_D"] > 0
    assert below[30][0] < 1.2 * below[10][0]          # bounded: no growth with the horizon
    above = {h: mean_queueing_delay(1.1, h)[0] for h in (10, 30)}
    assert above[30] > 2 * above[10]                   # the backlog grows with the horizon


@pytest.mark.slow
def test_capacity_study_quick(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "replay", "experiment=b_capacity",
                           "study.quick=true", f"data_dir={DATA_DIR}",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "capacity.csv")
    assert set(table["fraction"]) == {0.5, 2.0}
    # Every point under both timings: the scenario's own and the fluid model's linear one.
    for timing in ("vidur", "linear"):
        points = table[table["timing"] == timing].set_index("fraction")
        assert points["stable_in_simulation"].to_dict() == {0.5: True, 2.0: False}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [row["timing"] for row in summary["summary"]] == ["vidur", "linear"]
    for row in summary["summary"]:
        assert row["fluid_stable_but_unstable_in_simulation"] == []
        assert row["saturation_above"] < row["saturation_below"]
        assert row["saturation_above_over_boundary"] == 0.5
    assert (tmp_path / "capacity.png").is_file()
