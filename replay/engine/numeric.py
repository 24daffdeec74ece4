"""Plain functions over arrays that both step loops run, compiled with numba where it imports.

A rule that the Python engine and the compiled step loop (:mod:`replay.compiled`) must
apply to the last bit is written once, here or in a module that uses :func:`jit`, and
called by both: the compiled loop calls the compiled function, the Python engine the
same compiled function (or, on a machine without numba, numpy's equivalent, which only
such a machine runs).

numba keys a function cached on disk by its own source file only, so a caller in another
file would load stale machine code after an edit of its callee. Every compiled function
of kvsched is therefore cached in one folder named by a hash of all the sources that
define compiled functions (:data:`JIT_SOURCES`), under ``$NUMBA_CACHE_DIR`` if set, else
``numba/`` in kvsched's per-user cache folder; numba's own setting is restored once the
functions are defined, so other numba users in the process keep theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import numpy as np

from replay.data import cache_dir

try:
    import numba
except ImportError:  # the Python engine then runs numpy's equivalents
    numba = None

#: The modules (relative to the ``replay`` package) that define compiled functions: their
#: sources key the disk cache.
JIT_SOURCES = ("compiled/decisions.py", "compiled/kernels.py", "compiled/pricing.py",
               "compiled/sorting.py", "engine/numeric.py", "engine/histogram.py")


def numba_cache_dir() -> str:
    """The disk cache folder of kvsched's compiled functions (see the module docstring)."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for name in JIT_SOURCES:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes())
    root = os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir("numba"))
    return os.path.join(root, f"kvsched-compiled-{digest.hexdigest()[:16]}")


@contextlib.contextmanager
def kvsched_numba_cache():
    """Functions decorated with ``cache=True`` inside this block cache in
    :func:`numba_cache_dir` (numba reads its setting when it decorates)."""
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = numba_cache_dir()
    try:
        yield
    finally:
        numba.config.CACHE_DIR = saved


def jit(function):
    """``function`` compiled by numba (``njit``, cached on disk), or ``None`` without numba."""
    if numba is None:
        return None
    with kvsched_numba_cache():
        return numba.njit(cache=True)(function)


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


def _numpy_sum(a):
    return float(a.sum())


#: numpy's sum of a contiguous float64 array, callable from compiled code.
pairwise_sum = _numpy_sum if numba is None else jit(_pairwise_sum)
