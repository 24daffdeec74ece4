"""FCFS with lookahead (the papers' "MC-Benchmark"; POLICIES.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

from replay.lookahead import admissible_prefix, first_cannot_join
from replay.policy import Batch, OverflowRule, PolicyView


@dataclass
class FCFSLookahead:
    """Running requests always continue; admit waiting requests in arrival order
    (ties by workload position) while the lookahead check passes, stopping at the
    first that fails (no skipping)."""

    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting  # already in arrival order
        if waiting.size == 0 or first_cannot_join(view, waiting):
            return Batch(steady=True)
        return Batch(start=waiting[: admissible_prefix(view, waiting)])
