"""Multiruns on other launchers (Ray, submitit) give the joblib launcher's results and keep
the skip-finished-runs resume."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.test_cli import run_cli

#: Slow (sweeps through Ray and submitit):
#: CI runs it, and so does `pytest -m slow`.
pytestmark = pytest.mark.slow

SWEEP = ("-m", "experiment=c3_example", "policy=fcfs,mcsf,sorted_f",
         "workload.groups=[{count:1,prompt_len:63,output_len:1},{count:21,prompt_len:1,"
         "output_len:2}],[{count:21,prompt_len:1,output_len:2},{count:1,prompt_len:63,"
         "output_len:1}]")
#: What may differ between launchers: wall-clock times and the run's own record of them.
VOLATILE = {"wall_time_s", "loop_time_s", "decision_time_s", "compile_time_s", "policy_info",
            "config", "input_files", "packages", "summary_sha256"}


def sweep_results(sweep_dir) -> dict:
    results = {}
    for path in sorted(sweep_dir.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        results[path.parent.name] = {k: v for k, v in summary.items() if k not in VOLATILE}
        # As text, so that missing values (NaN) compare equal.
        results[path.parent.name]["requests"] = pd.read_parquet(
            path.parent / "requests.parquet").to_csv(index=False)
    return results


@pytest.fixture(scope="module")
def joblib_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("joblib")
    proc = run_cli(*SWEEP, f"hydra.sweep.dir={out}")
    assert proc.returncode == 0, proc.stderr
    return sweep_results(out)


@pytest.mark.parametrize("launcher", [
    ("hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
     "+hydra.launcher.ray.init.include_dashboard=false"),
    ("hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"),
], ids=["ray", "submitit_local"])
def test_launcher_gives_the_joblib_results_and_resumes(launcher, joblib_results, tmp_path):
    proc = run_cli(*SWEEP, *launcher, f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sweep_results(tmp_path)
    assert len(results) == 6 and results == joblib_results
    again = run_cli(*SWEEP, *launcher, f"hydra.sweep.dir={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    log = again.stdout + again.stderr + "".join(
        p.read_text() for p in tmp_path.rglob("*.log") if p.is_file())
    assert log.count("finished run with the same config") >= 6
