"""The B series' verdicts (replay/experiments/claims.py) on hand-made figure tables: each
verdict word, and the measured cause each one names, from the numbers that imply it."""

from pathlib import Path

import pandas as pd
import pytest

from replay.experiments.claims import (
    IN_SHAPE,
    MEASURED_CAUSE,
    REPRODUCED,
    UNEXPLAINED,
    fcfs_loss_check,
    fluid_boundary_check,
    membound_check,
    wait_best_check,
)


def _policies(out_dir: Path, wait: float, evictions: float = 0.0, rate: float = 2000.0,
              wait_evictions: float = 0.0, wait_unfinished: int = 0):
    out_dir.mkdir(parents=True)
    pd.DataFrame({"total_rate": rate, "policy": ["WAIT", "vLLM-like", "Sarathi-like"],
                  "throughput": [wait, 100.0, 90.0],
                  "evictions": [wait_evictions, evictions, evictions], "seeds": 3,
                  "not_completed": [wait_unfinished, 0, 0]}).to_csv(
        out_dir / "policies.csv", index=False)
    return out_dir


def test_wait_best_names_the_policys_own_overflows(tmp_path):
    out_dir = _policies(tmp_path / "b4", 83.0, wait_evictions=10_019.0, wait_unfinished=3)
    found, measured = wait_best_check("WAIT")(out_dir)
    assert found == MEASURED_CAUSE
    assert "itself evicts 10,019 times" in measured and "3 of 3 runs did not complete" in measured


def _capacity(outputs: Path, rows: list[dict]) -> None:
    folder = outputs / "b_capacity" / "runs"
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "capacity_summary.csv", index=False)


@pytest.mark.parametrize("wait, evictions, verdict, says", [
    (105.0, 0.0, REPRODUCED, "1.050x"),
    (100.5, 0.0, IN_SHAPE, "1.005x"),
    (95.0, 0.0, MEASURED_CAUSE, "evict nothing"),
    (95.0, 12.0, UNEXPLAINED, "evict 24 times"),
])
def test_wait_best_names_the_measured_cause(tmp_path, wait, evictions, verdict, says):
    out_dir = _policies(tmp_path / "b1_wait_low", wait, evictions)
    found, measured = wait_best_check("WAIT")(out_dir)
    assert found == verdict and says in measured


def test_wait_best_below_the_measured_saturation_is_a_measured_cause(tmp_path):
    # At 55/s every policy was measured stable up to 59/s: no server short of capacity.
    out_dir = _policies(tmp_path / "b4_nested_lmsys_real", 95.0, evictions=3.0, rate=55.0)
    _capacity(tmp_path, [{"scenario": "b4_nested_lmsys_real", "timing": t, "label": p,
                          "saturation_above": 59.1}
                         for t in ("vidur", "linear") for p in ("WAIT", "vLLM-like")])
    found, measured = wait_best_check("WAIT")(out_dir)
    assert found == MEASURED_CAUSE and "below every policy's measured saturation" in measured


def _membound(out_dir: Path, wait: float, wait_evictions: float, baseline_evictions=5.0):
    out_dir.mkdir(parents=True)
    pd.DataFrame({"kv_tokens": 1024, "total_rate": 150.0,
                  "policy": ["WAIT", "vLLM-like", "Sarathi-like"],
                  "throughput": [wait, 100.0, 90.0], "throughput_ci95": [2.0, 2.0, 2.0],
                  "evictions": [wait_evictions, baseline_evictions, 0.0]}).to_csv(
        out_dir / "membound.csv", index=False)
    return out_dir


@pytest.mark.parametrize("wait, wait_evictions, verdict, says", [
    (110.0, 0.0, REPRODUCED, "wins 1, ties 0, loses 0"),
    (101.0, 0.0, UNEXPLAINED, "wins 0, ties 1, loses 0"),  # within the intervals: no gain
    (80.0, 40.0, MEASURED_CAUSE, "in 1 of the 1 losses it evicts itself"),
    (80.0, 0.0, UNEXPLAINED, "it evicts in none of its losses"),
])
def test_membound_wins_ties_and_losses(tmp_path, wait, wait_evictions, verdict, says):
    found, measured = membound_check(_membound(tmp_path / "m", wait, wait_evictions))
    assert found == verdict and says in measured


def test_membound_without_a_binding_point_is_not_judged(tmp_path):
    with pytest.raises(ValueError):  # Claim.judge turns this into "not measured"
        membound_check(_membound(tmp_path / "m", 110.0, 0.0, baseline_evictions=0.0))


