"""The memory-bound WAIT scenarios (issue 30 item 2) and B3's threshold margin (item 3):
each new config composes and one tiny quick point runs; at the chosen M the baselines
evict; the figure's recomputed-token count is zero without evictions and positive with."""

from __future__ import annotations

import pytest

from replay.config import compose_config
from replay.experiments.plots.membound import recomputed_tokens
from replay.run import build_and_run
from tests.conftest import DATA_DIR

QUICK = ["timing.random_forest_grid={num_estimators:[8],max_depth:[8],min_samples_split:[2]}",
         "timing.k_fold_cv_splits=2", f"data_dir={DATA_DIR}"]

#: experiment -> (WAIT-side policy, a rate at about 0.95 S, a short horizon in seconds)
SCENARIOS = {"b1_wait_low_membound": ("wait", 285, 0.5),
             "b1_wait_high_membound": ("wait", 39.8, 3),
             "b2_nested_membound": ("nested_b2", 49, 2)}


def needs_vidur():
    if not (DATA_DIR / "vidur").is_dir():
        pytest.skip(f"the Vidur profiles are not under {DATA_DIR}")


@pytest.mark.parametrize("experiment", sorted(SCENARIOS))
def test_membound_config_composes_with_a_small_explicit_budget(experiment):
    cfg = compose_config([f"experiment={experiment}", *QUICK])
    assert cfg.kv._target_.endswith("explicit") and cfg.kv.tokens <= 4096
    assert "vidur" in cfg.timing._target_.lower()
    assert cfg.workload.load is None and cfg.workload.total_rate > 0


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(SCENARIOS))
@pytest.mark.parametrize("policy", ["vllm", "sarathi", "wait_side"])
def test_membound_quick_point_runs_and_baselines_evict(experiment, policy, tmp_path):
    needs_vidur()
    wait_side, rate, horizon = SCENARIOS[experiment]
    name = wait_side if policy == "wait_side" else policy
    cfg = compose_config([f"experiment={experiment}", f"paper_policy={name}", "seed=0",
                          f"workload.total_rate={rate}", f"workload.duration_s={horizon}",
                          *QUICK])
    result, _, _ = build_and_run(cfg)
    assert result.status == "completed"
    evictions = int(result.requests["evictions"].sum())
    if policy != "wait_side":
        assert evictions > 0, f"{name} does not evict at M = {cfg.kv.tokens}"


def test_recomputed_tokens_is_zero_without_evictions_and_positive_with(tmp_path):
    needs_vidur()
    counts = {}
    for tokens in (125885, 1024):
        cfg = compose_config(["experiment=b1_wait_low_membound", "paper_policy=vllm",
                              "seed=0", "workload.total_rate=150", "workload.duration_s=0.5",
                              f"kv.tokens={tokens}", *QUICK])
        result, _, _ = build_and_run(cfg)
        out = tmp_path / str(tokens)
        out.mkdir()
        result.requests.to_parquet(out / "requests.parquet")
        result.iterations.to_parquet(out / "iterations.parquet")
        counts[tokens] = (int(result.requests["evictions"].sum()), recomputed_tokens(out))
    assert counts[125885] == (0, 0.0)
    assert counts[1024][0] > 0 and counts[1024][1] > 0


def test_b3_epsilon_variant_raises_the_thresholds():
    plain = compose_config(["experiment=b3_nested_lmsys", "paper_policy=nested_lmsys", *QUICK])
    margin = compose_config(["experiment=b3_nested_lmsys_epsilon", *QUICK])
    assert plain.policy.epsilon == 0 and margin.policy.epsilon > 0
    assert margin.policy._target_ == plain.policy._target_


@pytest.mark.slow
def test_membound_figure_from_a_tiny_sweep(tmp_path):
    import subprocess
    import sys

    import pandas as pd

    from replay.experiments.plots.membound import plot_membound
    from tests.conftest import REPO

    needs_vidur()
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "replay", "-m", "experiment=b1_wait_low_membound",
                           "paper_policy=vllm,wait", "workload.total_rate=150", "kv.tokens=1024",
                           "workload.duration_s=0.3", "seed=0,1", *QUICK,
                           f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    [png] = plot_membound(sweep, tmp_path / "fig", "B1 low, memory-bound", saturation_rate=300)
    stats = pd.read_csv(png.with_suffix(".csv"))
    assert png.is_file() and set(stats["policy"]) == {"vLLM-like", "WAIT"}
    assert (stats["seeds"] == 2).all()
    assert {"recomputed_tokens", "recomputed_tokens_ci95", "p99_latency_ci95"} <= set(stats)
    assert (stats.set_index("policy").loc["vLLM-like", "recomputed_tokens"] > 0)
