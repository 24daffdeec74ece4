"""The two closed-form backends: unit time and the linear iteration-time model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.errors import ConfigError
from replay.timing.base import BatchShape, Stretch


class UnitTiming:
    """Every iteration takes exactly one round (the papers' theoretical model)."""

    time_unit = "rounds"

    def duration(self, batch: BatchShape) -> float:
        return 1.0

    def stretch_durations(self, stretch: Stretch, steps: int) -> np.ndarray:
        return np.ones(steps)

    def describe(self) -> dict:
        return {"backend": "unit"}


@dataclass(frozen=True)
class LinearTiming:
    """``d0 + d1 * (KV tokens touched by the batch) + d2 * (prefill tokens)`` seconds.

    "KV tokens touched" is the sum over batch members of the slots they hold
    after the iteration's new tokens are written (``context + new_tokens``): the
    memory the attention kernels read, as in the fluid/WAIT paper's
    ``tau = d0 + d1 * KV``. Paused requests hold KV but are not touched.
    """

    d0: float
    d1: float
    d2: float = 0.0
    source: str = "given"
    time_unit: str = "seconds"

    def __post_init__(self) -> None:
        if self.d0 < 0 or self.d1 < 0 or self.d2 < 0 or self.d0 + self.d1 + self.d2 <= 0:
            raise ConfigError(
                f"timing.linear: coefficients must be >= 0 and not all zero, got "
                f"d0={self.d0}, d1={self.d1}, d2={self.d2}"
            )

    @staticmethod
    def terms(batch: BatchShape) -> tuple[int, int]:
        """``(KV tokens touched, prefill tokens)``: the model's regressors besides 1."""
        new_tokens = int(batch.new_tokens.sum())
        return (int(batch.context.sum()) + new_tokens,
                int(batch.new_tokens[batch.is_prefill].sum()) if np.count_nonzero(batch.is_prefill)
                else 0)

    def duration(self, batch: BatchShape) -> float:
        touched, prefill = self.terms(batch)
        return self.d0 + self.d1 * touched + self.d2 * prefill

    def stretch_durations(self, stretch: Stretch, steps: int) -> np.ndarray:
        # The same float operations as duration(), one element per iteration: the terms are
        # whole numbers, so summing them in another order changes nothing.
        chunk_total = int(stretch.chunk.sum())
        per_step = stretch.decodes + chunk_total  # new tokens, and the growth of the context
        touched = (stretch.decode_context_sum + int(stretch.chunk_context.sum())
                   + per_step * np.arange(1, steps + 1, dtype=np.int64))
        return self.d0 + self.d1 * touched + self.d2 * chunk_total

    def describe(self) -> dict:
        return {"backend": "linear", "d0": self.d0, "d1": self.d1, "d2": self.d2,
                "source": self.source}
