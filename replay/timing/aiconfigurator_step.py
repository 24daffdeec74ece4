"""One engine step priced from aiconfigurator-core's kernel tables, as one ``@njit`` function.

:func:`kernel_db_seconds` sums what
:class:`replay.timing.aiconfigurator_timing.AIConfiguratorTiming` tabulated from the kernel
database at construction (all times in milliseconds):

``token_ms[t]``
    every token-wise operation of all layers at ``t`` new tokens (embedding, norms, the QKV,
    output and MLP GEMMs, the activation, and with tensor parallelism the all-reduces), for
    ``t`` = 0 .. ``token_ms.size - 1``;
``logits_ms[n]``
    the LM-head GEMM for ``n`` requests (vLLM computes logits for every scheduled request);
``prefill_ms[i, j]``
    the attention of all layers for one request prefilling ``chunk_axis[i]`` tokens on top of
    ``prefix_axis[j]`` cached ones, summed over the step's prefilling requests;
``decode_ms[i, j]``
    the attention of all layers for ``batch_axis[i]`` decodes reading ``kv_axis[j]`` keys
    each (their mean context plus the token they add).

Within the grids the price is interpolated (linearly in the tokens, bilinearly in the two
attention axes); beyond them it grows with the work from the edge: token-wise operations and
logits in proportion to the tokens (requests), prefill attention in proportion to
``chunk * (prefix + (chunk + 1) / 2)`` (the query-key pairs of causal attention), decode
attention in proportion to ``batch * kv``.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit
from replay.timing.grid_lookup import clamped_bilinear

MS = 1e-3


@jit
def _proportional(table, count):
    """``table[count]``, or beyond the table's end its last entry scaled by the count."""
    last = table.shape[0] - 1
    if count <= last:
        return table[count]
    return table[last] * count / last


@jit
def _pairs(chunk, prefix):
    return chunk * (prefix + (chunk + 1.0) / 2.0)


@jit
def prefill_attention_ms(chunk_axis, prefix_axis, prefill_ms, chunk, prefix):
    """One request's prefill attention (all layers), scaled by attention pairs off the grid."""
    c = min(max(chunk, chunk_axis[0]), chunk_axis[-1])
    p = min(max(prefix, prefix_axis[0]), prefix_axis[-1])
    value = clamped_bilinear(chunk_axis, prefix_axis, prefill_ms, c, p)
    if c != chunk or p != prefix:
        value *= _pairs(chunk, prefix) / _pairs(c, p)
    return value


@jit
def decode_attention_ms(batch_axis, kv_axis, decode_ms, batch, kv):
    """``batch`` decodes reading ``kv`` keys each (all layers), scaled by ``batch * kv`` off
    the grid."""
    b = min(max(batch, batch_axis[0]), batch_axis[-1])
    k = min(max(kv, kv_axis[0]), kv_axis[-1])
    value = clamped_bilinear(batch_axis, kv_axis, decode_ms, b, k)
    if b != batch or k != kv:
        value *= (batch * kv) / (b * k)
    return value


@jit
def kernel_db_seconds(new_tokens, context, is_prefill, m, token_ms, logits_ms, chunk_axis,
                      prefix_axis, prefill_ms, batch_axis, kv_axis, decode_ms):
    """Seconds of one step of the batch ``new_tokens[:m]``, ``context[:m]``,
    ``is_prefill[:m]``. A member prefills when it feeds more than one prompt token; a
    one-token chunk is a decode, as in Vidur's and LLMServingSim's models."""
    if m == 0:
        return 0.0
    tokens = np.int64(0)
    decodes = np.int64(0)
    decode_context = np.int64(0)
    prefill = 0.0
    for k in range(m):
        tokens += new_tokens[k]
        if is_prefill[k] and new_tokens[k] > 1:
            prefill += prefill_attention_ms(chunk_axis, prefix_axis, prefill_ms,
                                            float(new_tokens[k]), float(context[k]))
        else:
            decodes += 1
            decode_context += context[k]
    total = _proportional(token_ms, tokens) + _proportional(logits_ms, m) + prefill
    if decodes > 0:
        total += decode_attention_ms(batch_axis, kv_axis, decode_ms, float(decodes),
                                     decode_context / decodes + 1.0)
    return total * MS
