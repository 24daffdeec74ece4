"""Sarathi-like: decode-prioritising with chunked prefill, non-clairvoyant
(docs/policies/serving.md).

Modelled on Sarathi-Serve (and Vidur's ``sarathi`` replica scheduler). Every
iteration has a budget of ``chunk_size`` tokens:

1. Every running request whose prefill is complete decodes one token (one
   token of budget each). If the running set's blocks after the iteration
   exceed ``M``, the latest arrivals are preempted until it fits (as vLLM).
2. The remaining budget goes to prompt chunks: first requests whose prefill
   is under way (oldest first), then waiting requests in queue order while the
   running set stays within ``max_num_seqs``. A request decodes after its last
   chunk, which emits its first token.

KV: by default a chunk's KV is taken when it runs (a request holds what it has
prefilled), so a chunk is cut to the free blocks, and admission keeps
``watermark * M`` free. With ``reserve_prompt=true`` admission reserves the
blocks of the whole prefill (plus the first token) up front, as Vidur's
Sarathi scheduler does; the engine still records the slots actually written,
and this policy counts the reserved remainder as used. Output lengths are not
used.

Where the papers say nothing: with nothing running, the head of the queue is
admitted even if it would break the watermark; and if requests are part-way
through their prefill but none can take a chunk for lack of KV (possible only
without reservation), the latest of them is preempted so the oldest can go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.serving import (
    attribute_to_victims,
    check_serving_limits,
    preempt_latest_until_fit,
)
from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.prefix_cache import (
    blocks_freed_by,
    cached_blocks,
    free_among_hits,
)
from replay.engine.rules import CompiledPolicy
from replay.engine.state import give_chunk, new_rule_state
from replay.params import check

#: The rule's record: ``ints`` = [chunk_size, max_num_seqs, watermark in blocks,
#: reserve_prompt].
CHUNK, MAX_SEQS, WATERMARK, RESERVE = 0, 1, 2, 3


@jit(inline="always")
def _chunk_within(s, rid, skip, room_blocks, limited, budget):
    """The largest chunk of ``rid``'s remaining prefill (less ``skip`` tokens found in the
    prefix cache) within ``budget`` and, if ``limited``, ``room_blocks`` free blocks (plus the
    slack in its last block); a last chunk also writes the first token, so it needs one slot
    more."""
    remaining = s.prefill_len[rid] - s.prefilled[rid] - skip
    chunk = min(remaining, budget)
    if limited:
        held = s.held[rid] + skip
        room = room_blocks * s.block + (-held) % s.block
        chunk = min(chunk, room)
        if chunk == remaining and chunk + 1 > room:
            chunk = room - 1
    return max(chunk, 0)


@jit(inline="always")
def _take(s, rid, skip, chunk, budget, free, reserve):
    """Give ``rid`` its chunk (after ``skip`` cached tokens): the budget and free blocks
    left."""
    give_chunk(s, rid, chunk)
    budget -= chunk
    emits = 1 if chunk == s.prefill_len[rid] - s.prefilled[rid] - skip else 0
    if not reserve:
        held = s.held[rid] + skip
        free -= blocks(held + chunk + emits, s.block) - blocks(held, s.block)
    return budget, free


@jit
def _continue_prefill(s, rid, budget, free, reserve):
    """A running prefill takes the chunk that budget and KV allow, if any."""
    chunk = _chunk_within(s, rid, 0, free, not reserve, budget)
    if chunk > 0:
        budget, free = _take(s, rid, 0, chunk, budget, free, reserve)
    return budget, free


@jit
def sarathi_decide(s, rule):
    """Decodes first, then prompt chunks within the token budget: running prefills (oldest
    first), then waiting requests in queue order (see the module docstring)."""
    params, block = rule.ints, s.block
    reserve = params[RESERVE] != 0
    capacity = s.capacity // block
    running, n_run = s.running, s.n_run
    prefill_len, prefilled, held = s.prefill_len, s.prefilled, s.held
    occupied = s.scratch
    # Blocks each running request occupies after this iteration before any new chunk:
    # decodes grow by one token; prefills keep (or have reserved) their blocks.
    for k in range(n_run):
        rid = running[k]
        remaining = prefill_len[rid] - prefilled[rid]
        if reserve:
            slots = held[rid] + 1 if remaining == 0 else prefill_len[rid] + 1
        else:
            slots = held[rid] + (1 if remaining == 0 else 0)
        occupied[k] = blocks(slots, block)
    shared = attribute_to_victims(s, running, n_run, occupied, capacity)
    cut = preempt_latest_until_fit(running, occupied, n_run, capacity - shared)
    # kept decodes go to advance[:n_decode]; kept prefills (in order) to prefilling
    advance, prefilling = s.advance, s.scratch2
    n_decode = 0
    n_prefilling = 0
    n_preempt = 0
    n_kept = 0
    used = 0
    for k in range(n_run):
        rid = running[k]
        if cut >= 0 and rid >= cut:
            s.preempt[n_preempt] = rid
            n_preempt += 1
            continue
        n_kept += 1
        used += occupied[k]
        if prefill_len[rid] - prefilled[rid] == 0:
            advance[n_decode] = rid
            n_decode += 1
        else:
            prefilling[n_prefilling] = rid
            n_prefilling += 1
    used += shared  # (what the kept requests' ``occupied`` leaves out)
    free = capacity - used
    budget = params[CHUNK] - n_decode
    for i in range(n_prefilling):
        budget, free = _continue_prefill(s, prefilling[i], budget, free, reserve)
    while s.n_chunks == 0 and n_decode == 0 and n_prefilling > 1:
        # Part-way prefills starve each other of KV: free the latest for the oldest.
        n_prefilling -= 1
        victim = prefilling[n_prefilling]
        s.preempt[n_preempt] = victim
        n_preempt += 1
        free += blocks_freed_by(s, victim) if s.cache_on else blocks(held[victim], block)
        budget, free = _continue_prefill(s, prefilling[0], budget, free, reserve)
    watermark = params[WATERMARK]
    seats = params[MAX_SEQS] - n_kept
    queue = s.queue
    n_start = 0
    head_free_hits = 0  # free cache entries among the hits of the request that stayed out
    for q in range(s.qhead, s.qtail):
        rid = queue[q]
        if seats <= 0:
            break
        floor = 0 if n_kept + n_start == 0 else watermark
        cached = cached_blocks(s, rid)
        # hits on free cache entries take those out of the free blocks
        taken = free_among_hits(s, rid, cached) if cached else 0
        skip = cached * block
        if reserve:
            needed = blocks(prefill_len[rid] + 1, block) - cached + taken
            if free - needed < floor:
                break
            chunk = _chunk_within(s, rid, skip, 0, False, budget)
            if chunk > 0:
                free -= needed
        else:
            chunk = _chunk_within(s, rid, skip, free - floor - taken, True, budget)
            if chunk > 0:
                free -= taken
        if chunk <= 0:
            head_free_hits = taken
            break
        budget, free = _take(s, rid, skip, chunk, budget, free, reserve)
        s.start[n_start] = rid
        n_start += 1
        seats -= 1
    # advance: the decodes, then the prefills that got a chunk, in running order
    n_advance = n_decode
    for i in range(n_prefilling):
        rid = prefilling[i]
        if s.chunk_of[rid] > 0:
            advance[n_advance] = rid
            n_advance += 1
    s.n_start, s.n_advance, s.n_preempt = n_start, n_advance, n_preempt
    if (n_start == 0 and n_preempt == 0 and s.n_chunks == 0 and n_advance == n_run
            and head_free_hits == 0):
        # Every running request decodes and nothing starts: the free blocks only shrink until
        # a completion, so the queue head stays out. Not so if the head's cached prefix holds
        # free entries: a reclaim of one cuts its hits, and the blocks they took are room for
        # a chunk again.
        s.steady = 2 ** 62
    return 0


@dataclass
class SarathiLike(CompiledPolicy):
    overflow: OverflowRule
    chunk_size: int = field(default=512, metadata=check(ge=1))
    max_num_seqs: int = field(default=256, metadata=check(ge=1))
    watermark: float = field(default=0.01, metadata=check(ge=0, lt=1))
    reserve_prompt: bool = False
    block_size: int = field(default=16, metadata=check(ge=1))
    preemption: Literal["recompute", "restart"] = "recompute"

    decision = sarathi_decide

    def __post_init__(self) -> None:
        check_serving_limits(chunk_size=self.chunk_size, max_num_seqs=self.max_num_seqs,
                             watermark=self.watermark)

    def rule_state(self, setup: RunSetup):
        watermark = int(self.watermark * (setup.kv_capacity // setup.block_size))
        return new_rule_state(ints=np.array([self.chunk_size, self.max_num_seqs, watermark,
                                             int(self.reserve_prompt)]))
