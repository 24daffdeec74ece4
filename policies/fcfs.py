"""FCFS with lookahead (the papers' "MC-Benchmark"; docs/policies/lookahead.md)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.common.lookahead import lookahead_memory, start_admissible
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state


@jit
def fcfs_decide(s, rule):
    """Running requests continue; waiting requests start in queue order (arrival order,
    ties by workload position) while the lookahead check passes, stopping at the first that
    fails (no skipping)."""
    return start_admissible(s, rule, s.queue[s.qhead:s.qtail], s.qtail - s.qhead)


@dataclass
class FCFSLookahead(CompiledPolicy):
    """Running requests always continue; admit waiting requests in arrival order (ties by
    workload position) while the lookahead check passes, stopping at the first that fails
    (no skipping). Its record keeps the lookahead's memory (``counts``)."""

    overflow: OverflowRule

    decision = fcfs_decide

    def rule_state(self, setup: RunSetup):
        return new_rule_state(counts=lookahead_memory(setup.n))
