"""alpha-protection greedy and alpha/beta-clearing, the vLLM-style threshold baselines
(docs/policies/lookahead.md). Both use this admission rule; they differ only in the overflow
rule their config gives the engine (``ClearAll`` or ``ClearEachWithProb(beta)``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.params import check


@jit
def protection_decide(s, rule):
    """The queue prefix whose first iteration's KV fits ``(1 - alpha) M``: request ``i`` starts
    while the KV held now plus ``s_j + 1`` for it and every request started before it stays
    within that budget."""
    budget = (1.0 - rule.floats[0]) * s.capacity - s.kv_held
    queue, prompt_len, start = s.queue, s.prompt_len, s.start
    total = 0
    k = 0
    for q in range(s.qhead, s.qtail):
        total += prompt_len[queue[q]] + 1
        if total > budget:
            break
        start[k] = queue[q]
        k += 1
    s.n_start = k
    return 0


@dataclass
class AlphaProtection(CompiledPolicy):
    """Running requests always continue. Walk the waiting queue in arrival order and admit
    request ``i`` while ``held_now + admitted_so_far + (s_i + 1) <= (1 - alpha) M``, where
    ``admitted_so_far`` sums ``s_j + 1`` over the requests admitted before it; stop at the
    first that does not fit. Output lengths are not used, so the batch may later outgrow
    ``M``: the engine then applies ``overflow``.
    """

    alpha: float = field(metadata=check(ge=0, lt=1))
    overflow: OverflowRule

    decision = protection_decide

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"policy.alpha must be in [0, 1), got {self.alpha}")

    def rule_state(self, setup: RunSetup):
        return new_rule_state(floats=[self.alpha])
