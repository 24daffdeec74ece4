"""A streaming log-binned histogram, for per-run distributions too large to keep whole.

Time between tokens has one value per generated token (about 10^8 for a
million-request replay), so the engine keeps its distribution in fixed memory:
values are buffered and folded into bins of constant relative width. Quantiles
are then exact to within one bin (``resolution``, 0.1 % by default); the count,
sum, minimum and maximum are exact.
"""

from __future__ import annotations

import math

import numpy as np


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
        self.count += values.size
        self.total += float(values.sum())
        self.max = max(self.max, float(values.max()))
        # In place: the same floating-point steps as one expression, without a temporary
        # array per step (folding is a third of a short replay's compiled loop time).
        index = np.log(values)
        index -= self._log_lo
        index /= self._log_ratio
        np.floor(index, out=index)
        np.clip(index, 0, self.counts.size - 1, out=index)
        self.counts += np.bincount(index.astype(np.int64), minlength=self.counts.size)

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
