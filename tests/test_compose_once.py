"""A sweep's loader merges each choice of config files once, and every job's config is still
exactly the one Hydra composes from scratch (replay.config.compose_once)."""

from __future__ import annotations

import pickle

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import RunMode
from omegaconf import OmegaConf

from replay.config import CONFIG_DIR, register_resolvers
from replay.config import compose_once as compose_once_module
from replay.config.compose_once import ComposeOnceLoader, compose_once


def _loader() -> ConfigLoaderImpl:
    register_resolvers()
    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))


def _composed(loader, overrides):
    cfg = loader.load_configuration("config", overrides, RunMode.MULTIRUN)
    return OmegaConf.to_container(cfg, resolve=False)


def test_every_job_gets_the_config_hydra_composes():
    plain, once = _loader(), _loader()
    compose_once(once)
    assert type(once) is ComposeOnceLoader
    jobs = [["policy=mcsf", "seed=1"], ["policy=mcsf", "seed=2", "arrivals.rate=3"],
            ["policy=fcfs", "seed=1"], ["policy=mcsf", "seed=3"],
            ["policy=vllm", "kv=gqa_formula", "model=llama2_70b", "hardware=a100x2"],
            ["policy=fcfs", "seed=1", "+engine.extra_key=1"],
            ["policy=fcfs", "seed=1"], ["workload=shared_prefix", "kv.prefix_cache=block_hash"],
            ["policy=vllm", "kv=gqa_formula", "model=llama2_70b", "hardware=a100x2", "seed=5"]]
    for job in jobs:
        assert _composed(once, job) == _composed(plain, job), job


def test_a_job_that_changes_its_config_leaves_the_next_unchanged():
    once = _loader()
    compose_once(once)
    first = once.load_configuration("config", ["seed=1"], RunMode.MULTIRUN)
    first.kv.tokens = -1
    second = once.load_configuration("config", ["seed=2"], RunMode.MULTIRUN)
    assert second.kv.tokens != -1 and second.seed == 2


def test_a_process_reads_each_config_file_once(monkeypatch):
    from hydra._internal.config_repository import ConfigRepository

    monkeypatch.setattr(compose_once_module, "_repositories", {})  # a fresh process
    once = _loader()
    compose_once(once)
    once.load_configuration("config", ["policy=mcsf", "seed=1"], RunMode.MULTIRUN)
    reads = []
    plain_read = ConfigRepository.load_config
    monkeypatch.setattr(ConfigRepository, "load_config",
                        lambda self, config_path: reads.append(config_path)
                        or plain_read(self, config_path))
    once.load_configuration("config", ["policy=mcsf", "seed=2"], RunMode.MULTIRUN)
    assert reads == []
    # as a sweep worker receives it with each job: a copy
    pickle.loads(pickle.dumps(once)).load_configuration("config", ["policy=mcsf", "seed=3"],
                                                         RunMode.MULTIRUN)
    assert reads == []
    once.load_configuration("config", ["policy=fcfs", "seed=2"], RunMode.MULTIRUN)
    assert reads == ["policy/fcfs"]
