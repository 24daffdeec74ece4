"""Issue 32 class 4: config values that escaped validation.

Every component's parameters are declared once (annotations + ``replay.params.check``
ranges) and checked generically before anything is built. The property test feeds
arbitrary strings and numbers to every key of every policy through the project's own
compose + validate + build path and checks the contract: the run works, or the error is
an input error of one line (what ``python -m replay`` prints after ``error:``, exit 2).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from replay.config import compose_config
from replay.config.cli import check_overrides, input_error_message, is_input_error
from replay.config.validate import RULE_BY_KEY, validate_config
from replay.errors import ConfigError
from replay.run import build_and_run
from tests.conftest import REPO

TYPED = ["workload=typed", "arrivals=trace", "timing=unit", "workload.time_unit=rounds",
         "workload.duration_s=3", "workload.types=[{prompt_len:2,output_len:3,rate:1},"
         "{prompt_len:2,output_len:6,rate:1}]"]
SMALL = ["workload=synthetic", "workload.n=6", "arrivals=all_at_once", "timing=unit",
         "kv.tokens=200"]
#: A small runnable setting per policy (the threshold policies need a typed workload).
BASE = {"wait": [*TYPED, "policy.thresholds=fluid"],
        "nested_wait": [*TYPED, "policy.segments=2", "policy.segment_width=3",
                        "policy.max_stage=7", "policy.ratios=[2,1]"]}
POLICIES = sorted(p.stem for p in (REPO / "configs" / "policy").glob("*.yaml"))
ENGINE_CAP = ["engine.max_steps=3000"]


def base_config(policy: str):
    return compose_config([f"policy={policy}", *BASE.get(policy, SMALL), *ENGINE_CAP])


def outcome(cfg) -> str | None:
    """``None`` if the run works, else the one-line message of its input error; anything
    that is not an input error (a traceback in the command) fails the test."""
    try:
        validate_config(cfg)
        build_and_run(cfg)
    except Exception as exc:
        if not is_input_error(exc):
            raise AssertionError(f"not an input error: {type(exc).__name__}: {exc}") from exc
        message = input_error_message(exc)
        assert message.strip() and "\n" not in message, message
        return message
    return None


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_config_runs_as_shipped(policy):
    cfg = base_config(policy)
    validate_config(cfg)
    # Completed, not merely without an error: a stalled or livelocked run raises nothing.
    assert build_and_run(cfg)[0].status == "completed"


values = st.one_of(
    st.text(max_size=12), st.integers(min_value=-10**12, max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.lists(st.one_of(st.integers(-5, 5), st.floats(-5, 5), st.text(max_size=3)),
             max_size=4))


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_of_any_policy_key_is_a_run_or_one_error_line(policy, data):
    if policy not in _bases:
        _bases[policy] = base_config(policy)
    cfg = _bases[policy]
    keys = [k for k, v in OmegaConf.to_container(cfg.policy).items()
            if not k.startswith("_") and not isinstance(v, dict)] + ["overflow", "no_such_key"]
    key = data.draw(st.sampled_from(keys), label="key")
    value = data.draw(values, label="value")
    trial = copy.deepcopy(cfg)
    OmegaConf.set_struct(trial, False)
    OmegaConf.update(trial, f"policy.{key}", value, merge=False, force_add=True)
    outcome(trial)


_bases: dict = {}


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["workload.n=20", "arrivals.rate=fast"], "arrivals.rate='fast' is not allowed"),
    (["policy=protection", "policy.alpha=abc"], "policy.alpha='abc' is not allowed"),
    (["+policy.foo=1"], "policy.foo is not a parameter of policies.fcfs.FCFSLookahead"),
    ([*TYPED, "policy=wait", "policy.max_wait=abc"], "policy.max_wait='abc'"),
    (["policy=sorted_lp", "policy.grid=abc"], "policy.grid='abc' is not allowed"),
    (["prediction=noisy", "prediction.sigma=abc"], "prediction.sigma='abc'"),
    (["policy=sorted_lp", "policy.max_columns=0"], "policy.max_columns=0 is not allowed"),
    (["policy=sorted_lp", "policy.max_nonzeros=0"], "policy.max_nonzeros=0 is not allowed"),
    (["timing.d0=nan"], "timing.d0=nan is not allowed: it must be a finite number"),
    (["prediction=noisy", "prediction.sigma=1000"], "prediction.sigma=1000 is not allowed"),
    ([*TYPED, "policy=nested_wait", "policy.epsilon=-2"], "policy.epsilon=-2"),
    ([*TYPED, "policy=nested_wait", "policy.batch_limit=-1"], "policy.batch_limit=-1"),
    (["policy=vllm", "kv.block_size=100000"], "kv.block_size=100000 is larger than the KV"),
    ([*TYPED, "policy=wait", "policy.n=[2.5,3]"], "policy.n=[2.5, 3] is not allowed"),
    (["workload=typed", "arrivals=trace", "workload.duration_s=1",
      "workload.types=[{prompt_len:10,output_len:10,rate:100,bogus:1}]"],
     "workload.types[0].bogus is not a parameter"),
    (["workload=typed", "arrivals=trace", "workload.duration_s=1",
      "workload.types=[{prompt_len:10,output_len:10,rate:.inf}]"], "workload.types[0].rate"),
    # Issue 45 items 3 and 9.
    (["workload=fixed", "workload.groups=[{count:-1,prompt_len:10,output_len:10}]"],
     "workload.groups[0].count=-1 is not allowed: it must be a whole number (>= 1)"),
    (["workload=fixed", "workload.groups=[{count:2,prompt_len:10}]"],
     "workload.groups[0].output_len is required by replay.workloads.composite.RequestGroup"),
    (["output.fail_on=banana"], "output.fail_on='banana' is not allowed: it must be a list of "
                                "run statuses, each one of livelock, stalled, step_limit, error"),
    (["output.fail_on=[livelock,banana]"], "output.fail_on=['livelock', 'banana'] is not "
                                           "allowed"),
    (["policy=sorted_lp", "policy.time_limit_s=1e18"],
     "policy.time_limit_s=1e+18 is not allowed: it must be a finite number (> 0 and <= 1e+06)"),
    # A string is true to Python: "no" wrote the table it meant to turn off.
    (["output.request_table=no"], "output.request_table='no' is not allowed: it must be true "
                                  "or false"),
    (["output.progress=1"], "output.progress=1 is not allowed"),
])
def test_values_that_escaped_validation_are_refused_naming_the_key(overrides, fragment):
    with pytest.raises(ConfigError, match=None) as caught:
        validate_config(compose_config(overrides))
    assert fragment in str(caught.value)


@pytest.mark.parametrize("section", ["engine", "output"])
def test_every_key_of_the_runs_own_sections_has_a_rule(section):
    # Components check their own parameters when built; these keys belong to no component,
    # so a key without a rule takes any value unchecked.
    keys = {f"{section}.{key}" for key in compose_config([])[section]}
    assert keys - set(RULE_BY_KEY) == set()


@pytest.mark.parametrize(("overrides", "message"), [
    # A min above its max: numpy's draw raised (uniform), or every length was clipped to the
    # max without a word (the other distributions).
    (["workload=synthetic", "workload.output_min=60"],
     "workload.output_min=60 is above workload.output_max=50: no output length lies between "
     "them"),
    (["workload=synthetic", "workload.distribution=normal", "workload.prompt_min=100",
      "workload.prompt_max=10"],
     "workload.prompt_min=100 is above workload.prompt_max=10: no prompt length lies between "
     "them"),
    (["workload.prompt_mean=5"], "workload.prompt_median=12, workload.prompt_mean=5 and "
                                 "workload.prompt_max=2048: a lognormal fit needs median < mean "
                                 "< max"),
])
def test_a_synthetic_workloads_lengths_that_contradict_are_refused_naming_the_keys(
        overrides, message):
    assert message in outcome(compose_config(["workload.n=5", *overrides]))


def test_unit_time_with_arrivals_between_rounds_is_refused_naming_both_keys():
    message = outcome(compose_config(["workload.n=5", "timing=unit"]))
    assert message == ("arrivals: Poisson gives times between whole rounds, and a unit-time "
                       "replay (timing=unit) counts in rounds; use arrivals=all_at_once or "
                       "arrivals=poisson_rounds")


def test_nested_wait_max_stage_below_the_last_boundary_is_refused():
    cfg = compose_config([*TYPED, "policy=nested_wait", "policy.max_stage=100"])
    message = outcome(cfg)
    assert message and "policy.max_stage=100 must exceed the last boundary 450" in message


def test_a_huge_sigma_is_refused_and_a_large_one_cannot_overflow():
    import numpy as np

    from replay.workloads.prediction import MAX_PREDICTED, Noisy

    with pytest.raises(ConfigError, match="prediction.sigma"):
        Noisy(sigma=1000)
    lo, hi = Noisy(sigma=10).interval(np.full(10_000, 5, dtype=np.int64),
                                      np.random.default_rng(0))
    assert lo.min() >= 1 and hi.max() <= MAX_PREDICTED


def test_the_command_line_answers_a_bad_policy_value_with_one_line(tmp_path):
    done = subprocess.run(["python", "-m", "replay", "workload.n=5", "policy=protection",
                           "policy.alpha=abc", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=Path(REPO), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: policy.alpha='abc' is not allowed")


@pytest.mark.parametrize("override", ["policy=[fcfs,mcsf]", "+workload=[lmsys]"])
def test_a_list_of_group_options_is_refused_not_merged(override):
    group = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError) as caught:
        check_overrides(["workload.n=5", override])
    assert str(caught.value) == (
        f"{override}: a list of {group} options merges them into one config (the last wins key "
        f"by key), so only one would run; to run each, sweep them: python -m replay -m "
        f"{group}={override.split('=[')[1].rstrip(']')}")


def test_a_list_value_of_a_key_and_a_sweep_of_options_are_not_refused():
    check_overrides(["workload.groups=[{count:1,prompt_len:2,output_len:3}]", "policy=fcfs,mcsf",
                     "output.fail_on=[livelock]"])


@pytest.mark.parametrize(("overrides", "message"), [
    (["policy=nope"], "policy=nope: no such option in config group 'policy'; choose one of: "
                      + ", ".join(POLICIES)),
    (["timing.nosuch=1"], "timing.nosuch: no such config key; the keys there are: _target_, "
                          "attention, beyond_profile, cache_dir, device, "),
    (["policy=[fcfs,mcsf]"], "policy=[fcfs,mcsf]: a list of policy options merges them"),
])
def test_a_command_composing_overrides_says_what_replay_says(overrides, message):
    """Issue 45 item 9: every command's overrides go through replay's composition path
    (here timing.shapes, whose vidur timing node the unknown key is looked up in)."""
    from replay.timing.shapes import compose_timing

    with pytest.raises(ConfigError) as caught:
        compose_timing("llama2_7b", "a100x1", overrides)
    assert str(caught.value).startswith(message)
