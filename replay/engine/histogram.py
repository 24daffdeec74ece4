"""A streaming log-binned histogram, for per-run distributions too large to keep whole.

Time between tokens has one value per generated token (about 10^8 for a
million-request replay), so the engine keeps its distribution in fixed memory:
values are buffered and folded into bins of constant relative width. Quantiles
are then exact to within one bin (``resolution``, 0.1 % by default); the count,
sum, minimum and maximum are exact.

Folding is one rule, :func:`fold_values`, compiled, which the step loop calls inside its
loop on this histogram's own arrays and which :meth:`LogHistogram.add` calls for values
added from Python: a value lands in the same bin either way. (numpy's SIMD ``log`` and
the C library's ``log`` that compiled code calls differ in the last bit for about 3
values in 10,000, enough to move a value across a bin edge now and then, so there must
not be a second, vectorized version of the rule.)
"""

from __future__ import annotations

import math

import numpy as np

from replay.engine.jit import jit
from replay.engine.numeric import pairwise_sum


def _fold_values(values, k, counts, log_lo, log_ratio):
    """Count ``values[:k]`` into ``counts`` (bin ``floor((log v - log_lo) / log_ratio)``,
    clipped to the first and last bin) and return their sum (numpy's pairwise summation,
    as ``values[:k].sum()``) and maximum. A value equal to the one before it reuses its bin:
    token gaps come in runs of equal values (every decode of a step has the same gap), so
    most values cost no logarithm."""
    top = counts.size - 1
    previous = np.nan
    index = 0
    largest = -np.inf
    for i in range(k):
        value = values[i]
        if value != previous:
            if not value >= 0.0:  # NaN or negative: no bin (numpy's bincount refuses it too)
                raise ValueError("a token gap that is not a number >= 0")
            position = np.floor((np.log(value) - log_lo) / log_ratio)
            index = 0 if position < 0 else (top if position > top else np.int64(position))
            previous = value
            largest = max(largest, value)
        counts[index] += 1
    return pairwise_sum(values[:k]), largest


#: The fold rule (see the module docstring).
fold_values = jit(_fold_values)


class LogHistogram:
    """Positive values in geometric bins ``[lo * r^k, lo * r^(k+1))`` with ``r = 1 + resolution``.

    Values below ``lo`` go to the first bin and values above ``hi`` to the last
    (clipped, still counted; the exact ``max`` is kept separately).
    """

    def __init__(self, resolution: float = 1e-3, lo: float = 1e-7, hi: float = 1e7,
                 buffer_size: int = 1 << 16) -> None:
        self.resolution = resolution
        self._log_lo = math.log(lo)
        self._log_ratio = math.log1p(resolution)
        self.counts = np.zeros(int(math.ceil(math.log(hi / lo) / self._log_ratio)) + 1,
                               dtype=np.int64)
        self._buffer = np.empty(buffer_size)
        self._filled = 0
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, values: np.ndarray) -> None:
        k = values.size
        if k == 0:
            return
        if self._filled + k > self._buffer.size:
            self._flush()
            if k > self._buffer.size:
                self._fold(values)
                return
        self._buffer[self._filled:self._filled + k] = values
        self._filled += k

    def add_repeated(self, values: np.ndarray, each: int) -> None:
        """Same as ``add(np.full(each, v))`` for each ``v`` of ``values`` in turn.

        The buffer is folded at the same points as those separate calls would
        fold it, so the running ``total`` (a float sum) is identical too.
        """
        if each == 0:
            return
        if each > self._buffer.size:
            for value in values:
                self.add(np.full(each, value))
            return
        done = 0
        while done < values.size:
            rows = (self._buffer.size - self._filled) // each
            if rows == 0:
                self._flush()
                continue
            rows = min(rows, values.size - done)
            rows_values = values[done:done + rows]
            self._buffer[self._filled:self._filled + rows * each] = (
                rows_values if each == 1 else np.repeat(rows_values, each))
            self._filled += rows * each
            done += rows

    def _flush(self) -> None:
        if self._filled:
            self._fold(self._buffer[:self._filled])
            self._filled = 0

    def _fold(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float64)
        total, largest = fold_values(values, values.size, self.counts, self._log_lo,
                                     self._log_ratio)
        self.count += values.size
        self.total += total
        self.max = max(self.max, largest)

    def summary(self, quantiles=(0.5, 0.99)) -> dict:
        """``count``, ``mean``, ``max`` and the requested quantiles (bin midpoints, geometric)."""
        self._flush()
        out: dict = {"count": self.count, "mean": self.total / self.count if self.count else None,
                     "max": self.max if self.count else None}
        cumulative = np.cumsum(self.counts)
        for q in quantiles:
            if not self.count:
                out[q] = None
                continue
            k = int(np.searchsorted(cumulative, q * self.count, side="left"))
            mid = math.exp(self._log_lo + (k + 0.5) * self._log_ratio)
            out[q] = min(mid, self.max)
        return out
