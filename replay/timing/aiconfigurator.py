"""Measured A100 attention-kernel tables from NVIDIA's ``aiconfigurator-core`` package.

The package (Apache-2.0, a dependency: ``pip install aiconfigurator-core``, which is
also how a machine with internet fetches these files) ships per-layer attention
kernel latencies measured on an A100-SXM4-80GB in bfloat16 for three serving
frameworks ("collections"): vLLM 0.14.0 (FlashAttention), SGLang 0.5.10
(FlashAttention) and TensorRT-LLM 1.0.0. Two tables per collection:

* ``context_attention_perf``: a prefill of ``batch_size`` sequences of ``isl``
  tokens each, nothing cached;
* ``generation_attention_perf``: one decode step of ``batch_size`` sequences
  whose KV cache holds ``isl + step`` tokens (``isl`` is 1).

Latencies are milliseconds per layer. This module reads the rows for 32 query
heads of width 128, the per-GPU shape of Llama-2-70B at TP 2 (4 KV heads),
Llama-3-8B at TP 1 (8) and Llama-2-7B at TP 1 (32), so that each collection
measures how the same kernel's time changes with the number of KV heads alone. How the 7B table
uses them, and why, is in :mod:`replay.timing.attention_7b`.
"""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

import numpy as np
import pandas as pd

from replay.errors import ConfigError
from replay.storage.data import file_record

PACKAGE = "aiconfigurator-core"
SYSTEM = "a100_sxm"
COLLECTIONS = ("vllm/0.14.0", "sglang/0.5.10", "trtllm/1.0.0")
TABLES = {"prefill": "context_attention_perf.parquet",
          "decode": "generation_attention_perf.parquet"}
Q_HEADS, HEAD_DIM = 32, 128
KV_HEADS = (4, 8, 32)   # Llama-2-70B per GPU at TP 2; Llama-3-8B and Llama-2-7B at TP 1


def attention_dir() -> Path:
    """The package's A100-SXM attention folder; a clear error when the package is missing."""
    try:
        root = resources.files("aiconfigurator_core")
    except ModuleNotFoundError:
        raise ConfigError(f"the Llama-2-7B attention table needs the {PACKAGE} package "
                          f"(pip install '{PACKAGE}>=0.12', part of this project's "
                          f"dependencies)") from None
    return Path(str(root)) / "systems" / "data" / SYSTEM / "attention"


def table_paths(phase: str) -> dict[str, Path]:
    """``{collection: parquet path}`` of the ``phase`` ("prefill" or "decode") tables."""
    folder = attention_dir()
    paths = {c: folder / c / TABLES[phase] for c in COLLECTIONS}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"{PACKAGE} {metadata.version(PACKAGE)} lacks the attention "
                          f"table(s) {', '.join(missing)}; install version 0.12")
    return paths


def load(phase: str) -> pd.DataFrame:
    """Rows with 32 query heads x 128 and 4, 8 or 32 KV heads, one column per KV-head count.

    Index: ``collection``, ``batch_size`` and ``tokens`` (the prompt length for a
    prefill, the cached tokens for a decode); columns ``kv4``, ``kv8`` and ``kv32`` in ms per
    layer; a cell one of them lacks is NaN (vLLM's decode table stops at 8 KV heads).
    """
    frames = []
    for collection, path in table_paths(phase).items():
        rows = pd.read_parquet(path)
        rows = rows[(rows["num_heads"] == Q_HEADS) & (rows["head_dim"] == HEAD_DIM)
                    & rows["num_key_value_heads"].isin(KV_HEADS)
                    & (rows["beam_width"] == 1)].copy()
        rows["tokens"] = rows["isl"] + rows["step"]
        rows["collection"] = collection
        frames.append(rows)
    table = pd.concat(frames).pivot_table(
        index=["collection", "batch_size", "tokens"], columns="num_key_value_heads",
        values="latency", aggfunc="median")
    table.columns = [f"kv{k}" for k in table.columns]
    return table


def prefill_kv_head_ratio(kv_heads: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Measured (``kv_heads`` KV heads / 4 KV heads) prefill time of one sequence, by its
    length (32 for Llama-2-7B at TP 1, 8 for Llama-3-8B).

    The median over the three collections at each length, so that no one
    framework's kernel choice decides it. Returns ``(lengths, ratios)``.
    """
    if kv_heads not in KV_HEADS:
        raise ConfigError(f"{PACKAGE} prefill tables are read for {KV_HEADS} KV heads per GPU, "
                          f"not {kv_heads}")
    table = load("prefill")
    single = table.xs(1, level="batch_size")
    ratio = (single[f"kv{kv_heads}"] / single["kv4"]).groupby(level="tokens").median()
    ratio = ratio[ratio.index >= 16]   # a 1-token "prefill" is a decode in Vidur's model
    return ratio.index.to_numpy(np.int64), ratio.to_numpy(float)


def decode_batch_scaling(kv_heads: int, edge: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Measured decode-attention time of ``B`` sequences over that of ``edge`` sequences at
    the same cached length, for ``kv_heads`` KV heads per GPU (4, 8 or 32).

    Returns ``(lengths, batch_sizes, ratio)`` with ``ratio[i, k]`` the median over the
    collections at ``lengths[i]`` cached tokens and ``batch_sizes[k] >= edge`` (so
    ``ratio[:, 0] = 1``). A cell no collection measured (large batches of long
    sequences run out of memory) continues the last measured one linearly in ``B``.
    """
    column = f"kv{kv_heads}"
    if kv_heads not in KV_HEADS:
        raise ConfigError(f"{PACKAGE} decode tables are read for {KV_HEADS} KV heads per GPU, "
                          f"not {kv_heads}")
    table = load("decode")[column].dropna()
    per_collection = table.unstack("batch_size")
    per_collection = per_collection.loc[:, per_collection.columns >= edge]
    if per_collection.columns.size == 0 or per_collection.columns[0] != edge:
        raise ConfigError(f"{PACKAGE} decode tables have no batch of {edge} sequences")
    ratios = per_collection.div(per_collection[edge], axis=0)
    ratio = ratios.groupby(level="tokens").median()
    ratio = ratio[ratio[edge].notna()]
    sizes = ratio.columns.to_numpy(np.int64)
    values = ratio.to_numpy(float, copy=True)
    for k in range(1, sizes.size):
        missing = np.isnan(values[:, k])
        values[missing, k] = values[missing, k - 1] * sizes[k] / sizes[k - 1]
    return ratio.index.to_numpy(np.int64), sizes, values


def provenance() -> dict:
    """Package version and the hash of every table file read."""
    return {"package": PACKAGE, "version": metadata.version(PACKAGE), "system": SYSTEM,
            "files": {f"{c}/{TABLES[phase]}": file_record(path)
                      for phase in TABLES for c, path in table_paths(phase).items()}}
