"""The sorting and searching that the step loop and the compiled decisions need, over int64.

Written out rather than taken from numba's ``np.sort``, ``np.argsort`` (of either kind)
and ``np.searchsorted``: numba builds those from generic templates whose compilation cost
more cold-compile time (seconds) than the decisions that call them. One stable argsort
serves every caller; callers whose keys are unique get what numpy would give them too.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit

#: Runs of this many elements are insertion-sorted before the merging starts.
_RUN = 16


@jit
def stable_argsort(keys, n):
    """``np.argsort(keys[:n], kind="stable")``: a new int64 array (insertion-sorted runs,
    then bottom-up merges; ties keep their input order)."""
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        order[i] = i
    for lo in range(0, n, _RUN):
        hi = min(lo + _RUN, n)
        for i in range(lo + 1, hi):
            item = order[i]
            key = keys[item]
            j = i
            while j > lo and keys[order[j - 1]] > key:
                order[j] = order[j - 1]
                j -= 1
            order[j] = item
    if n <= _RUN:
        return order
    source = order
    target = np.empty(n, dtype=np.int64)
    width = _RUN
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            if mid >= hi or keys[source[mid - 1]] <= keys[source[mid]]:
                # already in order (a sorted or nearly sorted input costs O(n))
                for out in range(lo, hi):
                    target[out] = source[out]
                continue
            i, j = lo, mid
            for out in range(lo, hi):
                # the left run's element on ties: stable
                if j >= hi or (i < mid and keys[source[i]] <= keys[source[j]]):
                    target[out] = source[i]
                    i += 1
                else:
                    target[out] = source[j]
                    j += 1
        source, target = target, source
        width *= 2
    return source


@jit
def sorted_copy(values, n):
    """``np.sort(values[:n])``: a new array."""
    order = stable_argsort(values, n)
    result = np.empty(n, dtype=np.int64)
    for i in range(n):
        result[i] = values[order[i]]
    return result


@jit
def search_left(ascending, value):
    """``np.searchsorted(ascending, value)``: the first index whose element is not below
    ``value`` (``ascending.size`` if none)."""
    lo, hi = 0, ascending.size
    while lo < hi:
        mid = (lo + hi) // 2
        if ascending[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo
