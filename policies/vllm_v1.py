"""vLLM v1: the scheduler of vLLM 0.19's V1 engine, as a compiled policy.

Modelled on ``Scheduler.schedule()`` (``vllm/v1/core/sched/scheduler.py``) and
``KVCacheManager.allocate_slots()`` (``vllm/v1/core/kv_cache_manager.py``) of vLLM 0.19 with
the FCFS policy. There is no prefill or decode phase: each step has one budget of
``max_num_batched_tokens`` tokens, and every request is given the tokens it still has to
compute (a decode: one; a prompt, or a preempted request's prompt and output: what remains),
cut to ``long_prefill_token_threshold`` when that is set and to the budget left.

1. **Running requests first**, in running order (the order they were admitted). Each needs
   the KV blocks for the tokens it computes this step. While the free blocks do not cover
   them, the request at the end of the running list (the most recently admitted) is
   preempted and its blocks freed; if that is the request itself, scheduling of running
   requests stops. Running requests that the budget does not reach wait this step.
2. **Waiting requests next**, only in a step that preempted nothing, in queue order, while
   budget remains and the running set is below ``max_num_seqs``: each is admitted with the
   chunk the budget allows if the free blocks hold that chunk and, with
   ``reserve_full_isl`` (vLLM's ``scheduler_reserve_full_isl``, on by default), its whole
   sequence (prompt plus the tokens it already generated); at the first that does not fit,
   admission stops.

vLLM appends arrivals to its waiting queue and puts a preempted request back at its front;
the engine orders its queue by arrival (``engine.requeue=front``). Under FCFS the two are
the same order: admission takes the queue's head, so every running request arrived before
every waiting one and the running list is in arrival order; the request preempted (the
running list's tail) therefore arrived after every other running one and before every
waiting one, which is where both queues put it. Output lengths are not used.

KV is counted in blocks of the engine's ``kv.block_size`` with the engine's slots: a
request holds one slot more than vLLM has allocated for it once its prefill has emitted a
token (the engine counts the sampled token's slot when it is emitted, vLLM when the token is
fed back one step later), so a request crosses a block boundary one token earlier than in
vLLM. ``reserved_blocks`` (1 by default) are kept out of the capacity, as vLLM's block pool
keeps its null block out of the free list.

With the engine's prefix cache on (``kv.prefix_cache=block_hash``), the free blocks are
vLLM's: the blocks no request holds, free cache entries included (reclaimable, as in
vLLM's free queue). A request admitted skips the tokens of its leading blocks found cached,
and a hit on a free entry takes that entry from the free blocks; a preempted request frees
only the blocks no other request shares. Where vLLM does more than this (async scheduling,
speculative decoding, ...) see docs/policies/serving.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.serving import check_serving_limits
from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.prefix_cache import (
    blocks_freed_by,
    blocks_taken,
    cached_blocks,
    free_among_hits,
)
from replay.engine.rules import CompiledPolicy
from replay.engine.state import give_chunk, new_rule_state
from replay.errors import ConfigError
from replay.params import check

#: The rule's record: ``ints`` = [max_num_seqs, max_num_batched_tokens,
#: long_prefill_token_threshold, reserve_full_isl, reserved_blocks].
MAX_SEQS, MAX_TOKENS, THRESHOLD, FULL_ISL, RESERVED = range(5)


@jit(inline="always")
def _tokens_this_step(remaining, budget, threshold):
    """The tokens a request with ``remaining`` prompt tokens (0: it decodes) computes."""
    tokens = remaining if remaining > 0 else 1
    if 0 < threshold < tokens:
        tokens = threshold
    return min(tokens, budget)


@jit(inline="always")
def _new_blocks(held, tokens, remaining, block):
    """The blocks a request holding ``held`` slots needs for ``tokens`` more this step (a
    prompt's last chunk also writes the token it emits, as the engine counts it)."""
    gain = 1 if remaining == 0 else tokens + (1 if tokens == remaining else 0)
    return blocks(held + gain, block) - blocks(held, block)


@jit
def vllm_v1_decide(s, rule):
    """One step of vLLM 0.19's V1 scheduler (see the module docstring)."""
    params, block = rule.ints, s.block
    running, held = s.running, s.held
    prefill_len, prefilled = s.prefill_len, s.prefilled
    if s.cache_on:  # free cache entries are free blocks to vLLM (it reclaims them)
        used = blocks_taken(s)
    else:
        used = 0
        for k in range(s.n_run):
            used += blocks(held[running[k]], block)
    free = s.capacity // block - params[RESERVED] - used
    budget = params[MAX_TOKENS]
    threshold = params[THRESHOLD]
    # running requests, in running order; n_live shrinks as the tail is preempted
    n_live = s.n_run
    n_advance = 0
    n_preempt = 0
    advance, preempt, start = s.advance, s.preempt, s.start
    i = 0
    while i < n_live and budget > 0:
        rid = running[i]
        remaining = prefill_len[rid] - prefilled[rid]
        tokens = _tokens_this_step(remaining, budget, threshold)
        needed = _new_blocks(held[rid], tokens, remaining, block)
        itself = False
        while needed > free:
            n_live -= 1
            victim = running[n_live]
            preempt[n_preempt] = victim
            n_preempt += 1
            free += blocks_freed_by(s, victim) if s.cache_on else blocks(held[victim], block)
            if victim == rid:
                itself = True
                break
        if itself:
            break
        advance[n_advance] = rid
        n_advance += 1
        if tokens < remaining:
            give_chunk(s, rid, tokens)
        free -= needed
        budget -= tokens
        i += 1
    n_start = 0
    if n_preempt == 0:
        seats = params[MAX_SEQS] - n_live
        queue, q = s.queue, s.qhead
        while q < s.qtail and budget > 0 and n_start < seats:
            rid = queue[q]
            # its leading blocks found in the prefix cache are computed already; those that
            # were free entries leave the free pool
            hits = cached_blocks(s, rid)
            taken = free_among_hits(s, rid, hits) if hits else 0
            skip = hits * block
            remaining = prefill_len[rid] - prefilled[rid] - skip
            tokens = _tokens_this_step(remaining, budget, threshold)
            if params[FULL_ISL] and blocks(prefill_len[rid], block) - hits + taken > free:
                break
            needed = _new_blocks(held[rid] + skip, tokens, remaining, block) + taken
            if needed > free:
                break
            start[n_start] = rid
            n_start += 1
            if tokens < remaining:
                give_chunk(s, rid, tokens)
            free -= needed
            budget -= tokens
            q += 1
    s.n_start, s.n_advance, s.n_preempt = n_start, n_advance, n_preempt
    return 0


@dataclass
class VLLMV1(CompiledPolicy):
    overflow: OverflowRule
    max_num_seqs: int = field(default=256, metadata=check(ge=1))
    max_num_batched_tokens: int = field(default=2048, metadata=check(ge=1))
    long_prefill_token_threshold: int = field(default=0, metadata=check(ge=0))
    reserve_full_isl: bool = True
    reserved_blocks: int = field(default=1, metadata=check(ge=0))
    block_size: int = field(default=16, metadata=check(ge=1))
    preemption: Literal["recompute", "restart"] = "recompute"

    decision = vllm_v1_decide

    def __post_init__(self) -> None:
        check_serving_limits(max_num_seqs=self.max_num_seqs,
                             max_num_batched_tokens=self.max_num_batched_tokens)
        if self.long_prefill_token_threshold < 0:
            raise ConfigError(f"policy.long_prefill_token_threshold must be >= 0 (0: off), got "
                              f"{self.long_prefill_token_threshold}")
        if self.reserved_blocks < 0:
            raise ConfigError(f"policy.reserved_blocks must be >= 0, got {self.reserved_blocks}")

    def rule_state(self, setup: RunSetup):
        if setup.kv_capacity // setup.block_size <= self.reserved_blocks:
            raise ConfigError(f"policy.reserved_blocks={self.reserved_blocks} leaves no KV "
                              f"block of the {setup.kv_capacity // setup.block_size} in kv")
        return new_rule_state(ints=np.array([
            self.max_num_seqs, self.max_num_batched_tokens, self.long_prefill_token_threshold,
            int(self.reserve_full_isl), self.reserved_blocks], dtype=np.int64))

