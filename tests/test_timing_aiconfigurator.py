"""timing=aiconfigurator: step prices from aiconfigurator-core's kernel tables
(replay/timing/aiconfigurator_timing.py, replay/timing/aiconfigurator_step.py).

The step function is checked by hand on small made-up tables; the backend against
aiconfigurator's own evaluation of the same operations, on small grids so that the
tables build in about a second (they are cached in a per-test folder).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from replay.engine.timing import BatchShape
from replay.errors import ConfigError
from replay.timing.aiconfigurator_step import kernel_db_seconds
from replay.timing.aiconfigurator_timing import (
    AIConfiguratorTiming,
    geometric_axis,
    hf_config,
)

LLAMA_8B = dict(architecture="LlamaForCausalLM", num_layers=32, hidden_size=4096,
                num_q_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
                vocab_size=128256)
SMALL_GRIDS = dict(max_context=4096, max_tokens=512, max_sequences=64, max_decode_batch=64)


def shape(new_tokens, context) -> BatchShape:
    new_tokens = np.asarray(new_tokens, dtype=np.int64)
    return BatchShape(new_tokens, np.asarray(context, dtype=np.int64), new_tokens > 1)


# ------------------------------------------------------------------- the step, by hand
#: 0.01 ms per token; LM head 0.5 ms + 0.1 per request; prefill attention 0.1 ms per chunk
#: token + 0.01 per cached token; decode attention 0.001 ms per decode and key. All
#: bilinear, so the interpolation reproduces them exactly inside the grids.
TOKEN_MS = np.arange(101) * 0.01
LOGITS_MS = np.concatenate(([0.0], 0.5 + 0.1 * np.arange(1, 11)))
CHUNKS, PREFIXES = np.array([2.0, 4.0, 8.0]), np.array([0.0, 8.0])
BATCHES, KEYS = np.array([1.0, 2.0, 4.0]), np.array([1.0, 9.0])
PREFILL_MS = 0.1 * CHUNKS[:, None] + 0.01 * PREFIXES[None, :]
DECODE_MS = 0.001 * BATCHES[:, None] * KEYS[None, :]
TABLES = (TOKEN_MS, LOGITS_MS, CHUNKS, PREFIXES, PREFILL_MS, BATCHES, KEYS, DECODE_MS)


def price_ms(new_tokens, context) -> float:
    batch = shape(new_tokens, context)
    return kernel_db_seconds(batch.new_tokens, batch.context, batch.is_prefill, batch.size,
                             *TABLES) * 1e3


def test_one_decode_by_hand():
    # 1 token, 1 request (0.6 ms), 1 decode reading its 4 cached keys and its own: 0.005 ms.
    assert price_ms([1], [4]) == pytest.approx(0.01 + 0.6 + 0.005, rel=1e-12)


def test_one_prefill_by_hand():
    assert price_ms([4], [0]) == pytest.approx(0.04 + 0.6 + 0.4, rel=1e-12)


def test_a_mixed_batch_by_hand():
    # A 4-token chunk on 8 cached tokens (0.48 ms) and two decodes of 2 and 6 cached tokens:
    # 2 decodes reading 4 + 1 = 5 keys each (0.01 ms); 6 tokens, 3 requests.
    assert price_ms([4, 1, 1], [8, 2, 6]) == pytest.approx(0.06 + 0.8 + 0.48 + 0.01, rel=1e-12)


def test_beyond_the_grids_prices_grow_with_the_work():
    # 200 tokens: twice the last tabulated price; a 16-token chunk: the 8-token edge price
    # times the ratio of causal query-key pairs, 16 * 8.5 / (8 * 4.5); 8 decodes of 99
    # cached keys: the (4, 9) edge times (8 * 100) / (4 * 9).
    tokens = shape([200], [0])
    big = kernel_db_seconds(tokens.new_tokens, tokens.context, tokens.is_prefill, 1, *TABLES)
    assert big * 1e3 == pytest.approx(2.0 + 0.6 + 0.8 * 200 * 100.5 / (8 * 4.5), rel=1e-12)
    assert price_ms([16], [0]) == pytest.approx(0.16 + 0.6 + 0.8 * 16 * 8.5 / (8 * 4.5),
                                                rel=1e-12)
    assert price_ms([1] * 8, [99] * 8) == pytest.approx(
        0.08 + 1.3 + 0.036 * (8 * 100) / (4 * 9), rel=1e-12)


def test_an_empty_batch_costs_nothing():
    assert price_ms([], []) == 0.0


def test_geometric_axis_is_dense_low_and_ends_on_its_edge():
    axis = geometric_axis(1, 100)
    assert axis[:16].tolist() == list(range(1, 17)) and axis[-1] == 100
    assert np.all(np.diff(axis) > 0) and np.all(axis[16:] / axis[15:-1] < 1.22)


# ------------------------------------------------------- the backend against the database
@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCHED_CACHE_DIR", str(tmp_path))
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return tmp_path


def engine(system, tp=1, **model):
    """aiconfigurator's own compiled model of the same config, to evaluate operations."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    from replay.timing.aiconfigurator_timing import _model_folder

    config = hf_config(**{**LLAMA_8B, "max_context": 4096, **model})
    return EngineHandle.compile(str(_model_folder(config)), system, "vllm",
                                backend_version="current", tp_size=tp)


