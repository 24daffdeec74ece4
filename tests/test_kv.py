"""KV capacity modes (docs/model.md) against the numbers the spec prints."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from replay.engine.kv import explicit, gqa_formula, mha_formula

LLAMA2_70B = OmegaConf.load("configs/model/llama2_70b.yaml")
LLAMA2_7B = OmegaConf.load("configs/model/llama2_7b.yaml")
A100X2 = OmegaConf.load("configs/hardware/a100x2.yaml")
A100X1 = OmegaConf.load("configs/hardware/a100x1.yaml")


def test_papers_default_is_explicit_16492():
    kv = explicit()
    assert (kv.tokens, kv.mode) == (16_492, "explicit")


def test_mha_formula_gives_7629_for_70b_on_two_a100():
    assert mha_formula(LLAMA2_70B, A100X2).tokens == 7_629


def test_gqa_formula_gives_61035_for_70b_on_two_a100():
    kv = gqa_formula(LLAMA2_70B, A100X2)
    assert (kv.tokens, kv.mode) == (61_035, "gqa_formula")
    assert kv.detail["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2


def test_7b_on_one_a100_mha_equals_gqa():
    # Llama-2-7B has as many KV heads as query heads: (80 - 14) GB / 512 KiB per token.
    assert mha_formula(LLAMA2_7B, A100X1).tokens == gqa_formula(LLAMA2_7B, A100X1).tokens == (
        int((80e9 - 14e9) // (2 * 32 * 4096 * 2)))


def test_activation_reserve_and_blocks_reduce_capacity():
    reserved = gqa_formula(LLAMA2_70B, A100X2, activation_reserve=0.1)
    assert reserved.tokens == int((160e9 * 0.9 - 140e9) // (2 * 80 * 8 * 128 * 2))
    assert explicit(16_492, block_size=16).tokens == 16_480


def test_model_that_does_not_fit_is_an_error():
    with pytest.raises(ValueError, match="do not fit"):
        mha_formula(LLAMA2_70B, A100X1)


def test_llama3_8b_on_one_a100_composes_and_gives_its_gqa_capacity():
    from hydra.utils import instantiate

    from replay.config import compose_config

    cfg = compose_config(["model=llama3_8b", "hardware=a100x1", "kv=gqa_formula"])
    assert (cfg.model.num_layers, cfg.model.num_q_heads, cfg.model.num_kv_heads,
            cfg.model.head_dim, cfg.model.hidden_size) == (32, 32, 8, 128, 4096)
    kv = instantiate(cfg.kv)
    # K and V, 32 layers, 8 KV heads of 128 dimensions, 2 bytes: 131,072 bytes (128 KiB)
    # per token. Free memory: 80e9 - 8e9 parameters * 2 bytes = 64e9 bytes.
    # 64,000,000,000 // 131,072 = 488,281 (488,281.25).
    assert kv.detail["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert (kv.tokens, kv.mode) == (488_281, "gqa_formula")
    # In vLLM's blocks of 16: 30,517 whole blocks = 488,272 slots.
    assert instantiate(cfg.kv, block_size=16).tokens == 30_517 * 16 == 488_272
    # The printed MHA formula ignores the 8 KV heads: 2 * 32 * 4096 * 2 = 524,288 bytes, a
    # quarter of the true capacity: 64e9 // 524,288 = 122,070.
    assert mha_formula(cfg.model, cfg.hardware).tokens == 122_070
