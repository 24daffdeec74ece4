"""The model and hardware config groups: the published shapes, exact parameter counts, and
what the timing backends read from them."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from replay.config import CONFIG_DIR
from replay.engine.kv import weight_parameters

#: kvsched's model config -> aiconfigurator-core's copy of the published config.json.
PUBLISHED = {"llama3_1_8b": "meta-llama--Meta-Llama-3.1-8B",
             "llama3_1_70b": "meta-llama--Meta-Llama-3.1-70B",
             "qwen3_8b": "Qwen--Qwen3-8B", "qwen3_32b": "Qwen--Qwen3-32B"}
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
HARDWARE = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))


def load(group: str, name: str):
    return OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_configs_match_the_published_config_json(name):
    model = load("model", name)
    path = Path(str(resources.files("aiconfigurator_core"))) / "model_configs" / \
        f"{PUBLISHED[name]}_config.json"
    published = json.loads(path.read_text())
    assert model.architecture == published["architectures"][0]
    assert (model.num_layers, model.hidden_size, model.num_q_heads, model.num_kv_heads,
            model.mlp_hidden_size, model.vocab_size, model.max_context,
            model.tie_word_embeddings) == (
        published["num_hidden_layers"], published["hidden_size"],
        published["num_attention_heads"], published["num_key_value_heads"],
        published["intermediate_size"], published["vocab_size"],
        published["max_position_embeddings"], published["tie_word_embeddings"])
    assert model.head_dim == (published.get("head_dim")
                              or published["hidden_size"] // published["num_attention_heads"])
    assert model.qk_norm == (published["model_type"] == "qwen3")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_the_shapes_exact_counts(name):
    model = load("model", name)
    assert sum(weight_parameters(model)) == model.params


def test_llama_3_1_8b_has_its_well_known_8_03_billion_parameters():
    # 2 x 128,256 x 4,096 embedding and head + 32 x 218,112,000 per layer + 4,096.
    assert sum(weight_parameters(load("model", "llama3_1_8b"))) == 8_030_261_248


@pytest.mark.parametrize("name", HARDWARE)
def test_hardware_configs_agree_with_themselves(name):
    hw = load("hardware", name)
    assert hw.name == name and hw.num_gpus == hw.tensor_parallel >= 1
    if "gpu_memory_bytes" in hw and not name.startswith("a100"):
        assert hw.gpu_memory_gb == hw.gpu_memory_bytes / 1e9
    if hw.tensor_parallel > 1:
        assert hw.interconnect_gbps > 0


@pytest.mark.parametrize("name", [n for n in HARDWARE if load("hardware", n).get(
    "aiconfigurator_system")])
def test_every_named_aiconfigurator_system_is_in_the_database(name):
    from aiconfigurator_core.sdk.perf_database import get_version_slots

    system = load("hardware", name).aiconfigurator_system
    assert get_version_slots(system, "vllm"), system
