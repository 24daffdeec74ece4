"""The WAIT paper's FCFS (its Example 2 and Proposition 3; EXPERIMENTS.md B0, variant a).

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

KV is counted in the engine's blocks when ``kv.block_size > 1`` (token-exact at 1).
``overflow`` is never used by this policy's own batches; it is there for the contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.engine.paging import blocks
from replay.engine.policy import UNTIL_CHANGE, Batch, OverflowRule, PolicyView


@dataclass
class PaperFCFS:
    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch:
        block, running, waiting = view.kv_block_size, view.running, view.waiting
        capacity = view.kv_capacity // block
        # Admission: greedy against what the running set holds now (alpha = 0).
        free = capacity - int(blocks(view.held[running], block).sum())
        need = np.cumsum(blocks(view.prefill_len[waiting] + 1, block))
        start = waiting[: int(np.searchsorted(need, free, side="right"))]
        admitted = int(need[start.size - 1]) if start.size else 0
        # The next iteration: every running request processes what remains of its
        # prompt (nothing, once prefilled) and emits one token.
        gain = view.prefill_len[running] - view.prefilled[running] + 1
        after = blocks(view.held[running] + gain, block)
        excess = int(after.sum()) + admitted - capacity
        if excess <= 0:
            if start.size:
                return Batch(start=start)
            # Nothing fits and nothing is evicted: until an arrival or a completion the
            # queue head stays out (the free KV only shrinks) and the running set grows
            # by one slot each, which the engine's KV stop bounds.
            return Batch(steady_steps=UNTIL_CHANGE)
        # LIFO: the latest started first (ties: the later admitted of the same step).
        latest_first = np.argsort(view.start_iteration[running], kind="stable")[::-1]
        freed = np.cumsum(after[latest_first])
        evict = latest_first[: int(np.searchsorted(freed, excess, side="left")) + 1]
        keep = np.ones(running.size, dtype=bool)
        keep[evict] = False
        return Batch(start=start, advance=running[keep], preempt=running[~keep])
