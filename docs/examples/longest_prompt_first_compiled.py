"""Longest prompt first, as a compiled decision: the example of docs/adding-a-policy.md
written the way the built-in policies are, so that the step loop calls it directly.

Copy this file to ``policies/`` and select it with a yaml whose ``_target_`` is
``policies.longest_prompt_first_compiled.LongestPromptFirstCompiled``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.common.lookahead import lookahead_memory, start_admissible
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.sorting import stable_argsort
from replay.engine.state import new_rule_state


@jit
def longest_prompt_first_decide(s, rule):
    """The waiting queue by descending prompt length (ties: queue order), started as far as
    the lookahead check admits (``rule.counts`` is the check's memory)."""
    n = s.qtail - s.qhead
    # keys: the decision's scratch (free until start_admissible, which uses it); order: the
    # rule's own buffer (see rule_state), which start_admissible reads
    keys, order = s.scratch, rule.ids
    for i in range(n):
        keys[i] = -s.prompt_len[s.queue[s.qhead + i]]
    ranked = stable_argsort(keys, n)
    for i in range(n):
        order[i] = s.queue[s.qhead + ranked[i]]
    return start_admissible(s, rule, order, n)


@dataclass
class LongestPromptFirstCompiled(CompiledPolicy):
    """Start the longest waiting prompts first, within the lookahead memory check."""

    overflow: OverflowRule

    decision = longest_prompt_first_decide

    def rule_state(self, setup: RunSetup):
        return new_rule_state(ids=np.zeros(setup.n, dtype=np.int64),
                              counts=lookahead_memory(setup.n))
