"""What the serving-style policies (vLLM-like, Sarathi-like, LPM) share: vLLM's preemption
order, its prefill-first admission, and the checks of their limits.

With the prefix cache (``kv.prefix_cache=block_hash``) a waiting request's blocks found in
the cache cost no prefill tokens (they are computed already) and no new KV, except that a
hit on a free cache entry takes that entry out of the free blocks (as vLLM counts it).
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.prefix_cache import (
    blocks_freed_by,
    blocks_taken,
    cached_blocks,
    free_among_hits,
)
from replay.engine.sorting import stable_argsort
from replay.errors import ConfigError

#: A serving policy's record: ``ints`` = [max_num_seqs, max_num_batched_tokens, watermark in
#: blocks, ...].
MAX_SEQS, MAX_TOKENS, WATERMARK = 0, 1, 2
#: Error code: the first candidate's prefill exceeds max_num_batched_tokens (``error_arg``:
#: its id).
PREFILL_OVER_BUDGET = 1
#: Preemptions of one step found by passes over the running set before it is sorted.
_FEW_PREEMPTIONS = 8


@jit
def preempt_latest_until_fit(ids, blocks_after, n, capacity_blocks):
    """Which of ``ids[:n]`` to preempt so that the others' ``blocks_after`` fit
    ``capacity_blocks``, in vLLM's FCFS priority: the request that arrived last (largest
    engine id) goes first. Returns the smallest id preempted (every id at or above it goes),
    or -1 when they all fit (most steps)."""
    total = 0
    for k in range(n):
        total += blocks_after[k]
    excess = total - capacity_blocks
    if excess <= 0:
        return -1
    # A step preempts a few: the latest arrivals are found one at a time (the largest id
    # below the last one taken), a pass over the ids each, with no sort. Past a few, the ids
    # are sorted once and the walk goes on below the ones taken.
    freed = 0
    below = np.iinfo(np.int64).max
    for _ in range(min(n, _FEW_PREEMPTIONS)):
        latest, at = np.int64(-1), 0
        for k in range(n):
            if latest < ids[k] < below:
                latest, at = ids[k], k
        freed += blocks_after[at]
        if freed >= excess:
            return latest
        below = latest
    if n <= _FEW_PREEMPTIONS:
        return below  # all of them
    order = stable_argsort(ids, n)
    for k in range(n - 1 - _FEW_PREEMPTIONS, -1, -1):
        freed += blocks_after[order[k]]
        if freed >= excess:
            return ids[order[k]]
    return ids[order[0]]


@jit
def attribute_to_victims(s, running, n_run, after, capacity):
    """With the prefix cache: the blocks the running set occupies beyond the sum of
    ``after`` (each request's blocks after this step, shared ones counted by every sharer),
    which :func:`preempt_latest_until_fit` must leave out of ``capacity``. When they do not
    all fit, each ``after[k]`` becomes what preempting that request frees plus its growth,
    and the return value the blocks no single preemption frees (entries several share).
    0 with the cache off."""
    if not s.cache_on:
        return 0
    held, block = s.held, s.block
    shared = blocks_taken(s) - s.blocks_held  # references counted once, free entries not
    total = shared
    for k in range(n_run):
        total += after[k]
    if total <= capacity:  # (most steps: no preemption, no per-block work)
        return shared
    shared = blocks_taken(s)
    for k in range(n_run):
        rid = running[k]
        freed = blocks_freed_by(s, rid)
        after[k] += freed - blocks(held[rid], block)
        shared -= freed
    return shared


@jit
def free_blocks(s):
    """Blocks a serving policy may still allocate: the capacity less what the running
    requests hold (with the prefix cache, shared blocks once and free entries not): the
    engine's own count, no walk over the running set. It counts blocks where a block holds
    more than one slot (the prefix cache needs that), else slots (``kv_held``)."""
    if s.block > 1:
        return s.capacity // s.block - blocks_taken(s)
    return s.capacity - s.kv_held


@jit
def prefill_first(s, rule, candidates, n_candidates):
    """vLLM's prefill-first step: if a prefix of ``candidates[:n_candidates]`` fits within
    ``max_num_seqs``, the batch's prefill tokens within ``max_num_batched_tokens`` and the
    free blocks after admission at least the watermark, start it (prefill only: running
    decodes pause); else decode every running request, preempting the latest arrivals until
    their blocks fit. With nothing running, the first candidate starts even if it breaks the
    watermark."""
    block, params = s.block, rule.ints
    capacity = s.capacity // block
    running, n_run, held = s.running, s.n_run, s.held
    free = free_blocks(s)
    n_wait = min(max(0, params[MAX_SEQS] - n_run), n_candidates)
    if n_wait > 0:
        prefill_len = s.prefill_len
        first = candidates[0]
        if prefill_len[first] > params[MAX_TOKENS]:
            s.error_arg = first
            return PREFILL_OVER_BUDGET
        watermark = params[WATERMARK]
        s.n_advance = 0
        cached = cached_blocks(s, first)
        # hits on free cache entries take those out of the free blocks
        taken = free_among_hits(s, first, cached) if cached else 0
        if free - (blocks(prefill_len[first] + 1, block) - cached + taken) < watermark:
            # The first does not fit (most steps of an overloaded run), so no prefix does;
            # the watermark is waived for a lone request.
            if n_run == 0:
                s.start[0] = first
                s.n_start = 1
                return 0
        else:
            prefill = 0
            needed = 0
            k = 0
            while k < n_wait:
                rid = candidates[k]
                if k:
                    cached = cached_blocks(s, rid)
                    taken = free_among_hits(s, rid, cached) if cached else 0
                prefill += prefill_len[rid] - cached * block
                needed += blocks(prefill_len[rid] + 1, block) - cached + taken
                if prefill > params[MAX_TOKENS] or free - needed < watermark:
                    break
                s.start[k] = rid
                k += 1
            s.n_start = k
            return 0
        s.n_advance = -1
    after = s.scratch
    for k in range(n_run):
        after[k] = blocks(held[running[k]] + 1, block)
    shared = attribute_to_victims(s, running, n_run, after, capacity)
    cut = preempt_latest_until_fit(running, after, n_run, capacity - shared)
    if cut < 0:
        # Steady: without arrivals or completions the first candidate stays too big for the
        # free blocks (they only shrink), so only the preemption test can change this.
        s.steady = 2 ** 62
        return 0
    n_advance = 0
    n_preempt = 0
    advance, preempt = s.advance, s.preempt
    for k in range(n_run):
        rid = running[k]
        if rid >= cut:
            preempt[n_preempt] = rid
            n_preempt += 1
        else:
            advance[n_advance] = rid
            n_advance += 1
    s.n_advance, s.n_preempt = n_advance, n_preempt
    return 0


def check_serving_limits(**limits) -> None:
    """Reject a serving policy's limits: counts (``max_num_seqs``, token budgets) must be
    >= 1 and ``watermark`` a fraction in [0, 1); each named by its ``policy.`` key."""
    for key, value in limits.items():
        ok = 0.0 <= value < 1.0 if key == "watermark" else value >= 1
        if not ok:
            allowed = "in [0, 1)" if key == "watermark" else ">= 1"
            raise ConfigError(f"policy.{key} must be {allowed}, got {value}")
