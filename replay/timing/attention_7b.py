"""Attention profiles for A100 derived from the real Llama-2-70B (TP 2) profile.

Written for Llama-2-7B (TP 1) and generalised to any target in ``TARGET_SHAPES``
with 32 query heads of width 128 per GPU: Llama-3-8B (TP 1, 8 KV heads, GQA) is
derived the same way, with 8 KV heads in place of 32 (4096 K+V bytes per cached
token instead of 16384, and the measured 8/4 KV-head prefill ratio). The module
keeps its name; what follows is written for 7B and holds for 8B with those two
numbers changed (``docs/timing.md``, "The Llama-3-8B attention table").

Vidur's measured 7B attention table is not available offline (Git LFS only), so
this module writes one in Vidur's ``attention.csv`` format from the closest real
data, the FlashAttention kernel times Vidur measured for Llama-2-70B at tensor
parallel 2 on A100, using how the two shapes differ per GPU:

=================================  ================  ===============
per GPU, per layer                 70B at TP 2       7B at TP 1
=================================  ================  ===============
query heads                        64 / 2 = 32       32
key/value heads                    8 / 2 = 4         32
head dim                           128               128
K+V bytes per cached token (fp16)  2*4*128*2 = 2048  2*32*128*2 = 16384
=================================  ================  ===============

* Prefill rows are scaled by the measured cost of the extra KV heads. Both shapes
  run 32 query heads of width 128 per GPU, so the attention FLOPs
  ``4 * 32 * 128 * chunk * (kv + chunk/2)`` are the same; what differs is the K/V
  each query head reads. NVIDIA's A100-SXM4-80GB kernel tables
  (:mod:`replay.timing.aiconfigurator`) time the same prefill kernel with 4 and
  with 32 KV heads in three frameworks; the median of their ratios (1.01 to
  1.18 by length) multiplies each 70B row, looked up at the single-sequence
  length with the same FLOPs, ``sqrt(chunk * (2 * kv + chunk))``. Method
  version 1 copied the rows unchanged (ratio 1).
* Decode rows get the extra key/value traffic at the bandwidth the 70B decode
  kernel itself achieves: ``t7(B, kv) = t70(B, kv) + B * kv * (16384 - 2048) / BW``.
  ``BW`` is fitted by least squares of ``t = a + b*B + B*kv*2048/BW`` on every
  70B decode row (about 1.64 TB/s, 80 % of the A100-80GB's 2.04 TB/s peak).
  Decode is memory-bound, so the extra bytes are the whole difference; the
  launch and per-request terms (``a``, ``b``) are kept as measured.

The measured 32-KV-head decode kernels were compared with this derivation
(``python -m replay.tools.attention_sources``) and not adopted: the two
collections that time them (SGLang, TensorRT-LLM) differ from each other by about
1.5x and bracket the derivation (median 0.72x and 1.10x of it), and at the 70B
shape neither reproduces Vidur's own measurement, which the derivation starts
from (the README gives the numbers).

Every derived table records this provenance (``provenance()``), and runs that
use it report it through ``VidurTiming.describe()``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

METHOD_VERSION = 2
A100_80GB_PEAK_BANDWIDTH_GBPS = 2039.0   # reference only: the fitted bandwidth must stay below
DTYPE_BYTES = 2
HEAD_DIM = 128
SOURCE_SHAPE = {"model": "meta-llama/Llama-2-70b-hf", "tensor_parallel": 2, "n_embd": 8192,
                "n_q_head": 64, "n_kv_head": 8}
TARGET_SHAPES = {
    "meta-llama/Llama-2-7b-hf": {"model": "meta-llama/Llama-2-7b-hf", "tensor_parallel": 1,
                                 "n_embd": 4096, "n_q_head": 32, "n_kv_head": 32},
    # GQA: 8 KV heads of 128 per GPU at TP 1 (Vidur's Llama3_8BModelConfig).
    "meta-llama/Meta-Llama-3-8B": {"model": "meta-llama/Meta-Llama-3-8B", "tensor_parallel": 1,
                                   "n_embd": 4096, "n_q_head": 32, "n_kv_head": 8},
}
TARGET_SHAPE = TARGET_SHAPES["meta-llama/Llama-2-7b-hf"]   # the original (and default) target
DECODE_STATS = [f"time_stats.attn_decode.{stat}" for stat in ("min", "max", "mean", "median")]
PREFILL_STATS = [f"time_stats.attn_prefill.{stat}" for stat in ("min", "max", "mean", "median")]


def kv_bytes_per_token(shape: dict) -> int:
    """K and V bytes one cached token occupies per layer on one GPU."""
    return 2 * (shape["n_kv_head"] // shape["tensor_parallel"]) * HEAD_DIM * DTYPE_BYTES


def _source_rows(profile: pd.DataFrame) -> pd.DataFrame:
    rows = profile[(profile["n_embd"] == SOURCE_SHAPE["n_embd"])
                   & (profile["n_q_head"] == SOURCE_SHAPE["n_q_head"])
                   & (profile["n_kv_head"] == SOURCE_SHAPE["n_kv_head"])
                   & (profile["num_tensor_parallel_workers"] == SOURCE_SHAPE["tensor_parallel"])]
    if rows.empty or rows["is_prefill"].all() or not rows["is_prefill"].any():
        raise ValueError("attention_7b: the source profile has no Llama-2-70B TP 2 prefill and "
                         "decode rows to derive the 7B table from")
    return rows


def fit_decode_bandwidth(decode: pd.DataFrame) -> tuple[float, float]:
    """Least-squares ``t = a + b*B + B*kv*bytes/BW`` on 70B decode rows: (BW in bytes/ms, MAPE)."""
    batch = decode["batch_size"].to_numpy(float)
    kv = decode["kv_cache_size"].to_numpy(float)
    measured = decode["time_stats.attn_decode.median"].to_numpy(float)
    design = np.column_stack([np.ones_like(batch), batch,
                              batch * kv * kv_bytes_per_token(SOURCE_SHAPE)])
    coef, *_ = np.linalg.lstsq(design, measured, rcond=None)
    if coef[2] <= 0:
        raise ValueError("attention_7b: decode times do not grow with KV size in the source "
                         "profile; cannot calibrate a bandwidth")
    mape = float(np.mean(np.abs(design @ coef - measured) / measured))
    return 1.0 / coef[2], mape


def prefill_scale(chunk: np.ndarray, cached: np.ndarray, lengths: np.ndarray,
                  ratios: np.ndarray) -> np.ndarray:
    """The KV-head ratio for prefill rows, at the single-sequence length with the same FLOPs.

    Interpolated linearly in log length between measured lengths, held at the ends.
    """
    equivalent = np.sqrt(chunk * (2.0 * cached + chunk))
    return np.interp(np.log(equivalent), np.log(lengths), ratios)


def target_shape(model: str) -> dict | None:
    """The per-GPU shape a derived table is made for, or None if ``model`` has none."""
    return TARGET_SHAPES.get(model)


def derive(profile: pd.DataFrame, prefill_ratio: tuple[np.ndarray, np.ndarray],
           target: dict = TARGET_SHAPE) -> tuple[pd.DataFrame, dict]:
    """The ``target`` table (default Llama-2-7B TP 1) and the constants it was made with.

    ``prefill_ratio`` is ``(lengths, ratios)``: the measured (target KV heads)/4
    KV-head time ratio of a one-sequence prefill
    (:func:`replay.timing.aiconfigurator.prefill_kv_head_ratio` with
    ``kv_heads = target["n_kv_head"] // target["tensor_parallel"]``).
    """
    if target["n_q_head"] // target["tensor_parallel"] != (SOURCE_SHAPE["n_q_head"]
                                                           // SOURCE_SHAPE["tensor_parallel"]):
        raise ValueError("attention_7b: the target must run as many query heads per GPU as "
                         "the source (32), so that only the KV heads differ")
    rows = _source_rows(profile).copy()
    decode = ~rows["is_prefill"].astype(bool)
    bandwidth, mape = fit_decode_bandwidth(rows[decode])
    bandwidth_gbps = bandwidth * 1e3 / 1e9
    if bandwidth_gbps > A100_80GB_PEAK_BANDWIDTH_GBPS:
        raise ValueError(f"attention_7b: fitted decode bandwidth {bandwidth_gbps:.0f} GB/s "
                         f"exceeds the A100's peak; the source profile is not A100 decode data")
    extra_bytes = kv_bytes_per_token(target) - kv_bytes_per_token(SOURCE_SHAPE)
    extra_ms = (rows.loc[decode, "batch_size"] * rows.loc[decode, "kv_cache_size"]
                * extra_bytes / bandwidth)
    for column in DECODE_STATS:
        rows.loc[decode, column] = rows.loc[decode, column] + extra_ms
    lengths, ratios = prefill_ratio
    scale = prefill_scale(rows.loc[~decode, "prefill_chunk_size"].to_numpy(float),
                          rows.loc[~decode, "kv_cache_size"].to_numpy(float), lengths, ratios)
    for column in PREFILL_STATS:
        rows.loc[~decode, column] = rows.loc[~decode, column] * scale
    rows["n_embd"] = target["n_embd"]
    rows["n_q_head"] = target["n_q_head"]
    rows["n_kv_head"] = target["n_kv_head"]
    rows["num_tensor_parallel_workers"] = target["tensor_parallel"]
    constants = {
        "method_version": METHOD_VERSION,
        "source": SOURCE_SHAPE, "target": target,
        "kv_bytes_per_token_source": kv_bytes_per_token(SOURCE_SHAPE),
        "kv_bytes_per_token_target": kv_bytes_per_token(target),
        "decode_bandwidth_GBps": round(bandwidth_gbps, 3),
        "decode_bandwidth_fit_mape": round(mape, 4),
        "a100_peak_bandwidth_GBps": A100_80GB_PEAK_BANDWIDTH_GBPS,
        "prefill_rows": int((~decode).sum()), "decode_rows": int(decode.sum()),
        "prefill_kv_head_ratio": {int(n): round(float(r), 4)
                                  for n, r in zip(lengths, ratios, strict=True)},
        "prefill_scale_range": [round(float(scale.min()), 4), round(float(scale.max()), 4)],
    }
    return rows, constants


def provenance(constants: dict, source_record: dict, table_record: dict,
               kernel_tables: dict) -> dict:
    target = constants.get("target", TARGET_SHAPE)
    name = target["model"].split("/")[-1]
    kv = target["n_kv_head"] // target["tensor_parallel"]
    return {
        "what": f"{name} TP{target['tensor_parallel']} A100 attention table derived from the "
                f"measured Llama-2-70B TP2 attention profile (no measured {name} attention "
                f"profile available)",
        "method": f"prefill rows x measured {kv}/4 KV-head prefill time ratio (median of the "
                  f"vLLM, SGLang and TensorRT-LLM A100 kernel tables of aiconfigurator-core); "
                  f"decode rows + B*kv*({kv_bytes_per_token(target)}-"
                  f"{kv_bytes_per_token(SOURCE_SHAPE)}) bytes / fitted decode bandwidth "
                  f"(replay/timing/attention_7b.py)",
        "constants": constants,
        "source_file": source_record,
        "table_file": table_record,
        "kernel_tables": kernel_tables,
    }
