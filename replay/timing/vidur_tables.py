"""Vidur's predictions as numpy lookup tables.

Vidur's ``SklearnExecutionTimePredictor`` never calls sklearn per batch either:
at build time it predicts every operation on integer grids
(``self._predictions[op][key]``) and ``get_execution_time`` looks the batch up
in them. :func:`export_tables` copies those grids into arrays, folding the
per-layer operations that share a key into one array;
``VidurTiming.duration`` repeats Vidur's lookups on them with numpy:

* every linear layer, norm, rope, residual add and (TP > 1) the two all-reduces
  per layer are indexed by the batch's new tokens rounded up to a multiple of 8;
* decode attention (requests with exactly one new token, Vidur's own test) is
  one lookup at (number of decodes, their mean context floored, then rounded up
  to the KV granularity), times ``1 + overhead`` when more than one request
  decodes (Vidur's GQA batching overhead; 0 for multi-head models);
* prefill attention is a sum over prefilling requests of the lookup at
  (cached tokens rounded up to the KV granularity, chunk rounded up to 32).

The KV-cache save kernel is looked up by Vidur but left out of its total
(``ExecutionTime._get_attention_layer_execution_time``), so it is not tabled.
The iteration time is the number of layers times the sum of the three lookups,
in milliseconds (one pipeline stage; no pipeline or KV-parallel communication).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.errors import InputError

TOKEN_ROUNDING = 8      # Vidur's _total_num_q_tokens_rounded
CHUNK_ROUNDING = 32     # Vidur's prefill chunk rounding in _get_attention_prefill_execution_time
TOKEN_OPS = ("attn_pre_proj", "attn_post_proj", "attn_rope", "input_layernorm",
             "mlp_up_proj", "mlp_down_proj", "mlp_act", "add")


#: The cells no lookup reaches (zero tokens, zero decodes, a zero-token chunk): NaN.
UNREACHABLE = {"token_ms": np.s_[0], "decode_ms": np.s_[0], "prefill_ms": np.s_[:, 0]}


@dataclass(frozen=True)
class VidurTables:
    """Per-layer milliseconds on Vidur's grids.

    ``token_ms[n]``: all per-token operations for ``n`` new tokens (n = 0..max_tokens;
    only multiples of 8 are looked up). ``decode_ms[b, k]``: decode attention for
    ``b`` requests at mean context ``k * kv_granularity``, overhead included.
    ``prefill_ms[k, c]``: prefill attention of one request with ``k * kv_granularity``
    cached tokens and a ``c * 32``-token chunk. Unreachable cells are NaN; every other
    cell must be a finite time >= 0 (an :class:`~replay.errors.InputError` otherwise: a
    predictor trained on a bad profile must not price a replay).
    """

    token_ms: np.ndarray
    decode_ms: np.ndarray
    prefill_ms: np.ndarray
    num_layers: int
    kv_granularity: int

    def __post_init__(self) -> None:
        for name in ("token_ms", "decode_ms", "prefill_ms"):
            cells = getattr(self, name)
            bad = ~(np.isfinite(cells) & (cells >= 0))
            bad[UNREACHABLE[name]] = False
            if bad.any():
                where = tuple(int(i) for i in np.unravel_index(int(bad.argmax()), cells.shape))
                raise InputError(f"Vidur's predictions: {name}{list(where)} is "
                                 f"{float(cells[where])} ms ({int(bad.sum())} such cells), "
                                 f"not a finite time >= 0; the profiles it was trained on "
                                 f"hold bad values")

    @property
    def max_tokens(self) -> int:
        return self.token_ms.shape[0] - 1

    @property
    def max_batch_size(self) -> int:
        return self.decode_ms.shape[0] - 1

    @property
    def max_prefill_chunk(self) -> int:
        return (self.prefill_ms.shape[1] - 1) * CHUNK_ROUNDING

    def save(self, path: Path) -> None:
        """Write atomically (concurrent readers never see a partial file)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, token_ms=self.token_ms, decode_ms=self.decode_ms,
                     prefill_ms=self.prefill_ms, num_layers=self.num_layers,
                     kv_granularity=self.kv_granularity)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> VidurTables:
        """The tables saved in ``path``; a file that is not whole (cut short, emptied, missing
        an array) or holds a bad time is an :class:`~replay.errors.InputError` saying how to
        rebuild it."""
        try:
            with np.load(path) as data:
                return cls(token_ms=data["token_ms"], decode_ms=data["decode_ms"],
                           prefill_ms=data["prefill_ms"], num_layers=int(data["num_layers"]),
                           kv_granularity=int(data["kv_granularity"]))
        except InputError as exc:
            raise InputError(f"{exc} (cached in {path}: remove its folder to rebuild "
                             f"from good profiles)") from None
        except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise InputError(f"timing.vidur: the cached tables {path} cannot be read "
                             f"({type(exc).__name__}: {exc}); remove its folder to rebuild "
                             f"them") from None


def export_tables(predictor) -> VidurTables:
    """Copy a built Vidur ``SklearnExecutionTimePredictor``'s prediction grids into arrays."""
    config = predictor._config
    predictions = predictor._predictions
    max_tokens = int(config.prediction_max_tokens_per_request)
    granularity = int(config.kv_cache_prediction_granularity)
    tokens = range(1, max_tokens + 1)

    ops = list(TOKEN_OPS)
    if predictor._model_config.post_attn_norm:
        ops.append("post_attention_layernorm")
    token_ms = np.full(max_tokens + 1, np.nan)
    token_ms[1:] = 0.0
    for op in ops:
        token_ms[1:] += np.array([predictions[op][(n,)] for n in tokens])
    if predictor._replica_config.tensor_parallel_size > 1:
        # One all-reduce after attention and one after the MLP, each with NCCL's CPU overheads.
        all_reduce = (np.array([predictions["all_reduce"][(n,)] for n in tokens])
                      + config.nccl_cpu_launch_overhead_ms
                      + config.nccl_cpu_skew_overhead_per_device_ms
                      * predictor._replica_config.tensor_parallel_size ** 1.25)
        token_ms[1:] += 2 * all_reduce

    kv_steps = max_tokens // granularity
    max_batch = int(config.prediction_max_batch_size)
    decode_ms = np.full((max_batch + 1, kv_steps + 1), np.nan)
    overhead = predictor._attention_decode_batching_overhead_fraction
    for batch_size in range(1, max_batch + 1):
        factor = 1 + overhead * int(batch_size > 1)
        for k in range(kv_steps + 1):
            decode_ms[batch_size, k] = (
                predictions["attn_decode"][(batch_size, k * granularity)] * factor)

    max_chunk_steps = int(config.prediction_max_prefill_chunk_size) // CHUNK_ROUNDING
    prefill_ms = np.full((kv_steps + 1, max_chunk_steps + 1), np.nan)
    for k in range(kv_steps + 1):
        for c in range(1, max_chunk_steps + 1):
            prefill_ms[k, c] = predictions["attn_prefill"][(k * granularity, c * CHUNK_ROUNDING)]

    return VidurTables(token_ms=token_ms, decode_ms=decode_ms, prefill_ms=prefill_ms,
                       num_layers=int(predictor._num_layers_per_pipeline_stage),
                       kv_granularity=granularity)
