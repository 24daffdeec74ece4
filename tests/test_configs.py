"""Every config file composes (and its components instantiate); bad names fail clearly."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate

from replay.config import CONFIG_DIR, compose_config
from replay.config.validate import validate_config
from tests.conftest import DATA_DIR

CONFIGS = CONFIG_DIR
GROUPS = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONFIGS / g).glob("*.yaml"))]
#: Components that need the data directory (or a slow predictor build) to instantiate; the
#: per-layer profiles exist for some models and GPUs only (tests/test_timing_layer_profile.py
#: instantiates one).
NEEDS_DATA = {("timing", "vidur"), ("timing", "layer_profile")}


def compose_with(*overrides: str):
    return compose_config([f"data_dir={DATA_DIR}", *overrides])


def test_there_is_something_to_check():
    assert {"model", "hardware", "kv", "workload", "arrivals", "timing", "policy",
            "experiment"} <= set(GROUPS)


#: Options that need a value the user must give.
TYPED = ["workload=typed", "arrivals=trace"]
REQUIRED = {("workload", "csv"): ["workload.path=trace.csv"], ("policy", "wait"): TYPED,
            ("paper_policy", "wait"): TYPED, ("paper_policy", "wait_authors"): TYPED,
            ("paper_policy", "nested_authors"): TYPED,
            ("paper_policy", "wait_b0"): [*TYPED,
                                          "workload.types=[{prompt_len:1,output_len:2,rate:4}]"]}
COMPONENTS = ("kv", "timing", "workload", "arrivals", "policy", "prediction")
#: Groups whose options are `# @package _global_` setups rather than one config node.
GLOBAL_GROUPS = {"experiment", "paper_policy", "setup"}
#: Groups that are not in the primary defaults list (experiments include them).
APPENDED = {"setup"}


def instantiate_components(cfg, skip=()):
    for key in COMPONENTS:
        if key not in skip:
            assert instantiate(cfg[key]) is not None, key


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_config_composes_and_instantiates(group, option):
    prefix = "+" if group in APPENDED else ""
    cfg = compose_with(f"{prefix}{group}={option}", *REQUIRED.get((group, option), []))
    if group in GLOBAL_GROUPS:
        if cfg.study is not None:  # a study runs later: its function takes every key given
            study = instantiate(cfg.study, _partial_=True)
            inspect.signature(study.func).bind_partial(**study.keywords)
        else:
            instantiate_components(cfg, skip={"timing"} if cfg.timing.get("profile_dir") else ())
    elif (group, option) in NEEDS_DATA:  # declared parameters checked, no profile read
        assert validate_config(cfg)[group]["_target_"] == cfg[group]["_target_"]
    elif group in COMPONENTS:
        assert instantiate(cfg[group]) is not None
    else:
        assert cfg[group].name == option


def test_default_config_instantiates_every_component():
    instantiate_components(compose_with())


def test_unknown_group_option_names_the_group_and_choices():
    with pytest.raises(MissingConfigException, match="policy"):
        compose_with("policy=does_not_exist")


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigCompositionException, match="alphaa"):
        compose_with("policy=protection", "policy.alphaa=0.3")


def test_linear_timing_follows_model_and_hardware():
    cfg = compose_with("model=llama2_7b", "hardware=a100x1", "timing=linear")
    timing = instantiate(cfg.timing)
    assert timing.source == "llama2_7b_a100x1"
    assert Path(CONFIGS / "timing" / "linear.yaml").is_file()


def test_wait_without_a_typed_workload_is_a_clear_error():
    from hydra.errors import InstantiationException

    from replay.errors import ConfigError

    with pytest.raises(InstantiationException) as caught:
        instantiate(compose_with("policy=wait").policy)
    assert isinstance(caught.value.__cause__, ConfigError)
    assert "typed workload" in str(caught.value.__cause__)
