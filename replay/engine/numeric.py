"""numpy's float sum as a compiled function, for rules that must agree with numpy to the last bit.

Where a rule sums a float array (Vidur's prefill terms, the token-gap histogram's total),
numpy's result depends on the order of its pairwise summation. The compiled code adds in
the same order, so a run's totals are what numpy would compute from the same values.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit


def _pairwise_leaf(a):
    """numpy's pairwise_sum for ``a.size <= 128``: sequential below 8, else 8 accumulators."""
    n = a.size
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    whole = n - n % 8
    while i < whole:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i]
        i += 1
    return res


_compiled_leaf = jit(_pairwise_leaf)


def _pairwise_sum(a):
    """``a.sum()`` as numpy computes it for a contiguous float64 array (pairwise
    summation: 8 accumulators per block of up to 128, halves above).

    numpy recurses; numba's on-disk cache cannot load recursive functions, so the halving
    tree is walked with an explicit stack (float addition commutes, so only the tree's
    shape fixes the result, not the order it is walked in)."""
    n = a.size
    if n <= 128:
        return _compiled_leaf(a)
    frame_lo = np.empty(128, dtype=np.int64)
    frame_n = np.empty(128, dtype=np.int64)
    frame_join = np.empty(128, dtype=np.bool_)
    values = np.empty(128, dtype=np.float64)
    frames = 1
    frame_lo[0], frame_n[0], frame_join[0] = 0, n, False
    top = 0
    while frames:
        frames -= 1
        at, size, join = frame_lo[frames], frame_n[frames], frame_join[frames]
        if size <= 128:
            values[top] = _compiled_leaf(a[at:at + size])
            top += 1
        elif join:
            top -= 1
            values[top - 1] = values[top - 1] + values[top]
        else:
            half = size // 2
            half -= half % 8
            frame_join[frames] = True
            frames += 1
            frame_lo[frames], frame_n[frames], frame_join[frames] = at + half, size - half, False
            frames += 1
            frame_lo[frames], frame_n[frames], frame_join[frames] = at, half, False
            frames += 1
    return values[0]


#: numpy's sum of a contiguous float64 array, callable from compiled code.
pairwise_sum = jit(_pairwise_sum)
