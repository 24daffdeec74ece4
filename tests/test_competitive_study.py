"""The MC-SF vs hindsight-optimum study (docs/reproducing/mcsf.md A1/A2): quick runs end to end."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate

from replay.config import compose_config
from replay.errors import InputError
from replay.experiments.studies.competitive import (
    COLUMNS,
    run_trial,
    sample_trial,
    summarize_trials,
)


def study_config(name: str, *overrides: str):
    return compose_config([f"experiment={name}", *overrides])


def run(cfg, out_dir):
    return instantiate(cfg.study, _partial_=True)(cfg=cfg, out_dir=out_dir)


@pytest.mark.parametrize("name,online", [("mcsf_vs_opt_offline", False),
                                         ("mcsf_vs_opt_online", True),
                                         ("mcsf_vs_opt_offline_small", False),
                                         ("mcsf_vs_opt_online_small", True)])
def test_configs_describe_the_experiments(name, online):
    cfg = study_config(name)
    assert cfg.study.trials == 200 and cfg.study.online == online
    assert list(cfg.study.kv_tokens) == [30, 50] and cfg.study.prompt_max == 5
    small = name.endswith("_small")
    assert list(cfg.study.n_requests if not online else cfg.study.horizon) == (
        [5, 12] if small else [40, 60])


@pytest.mark.slow
def test_quick_study_writes_csv_histograms_and_resumes(tmp_path):
    cfg = study_config("mcsf_vs_opt_online_small", "study.quick=true", "study.workers=1",
                       "study.progress=false")
    summary = run(cfg, tmp_path)
    table = pd.read_csv(tmp_path / "trials.csv")
    assert list(table.columns) == list(COLUMNS) and len(table) == 4
    assert (tmp_path / "ratio_hist.png").stat().st_size > 0
    assert (tmp_path / "ratio_upper_hist.png").stat().st_size > 0
    solved = table[table["status"] != "empty"]
    assert summary["proven_optimal"] == int((solved["status"] == "optimal").sum())
    # Proven optimum: best schedule meets the bound and is never worse than either policy.
    proven = solved[solved["status"] == "optimal"]
    assert (proven["best_objective"] == proven["best_bound"]).all()
    assert (solved["best_objective"] <= solved[["tel_mcsf", "tel_fcfs"]].min(axis=1)).all()
    assert (solved["lp_bound"] <= solved["best_objective"]).all()
    assert (solved["ratio"] >= 1).all()

    # Drop one finished trial: the rerun recomputes exactly that one, identically.
    table[table["trial"] != 2].to_csv(tmp_path / "trials.csv", index=False)
    resumed = run(cfg, tmp_path)
    assert resumed["resumed_trials"] == 3
    again = pd.read_csv(tmp_path / "trials.csv").sort_values("trial").reset_index(drop=True)
    same = ["seed", "M", "n", "tel_mcsf", "tel_fcfs", "best_objective", "status"]
    pd.testing.assert_frame_equal(again[same], table.sort_values("trial")
                                  .reset_index(drop=True)[same])


@pytest.mark.slow
def test_rerun_with_other_parameters_is_refused(tmp_path):
    cfg = study_config("mcsf_vs_opt_offline_small", "study.quick=true", "study.workers=1",
                       "study.progress=false", "study.lp_bound=false")
    run(cfg, tmp_path)
    other = study_config("mcsf_vs_opt_offline_small", "study.quick=true", "study.workers=1",
                         "study.progress=false", "study.lp_bound=true")
    with pytest.raises(InputError, match="study with other parameters"):
        run(other, tmp_path)


@pytest.mark.slow
def test_parallel_trials_match_serial(tmp_path):
    serial = study_config("mcsf_vs_opt_offline_small", "study.quick=true", "study.workers=1",
                          "study.progress=false")
    parallel = study_config("mcsf_vs_opt_offline_small", "study.quick=true",
                            "study.workers=2", "study.progress=false")
    run(serial, tmp_path / "serial")
    run(parallel, tmp_path / "parallel")
    key = ["trial", "seed", "M", "n", "tel_mcsf", "tel_fcfs", "best_objective"]
    a = pd.read_csv(tmp_path / "serial" / "trials.csv").sort_values("trial")[key]
    b = pd.read_csv(tmp_path / "parallel" / "trials.csv").sort_values("trial")[key]
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_trial_draws_follow_the_experiment():
    params = {"online": True, "kv_tokens": [30, 50], "horizon": [40, 60], "rate": [0.5, 1.5],
              "n_requests": [40, 60], "prompt_max": 5}
    for seed in range(20):
        requests, kv, drawn = sample_trial(seed, params)
        assert 30 <= kv <= 50 and 40 <= drawn["horizon"] <= 60 and 0.5 <= drawn["rate"] <= 1.5
        assert np.all((requests.arrival >= 1) & (requests.arrival <= drawn["horizon"]))
        assert np.all(np.mod(requests.arrival, 1) == 0)
        assert np.all((requests.prompt_len >= 1) & (requests.prompt_len <= 5))
        assert np.all((requests.output_len >= 1)
                      & (requests.output_len <= kv - requests.prompt_len))
    offline = dict(params, online=False)
    requests, _, drawn = sample_trial(5, offline)
    assert 40 <= len(requests) <= 60 and np.all(requests.arrival == 0)
    assert drawn["horizon"] is None


def test_empty_online_trial_is_counted_not_dropped():
    params = {"online": True, "kv_tokens": [30, 50], "horizon": [1, 1], "rate": [1e-9, 1e-9],
              "n_requests": [1, 1], "prompt_max": 5, "solver": "cpsat", "lp_bound": False}
    row = run_trial(0, 1, params)
    assert row["n"] == 0 and row["status"] == "empty"
    summary = summarize_trials(pd.DataFrame([row], columns=COLUMNS))
    assert summary["empty_trials"] == 1 and summary["proven_optimal"] == 0


@pytest.mark.slow
def test_a_partial_trial_row_is_dropped_and_a_study_extends_in_place(tmp_path):
    tiny = ("study.workers=1", "study.progress=false", "study.lp_bound=false",
            "study.n_requests=[3,4]", "study.time_limit_s=5")
    run(study_config("mcsf_vs_opt_offline_small", *tiny, "study.trials=2"), tmp_path)
    with (tmp_path / "trials.csv").open("a") as fh:
        fh.write("2,1234,40")  # an interrupted write: half a row, no newline
    summary = run(study_config("mcsf_vs_opt_offline_small", *tiny, "study.trials=3"), tmp_path)
    table = pd.read_csv(tmp_path / "trials.csv")
    assert sorted(table["trial"]) == [0, 1, 2]
    assert summary["resumed_trials"] == 2
    assert json.loads((tmp_path / "study.json").read_text())["trials"] == 3
    # Asked for fewer trials than the folder holds: the rows stay on disk, but the log,
    # the summary and study.json all count the trials asked for.
    fewer = run(study_config("mcsf_vs_opt_offline_small", *tiny, "study.trials=2"), tmp_path)
    assert fewer["resumed_trials"] == 2 and fewer["trials"] == 2
    assert json.loads((tmp_path / "study.json").read_text())["trials"] == 2
    assert len(pd.read_csv(tmp_path / "trials.csv")) == 3
