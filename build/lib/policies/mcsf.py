"""MC-SF, memory-constrained shortest first (POLICIES.md §2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.lookahead import admissible_prefix
from replay.policy import Batch, OverflowRule, PolicyView


@dataclass
class MCSF:
    """FCFS with lookahead, but the waiting queue is walked in ascending predicted
    output length (ties: earlier arrival, then id; engine ids already encode that
    order). Stops at the first request that fails the lookahead check.

    Cost per decision: one sort of the waiting queue plus ``O(log k)``
    vectorised checks, independent of the trace length.
    """

    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting
        if waiting.size == 0:
            return Batch()
        order = waiting[np.lexsort((waiting, view.predicted_output[waiting]))]
        return Batch(start=order[: admissible_prefix(view, order)])
