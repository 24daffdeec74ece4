"""SLO metrics (``metrics.slo``): attainment and goodput by hand, where they appear, and the
capacity search."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from replay.engine.metrics import SLO, slo_summary, summarize
from replay.errors import ConfigError
from replay.experiments.studies import slo_capacity
from replay.results import SweepJob, run_row, sweep_tables
from tests.conftest import DATA_DIR, replay
from tests.test_vllm_v1 import v1

#: Four requests: TTFT 0.1, 0.5 and 2 s, TPOT 20, 60 and 10 ms; the fourth unfinished.
REQUESTS = pd.DataFrame({"completed": [True, True, True, False],
                         "ttft": [0.1, 0.5, 2.0, np.nan],
                         "tbt_mean": [0.02, 0.06, 0.01, np.nan]})


def test_attainment_counts_requests_meeting_every_objective_over_all_requests():
    record = slo_summary(REQUESTS, 10.0, SLO(ttft_ms=1000, tpot_ms=50))
    # TTFT met by the first two, TPOT by the first and third; both by the first only.
    assert record["slo_ttft_attainment"] == 0.5
    assert record["slo_tpot_attainment"] == 0.5
    assert record["slo_attainment"] == 0.25
    assert record["n_slo_met"] == 1
    assert record["goodput_requests_per_s"] == 0.1
    assert record["slo"] == {"ttft_ms": 1000, "tpot_ms": 50}


def test_an_objective_left_out_is_not_checked():
    record = slo_summary(REQUESTS, 10.0, SLO(ttft_ms=1000))
    assert record["slo_attainment"] == 0.5
    assert record["slo_tpot_attainment"] == 0.75  # every completed request


def test_a_single_token_request_meets_a_tpot_objective():
    one = pd.DataFrame({"completed": [True], "ttft": [0.1], "tbt_mean": [np.nan]})
    assert slo_summary(one, 1.0, SLO(tpot_ms=1))["slo_attainment"] == 1.0


def test_a_replay_summary_has_slo_fields_only_when_objectives_are_set():
    # Unit time: request 0 (s=4, o=3) has TTFT 1 and TPOT 1; request 1 (s=2, o=2) waits behind
    # it (max_num_seqs=1): TTFT 4, TPOT 1. A round counts as a second.
    result = replay([4, 2], [3, 2], v1(max_num_seqs=1), 100, preemption="recompute")
    assert result.requests["ttft"].tolist() == [1, 4]
    assert "slo_attainment" not in summarize(result)
    summary = summarize(result, SLO(ttft_ms=2000, tpot_ms=1000))
    assert summary["slo_attainment"] == 0.5
    assert summary["goodput_requests_per_s"] == 1 / 5


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "1"])
def test_an_objective_must_be_a_positive_number_of_ms(value):
    with pytest.raises(ConfigError, match=r"metrics.slo.ttft_ms=.* it must be a number of "
                                          r"milliseconds > 0"):
        SLO(ttft_ms=value)


def test_a_node_sets_objectives_or_none():
    assert SLO.of(None) is None
    assert SLO.of({"ttft_ms": None, "tpot_ms": None}) is None
    assert SLO.of({"tpot_ms": 30}) == SLO(tpot_ms=30)
    with pytest.raises(ConfigError, match="metrics.slo.p99_ms is not an objective"):
        SLO.of({"p99_ms": 3})


def test_the_sweep_and_results_tables_show_attainment_and_goodput(tmp_path):
    summary = {"status": "completed", "n_completed": 4, "n_requests": 4,
               "config": {"policy": {"_target_": "policies.vllm_v1.VLLMV1"}},
               **slo_summary(REQUESTS, 10.0, SLO(ttft_ms=1000, tpot_ms=50))}
    table, _ = sweep_tables({"job": SweepJob(summary, "a"),
                             "other": SweepJob({"status": "completed"}, "b")})
    assert table["SLO attainment"].tolist()[0] == 0.25
    assert table["goodput (req/s)"].tolist()[0] == 0.1
    assert pd.isna(table["SLO attainment"].tolist()[1])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    row = run_row(tmp_path / "summary.json")
    assert (row["slo_attainment"], row["slo.ttft_ms"], row["slo.tpot_ms"]) == (0.25, 1000, 50)
    assert row["goodput_requests_per_s"] == 0.1


# ------------------------------------------------------------------- capacity search
def step(capacity: float):
    """Attainment 1 up to ``capacity`` requests/s, 0.5 beyond."""
    return lambda rate: 1.0 if rate <= capacity else 0.5


def test_bisection_brackets_the_capacity_within_the_tolerance():
    found = slo_capacity.search(step(3.3), 0.5, 8.0, 0.9, 0.01, 30)
    assert found["capacity"] <= 3.3 < found["next_rate"]
    assert found["next_rate"] - found["capacity"] <= 0.01 * found["capacity"]
    assert min(found["tested"]) == 0.5 and max(found["tested"]) == 8.0


def test_bisection_reports_a_capacity_outside_the_range_and_stops_at_max_runs():
    assert slo_capacity.search(step(0.1), 0.5, 8.0, 0.9, 0.01, 30)["capacity"] is None
    assert slo_capacity.search(step(9.0), 0.5, 8.0, 0.9, 0.01, 30)["capacity"] == 8.0
    assert len(slo_capacity.search(step(3.3), 0.5, 8.0, 0.9, 1e-6, 5)["tested"]) == 5


@pytest.mark.slow
def test_the_capacity_study_runs_a_short_search(tmp_path):
    if not (DATA_DIR / "traces").is_dir():
        pytest.skip(f"data directory {DATA_DIR} not present")
    from replay.config import compose_config

    cfg = compose_config(["experiment=slo_capacity", "workload.n=30", "metrics.slo.ttft_ms=200"])
    summary = slo_capacity.run_study(cfg, tmp_path, rate_low=0.5, rate_high=64.0, max_runs=3)
    table = pd.read_csv(tmp_path / "slo_capacity.csv")
    assert len(table) == summary["n_runs"] == 3
    assert (tmp_path / "slo_capacity.png").is_file()
    assert set(summary["attainment_by_rate"]) == {str(r) for r in table["rate"]}
    with pytest.raises(ConfigError, match="needs an objective"):
        slo_capacity.run_study(compose_config(["experiment=slo_capacity",
                                               "metrics.slo.ttft_ms=null",
                                               "metrics.slo.tpot_ms=null"]),
                               tmp_path, rate_low=0.5, rate_high=1.0)
