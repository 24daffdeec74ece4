"""Bad config values are one `error:` line naming the key, the value and what is allowed,
with exit status 2, before anything runs (replay.config.validate)."""

from __future__ import annotations

import pytest

from tests.test_cli import run_cli

#: Slow (one subprocess per bad value):
#: CI runs it, and so does `pytest -m slow`.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("overrides", "message"), [
    (["seed=abc"], "seed='abc' is not allowed: it must be a whole number >= 0"),
    (["seed=-3"], "seed=-3"),
    (["workload.n=-1"], "workload.n=-1 is not allowed"),
    (["workload=csv"], "workload.path is required"),
    (["kv.block_size=0"], "kv.block_size=0"),
    (["engine.max_steps=abc"], "engine.max_steps='abc'"),
    (["engine.livelock_window=-1"], "engine.livelock_window=-1"),
    (["engine.requeue=side"], "must be front or back"),
    (["hardware=a100x1", "timing=linear"], "has no linear timing coefficients for hardware"),
    # A model config with no linear coefficients at all (here: deleted from Llama-3-8B's).
    (["model=llama3_8b", "hardware=a100x1", "timing=linear", "~model.linear_timing"],
     "model llama3_8b has no linear timing coefficients (model.linear_timing.a100x1 is missing"),
    (["workload=csv", "workload.path=/"], "is a directory"),
    (["engine.max_starts_per_round=0"], "engine.max_starts_per_round=0"),
    (["policy=sorted_f", "policy.solver=knapsack"], "policy.solver='knapsack'"),
    (["policy=sorted_f", "policy.solver=dp", "policy.phase1_feasibility=staggered"],
     "exact for phase1_feasibility=peak_sum only"),
    (["policy=sorted_lp", "policy.method=simplex"], "policy.method='simplex'"),
    (["experiment=c3_example", "policy=sorted_lp", "policy.grid=1", "policy.time_limit_s=1e-9"],
     "ended with status time_limit"),
    (["prediction=ratio", "prediction.alpha=1.5"], "prediction.alpha=1.5"),
    (["policy=a_min", "policy.variant=a_mid"], "policy.variant='a_mid'"),
])
def test_bad_values_are_one_line_naming_the_key(overrides, message, tmp_path):
    proc = run_cli(*overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and message in lines[-1], lines[-1]
    assert "Traceback" not in proc.stderr