def op_sum(values, keep=lambda name: True) -> float:
    return sum(v for name, v, *_ in values if keep(name))


def test_decode_and_prefill_are_aiconfigurators_own_sums(private_cache):
    timing = AIConfiguratorTiming(system="h100_sxm", **LLAMA_8B, **SMALL_GRIDS)
    handle = engine("h100_sxm")
    ops = list(range(14))
    token_ops = lambda name: not name.endswith(("attention", "logits_gemm"))  # noqa: E731
    # 8 decodes with 1023 cached tokens: every token-wise operation at 8 tokens, the LM head
    # for 8 requests, generation attention for 8 sequences of 1024 keys.
    expected = (op_sum(handle.evaluate_context_ops(ops, batch_size=1, s=8), token_ops)
                + op_sum(handle.evaluate_context_ops([9], batch_size=8, s=1))
                + op_sum(handle.evaluate_generation_ops([3], batch_size=8, s=1024)))
    assert timing.duration(shape([1] * 8, [1023] * 8)) * 1e3 == pytest.approx(expected, rel=1e-9)
    # A 256-token prompt on 512 cached tokens: context attention with that prefix.
    expected = (op_sum(handle.evaluate_context_ops(ops, batch_size=1, s=256), token_ops)
                + op_sum(handle.evaluate_context_ops([9], batch_size=1, s=1))
                + op_sum(handle.evaluate_context_ops([3], batch_size=1, s=256, prefix=512)))
    assert timing.duration(shape([256], [512])) * 1e3 == pytest.approx(expected, rel=1e-9)
    info = timing.describe()
    assert info["resolved_version"] == "0.24.0" and info["operation_sources"]["context_qkv_gemm"]
    assert all(len(record["sha256"]) == 64 for record in info["files"])


def test_between_grid_points_the_tables_stay_within_one_percent(private_cache):
    from replay.timing.aiconfigurator_step import decode_attention_ms, prefill_attention_ms

    timing = AIConfiguratorTiming(system="h100_sxm", **LLAMA_8B, **SMALL_GRIDS)
    handle = engine("h100_sxm")
    rng = np.random.default_rng(3)
    for _ in range(40):
        chunk, prefix = int(rng.integers(2, 512)), int(rng.integers(0, 4000))
        direct = op_sum(handle.evaluate_context_ops([3], batch_size=1, s=chunk, prefix=prefix))
        table = prefill_attention_ms(timing.chunk_axis, timing.prefix_axis, timing.prefill_ms,
                                     float(chunk), float(prefix))
        assert table == pytest.approx(direct, rel=0.01)
        batch, keys = int(rng.integers(1, 64)), int(rng.integers(1, 4097))
        direct = op_sum(handle.evaluate_generation_ops([3], batch_size=batch, s=keys))
        table = decode_attention_ms(timing.batch_axis, timing.kv_axis, timing.decode_ms,
                                    float(batch), float(keys))
        assert table == pytest.approx(direct, rel=0.01)


