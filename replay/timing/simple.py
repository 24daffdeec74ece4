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
    """``d0 + d1 KV + d2 P + d3 D + d4 R`` seconds per iteration, all terms linear counts.

    * ``KV``, the KV tokens touched: the sum over batch members of the slots they
      hold after the iteration's new tokens are written (``context + new_tokens``),
      the memory the attention kernels read, as in the fluid/WAIT paper's
      ``tau = d0 + d1 * KV``. Paused requests hold KV but are not touched.
    * ``P``, prefill tokens: the new tokens of the members that prefill.
    * ``D``, decode tokens: the members that decode (one new token each). ``d2`` and
      ``d3`` are the per-token compute of the linear layers (``d2`` also carries the
      prompts' attention); a prompt token costs about a decode token.
    * ``R``, prompts: the members that prefill. Attention is priced per prompt (a
      kernel call per sequence, short chunks padded), which a per-token term misses
      when many short prompts start together.

    With ``d3 = d4 = 0`` this is the paper's model plus the prefill term, unchanged.
    The coefficients per model and hardware are fitted to ``timing=vidur`` by
    :mod:`replay.timing.fit_linear` (``configs/model/*.yaml``, ``linear_timing``);
    :mod:`replay.fluid.model` solves the fluid equilibrium of this form in closed form.
    """

    d0: float
    d1: float
    d2: float = 0.0
    d3: float = 0.0
    d4: float = 0.0
    source: str = "given"
    time_unit: str = "seconds"

    def __post_init__(self) -> None:
        coefficients = (self.d0, self.d1, self.d2, self.d3, self.d4)
        if min(coefficients) < 0 or sum(coefficients) <= 0:
            raise ConfigError(
                f"timing.linear: coefficients must be >= 0 and not all zero, got "
                f"d0={self.d0}, d1={self.d1}, d2={self.d2}, d3={self.d3}, d4={self.d4}")

    @staticmethod
    def terms(batch: BatchShape) -> tuple[int, int, int, int]:
        """``(KV tokens touched, prefill tokens, decode tokens, prompts)``: the regressors
        besides 1."""
        new_tokens = int(batch.new_tokens.sum())
        prompts = int(np.count_nonzero(batch.is_prefill))
        prefill = int(batch.new_tokens[batch.is_prefill].sum()) if prompts else 0
        return (int(batch.context.sum()) + new_tokens, prefill, batch.size - prompts, prompts)

    def duration(self, batch: BatchShape) -> float:
        touched, prefill, decodes, prompts = self.terms(batch)
        return (self.d0 + self.d1 * touched + self.d2 * prefill + self.d3 * decodes
                + self.d4 * prompts)

    def stretch_durations(self, stretch: Stretch, steps: int) -> np.ndarray:
        # The same float operations as duration(), one element per iteration: the terms are
        # whole numbers, so summing them in another order changes nothing. Within a stretch
        # only KV grows; prefill tokens, decodes and prompts are constants.
        chunk_total = int(stretch.chunk.sum())
        per_step = stretch.decodes + chunk_total  # new tokens, and the growth of the context
        touched = (stretch.decode_context_sum + int(stretch.chunk_context.sum())
                   + per_step * np.arange(1, steps + 1, dtype=np.int64))
        return (self.d0 + self.d1 * touched + self.d2 * chunk_total + self.d3 * stretch.decodes
                + self.d4 * int(stretch.chunk.size))

    def coefficients(self) -> dict[str, float]:
        return {"d0": self.d0, "d1": self.d1, "d2": self.d2, "d3": self.d3, "d4": self.d4}

    def describe(self) -> dict:
        return {"backend": "linear", **self.coefficients(), "source": self.source,
                "form": "d0 + d1*KV touched + d2*prefill tokens + d3*decode tokens + d4*prompts"}
