"""The timing backends as ``@njit`` functions over one iteration's arrays.

Each function prices a batch given as ``new_tokens[:m]``, ``context[:m]`` and
``is_prefill[:m]`` (the fields of :class:`replay.timing.base.BatchShape`) and returns
exactly the float its Python twin returns: the same operations in the same order,
and numpy's pairwise summation (:func:`replay.engine.numeric.pairwise_sum`) wherever the
twin sums a float array. Integer sums are exact in any order.

* :func:`linear_duration`: :class:`replay.timing.simple.LinearTiming`;
* :func:`vidur_duration`: :class:`replay.timing.vidur.VidurTiming`, its in-range lookups
  and its ``out_of_range=extrapolate`` rule; out of range it counts the batch per kind
  in ``out_of_range`` (``tokens``, ``decode_batch``, ``context``), or, under
  ``out_of_range=error``, returns NaN and leaves raising to the caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from replay.engine.numeric import pairwise_sum
from replay.timing.vidur_tables import CHUNK_ROUNDING, TOKEN_ROUNDING

#: The backends (:class:`replay.timing.simple.UnitTiming` prices every batch 1.0: no
#: function here).
UNIT, LINEAR, VIDUR = 0, 1, 2
#: Indices of the Vidur integer parameters in ``vidur_ints``.
V_GRANULARITY, V_MAX_TOKENS, V_MAX_BATCH, V_MAX_CHUNK, V_CHECK_CHUNK, V_ERROR = range(6)
#: ``out_of_range`` counters, in :attr:`VidurTiming.out_of_range_batches` order.
OUT_OF_RANGE_KINDS = ("tokens", "decode_batch", "context")


@njit(cache=True)
def linear_duration(new_tokens, context, is_prefill, m, d0, d1, d2, d3, d4):
    """``d0 + d1 * touched + d2 * prefill + d3 * decodes + d4 * prompts``
    (LinearTiming.duration: the same operations in the same order)."""
    touched = 0
    prefill = 0
    prompts = 0
    for k in range(m):
        touched += context[k] + new_tokens[k]
        if is_prefill[k]:
            prefill += new_tokens[k]
            prompts += 1
    return d0 + d1 * touched + d2 * prefill + d3 * (m - prompts) + d4 * prompts


@njit(cache=True, inline="always")
def _ceil_div(a, b):
    return -(-a // b)


@njit(cache=True)
def vidur_duration(new_tokens, context, m, token_ms, decode_ms, prefill_ms, ms_to_s,
                   vidur_ints, out_of_range, scratch):
    """VidurTiming.duration; ``scratch`` (float64, at least ``m``) holds the prefill terms."""
    granularity = vidur_ints[V_GRANULARITY]
    max_tokens = vidur_ints[V_MAX_TOKENS]
    max_batch = vidur_ints[V_MAX_BATCH]
    max_chunk = vidur_ints[V_MAX_CHUNK]
    total = np.int64(0)
    context_max = 0
    for k in range(m):
        total += new_tokens[k]
        context_max = max(context_max, context[k])
    if total == m:
        if m > max_batch or context_max >= max_tokens:
            return _vidur_out_of_range(new_tokens, context, m, total, m, token_ms, decode_ms,
                                       prefill_ms, ms_to_s, vidur_ints, out_of_range, scratch)
        context_sum = 0
        for k in range(m):
            context_sum += context[k]
        mean_context = context_sum // m
        return (token_ms[_ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING]
                + decode_ms[m, _ceil_div(mean_context, granularity)]) * ms_to_s
    n_decode = np.int64(0)
    reach = 0
    chunk_max = 0
    for k in range(m):
        if new_tokens[k] == 1:
            n_decode += 1
        reach = max(reach, context[k] + new_tokens[k])
        chunk_max = max(chunk_max, new_tokens[k])
    if (total > max_tokens or n_decode > max_batch or reach > max_tokens
            or (vidur_ints[V_CHECK_CHUNK] and chunk_max > max_chunk)):
        return _vidur_out_of_range(new_tokens, context, m, total, n_decode, token_ms,
                                   decode_ms, prefill_ms, ms_to_s, vidur_ints, out_of_range,
                                   scratch)
    ms = token_ms[_ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING]
    if n_decode:
        context_sum = 0
        for k in range(m):
            if new_tokens[k] == 1:
                context_sum += context[k]
        ms += decode_ms[n_decode, _ceil_div(context_sum // n_decode, granularity)]
    p = 0
    for k in range(m):
        if new_tokens[k] != 1:
            scratch[p] = prefill_ms[(context[k] + (granularity - 1)) // granularity,
                                    (new_tokens[k] + (CHUNK_ROUNDING - 1)) // CHUNK_ROUNDING]
            p += 1
    ms += pairwise_sum(scratch[:p])
    return ms * ms_to_s


@njit(cache=True)
def _vidur_out_of_range(new_tokens, context, m, total, n_decode, token_ms, decode_ms,
                        prefill_ms, ms_to_s, vidur_ints, out_of_range, scratch):
    """VidurTiming._out_of_range: count the kinds, then extrapolate (or NaN under error)."""
    max_tokens = vidur_ints[V_MAX_TOKENS]
    max_batch = vidur_ints[V_MAX_BATCH]
    max_chunk = vidur_ints[V_MAX_CHUNK]
    granularity = vidur_ints[V_GRANULARITY]
    reach = 0
    chunk_max = 0
    for k in range(m):
        reach = max(reach, context[k] + new_tokens[k])
        chunk_max = max(chunk_max, new_tokens[k])
    if vidur_ints[V_ERROR]:
        return np.nan
    if total > max_tokens:
        out_of_range[0] += 1
    if n_decode > max_batch:
        out_of_range[1] += 1
    if reach > max_tokens or chunk_max > max_chunk:
        out_of_range[2] += 1
    rounded = _ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING
    ms = (token_ms[rounded] if rounded <= max_tokens
          else token_ms[max_tokens] * rounded / max_tokens)
    if n_decode:
        batch = min(n_decode, max_batch)
        context_sum = 0
        for k in range(m):
            if new_tokens[k] == 1:
                context_sum += context[k]
        kv = _ceil_div(context_sum // n_decode, granularity) * granularity
        kv_edge = min(kv, max_tokens)
        ratio = kv / kv_edge if kv > kv_edge else 1.0
        ms += decode_ms[batch, kv_edge // granularity] * (n_decode / batch) * ratio
    p = 0
    for k in range(m):
        q = new_tokens[k]
        if q == 1:
            continue
        cached = context[k]
        inside = cached + q <= max_tokens and q <= max_chunk
        kv = _ceil_div(cached, granularity) * granularity
        chunk = _ceil_div(q, CHUNK_ROUNDING) * CHUNK_ROUNDING
        if inside:
            chunk_edge, kv_edge = chunk, kv
        else:
            chunk_edge = min(chunk, max_chunk)
            kv_edge = min(kv, (max_tokens - chunk_edge) // granularity * granularity)
        flops_ratio = chunk * (kv + chunk / 2) / (chunk_edge * (kv_edge + chunk_edge / 2))
        scratch[p] = (prefill_ms[kv_edge // granularity, chunk_edge // CHUNK_ROUNDING]
                      * flops_ratio)
        p += 1
    if p:
        ms += pairwise_sum(scratch[:p])
    return ms * ms_to_s
