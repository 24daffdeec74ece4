"""MC-SF, memory-constrained shortest first (POLICIES.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.lookahead import admissible_prefix, first_cannot_join
from replay.ordering import KeptOrder
from replay.policy import Batch, OverflowRule, PolicyView


@dataclass
class MCSF:
    """FCFS with lookahead, but the waiting queue is walked in ascending predicted
    output length (ties: earlier arrival, then id; engine ids already encode that
    order). Stops at the first request that fails the lookahead check.

    Cost per decision: ``O(waiting)`` vectorised work to keep the order across steps
    (:class:`replay.ordering.KeptOrder`; no sort of the whole queue) plus
    ``O(log k)`` vectorised checks, independent of the trace length.
    """

    overflow: OverflowRule
    kept: KeptOrder = field(default_factory=KeptOrder, init=False, repr=False)

    def decide(self, view: PolicyView) -> Batch:
        if view.waiting.size == 0:
            return Batch(steady=True)
        order = self.kept.ordered(view.waiting, view.predicted_output)
        if first_cannot_join(view, order):
            return Batch(steady=True)
        return Batch(start=order[: admissible_prefix(view, order)])
