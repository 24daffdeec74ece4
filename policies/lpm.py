"""Longest prefix match (LPM): vLLM-like admission in order of cached prefix, longest first.

With a prefix cache, a request whose prompt starts with blocks already cached costs less
KV and less prefill to start, and starting it soon keeps those blocks referenced (they
cannot be reclaimed meanwhile). SGLang's ``lpm`` schedule orders its waiting queue this way
(Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
NeurIPS 2024); Dexter et al., "LLM Query Scheduling with Prefix Reuse and Latency
Constraints" (arXiv:2502.04677, 2025) analyse LPM and FCFS under latency constraints and
propose interpolating between them (k-LPM), which this policy does not implement.

The first ``window`` waiting requests (in queue order) are ordered by the blocks of their
prefill found in the cache, longest first (ties keep queue order), and admitted as
vLLM-like admits (:func:`policies.common.serving.prefill_first`); beyond the window the
queue waits, as SGLang falls back to FCFS on long queues so that one step does not look up
the whole backlog. Without the cache every request matches nothing and LPM is vLLM-like.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from policies.common.serving import prefill_first
from policies.vllm import VLLMLike
from replay.engine.jit import jit
from replay.engine.policy import RunSetup
from replay.engine.prefix_cache import lookup_hits_of
from replay.engine.sorting import stable_argsort
from replay.engine.state import new_rule_state
from replay.params import check

#: The record: ``ints`` = [max_num_seqs, max_num_batched_tokens, watermark in blocks,
#: window].
WINDOW = 3


@jit
def lpm_decide(s, rule):
    """The window at the queue's head, longest cached prefix first, admitted vLLM-like."""
    n = min(rule.ints[WINDOW], s.qtail - s.qhead)
    keys, order = s.scratch3, s.scratch2
    if s.cache_on:
        lookup_hits_of(s, s.queue, s.qhead, n, keys)
        for i in range(n):
            keys[i] = -keys[i]
    else:
        keys[:n] = 0
    ranked = stable_argsort(keys, n)
    for i in range(n):
        order[i] = s.queue[s.qhead + ranked[i]]
    code = prefill_first(s, rule, order, n)
    if s.cache_on:
        # vLLM-like promises while its first candidate stays too big; here a reclaim can
        # reorder the window and put first one that fits, so there is no promise.
        s.steady = 0
    return code


@dataclass
class LongestPrefixMatch(VLLMLike):
    window: int = field(default=128, metadata=check(ge=1))

    decision = lpm_decide

    def rule_state(self, setup: RunSetup):
        watermark = int(self.watermark * (setup.kv_capacity // setup.block_size))
        return new_rule_state(ints=np.array([self.max_num_seqs, self.max_num_batched_tokens,
                                             watermark, self.window]))
