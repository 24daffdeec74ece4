"""MC-SF, memory-constrained shortest first (docs/policies/lookahead.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.common.lookahead import lookahead_memory, start_admissible
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.sorting import sorted_copy
from replay.engine.state import WAITING, new_rule_state

#: The rule's record: ``ints`` = [length of the kept order]; ``ids[:length]`` the waiting
#: queue in ascending (estimate, id); ``marks[id]``: ``id`` is in it; ``counts``: the
#: lookahead's memory.
LENGTH = 0
#: Combined keys ``estimate * n + id`` must stay below this (int64, with headroom).
KEY_LIMIT = 2 ** 62


@jit
def keep_order(s, rule):
    """The waiting queue in ascending (estimate, id), kept across steps: drop who started
    since the last decision, merge in who joined (arrived or was evicted), so a step costs
    work in the changes, not a sort of the whole queue. Returns its length."""
    order, member, n = rule.ids, rule.marks, s.n
    status, estimate = s.status, s.estimate
    length = rule.ints[LENGTH]
    if s.n_started:
        kept = 0
        for i in range(length):
            rid = order[i]
            if status[rid] == WAITING:
                order[kept] = rid
                kept += 1
            else:
                member[rid] = False
        length = kept
    keys, merged = s.scratch, s.scratch2
    n_joined = np.int64(0)
    joined = s.joined
    for i in range(s.n_joined):
        rid = joined[i]
        if status[rid] == WAITING and not member[rid]:
            member[rid] = True
            keys[n_joined] = estimate[rid] * n + rid
            n_joined += 1
    if n_joined:
        new_keys = sorted_copy(keys, n_joined)
        for i in range(length):
            merged[i] = order[i]
        a = 0
        b = 0
        out = 0
        while a < length or b < n_joined:
            if b >= n_joined or (a < length and estimate[merged[a]] * n + merged[a]
                                 < new_keys[b]):
                order[out] = merged[a]
                a += 1
            else:
                order[out] = new_keys[b] % n
                b += 1
            out += 1
        length += n_joined
    rule.ints[LENGTH] = length
    return length


@jit
def mcsf_decide(s, rule):
    """FCFS's lookahead admission, walking the waiting queue in ascending predicted output
    length (ties: earlier arrival, then id) and stopping at the first request that fails."""
    n_cand = np.int64(0)
    if s.qtail == s.qhead:  # nothing waits: the kept order empties
        for i in range(rule.ints[LENGTH]):
            rule.marks[rule.ids[i]] = False
        rule.ints[LENGTH] = 0
    else:
        n_cand = keep_order(s, rule)
    # one call: the admission is compiled into this decision once per call of it
    return start_admissible(s, rule, rule.ids, n_cand)


@dataclass
class MCSF(CompiledPolicy):
    """FCFS with lookahead, but the waiting queue is walked in ascending predicted output
    length (ties: earlier arrival, then id; engine ids already encode that order). Stops at
    the first request that fails the lookahead check.

    Cost per decision: keeping the order across steps (:func:`keep_order`: nothing while
    the queue is unchanged) plus ``O(log k)`` lookahead checks, independent of the trace
    length.
    """

    overflow: OverflowRule

    decision = mcsf_decide

    def rule_state(self, setup: RunSetup):
        if int(setup.estimate.max(initial=0)) >= KEY_LIMIT // max(setup.n, 1):
            raise ValueError("MC-SF: predicted outputs too large to order by (estimate, id) "
                             "in int64")
        return new_rule_state(ints=[0], ids=np.zeros(setup.n, dtype=np.int64),
                              marks=np.zeros(setup.n, dtype=np.bool_),
                              counts=lookahead_memory(setup.n))
