"""The default sweeper (hydra_plugins/kvsched_sweeper): which jobs it composes before any
job runs, and that a config error in any job still stops the sweep before the first."""

from __future__ import annotations

import json

import pytest

from hydra_plugins.kvsched_sweeper.sweeper import representatives
from tests.test_cli import run_cli

GROUPS = {"paper_policy", "workload"}


def group_of(override: str) -> str | None:
    key = override.split("=", 1)[0]
    return key if key in GROUPS else None


def product(*axes: list[str]) -> list[list[str]]:
    import itertools

    return [list(job) for job in itertools.product(*axes)]


def test_one_job_per_choice_of_groups_and_per_new_value():
    batch = product(["paper_policy=fcfs", "paper_policy=mcsf"],
                    [f"seed={s}" for s in range(4)])
    # fcfs with every seed (each brings a new value), then mcsf once (a new choice).
    assert representatives(batch, group_of) == [
        ["paper_policy=fcfs", "seed=0"], ["paper_policy=fcfs", "seed=1"],
        ["paper_policy=fcfs", "seed=2"], ["paper_policy=fcfs", "seed=3"],
        ["paper_policy=mcsf", "seed=0"]]


def test_every_combination_of_group_choices_is_composed():
    batch = product(["paper_policy=fcfs", "paper_policy=mcsf"],
                    ["workload=lmsys", "workload=arxiv"], ["seed=0", "seed=1"])
    chosen = representatives(batch, group_of)
    assert {tuple(job[:2]) for job in chosen} == {tuple(job[:2]) for job in batch}
    assert {o for job in chosen for o in job} == {o for job in batch for o in job}
    # fcfs/lmsys with seed 0, then seed 1 (a new value); each other choice once
    assert len(chosen) == 5


def test_a_sweep_without_groups_composes_one_job_per_new_value():
    batch = product([f"seed={s}" for s in range(3)], ["workload.n=10", "workload.n=20"])
    assert representatives(batch, group_of) == [["seed=0", "workload.n=10"],
                                                ["seed=0", "workload.n=20"],
                                                ["seed=1", "workload.n=10"],
                                                ["seed=2", "workload.n=10"]]


SMALL = ("timing=unit", "arrivals=all_at_once", "workload.n=20", "kv.tokens=2000")


@pytest.mark.parametrize("sweep, message", [
    (("policy=fcfs,mcsf,no_such_policy",), "no_such_policy"),  # a group option, last job
    # a key that only the first job's policy has: the last job's choice does not compose
    (("policy=protection,clearing,fcfs", "policy.alpha=0.2"), "policy.alpha"),
], ids=["group option", "key of another group choice"])
def test_a_bad_override_in_the_last_job_stops_the_sweep_before_any_job(tmp_path, sweep,
                                                                        message):
    proc = run_cli("-m", *SMALL, *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert not list((tmp_path / "sweep").glob("*/summary.json"))  # no job ran


@pytest.mark.slow
def test_a_sweep_runs_every_job(tmp_path):
    proc = run_cli("-m", *SMALL, "policy=fcfs,mcsf", "seed=0,1,2",
                   f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(tmp_path.glob("*/summary.json"))) == 6
    # stdout is the six summaries, a JSON object a line, and nothing else (`| jq .` reads
    # it): Hydra's launcher lines and the sweep's table go to stderr.
    assert [json.loads(line)["status"] for line in proc.stdout.splitlines()] == ["completed"] * 6
    assert "mean ± 95 % interval over seeds" in proc.stderr  # three seeds per policy


@pytest.mark.slow
def test_jobs_that_add_a_key_each_pass_the_early_check(tmp_path):
    # The early check sets each job's values on one config per choice of groups; a job that
    # adds a key gets a copy, or the next job's "+key" would find it there already.
    proc = run_cli("-m", *SMALL, "+note=a,b", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(tmp_path.glob("*/summary.json"))) == 2


def test_the_default_sweeper_config_composes_to_kvscheds_sweeper():
    # configs/hydra/ holds option folders only, so the per-file test of every config
    # (tests/test_configs.py) does not reach it.
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from replay.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=["experiment=a4"])
    sweeper = instantiate(cfg.hydra.sweeper)
    # by name: Hydra's plugin scan may have executed the module again (a new class object)
    assert f"{type(sweeper).__module__}.{type(sweeper).__name__}" == \
        "hydra_plugins.kvsched_sweeper.sweeper.KvschedSweeper"
    assert sweeper.basic.params["paper_policy"].startswith("mcsf,")  # the experiment's sweep
    assert cfg.hydra.launcher.n_jobs == 2  # configs/hydra/launcher/local.yaml
