"""The WAIT paper's FCFS (its Example 2 and Proposition 3; docs/reproducing/wait.md B0, variant a).

Admission is the greedy rule of alpha-protection with ``alpha = 0``: walk the waiting
queue in order and admit request ``i`` while the KV the running set holds now plus
``prefill_len + 1`` for it and every request admitted before it stays within ``M``;
stop at the first that does not fit. Output lengths are not used.

What differs from the greedy FCFS of ``paper_policy=greedy_fcfs`` is what happens when
the batch outgrows ``M`` because every running request grows by one slot in the same
iteration. There, the engine's convention applies: the whole attempt fails, its time is
charged, ``EvictLIFO`` evicts and the step is retried, which in experiment B0 cycles
without a single completion. The paper's FCFS instead serves the new requests first and
evicts the running requests that started last (its LIFO rule) until the batch fits; the
evicted requests lose their work and wait again, and the rest of the batch runs in the
same iteration. This policy computes that itself, before the engine's KV check: it
returns the admissions and, as ``preempt``, the latest-started running requests whose
removal makes the next iteration fit, so the engine never sees an overflow. (Admission
keeps the new requests within ``M`` even with every running request evicted, so a
fitting batch always exists.) Evicted requests follow the engine's ``preemption`` and
``requeue`` options like any other.

Why a policy and not an engine convention: the policy contract already lets a policy
preempt before an iteration (vLLM-like does exactly this), so the paper's mechanism
needs no second execution path in the engine and no new engine option, and every
existing run is untouched. In unit time the two are the same process: the paper's
"evict on overflow, the rest runs" is this policy's "evict before the iteration, the
rest runs". See ``docs/reproducing/wait.md`` (B0: two FCFS conventions).

KV is counted in the engine's blocks when ``kv.block_size > 1`` (token-exact at 1). With
the prefix cache, blocks shared by running requests count once and free cached blocks as
free (the engine reclaims them); an admission is planned with its whole prompt.
``overflow`` is never used by this policy's own batches; it is there for the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.common.serving import attribute_to_victims
from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.policy import OverflowRule
from replay.engine.prefix_cache import blocks_taken
from replay.engine.rules import CompiledPolicy
from replay.engine.sorting import stable_argsort


@jit
def paper_fcfs_decide(s, rule):
    """Admit greedily against the KV the running set holds now; if the next iteration would
    then exceed ``M``, preempt the latest-started running requests until it fits."""
    block = s.block
    capacity = s.capacity // block
    running, n_run, queue = s.running, s.n_run, s.queue
    held, prefill_len, prefilled = s.held, s.prefill_len, s.prefilled
    free = capacity
    if s.cache_on:  # shared blocks once, free cache entries free (the engine reclaims them)
        free -= blocks_taken(s)
    else:
        for k in range(n_run):
            free -= blocks(held[running[k]], block)
    # Admission: greedy against what the running set holds now (alpha = 0).
    admitted = 0
    n_start = 0
    start = s.start
    for q in range(s.qhead, s.qtail):
        need = admitted + blocks(prefill_len[queue[q]] + 1, block)
        if need > free:
            break
        admitted = need
        start[n_start] = queue[q]
        n_start += 1
    s.n_start = n_start
    # The next iteration: every running request processes what remains of its prompt
    # (nothing, once prefilled) and emits one token.
    after, latest = s.scratch, s.scratch2
    start_iteration = s.start_iteration
    for k in range(n_run):
        rid = running[k]
        after[k] = blocks(held[rid] + prefill_len[rid] - prefilled[rid] + 1, block)
        latest[k] = start_iteration[rid]
    excess = admitted - capacity + attribute_to_victims(s, running, n_run, after,
                                                        capacity - admitted)
    for k in range(n_run):
        excess += after[k]
    if excess <= 0:
        if n_start == 0:
            # Nothing fits and nothing is evicted: until an arrival or a completion the queue
            # head stays out (the free KV only shrinks) and the running set grows by one slot
            # each, which the engine's KV stop bounds.
            s.steady = 2 ** 62
        return 0
    # LIFO: the latest started first (ties: the later admitted of the same step).
    order = stable_argsort(latest, n_run)
    evicted = s.scratch3
    for k in range(n_run):
        evicted[k] = 0
    freed = 0
    for k in range(n_run - 1, -1, -1):
        freed += after[order[k]]
        evicted[order[k]] = 1
        if freed >= excess:
            break
    n_advance = 0
    n_preempt = 0
    advance, preempt = s.advance, s.preempt
    for k in range(n_run):
        if evicted[k]:
            preempt[n_preempt] = running[k]
            n_preempt += 1
        else:
            advance[n_advance] = running[k]
            n_advance += 1
    s.n_advance, s.n_preempt = n_advance, n_preempt
    return 0


@dataclass
class PaperFCFS(CompiledPolicy):
    overflow: OverflowRule

    decision = paper_fcfs_decide
