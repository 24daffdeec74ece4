"""The Vidur backend's price of one iteration, as compiled functions over its tables.

Vidur prices an iteration as the sum of three parts, each looked up in tables its predictor
exported (:mod:`replay.timing.vidur_tables`): the token-wise operations at the batch's new
tokens (rounded up to 8), decode attention at the number of decodes and their mean context
(rounded up to the table's granularity), and prefill attention per prompt at its context and
chunk (chunks rounded up to 32). Times are per layer in milliseconds, times the layer count.

Outside the profiled range the batch is counted per kind (``tokens``, ``decode_batch``,
``context``: :data:`OUT_OF_RANGE_KINDS`) and then priced from the edge of the profile
(``out_of_range=extrapolate``), or refused (``error``: NaN, and the backend's Python side says
why); see :mod:`replay.timing.vidur` for the extrapolation rules.

The record (:class:`replay.engine.state.TimingState`) holds ``ints`` = [kv granularity, max
tokens, max decode batch, max prefill chunk, whether chunks are checked, whether out of
range is an error, the beyond-profile mode], ``floats`` = [ms to seconds], ``table`` the
token-wise times, ``grid`` decode attention, ``grid2`` prefill attention, and for the
``measured`` beyond-profile mode ``table2``/``table3`` the log lengths and log batch sizes and
``grid3`` the measured ratios; ``counters`` counts out-of-range batches per kind.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit
from replay.engine.numeric import pairwise_sum
from replay.timing.vidur_tables import CHUNK_ROUNDING, TOKEN_ROUNDING

GRANULARITY, MAX_TOKENS, MAX_BATCH, MAX_CHUNK, CHECK_CHUNK, ERROR, BEYOND = range(7)
#: ``beyond_profile`` modes, as ``ints[BEYOND]``.
BEYOND_PROFILE_MODES = ("linear", "flat", "measured")
#: ``counters``, in :attr:`VidurTiming.out_of_range_batches` order.
OUT_OF_RANGE_KINDS = ("tokens", "decode_batch", "context")


@jit(inline="always")
def _ceil_div(a, b):
    return -(-a // b)


@jit
def price_decodes(timing, m, context_sum, context_max):
    """``m`` decodes whose contexts sum to ``context_sum`` (largest ``context_max``), in O(1);
    NaN beyond the profile (the member-by-member price then counts and extrapolates)."""
    p = timing.ints
    if m > p[MAX_BATCH] or context_max >= p[MAX_TOKENS]:
        return np.nan
    return (timing.table[_ceil_div(m, TOKEN_ROUNDING) * TOKEN_ROUNDING]
            + timing.grid[m, _ceil_div(context_sum // m, p[GRANULARITY])]) * timing.floats[0]


@jit
def price_batch(s, timing):
    """The iteration ``new_tokens``, ``context`` ``[:m]`` in seconds: in range, the three parts
    looked up; out of range, counted and extrapolated (or NaN under ``out_of_range=error``).
    Requests with exactly one new token are decodes, as in Vidur."""
    new_tokens, context, m = s.new_tokens, s.context, s.m
    p = timing.ints
    granularity, max_tokens, max_batch = p[GRANULARITY], p[MAX_TOKENS], p[MAX_BATCH]
    token_ms, decode_ms, prefill_ms = timing.table, timing.grid, timing.grid2
    total = np.int64(0)
    context_max = 0
    for k in range(m):
        total += new_tokens[k]
        context_max = max(context_max, context[k])
    if total == m:  # decodes only
        if m > max_batch or context_max >= max_tokens:
            return _out_of_range(s, timing, total, m)
        context_sum = 0
        for k in range(m):
            context_sum += context[k]
        return (token_ms[_ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING]
                + decode_ms[m, _ceil_div(context_sum // m, granularity)]) * timing.floats[0]
    n_decode = np.int64(0)
    reach = 0
    chunk_max = 0
    for k in range(m):
        if new_tokens[k] == 1:
            n_decode += 1
        reach = max(reach, context[k] + new_tokens[k])
        chunk_max = max(chunk_max, new_tokens[k])
    if (total > max_tokens or n_decode > max_batch or reach > max_tokens
            or (p[CHECK_CHUNK] and chunk_max > p[MAX_CHUNK])):
        return _out_of_range(s, timing, total, n_decode)
    ms = token_ms[_ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING]
    if n_decode:
        context_sum = 0
        for k in range(m):
            if new_tokens[k] == 1:
                context_sum += context[k]
        ms += decode_ms[n_decode, _ceil_div(context_sum // n_decode, granularity)]
    terms = s.float_scratch
    n_terms = 0
    for k in range(m):
        if new_tokens[k] != 1:
            terms[n_terms] = prefill_ms[(context[k] + (granularity - 1)) // granularity,
                                        (new_tokens[k] + (CHUNK_ROUNDING - 1)) // CHUNK_ROUNDING]
            n_terms += 1
    ms += pairwise_sum(terms[:n_terms])
    return ms * timing.floats[0]


@jit
def _out_of_range(s, timing, total, n_decode):
    """Count the batch per kind, then extrapolate it (or NaN under ``out_of_range=error``)."""
    new_tokens, context, m = s.new_tokens, s.context, s.m
    p = timing.ints
    reach = 0
    chunk_max = 0
    for k in range(m):
        reach = max(reach, context[k] + new_tokens[k])
        chunk_max = max(chunk_max, new_tokens[k])
    counters = timing.counters
    if total > p[MAX_TOKENS]:
        counters[0] += 1
    if n_decode > p[MAX_BATCH]:
        counters[1] += 1
    if reach > p[MAX_TOKENS] or chunk_max > p[MAX_CHUNK]:
        counters[2] += 1
    if p[ERROR]:
        return np.nan
    token, decode, prefill = parts_ms(new_tokens, context, m, total, n_decode, timing,
                                      s.float_scratch)
    return (token + decode + prefill) * timing.floats[0]


@jit
def parts_ms(new_tokens, context, m, total, n_decode, timing, terms):
    """The three parts of an iteration in milliseconds per layer, priced from the edge of the
    profile where the batch leaves it: token-wise operations scale linearly in the tokens,
    decode attention beyond the largest profiled batch as ``beyond_profile`` says and beyond
    the largest context linearly in it, prefill attention by attention FLOPs
    ``chunk * (context + chunk / 2)`` from the largest profiled point with the same chunk (or
    the largest chunk). Inside the profile they are the lookups ``price_batch`` makes."""
    p = timing.ints
    granularity, max_tokens, max_batch, max_chunk = (p[GRANULARITY], p[MAX_TOKENS],
                                                     p[MAX_BATCH], p[MAX_CHUNK])
    token_ms, decode_ms, prefill_ms = timing.table, timing.grid, timing.grid2
    rounded = _ceil_div(total, TOKEN_ROUNDING) * TOKEN_ROUNDING
    token = (token_ms[rounded] if rounded <= max_tokens
             else token_ms[max_tokens] * rounded / max_tokens)
    decode = 0.0
    if n_decode:
        batch = min(n_decode, max_batch)
        context_sum = 0
        for k in range(m):
            if new_tokens[k] == 1:
                context_sum += context[k]
        kv = _ceil_div(context_sum // n_decode, granularity) * granularity
        kv_edge = min(kv, max_tokens)
        factor = _batch_factor(timing, n_decode, kv) if n_decode > batch else 1.0
        decode = (decode_ms[batch, kv_edge // granularity] * factor
                  * (kv / kv_edge if kv > kv_edge else 1.0))
    n_terms = 0
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
        terms[n_terms] = (prefill_ms[kv_edge // granularity, chunk_edge // CHUNK_ROUNDING]
                          * flops_ratio)
        n_terms += 1
    prefill = pairwise_sum(terms[:n_terms]) if n_terms else 0.0
    return token, decode, prefill


@jit
def _batch_factor(timing, n_decode, mean_context):
    """Decode attention of ``n_decode`` requests, more than the largest profiled batch, over
    that of the largest profiled batch at the same context (``beyond_profile``)."""
    mode = timing.ints[BEYOND]
    if mode == 0:  # linear
        return n_decode / timing.ints[MAX_BATCH]
    if mode == 1:  # flat
        return 1.0
    # measured: the kernels' ratios, interpolated in log context, then in log batch size
    log_lengths, log_sizes, ratio = timing.table2, timing.table3, timing.grid3
    x = np.log(max(mean_context, 1.0))
    per_size = np.empty(log_sizes.size)
    for k in range(log_sizes.size):
        per_size[k] = np.interp(x, log_lengths, ratio[:, k])
    largest = np.exp(log_sizes[-1])
    if n_decode >= largest:
        return per_size[-1] * n_decode / largest
    return np.interp(np.log(n_decode), log_sizes, per_size)
