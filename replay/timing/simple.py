"""The two closed-form backends: unit time and the linear iteration-time model.

Each price is one compiled function that the step loop calls and that ``duration()`` calls
for a single shape (:class:`replay.engine.rules.CompiledTiming`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.engine.jit import jit
from replay.engine.rules import CompiledTiming
from replay.engine.state import new_timing_state
from replay.engine.timing import BatchShape
from replay.errors import ConfigError


@jit
def _unit_price(s, timing):
    return 1.0


@jit
def _unit_price_decodes(timing, m, context_sum, context_max):
    return 1.0


class UnitTiming(CompiledTiming):
    """Every iteration takes exactly one round (the papers' theoretical model)."""

    time_unit = "rounds"
    price_batch = _unit_price
    price_decodes = _unit_price_decodes

    def describe(self) -> dict:
        return {"backend": "unit"}


@jit(inline="always")
def linear_terms(new_tokens, context, is_prefill, m):
    """``(KV tokens touched, prefill tokens, decode tokens, prompts)`` of the batch ``[:m]``:
    the linear model's regressors besides 1 (see :class:`LinearTiming`)."""
    touched = 0
    prefill = 0
    prompts = 0
    for k in range(m):
        touched += context[k] + new_tokens[k]
        if is_prefill[k]:
            prefill += new_tokens[k]
            prompts += 1
    return touched, prefill, m - prompts, prompts


@jit
def _linear_price(s, timing):
    touched, prefill, decodes, prompts = linear_terms(s.new_tokens, s.context, s.is_prefill, s.m)
    d = timing.floats
    return d[0] + d[1] * touched + d[2] * prefill + d[3] * decodes + d[4] * prompts


@jit
def _linear_price_decodes(timing, m, context_sum, context_max):
    # The same operations as _linear_price for m decodes: touched = context + one new token
    # each, no prefill tokens and no prompts.
    d = timing.floats
    return d[0] + d[1] * (context_sum + m) + d[2] * 0 + d[3] * m + d[4] * 0


@dataclass(frozen=True)
class LinearTiming(CompiledTiming):
    """``d0 + d1 KV + d2 P + d3 D + d4 R`` seconds per iteration, all terms linear counts.

    * ``KV``, the KV tokens touched: the sum over batch members of the slots they hold after
      the iteration's new tokens are written (``context + new_tokens``), the memory the
      attention kernels read, as in the fluid/WAIT paper's ``tau = d0 + d1 * KV``. Paused
      requests hold KV but are not touched.
    * ``P``, prefill tokens: the new tokens of the members that prefill.
    * ``D``, decode tokens: the members that decode (one new token each). ``d2`` and ``d3``
      are the per-token compute of the linear layers (``d2`` also carries the prompts'
      attention); a prompt token costs about a decode token.
    * ``R``, prompts: the members that prefill. Attention is priced per prompt (a kernel
      call per sequence, short chunks padded), which a per-token term misses when many short
      prompts start together.

    With ``d3 = d4 = 0`` this is the paper's model plus the prefill term, unchanged. The
    coefficients per model and hardware are fitted to ``timing=vidur`` by
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

    price_batch = _linear_price
    price_decodes = _linear_price_decodes

    def __post_init__(self) -> None:
        coefficients = (self.d0, self.d1, self.d2, self.d3, self.d4)
        if min(coefficients) < 0 or sum(coefficients) <= 0:
            raise ConfigError(
                f"timing.linear: coefficients must be >= 0 and not all zero, got "
                f"d0={self.d0}, d1={self.d1}, d2={self.d2}, d3={self.d3}, d4={self.d4}")

    def timing_state(self):
        return new_timing_state(floats=[self.d0, self.d1, self.d2, self.d3, self.d4])

    @staticmethod
    def terms(batch: BatchShape) -> tuple[int, int, int, int]:
        """``(KV tokens touched, prefill tokens, decode tokens, prompts)``: the regressors
        besides 1, as the price counts them."""
        terms = linear_terms(np.ascontiguousarray(batch.new_tokens, dtype=np.int64),
                             np.ascontiguousarray(batch.context, dtype=np.int64),
                             np.ascontiguousarray(batch.is_prefill, dtype=np.bool_), batch.size)
        return tuple(int(term) for term in terms)

    def coefficients(self) -> dict[str, float]:
        return {"d0": self.d0, "d1": self.d1, "d2": self.d2, "d3": self.d3, "d4": self.d4}

    def describe(self) -> dict:
        return {"backend": "linear", **self.coefficients(), "source": self.source,
                "form": "d0 + d1*KV touched + d2*prefill tokens + d3*decode tokens + d4*prompts"}

