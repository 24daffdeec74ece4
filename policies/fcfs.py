"""FCFS with lookahead (the papers' "MC-Benchmark"; POLICIES.md §1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.common.lookahead import PeakHint, start_admissible
from replay.engine.policy import Batch, OverflowRule, PolicyView


@dataclass
class FCFSLookahead:
    """Running requests always continue; admit waiting requests in arrival order
    (ties by workload position) while the lookahead check passes, stopping at the
    first that fails (no skipping)."""

    overflow: OverflowRule
    hint: PeakHint = field(default_factory=PeakHint, init=False, repr=False)

    def decide(self, view: PolicyView) -> Batch:
        return start_admissible(view, view.waiting, self.hint)  # the queue is in arrival order
