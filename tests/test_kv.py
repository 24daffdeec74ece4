"""KV capacity modes (MODEL.md §2) against the numbers the spec prints."""

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
