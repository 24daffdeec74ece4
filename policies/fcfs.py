"""FCFS with lookahead (the papers' "MC-Benchmark"; POLICIES.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

from replay.lookahead import start_admissible
from replay.policy import Batch, OverflowRule, PolicyView


@dataclass
class FCFSLookahead:
    """Running requests always continue; admit waiting requests in arrival order
    (ties by workload position) while the lookahead check passes, stopping at the
    first that fails (no skipping)."""

    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch:
        return start_admissible(view, view.waiting)  # the queue is in arrival order