def test_tensor_parallel_prices_include_the_all_reduces(private_cache):
    timing = AIConfiguratorTiming(system="h100_sxm", tensor_parallel=2, **LLAMA_8B,
                                  **SMALL_GRIDS)
    handle = engine("h100_sxm", tp=2)
    values = handle.evaluate_context_ops(list(range(14)), batch_size=1, s=100)
    all_reduce = op_sum(values, lambda name: "_ar" in name)
    assert all_reduce > 0
    expected = op_sum(values, lambda name: not name.endswith(("attention", "logits_gemm")))
    assert timing.token_ms[100] == pytest.approx(expected, rel=1e-12)


def test_prices_grow_with_context_and_decodes(private_cache):
    timing = AIConfiguratorTiming(system="rtx_pro_6000_server", **LLAMA_8B, **SMALL_GRIDS)
    by_context = [timing.duration(shape([1] * 16, [c] * 16)) for c in (64, 256, 1024, 4000)]
    by_decodes = [timing.duration(shape([1] * n, [512] * n)) for n in (1, 8, 32, 64)]
    by_prompt = [timing.duration(shape([t], [0])) for t in (16, 64, 256, 512)]
    for series in (by_context, by_decodes, by_prompt):
        assert all(a < b for a, b in zip(series, series[1:], strict=False)), series


def test_qwen3_and_a_config_group_compose(private_cache):
    from hydra.utils import instantiate

    from replay.config import compose_config

    cfg = compose_config(["model=qwen3_8b", "hardware=h200x1", "timing=aiconfigurator",
                          "timing.max_tokens=256", "timing.max_sequences=32",
                          "timing.max_decode_batch=32"])
    timing = instantiate(cfg.timing)
    assert (timing.system, timing.architecture, timing.num_layers) == (
        "h200_sxm", "Qwen3ForCausalLM", 36)
    assert timing.duration(shape([1] * 4, [100] * 4)) > 0


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("option", "message"), [
    ({"system": "rtx4090"}, "timing.system=rtx4090: aiconfigurator-core .* has no kernel tables"),
    ({"framework": "tensorrt"}, "timing.framework=tensorrt: .* has no tensorrt tables for "
                                "rtx_pro_6000_server; it has vllm, sglang, trtllm"),
    ({"version": "0.19.0"}, "timing.version=0.19.0: .* has rtx_pro_6000_server/vllm tables "
                            "for current=0.24.0"),
    ({"architecture": "MixtralForCausalLM"}, "timing.architecture=MixtralForCausalLM"),
    ({"tensor_parallel": 3}, "timing.num_q_heads=32 does not split over tensor_parallel=3"),
])
def test_what_the_database_lacks_is_one_config_error(option, message, private_cache):
    options = {"system": "rtx_pro_6000_server", **LLAMA_8B, **SMALL_GRIDS, **option}
    with pytest.raises(ConfigError, match=message) as caught:
        AIConfiguratorTiming(**options)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_cli_reports_a_gpu_the_database_lacks_on_one_line(tmp_path):
    from tests.test_cli import run_cli

    proc = run_cli("model=llama3_1_8b", "hardware=rtx4090x1", "timing=aiconfigurator",
                   "workload.n=5", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: timing.system is null: hardware.aiconfigurator_system"), last
    assert "Traceback" not in proc.stderr


def test_the_step_price_runs_inside_compiled_code():
    """The compiled engine calls the step price from its own nopython loop."""
    from numba import njit

    @njit
    def two_steps(new_tokens, context, is_prefill, tables):
        return (kernel_db_seconds(new_tokens, context, is_prefill, 1, *tables)
                + kernel_db_seconds(new_tokens, context, is_prefill, 3, *tables))

    batch = shape([4, 1, 1], [8, 2, 6])
    total = two_steps(batch.new_tokens, batch.context, batch.is_prefill, TABLES) * 1e3
    assert total == pytest.approx(price_ms([4], [8]) + price_ms([4, 1, 1], [8, 2, 6]), rel=1e-12)