def test_fluid_boundary_splits_timing_from_dynamics(tmp_path):
    out_dir = tmp_path / "b_capacity"
    row = {"scenario": "b1_wait_low", "fluid_boundary_rate": 600.0,
           "fluid_label_at_own_rate": "unstable"}
    _capacity(tmp_path, [
        # WAIT: unstable from 0.7 under Vidur and under linear timing too -> its dynamics.
        {**row, "label": "WAIT", "timing": "vidur", "saturation_above_over_boundary": 0.5,
         "fluid_stable_but_unstable_in_simulation": "[0.7, 0.85]"},
        {**row, "label": "WAIT", "timing": "linear", "saturation_above_over_boundary": 0.6,
         "fluid_stable_but_unstable_in_simulation": "[0.7]"},
        # vLLM-like: unstable from 0.7 under Vidur, stable to the boundary under linear.
        {**row, "label": "vLLM-like", "timing": "vidur", "saturation_above_over_boundary": 0.6,
         "fluid_stable_but_unstable_in_simulation": "[0.7]"},
        {**row, "label": "vLLM-like", "timing": "linear", "saturation_above_over_boundary": 1.0,
         "fluid_stable_but_unstable_in_simulation": "[]"}])
    found, measured = fluid_boundary_check(out_dir)
    assert found == MEASURED_CAUSE
    wait, vllm = measured.split("; ")
    assert "0.5x" in wait and "so not the timing model" in wait
    assert "0.6x" in vllm and "the timing model" in vllm


def test_fluid_boundary_that_holds_is_reproduced(tmp_path):
    _capacity(tmp_path, [{"scenario": "b4", "label": "WAIT", "timing": "vidur",
                          "saturation_above_over_boundary": 1.0,
                          "fluid_label_at_own_rate": "stable",
                          "fluid_stable_but_unstable_in_simulation": "[]"}])
    assert fluid_boundary_check(tmp_path / "b_capacity")[0] == REPRODUCED


@pytest.mark.parametrize("fcfs, verdict", [(77.0, REPRODUCED), (95.0, IN_SHAPE),
                                           (100.0, UNEXPLAINED)])
def test_fcfs_loss_range(tmp_path, fcfs, verdict):
    tmp_path.joinpath("policies.csv").write_text(
        "total_rate,policy,throughput,evictions\n"
        f"4,FCFS (WAIT paper),{fcfs},754\n4,WAIT,100,0\n4,alpha-protection (0.0),0,185\n")
    found, measured = fcfs_loss_check(tmp_path)
    assert found == verdict and "alpha-protection (0.0): 0 tokens per round" in measured


def test_fluid_boundary_reads_the_full_length_paper_runs_of_a_stable_scenario(tmp_path):
    # Stable at 30/60 s horizons, but the full paper runs of the policy livelock.
    _capacity(tmp_path, [{"scenario": "b4", "label": "WAIT", "timing": "vidur",
                          "saturation_above_over_boundary": 0.85,
                          "fluid_label_at_own_rate": "stable",
                          "fluid_stable_but_unstable_in_simulation": "[]"}])
    _policies(tmp_path / "b4", 83.0, rate=55.0, wait_evictions=10_019.0, wait_unfinished=3)
    found, measured = fluid_boundary_check(tmp_path / "b_capacity")
    assert found == MEASURED_CAUSE
    assert "b4 at its paper rate 55/s (fluid-stable): WAIT did not complete 3 of 3" in measured


def test_wait_best_judges_every_rate_and_keeps_the_weakest(tmp_path):
    out_dir = tmp_path / "b3"
    out_dir.mkdir()
    rows = [(55.0, "WAIT", 105.0, 0.0), (55.0, "vLLM-like", 100.0, 0.0),
            (550.0, "WAIT", 95.0, 0.0), (550.0, "vLLM-like", 100.0, 4.0)]
    pd.DataFrame(rows, columns=["total_rate", "policy", "throughput", "evictions"]).to_csv(
        out_dir / "policies.csv", index=False)
    found, measured = wait_best_check("WAIT")(out_dir)
    assert found == UNEXPLAINED
    assert "rate 55/s: WAIT 1.050x" in measured and "rate 550/s: WAIT 0.950x" in measured


def test_a_scaled_down_hindsight_study_reports_its_ratios_without_a_verdict(tmp_path):
    from replay.experiments.claims import CLAIMS

    pd.DataFrame({"status": ["optimal", "optimal", "feasible"],
                  "ratio": [1.0, 1.2, 1.5]}).to_csv(tmp_path / "ratio_hist.csv", index=False)
    (claim,) = CLAIMS["a1s"]
    verdict, measured = claim.judge(tmp_path)
    assert verdict == "no check"  # the paper's 1.005 is for n ~ U{40..60}, not this size
    assert measured.startswith("mean 1.100, max 1.200, exact in 1 of 2 proven trials")
    (full,) = CLAIMS["a1"]
    assert full.judge(tmp_path)[0] == "differs"  # at full size the paper's value applies
