"""Sorted-F with interval predictions: A_min and its two naive variants (docs/policies/sorted-f.md).

Each request has a predicted interval ``[l, u]`` holding ``o`` (``prediction=``).

* ``a_min``: plan with ``ô = l``. After every iteration a running request's
  ``ô`` rises to the tokens it has generated, so one that outlives its estimate
  is assumed to need one more iteration. When the running set's projected KV
  under ``ô`` exceeds ``M``, it is evicted in ascending ``(ô, id)`` until the
  rest fits (the policy preempts, under ``restart``: progress is lost); an
  evicted request keeps its refined ``ô`` and waits at its place in the Phase-1
  order. Evicting before admitting means no just-admitted request ever needs
  to go: the admission check already uses the refined estimates.
* ``a_max``: plan and check with ``u``; never evicts (``u >= o``).
* ``optimistic``: plan and check with ``l`` and never refine; an actual overflow
  is the engine's ``overflow`` rule (``EvictLIFO`` by default).

Phase 1 and 2 are Sorted-F's (``solver``, ``phase1_feasibility``). With
``prediction=exact`` all three are Sorted-F.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.lookahead import peak_kv, running_profile
from policies.sorted_f import SortedF
from replay.engine.policy import PolicyView
from replay.errors import ConfigError

VARIANTS = ("a_min", "a_max", "optimistic")


@dataclass
class AMin(SortedF):
    variant: Literal["a_min", "a_max", "optimistic"] = "a_min"
    estimates: np.ndarray | None = field(default=None, init=False, repr=False)
    policy_evictions: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise ConfigError(f"policy.variant={self.variant!r}: choose one of "
                              f"{', '.join(VARIANTS)}")

    def estimate(self, view: PolicyView) -> np.ndarray:
        if self.variant == "a_max":
            return view.predicted_hi
        if self.variant == "optimistic":
            return view.predicted_lo
        if self.estimates is None:
            self.estimates = view.predicted_lo.copy()
        run = view.running
        self.estimates[run] = np.maximum(self.estimates[run], view.generated[run])
        return self.estimates

    def evict(self, view: PolicyView, estimate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A_min only: the fewest running requests, in ascending ``(ô, id)``, whose eviction
        brings the projected KV within ``M``."""
        if self.variant != "a_min" or view.running.size == 0:
            return super().evict(view, estimate)
        run = view.running
        by_estimate = run[np.lexsort((run, estimate[run]))]
        for count in range(by_estimate.size + 1):
            kept = by_estimate[count:]
            base, remaining = running_profile(view, estimate, kept)
            if peak_kv(base, remaining, view.kv_block_size) <= view.kv_capacity:
                break
        self.policy_evictions += count
        return np.sort(kept), by_estimate[:count]

    def describe(self) -> dict:
        return {**super().describe(), "variant": self.variant,
                "policy_evictions": self.policy_evictions}
