"""MC-SF, memory-constrained shortest first (POLICIES.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.common.lookahead import PeakHint, start_admissible
from policies.common.ordering import KeptOrder
from replay.engine.policy import UNTIL_CHANGE, Batch, OverflowRule, PolicyView


@dataclass
class MCSF:
    """FCFS with lookahead, but the waiting queue is walked in ascending predicted
    output length (ties: earlier arrival, then id; engine ids already encode that
    order). Stops at the first request that fails the lookahead check.

    Cost per decision: keeping the order across steps (:class:`policies.common.ordering.KeptOrder`:
    nothing while the queue is unchanged, else ``O(waiting)`` vectorised work, no sort
    of the whole queue) plus ``O(log k)`` vectorised checks, independent of the trace
    length.
    """

    overflow: OverflowRule
    kept: KeptOrder = field(default_factory=KeptOrder, init=False, repr=False)
    hint: PeakHint = field(default_factory=PeakHint, init=False, repr=False)

    def decide(self, view: PolicyView) -> Batch:
        if view.waiting.size == 0:  # start_admissible says the same, but skip the ordering
            return Batch(steady_steps=UNTIL_CHANGE)
        return start_admissible(view, self.kept.ordered(view.waiting, view.predicted_output),
                                self.hint)
