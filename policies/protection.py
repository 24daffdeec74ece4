"""alpha-protection greedy and alpha/beta-clearing, the vLLM-style threshold baselines
(POLICIES.md §3). Both use this admission rule; they differ only in the overflow
rule their config gives the engine (``ClearAll`` or ``ClearEachWithProb(beta)``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay.engine.policy import Batch, OverflowRule, PolicyView
from replay.errors import ConfigError
from replay.params import check


@dataclass
class AlphaProtection:
    """Running requests always continue. Walk the waiting queue in arrival order and
    admit request ``i`` while ``held_now + admitted_so_far + (s_i + 1) <= (1 - alpha) M``,
    where ``admitted_so_far`` sums ``s_j + 1`` over the requests admitted before it;
    stop at the first that does not fit. Output lengths are not used, so the batch
    may later outgrow ``M``: the engine then applies ``overflow``.
    """

    alpha: float = field(metadata=check(ge=0, lt=1))
    overflow: OverflowRule

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"policy.alpha must be in [0, 1), got {self.alpha}")

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting
        budget = (1.0 - self.alpha) * view.kv_capacity - view.kv_held
        first_step = np.cumsum(view.prompt_len[waiting] + 1)
        return Batch(start=waiting[: int(np.searchsorted(first_step, budget, side="right"))])
