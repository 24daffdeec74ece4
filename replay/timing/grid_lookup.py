"""Interpolation on measured grids, as ``@njit`` functions the step prices of the table-driven
backends share (:mod:`replay.timing.layer_profile_step`, :mod:`replay.timing.kernel_db_step`).

An axis is a sorted, strictly increasing float64 array. :func:`bracket` places a query on
it the way LLMServingSim's trace generator does (``_axis_bracket`` and ``_lookup_bounds`` in
its ``serving/core/trace_generator.py``): at or below the first point it clamps to the
first point, between two points it interpolates linearly, above the last point it
extrapolates linearly from the last two.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit


@jit
def bracket(axis, query):
    """``(lo, hi, t)``: the value at ``query`` is ``v[lo] + t * (v[hi] - v[lo])``."""
    n = axis.shape[0]
    if n == 1 or query <= axis[0]:
        return 0, 0, 0.0
    idx = np.searchsorted(axis, query, side="right")
    if idx >= n:
        lo, hi = n - 2, n - 1
    else:
        lo, hi = idx - 1, idx
    return lo, hi, (query - axis[lo]) / (axis[hi] - axis[lo])


@jit
def interpolate(axis, values, query):
    """``values`` (one per point of ``axis``) at ``query``, placed by :func:`bracket`."""
    lo, hi, t = bracket(axis, query)
    if lo == hi:
        return values[lo]
    return values[lo] + t * (values[hi] - values[lo])


@jit
def clamped_bilinear(x_axis, y_axis, table, x, y):
    """``table[i, j]`` (measured at ``x_axis[i]``, ``y_axis[j]``) at ``(x, y)`` clamped into
    the grid, bilinear between the four surrounding points."""
    x = min(max(x, x_axis[0]), x_axis[-1])
    y = min(max(y, y_axis[0]), y_axis[-1])
    i0, i1, tx = bracket(x_axis, x)
    j0, j1, ty = bracket(y_axis, y)
    low = table[i0, j0] + ty * (table[i0, j1] - table[i0, j0])
    high = table[i1, j0] + ty * (table[i1, j1] - table[i1, j0])
    return low + tx * (high - low)
