"""One engine step priced from a per-layer profile, as one ``@njit`` function.

:func:`layer_profile_seconds` composes a step as LLMServingSim's trace generator does
(casys-kaist/LLMServingSim, ``serving/core/trace_generator.py``; see
:mod:`replay.timing.layer_profile` for the loading and docs/timing.md for the comparison):

* every token-wise layer (``dense.csv``) at the step's new tokens, every per-sequence layer
  (``per_sequence.csv``: LM head and sampler) at its number of requests, each looked up in
  whole nanoseconds and counted as many times as the model runs it (once per step, or once
  or twice per decoder layer);
* the attention of one decoder layer (``attention.csv``) at the step's summed prefill
  chunk, summed prefill context, number of decodes and mean decode context, times the
  number of layers, with the skew correction of the profile's ``skew_fit`` when
  ``meta.yaml`` enables it;
* with tensor parallelism, two ring all-reduces of the hidden state per decoder layer.

The tables arrive as flat arrays (built by :func:`replay.timing.layer_profile.load`):

``op_keys[i, :op_sizes[i]]``, ``op_ns[i, :op_sizes[i]]``
    token (or sequence) counts and nanoseconds of layer ``i``; ``op_counts[i]`` is how
    often a step runs it; ``op_per_sequence[i]`` is true when it is keyed by sequences.
``pc_axis``, ``nd_axis``, ``slice_of[p, n]``
    the attention grid's prefill chunks and decode counts, and the slice measured at
    ``(pc_axis[p], nd_axis[n])`` (-1 where none was).
``slice_kp_start[s]``, ``slice_kp_size[s]``
    slice ``s``'s prefill contexts ``kp_axis[start:start + size]``; the row of its
    ``j``-th prefill context is ``start + j``.
``row_kd_start[r]``, ``row_kd_size[r]``
    row ``r``'s decode contexts ``kd_axis[start:start + size]`` and their nanoseconds
    ``attention_ns[start:start + size]``.
``skew_pc``, ``skew_*_bins``, ``skew_alpha[q, n, s, k, p]``
    the skew fit's bucket table: ``alpha`` for the batch prefill chunk ``skew_pc[q]`` and
    the bucket of each axis (NaN where the fit has no bucket).
``ints``, ``floats``
    the scalar parameters, at the indices below.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit
from replay.timing.grid_lookup import bracket, interpolate

#: Indices into ``ints``.
I_LAYERS, I_TP, I_SKEW_ENABLED = range(3)
#: Indices into ``floats``: the pooled alpha for a bucket the fit lacks, the bytes an
#: all-reduce moves per token, the link's bytes per second and its latency in seconds.
F_SKEW_DEFAULT, F_ALLREDUCE_BYTES_PER_TOKEN, F_LINK_BYTES_PER_S, F_LINK_LATENCY_S = range(4)
#: All-reduces per decoder layer with tensor parallelism (after ``o_proj`` and ``down_proj``).
ALLREDUCES_PER_LAYER = 2


@jit
def _lookup_ns(keys, values, query):
    """A layer's nanoseconds at ``query`` tokens or sequences: ``max(1, int(...))`` of the
    interpolated value, as ``_lookup_dense`` and ``_lookup_per_sequence`` round it."""
    return max(1, int(interpolate(keys, values, float(max(query, 1)))))


@jit
def _row_value(row, kd, row_kd_start, row_kd_size, kd_axis, attention_ns):
    start = row_kd_start[row]
    size = row_kd_size[row]
    keys = kd_axis[start:start + size]
    values = attention_ns[start:start + size]
    if size == 1:
        return values[0]
    return interpolate(keys, values, float(max(kd, 0)))


@jit
def _slice_value(s, kp, kd, slice_kp_start, slice_kp_size, kp_axis, row_kd_start,
                 row_kd_size, kd_axis, attention_ns):
    """Bilinear in (prefill context, decode context) within one measured slice."""
    start = slice_kp_start[s]
    lo, hi, t = bracket(kp_axis[start:start + slice_kp_size[s]], float(max(kp, 0)))
    low = _row_value(start + lo, kd, row_kd_start, row_kd_size, kd_axis, attention_ns)
    if lo == hi:
        return low
    high = _row_value(start + hi, kd, row_kd_start, row_kd_size, kd_axis, attention_ns)
    return low + t * (high - low)


@jit
def _corner(p, n, kp, kd, pc_axis, nd_axis, slice_of, slice_kp_start, slice_kp_size, kp_axis,
            row_kd_start, row_kd_size, kd_axis, attention_ns):
    """The slice at grid point ``(p, n)``, or where none was measured the nearest measured
    one (squared distance in chunk and decode count; the first in grid order on a tie)."""
    s = slice_of[p, n]
    if s < 0:
        best = np.inf
        for i in range(pc_axis.shape[0]):
            for j in range(nd_axis.shape[0]):
                if slice_of[i, j] >= 0:
                    dist = (pc_axis[i] - pc_axis[p]) ** 2 + (nd_axis[j] - nd_axis[n]) ** 2
                    if dist < best:
                        best = dist
                        s = slice_of[i, j]
    return _slice_value(s, kp, kd, slice_kp_start, slice_kp_size, kp_axis, row_kd_start,
                        row_kd_size, kd_axis, attention_ns)


@jit
def attention_layer_ns(pc, kp, nd, kd, pc_axis, nd_axis, slice_of, slice_kp_start,
                       slice_kp_size, kp_axis, row_kd_start, row_kd_size, kd_axis,
                       attention_ns):
    """One decoder layer's attention at (summed prefill chunk ``pc``, summed prefill context
    ``kp``, decodes ``nd``, decode context ``kd``): linear in each of the four axes."""
    p0, p1, tp = bracket(pc_axis, float(max(pc, 0)))
    n0, n1, tn = bracket(nd_axis, float(max(nd, 0)))
    c00 = _corner(p0, n0, kp, kd, pc_axis, nd_axis, slice_of, slice_kp_start, slice_kp_size,
                  kp_axis, row_kd_start, row_kd_size, kd_axis, attention_ns)
    c01 = _corner(p0, n1, kp, kd, pc_axis, nd_axis, slice_of, slice_kp_start, slice_kp_size,
                  kp_axis, row_kd_start, row_kd_size, kd_axis, attention_ns)
    c10 = _corner(p1, n0, kp, kd, pc_axis, nd_axis, slice_of, slice_kp_start, slice_kp_size,
                  kp_axis, row_kd_start, row_kd_size, kd_axis, attention_ns)
    c11 = _corner(p1, n1, kp, kd, pc_axis, nd_axis, slice_of, slice_kp_start, slice_kp_size,
                  kp_axis, row_kd_start, row_kd_size, kd_axis, attention_ns)
    v0 = c00 + tn * (c01 - c00)
    v1 = c10 + tn * (c11 - c10)
    return max(1, int(v0 + tp * (v1 - v0)))


@jit
def _bucket(bins, value):
    """The bucket ``i`` with ``bins[i] < value <= bins[i + 1]`` (the last one past the end)."""
    labels = bins.shape[0] - 1
    for i in range(labels):
        if value <= bins[i + 1]:
            return i
    return labels - 1


@jit
def skew_alpha(pc, nd, skew_rate, kv_big, kp, skew_pc, skew_n_bins, skew_rate_bins,
               skew_kv_bins, skew_kp_bins, skew_alpha_table, default):
    """The fitted alpha of the batch's bucket, or ``default`` where the fit has none (its
    key holds the batch's prefill chunk as it is, so a chunk off the profiled grid has no
    bucket)."""
    q = -1
    for i in range(skew_pc.shape[0]):
        if skew_pc[i] == pc:
            q = i
    if q < 0:
        return default
    alpha = skew_alpha_table[q, _bucket(skew_n_bins, float(nd)),
                             _bucket(skew_rate_bins, min(max(skew_rate, 0.0), 1.0)),
                             _bucket(skew_kv_bins, float(kv_big)), _bucket(skew_kp_bins, float(kp))]
    return default if np.isnan(alpha) else alpha


@jit
def layer_profile_seconds(new_tokens, context, is_prefill, m, op_keys, op_ns, op_sizes,
                          op_counts, op_per_sequence, pc_axis, nd_axis, slice_of,
                          slice_kp_start, slice_kp_size, kp_axis, row_kd_start, row_kd_size,
                          kd_axis, attention_ns, skew_pc, skew_n_bins, skew_rate_bins,
                          skew_kv_bins, skew_kp_bins, skew_alpha_table, ints, floats):
    """Seconds of one step of the batch ``new_tokens[:m]``, ``context[:m]``,
    ``is_prefill[:m]``. A member counts as a prefill when it prefills more than one token
    (LLMServingSim classifies by the count: a one-token chunk is priced as a decode)."""
    if m == 0:
        return 0.0
    tokens = np.int64(0)
    pc = np.int64(0)
    kp = np.int64(0)
    nd = np.int64(0)
    kd_sum = np.int64(0)
    kd_max = np.int64(0)
    kd_min = np.int64(0)
    for k in range(m):
        tokens += new_tokens[k]
        if is_prefill[k] and new_tokens[k] > 1:
            pc += new_tokens[k]
            kp += context[k]
        else:
            if nd == 0 or context[k] > kd_max:
                kd_max = context[k]
            if nd == 0 or context[k] < kd_min:
                kd_min = context[k]
            nd += 1
            kd_sum += context[k]
    kd_mean = kd_sum // nd if nd > 0 else np.int64(0)
    if nd == 0:
        kd_max = np.int64(0)
        kd_min = np.int64(0)

    total_ns = np.int64(0)
    for i in range(op_sizes.shape[0]):
        size = op_sizes[i]
        query = m if op_per_sequence[i] else tokens
        total_ns += op_counts[i] * _lookup_ns(op_keys[i, :size], op_ns[i, :size], query)

    attention = attention_layer_ns(pc, kp, nd, kd_mean, pc_axis, nd_axis, slice_of,
                                   slice_kp_start, slice_kp_size, kp_axis, row_kd_start,
                                   row_kd_size, kd_axis, attention_ns)
    if ints[I_SKEW_ENABLED] and nd > 1 and kd_max != kd_mean:
        gap = kd_max - kd_min
        skew_rate = (kd_mean - kd_min) / gap if gap > 0 else 0.5
        alpha = skew_alpha(pc, nd, skew_rate, kd_max, kp, skew_pc, skew_n_bins, skew_rate_bins,
                           skew_kv_bins, skew_kp_bins, skew_alpha_table, floats[F_SKEW_DEFAULT])
        if alpha != 0.0:
            longest = attention_layer_ns(pc, kp, nd, kd_max, pc_axis, nd_axis, slice_of,
                                         slice_kp_start, slice_kp_size, kp_axis, row_kd_start,
                                         row_kd_size, kd_axis, attention_ns)
            if longest > attention:
                attention = max(1, int(np.rint(attention + alpha * (longest - attention))))
    layers = ints[I_LAYERS]
    total_ns += layers * attention
    seconds = total_ns * 1e-9

    p = ints[I_TP]
    if p > 1:
        # A ring all-reduce: 2 (p - 1) steps, each moving a p-th of the message over a link.
        message = tokens * floats[F_ALLREDUCE_BYTES_PER_TOKEN]
        step = floats[F_LINK_LATENCY_S] + message / (p * floats[F_LINK_BYTES_PER_S])
        seconds += ALLREDUCES_PER_LAYER * layers * 2 * (p - 1) * step
    return seconds
