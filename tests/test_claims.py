"""Verdicts that cannot overstate (replay/experiments/verdicts.py, claims.py): each rule fed
constructed figure tables, with the verdict the rules give worked out by hand. A tie is
reported as a tie, a one-trial sample is not measured, a ratio outside its tolerance with
the right winner holds in shape, a precondition that fails is its own verdict, and a cause
is named only where a run varied it alone."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replay.experiments.claims import CLAIMS
from replay.experiments.plots.common import PAPER_TABLE_1
from replay.experiments.verdicts import (
    AGREES,
    DIFFERS,
    IN_SHAPE,
    MEASURED_CAUSE,
    NO_CHECK,
    NOT_MEASURED,
    Estimate,
    Part,
    Result,
    Tolerance,
    claim_verdict,
    judge_ranking,
    judge_ratios,
    judge_value,
    welch_difference,
)


def _judge(target: str, out_dir: Path, index: int = 0) -> dict:
    return CLAIMS[target][index].judge(out_dir)


def _part(judged: dict, kind: str) -> Result:
    (result,) = [r for p, r in judged["parts"] if p.kind == kind]
    return result


# ---------------------------------------------------------------------------- the rules
def test_welch_interval_by_hand():
    # Means 10 and 12, sd 1 over 5 samples each: s^2/n = 0.2 each, Welch dof = 8,
    # half-width t(0.975, 8) * sqrt(0.4) = 2.306 * 0.6325 = 1.4585.
    a, b = Estimate.from_summary(10, 1, 5), Estimate.from_summary(12, 1, 5)
    diff, half = welch_difference(a, b)
    assert diff == -2 and half == pytest.approx(1.4585, abs=1e-3)


def test_a_ranking_with_overlapping_intervals_is_a_tie_not_an_order():
    table = pd.DataFrame({"policy": ["MC-SF", "FCFS"], "mean": [10.0, 10.5],
                          "std": [1.0, 1.0], "n": [5, 5]})
    found = judge_ranking(table, "MC-SF", True, 3, "mean latency", "seeds")
    assert found.verdict == DIFFERS and "ties with FCFS" in found.sentence
    # Separated by their intervals: MC-SF is ahead.
    table["mean"] = [10.0, 12.0]
    assert judge_ranking(table, "MC-SF", True, 3, "mean latency", "seeds").verdict == AGREES


def test_equal_results_are_reported_equal_whatever_their_row_order():
    # Bit-identical means per n, as MC-SF, FCFS and clearing (0.1, 0.1) have at 10/s.
    n = [1000, 2000, 3000, 4000, 5000]
    same = [7.49, 7.75, 7.86, 7.58, 7.98]
    for order in (["clearing", "MC-SF", "FCFS"], ["FCFS", "clearing", "MC-SF"]):
        table = pd.DataFrame([{"policy": p, "sample": k, "value": v}
                              for p in order for k, v in zip(n, same, strict=True)])
        found = judge_ranking(table, "MC-SF", True, 5, "mean latency", "runs")
        assert found.verdict == DIFFERS
        assert found.sentence.startswith("Not the lowest mean latency: MC-SF equals ")
        assert "clearing" in found.sentence and "FCFS" in found.sentence


def test_a_one_trial_sample_is_not_measured_never_a_verdict():
    found = judge_value(1.117, 1, 1.047, 1.047, Tolerance(absolute=0.02), 10,
                        "mean of MC-SF / OPT", "trials proven optimal")
    assert found.verdict == NOT_MEASURED and "1 trial proven optimal (needs 10)" in found.sentence


def test_a_ratio_outside_its_tolerance_with_the_right_winner_holds_in_shape():
    ratios = pd.DataFrame({"label": ["FCFS", "clearing"], "ratio": [1.35, 4.59], "n": 50})
    found = judge_ratios(ratios, 1.447, 1.663, Tolerance(relative=0.05), 10, "ratios",
                         "MC-SF", "seeds")
    assert found.verdict == IN_SHAPE and "MC-SF wins every comparison" in found.sentence
    # The wrong winner (a ratio below 1) differs; a ratio of exactly 1 is named as equal.
    ratios["ratio"] = [1.0, 0.9]
    found = judge_ratios(ratios, 1.447, 1.663, Tolerance(relative=0.05), 10, "ratios",
                         "MC-SF", "seeds")
    assert found.verdict == DIFFERS
    assert "MC-SF equals FCFS" in found.sentence and "not ahead of clearing" in found.sentence
    ratios["ratio"] = [1.45, 1.6]
    assert judge_ratios(ratios, 1.447, 1.663, Tolerance(relative=0.05), 10, "ratios",
                        "MC-SF", "seeds").verdict == AGREES


def test_a_claims_verdict_is_its_weakest_parts_and_a_failed_premise_comes_first():
    def part(kind):
        return Part(kind, "q", "p", "t", "m", lambda _: None)

    agree, shape = Result(AGREES, "a."), Result(IN_SHAPE, "s.")
    unmeasured, differs = Result(NOT_MEASURED, "n."), Result(DIFFERS, "d.")
    assert claim_verdict([(part("value"), agree), (part("ratio"), shape)]) == (IN_SHAPE, "s.")
    assert claim_verdict([(part("value"), unmeasured), (part("ratio"), shape)])[0] == NOT_MEASURED
    assert claim_verdict([(part("value"), unmeasured), (part("ratio"), differs)])[0] == DIFFERS
    absent = Result("premise absent: memory never binds", "x.")
    assert claim_verdict([(part("ranking"), differs), (part("premise"), absent)]) == (
        "premise absent: memory never binds", "x.")
    assert claim_verdict([])[0] == NO_CHECK


# ----------------------------------------------------------------------- A: MC-SF claims
def _a3_runs(out_dir: Path, rate: int, slopes: dict[str, float], noise: float = 0.0) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = [{"n": n, "rate": rate, "status": "completed", "policy": policy,
             "mean_latency": 5 + slope * n + noise * rng.standard_normal()}
            for policy, slope in slopes.items() for n in range(1000, 10001, 1000)]
    pd.DataFrame(rows).to_csv(out_dir / f"latency_vs_n_runs_rate{rate}.csv", index=False)
    return out_dir


def test_a3_high_demand_slope_ratio_is_judged_against_the_papers_three(tmp_path):
    out = _a3_runs(tmp_path / "a3", 50, {"MC-SF": 0.01, "FCFS": 0.03, "clearing": 0.032})
    judged = _judge("a3", out)
    assert judged["verdict"] == AGREES  # lowest, and the best other slope is 3x
    out = _a3_runs(tmp_path / "b", 50, {"MC-SF": 0.01, "FCFS": 0.016, "clearing": 0.02})
    judged = _judge("a3", out)
    assert judged["verdict"] == IN_SHAPE  # lowest, but 1.6x is outside 3 +- 25 %
    assert _part(judged, "slope").measured == "1.6"


def test_a3_low_demand_ties_are_not_a_win(tmp_path):
    out = _a3_runs(tmp_path / "a3", 10, {"MC-SF": 3e-5, "FCFS": 3e-5, "clearing": 3e-5})
    judged = _judge("a3", out, index=1)
    assert judged["verdict"] == DIFFERS and "MC-SF equals" in judged["sentence"]


def test_a2_on_one_proven_trial_is_not_measured(tmp_path):
    pd.DataFrame({"trial": [147, 148], "status": ["optimal", "time_limit"],
                  "ratio": [1.117, np.nan]}).to_csv(tmp_path / "ratio_hist.csv", index=False)
    judged = _judge("a2", tmp_path)
    assert judged["verdict"] == NOT_MEASURED
    assert "1 trial proven optimal (needs 10)" in judged["sentence"]
    # The scaled-down study reports what it measured without a verdict.
    assert _judge("a2s", tmp_path)["verdict"] == NO_CHECK


def _seed_statistics(out_dir: Path, means: dict[str, float], std: float = 0.3) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"policy": p, "mean": m, "std": std, "count": 50} for p, m in means.items()]
                 ).to_csv(out_dir / "seed_statistics.csv", index=False)
    return out_dir


def test_a4_lowest_but_outside_the_ratio_range_is_in_shape_not_agrees(tmp_path):
    means = {p: mean for p, (mean, _) in PAPER_TABLE_1.items()}
    assert _judge("a4", _seed_statistics(tmp_path / "ok", means))["verdict"] == AGREES
    means["alpha/beta-clearing (0.1, 0.2)"] = 4.59 * means["MC-SF"]  # right winner, too slow
    judged = _judge("a4", _seed_statistics(tmp_path / "shape", means, std=0.5))
    assert _part(judged, "ratio").verdict == IN_SHAPE
    assert judged["verdict"] == IN_SHAPE


def test_a4_mcsf_too_fast_differs_and_a_variant_that_varies_one_factor_names_the_cause(
        tmp_path):
    means = {p: 0.68 * mean for p, (mean, _) in PAPER_TABLE_1.items()}
    out = _seed_statistics(tmp_path / "a4", means, std=0.2)
    judged = _judge("a4", out)
    assert judged["verdict"] == DIFFERS and "(0.68x)" in judged["sentence"]
    # a4_timescale beside it: one variant varied alone brings MC-SF within 10 % of 32.1 s.
    (tmp_path / "a4_timescale").mkdir()
    pd.DataFrame([{"policy": p, "mean": mean * scale, "count": 10, "variant": variant}
                  for variant, scale in (("baseline", 1.0), ("slower_gpu", 1.45))
                  for p, mean in means.items()]).to_csv(
        tmp_path / "a4_timescale" / "timescale.csv", index=False)
    judged = _judge("a4", out)
    mcsf = [r for p, r in judged["parts"] if p.quantity == "MC-SF's mean latency"][0]
    assert mcsf.verdict == MEASURED_CAUSE and "varying slower_gpu alone" in mcsf.sentence


# ------------------------------------------------------------------------ B: WAIT claims
def _policies(out_dir: Path, wait: float, baseline_evictions: float, std: float = 1.0,
              rate: float = 2000.0) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"total_rate": rate, "policy": ["WAIT", "vLLM-like", "Sarathi-like"],
                  "throughput": [wait, 100.0, 90.0], "throughput_std": std, "seeds": 3,
                  "evictions": [0.0, baseline_evictions, baseline_evictions],
                  "not_completed": 0}).to_csv(out_dir / "policies.csv", index=False)
    return out_dir


def test_a_premise_that_fails_is_its_own_verdict_not_a_measured_cause(tmp_path):
    judged = _judge("b1_wait_low", _policies(tmp_path / "b1_wait_low", 96.0, 0.0))
    assert judged["verdict"] == "premise absent: memory never binds (the baselines evict nothing)"


@pytest.mark.parametrize("wait, verdict, says", [
    (110.0, AGREES, "WAIT has the highest throughput"),
    (101.0, DIFFERS, "WAIT ties with vLLM-like"),
    (80.0, DIFFERS, "vLLM-like, Sarathi-like are ahead of WAIT"),
])
def test_where_memory_binds_the_ranking_is_judged_by_intervals(tmp_path, wait, verdict, says):
    judged = _judge("b1_wait_low", _policies(tmp_path / "b1_wait_low", wait, 12.0))
    assert judged["verdict"] == verdict and says in judged["sentence"]


def _membound(out_dir: Path, **wait_columns) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"kv_tokens": 1024, "total_rate": 150.0, "seeds": 5,
                  "policy": ["WAIT", "vLLM-like", "Sarathi-like"],
                  "throughput": [80.0, 100.0, 90.0], "throughput_ci95": 2.0,
                  "evictions": [40.0, 5.0, 0.0],
                  **{k: [v, None, None] for k, v in wait_columns.items()}}).to_csv(
        out_dir / "membound.csv", index=False)
    return out_dir


def test_a_runs_own_recorded_checks_are_read_and_named(tmp_path):
    judged = _judge("b1_wait_low_membound", _membound(tmp_path / "a", m_pi=1500.0))
    assert judged["verdict"].startswith("premise absent: WAIT's own batch does not fit M")
    assert "m_pi = 1,500 > M = 1,024" in judged["verdict"]
    judged = _judge("b1_wait_low_membound", _membound(tmp_path / "b", m_pi=900.0,
                                                      condition_11=False))
    assert judged["verdict"].startswith("premise absent: condition (11) fails")
    # Both hold: WAIT is judged, and loses.
    judged = _judge("b1_wait_low_membound", _membound(tmp_path / "c", m_pi=900.0,
                                                      condition_11=True))
    assert judged["verdict"] == DIFFERS


def _capacity(outputs: Path, rows: list[dict]) -> Path:
    folder = outputs / "b_capacity" / "runs"
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "capacity_summary.csv", index=False)
    return outputs / "b_capacity"


def test_a_cause_needs_a_run_that_varied_it_alone(tmp_path):
    row = {"scenario": "b1_wait_low", "fluid_label_at_own_rate": "unstable"}
    out = _capacity(tmp_path, [
        # vLLM-like: unstable below the boundary under Vidur, stable under linear timing
        # (the timing varied alone): a measured cause.
        {**row, "label": "vLLM-like", "timing": "vidur", "saturation_above_over_boundary": 0.6,
         "fluid_stable_but_unstable_in_simulation": "[0.7]"},
        {**row, "label": "vLLM-like", "timing": "linear", "saturation_above_over_boundary": 1.0,
         "fluid_stable_but_unstable_in_simulation": "[]"}])
    judged = _judge("b_capacity", out)
    assert judged["verdict"] == MEASURED_CAUSE
    # WAIT unstable under linear timing too: the timing model is ruled out, nothing is
    # measured to explain it, so the claim differs.
    (tmp_path / "b_capacity").rename(tmp_path / "old")
    out = _capacity(tmp_path, [
        {**row, "label": "WAIT", "timing": "vidur", "saturation_above_over_boundary": 0.5,
         "fluid_stable_but_unstable_in_simulation": "[0.7, 0.85]"},
        {**row, "label": "WAIT", "timing": "linear", "saturation_above_over_boundary": 0.6,
         "fluid_stable_but_unstable_in_simulation": "[0.7]"}])
    judged = _judge("b_capacity", out)
    assert judged["verdict"] == DIFFERS and "rule it out for 1" in judged["sentence"]


def test_b0_loss_range(tmp_path):
    for fcfs, verdict in ((75.0, AGREES), (95.0, IN_SHAPE), (101.0, DIFFERS)):
        tmp_path.joinpath("policies.csv").write_text(
            "total_rate,policy,throughput,evictions,seeds\n"
            f"4,FCFS (WAIT paper),{fcfs},754,1\n4,WAIT,100,0,1\n")
        assert _judge("b0", tmp_path)["verdict"] == verdict, fcfs


def test_every_part_prints_the_papers_number_tolerance_and_minimum_sample():
    for target, claims in CLAIMS.items():
        for claim in claims:
            for part in claim.parts:
                assert part.kind in {"value", "ratio", "ranking", "slope", "shape", "premise",
                                     "observed"}, (target, part)
                if part.kind not in ("observed", "premise"):
                    assert part.paper and part.tolerance and part.min_sample, (target, part)
