"""Compiled twins of the built-in policies' decisions and of the overflow rules.

Each decision reads the engine's state arrays and writes one
:class:`replay.engine.policy.Batch` into scratch buffers:

* ``start[:n_start]``: the requests to start, in the policy's order;
* ``advance[:n_advance]``: the running requests that take part (``n_advance = -1``: all
  running, ``Batch.advance=None``);
* ``preempt[:n_preempt]``: running requests to evict before the iteration;
* ``chunk_of[rid]``: a prompt chunk named for ``rid`` (0: the engine's default, all of
  the remaining prompt), the ids so named in ``chunk_ids[:n_chunks]`` (the caller
  clears them after the step).

and returns ``(n_start, n_advance, n_preempt, n_chunks, error)``. ``error`` is 0, or
:data:`ASK_PYTHON` where the Python twin raises (the driver then asks it, so that the
same exception reaches the caller). Steady-step promises are not produced: the
compiled loop runs every step, which the engine's fast-forward is defined to equal.

The running set is ``running[:n_run]`` in start order (in id order for WAIT and Nested
WAIT, as the step loop keeps it for them) and the waiting queue ``queue[head:tail]`` in
queue order, as the engine keeps them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from replay.compiled.sorting import search_left, stable_argsort

VLLM, SARATHI, FCFS, MCSF, PROTECTION, WAIT, NESTED_WAIT = 0, 1, 2, 3, 4, 5, 6
EVICT_LIFO, CLEAR_ALL, CLEAR_WITH_PROB = 0, 1, 2
ASK_PYTHON = 1
# vLLM-like parameters (policy_ints)
V_MAX_SEQS, V_MAX_TOKENS, V_WATERMARK = 0, 1, 2
# Sarathi-like parameters (policy_ints)
S_CHUNK, S_MAX_SEQS, S_WATERMARK, S_RESERVE = 0, 1, 2, 3


@intrinsic
def _trailing_zeros(typingctx, value):
    """The number of trailing zero bits of an int64 (one instruction)."""

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.int64(types.int64), codegen


@njit(cache=True, inline="always")
def blocks(tokens, block):
    """``ceil(tokens / block)``, as the Python twins compute it: ``-(-tokens // block)``.
    A block of a power of two tokens (16, the usual one) divides by a shift: the loop
    computes this for every batch member and step, and an integer division by a value
    known only at run time was a sixth of an LMSYS crosscheck case's loop time."""
    if block & (block - 1) == 0:  # floor division by 2^k is an arithmetic right shift
        return (tokens + (block - 1)) >> _trailing_zeros(block)
    return (tokens + (block - 1)) // block


@njit(cache=True)
def preempt_latest_until_fit(ids, blocks_after, n, capacity_blocks):
    """policies.common.serving.preempt_latest_until_fit over ``ids[:n]``: the smallest id that is
    preempted (every id at or above it goes; the latest arrivals first), or -1 if all fit.
    """
    total = 0
    for k in range(n):
        total += blocks_after[k]
    excess = total - capacity_blocks
    if excess <= 0:
        return -1
    order = stable_argsort(ids, n)
    freed = 0
    for k in range(n - 1, -1, -1):
        freed += blocks_after[order[k]]
        if freed >= excess:
            return ids[order[k]]
    return ids[order[0]]


# --------------------------------------------------------------------------- vLLM-like
@njit(cache=True)
def vllm_decide(params, kv_capacity, block, prefill_len, held, queue, head, tail, running,
                n_run, start, advance, preempt, scratch):
    """policies.vllm.VLLMLike.decide."""
    capacity = kv_capacity // block
    used = 0
    for k in range(n_run):
        used += blocks(held[running[k]], block)
    free = capacity - used
    n_wait = min(max(0, params[V_MAX_SEQS] - n_run), tail - head)
    if n_wait > 0:
        first = queue[head]
        head_prefill = prefill_len[first]
        if head_prefill > params[V_MAX_TOKENS]:
            return 0, 0, 0, 0, ASK_PYTHON
        watermark = params[V_WATERMARK]
        if free - blocks(head_prefill + 1, block) < watermark:
            if n_run == 0:
                start[0] = first
                return 1, 0, 0, 0, 0
        else:
            prefill = 0
            needed = 0
            k = 0
            while k < n_wait:
                rid = queue[head + k]
                prefill += prefill_len[rid]
                needed += blocks(prefill_len[rid] + 1, block)
                if prefill > params[V_MAX_TOKENS] or free - needed < watermark:
                    break
                start[k] = rid
                k += 1
            return k, 0, 0, 0, 0
    for k in range(n_run):
        scratch[k] = blocks(held[running[k]] + 1, block)
    cut = preempt_latest_until_fit(running, scratch, n_run, capacity)
    if cut < 0:
        return 0, -1, 0, 0, 0
    n_adv = 0
    n_pre = 0
    for k in range(n_run):
        rid = running[k]
        if rid >= cut:
            preempt[n_pre] = rid
            n_pre += 1
        else:
            advance[n_adv] = rid
            n_adv += 1
    return 0, n_adv, n_pre, 0, 0


# ----------------------------------------------------------------------- Sarathi-like
@njit(cache=True, inline="always")
def _sarathi_chunk(rid, room_blocks, limited, budget, block, prefill_len, prefilled, held):
    """_ChunkPlan._chunk: the largest chunk of ``rid``'s remaining prefill within budget and
    (if ``limited``) ``room_blocks``."""
    remaining = prefill_len[rid] - prefilled[rid]
    chunk = min(remaining, budget)
    if limited:
        h = held[rid]
        room = room_blocks * block + (-h) % block
        chunk = min(chunk, room)
        if chunk == remaining and chunk + 1 > room:
            chunk = room - 1
    return max(chunk, 0)


@njit(cache=True)
def sarathi_decide(params, kv_capacity, block, prefill_len, prefilled, held, queue, head, tail,
                   running, n_run, start, advance, preempt, chunk_of, chunk_ids, scratch,
                   scratch2):
    """policies.sarathi.SarathiLike.decide (without its steady-steps promise)."""
    reserve = params[S_RESERVE] != 0
    capacity = kv_capacity // block
    occupied = scratch
    for k in range(n_run):
        rid = running[k]
        remaining = prefill_len[rid] - prefilled[rid]
        if reserve:
            slots = held[rid] + 1 if remaining == 0 else prefill_len[rid] + 1
        else:
            slots = held[rid] + (1 if remaining == 0 else 0)
        occupied[k] = blocks(slots, block)
    cut = preempt_latest_until_fit(running, occupied, n_run, capacity)
    # kept decodes go to advance[:n_dec]; kept prefills (in order) to scratch2[:n_pre_fill]
    n_dec = 0
    n_prefilling = 0
    n_pre = 0
    n_kept = 0
    used = 0
    for k in range(n_run):
        rid = running[k]
        if cut >= 0 and rid >= cut:
            preempt[n_pre] = rid
            n_pre += 1
            continue
        n_kept += 1
        used += occupied[k]
        if prefill_len[rid] - prefilled[rid] == 0:
            advance[n_dec] = rid
            n_dec += 1
        else:
            scratch2[n_prefilling] = rid
            n_prefilling += 1
    free = capacity - used
    budget = params[S_CHUNK] - n_dec
    n_chunks = np.int64(0)
    for i in range(n_prefilling):
        rid = scratch2[i]
        budget, free, n_chunks = _sarathi_offer(rid, budget, free, reserve, block, prefill_len,
                                                prefilled, held, chunk_of, chunk_ids, n_chunks)
    while n_chunks == 0 and n_dec == 0 and n_prefilling > 1:
        # Part-way prefills starve each other of KV: free the latest for the oldest.
        n_prefilling -= 1
        victim = scratch2[n_prefilling]
        preempt[n_pre] = victim
        n_pre += 1
        free += blocks(held[victim], block)
        rid = scratch2[0]
        budget, free, n_chunks = _sarathi_offer(rid, budget, free, reserve, block, prefill_len,
                                                prefilled, held, chunk_of, chunk_ids, n_chunks)
    watermark = params[S_WATERMARK]
    seats = params[S_MAX_SEQS] - n_kept
    n_start = 0
    for q in range(head, tail):
        rid = queue[q]
        if seats <= 0:
            break
        floor = 0 if n_kept + n_start == 0 else watermark
        if reserve:
            needed = blocks(prefill_len[rid] + 1, block)
            if free - needed < floor:
                break
            chunk = _sarathi_chunk(rid, 0, False, budget, block, prefill_len, prefilled, held)
            if chunk > 0:
                free -= needed
        else:
            chunk = _sarathi_chunk(rid, free - floor, True, budget, block, prefill_len,
                                   prefilled, held)
        if chunk <= 0:
            break
        budget, free = _sarathi_take(rid, chunk, budget, free, reserve, block, prefill_len,
                                     prefilled, held, chunk_of)
        chunk_ids[n_chunks] = rid
        n_chunks += 1
        start[n_start] = rid
        n_start += 1
        seats -= 1
    # advance: the decodes, then the prefills that got a chunk, in running order
    n_adv = n_dec
    for i in range(n_prefilling):
        rid = scratch2[i]
        if chunk_of[rid] > 0:
            advance[n_adv] = rid
            n_adv += 1
    return n_start, n_adv, n_pre, n_chunks, 0


@njit(cache=True)
def _sarathi_offer(rid, budget, free, reserve, block, prefill_len, prefilled, held, chunk_of,
                   chunk_ids, n_chunks):
    """Give prefilling ``rid`` the chunk that budget and KV allow, if any: the new budget,
    free blocks and chunk count."""
    chunk = _sarathi_chunk(rid, free, not reserve, budget, block, prefill_len, prefilled, held)
    if chunk > 0:
        budget, free = _sarathi_take(rid, chunk, budget, free, reserve, block, prefill_len,
                                     prefilled, held, chunk_of)
        chunk_ids[n_chunks] = rid
        n_chunks += 1
    return budget, free, n_chunks


@njit(cache=True, inline="always")
def _sarathi_take(rid, chunk, budget, free, reserve, block, prefill_len, prefilled, held,
                  chunk_of):
    """_ChunkPlan._take: returns the budget and free blocks left."""
    chunk_of[rid] = chunk
    budget -= chunk
    emits = 1 if chunk == prefill_len[rid] - prefilled[rid] else 0
    if not reserve:
        h = held[rid]
        free -= blocks(h + chunk + emits, block) - blocks(h, block)
    return budget, free


# ------------------------------------------------------------ FCFS / MC-SF lookahead
@njit(cache=True)
def peak_kv(base, remaining, n, block, order_key):
    """policies.common.lookahead.peak_kv of ``(base[:n], remaining[:n])``."""
    if n == 0:
        return 0
    if block > 1:
        best = 0
        for c_i in range(n):
            c = remaining[c_i]
            total = 0
            for j in range(n):
                if remaining[j] >= c:
                    total += blocks(base[j] + c, block) * block
            best = max(best, total)
        return best
    return _peak_and_checkpoint(base, remaining, n, order_key)[0]


@njit(cache=True)
def _peak_and_checkpoint(base, remaining, n, order_key):
    """Token-exact peak_kv of ``(base[:n], remaining[:n])`` and a checkpoint where it is
    reached (checkpoint ``remaining[k]`` holds ``cumsum(base)[k] + (k + 1) * remaining[k]``
    in descending ``remaining`` order)."""
    for k in range(n):
        order_key[k] = -remaining[k]
    order = stable_argsort(order_key, n)
    best = 0
    at = 0
    cumulative = 0
    for k in range(n):
        j = order[k]
        cumulative += base[j]
        kv = cumulative + (k + 1) * remaining[j]
        if kv > best:
            best, at = kv, remaining[j]
    return best, at


@njit(cache=True)
def lookahead_decide(candidates, n_cand, kv_capacity, block, kv_held, prompt_len, prefill_len,
                     generated, estimate, running, n_run, start, base, remaining, order_key,
                     hint, iteration):
    """policies.common.lookahead.start_admissible over ``candidates[:n_cand]``: how many of them
    start (written to ``start``). ``hint[0]`` is the policy's PeakHint (an absolute
    iteration where the first candidate last failed; speed only, as in Python)."""
    if n_cand == 0:
        return 0
    if kv_held + n_run + prefill_len[candidates[0]] + 1 > kv_capacity:
        return 0
    first = 0
    for k in range(n_run):
        rid = running[k]
        base[k] = prompt_len[rid] + generated[rid]
        remaining[k] = max(estimate[rid] - generated[rid], 1)
        first += base[k]
    first += n_run
    budget = kv_capacity
    limit = min(n_cand, max(0, (budget - first) // 2) + 1)
    rid = candidates[0]
    base[n_run] = prefill_len[rid]
    remaining[n_run] = max(estimate[rid] - generated[rid], 1)
    if block > 1 or n_run == 0:
        if peak_kv(base, remaining, n_run + 1, block, order_key) > budget:
            return 0
    else:
        # The hint's checkpoint: the KV there is a lower bound of the peak (kv_at).
        checkpoint = hint[0] - iteration
        if checkpoint > 1:
            excess = -budget
            for k in range(n_run):
                if remaining[k] >= checkpoint:
                    excess += base[k] + checkpoint
            if checkpoint <= remaining[n_run]:
                excess += base[n_run] + checkpoint
            if excess > 0:
                return 0
        peak, at = _peak_and_checkpoint(base, remaining, n_run + 1, order_key)
        if peak > budget:
            hint[0] = iteration + at
            return 0
    # The first one fits; a necessary condition at the first checkpoint bounds the prefix
    # (only the candidates within it are needed).
    upper = 0
    total = 0
    for k in range(limit):
        rid = candidates[k]
        total += prefill_len[rid] + 1
        if total > budget - first:
            break
        base[n_run + k] = prefill_len[rid]
        remaining[n_run + k] = max(estimate[rid] - generated[rid], 1)
        upper += 1
    if upper > 1 and peak_kv(base, remaining, n_run + upper, block, order_key) > budget:
        good, bad = 1, 2
        while bad < upper and peak_kv(base, remaining, n_run + bad, block,
                                      order_key) <= budget:
            good, bad = bad, min(2 * bad, upper)
        while bad - good > 1:
            mid = (good + bad) // 2
            if peak_kv(base, remaining, n_run + mid, block, order_key) <= budget:
                good = mid
            else:
                bad = mid
        upper = good
    for k in range(upper):
        start[k] = candidates[k]
    return upper


# --------------------------------------------------------------- alpha-protection
@njit(cache=True)
def protection_decide(alpha, kv_capacity, kv_held, prompt_len, queue, head, tail, start):
    """policies.protection.AlphaProtection.decide: the queue prefix whose first-step KV fits
    ``(1 - alpha) M``."""
    budget = (1.0 - alpha) * kv_capacity - kv_held
    total = 0
    k = 0
    for q in range(head, tail):
        total += prompt_len[queue[q]] + 1
        if total > budget:
            break
        start[k] = queue[q]
        k += 1
    return k


# ------------------------------------------------------------------- overflow rules
@njit(cache=True)
def overflow_evict(kind, beta, rng, holders, held_after, n_holders, kv_capacity, n_running,
                   victims):
    """The overflow rule's victims (replay.engine.overflow), written to ``victims``; their count."""
    if kind == CLEAR_ALL:
        for k in range(n_running):
            victims[k] = holders[k]
        return n_running
    if kind == CLEAR_WITH_PROB:
        n = 0
        for k in range(n_holders):
            draw = rng.random()
            if k < n_running and draw < beta:
                victims[n] = holders[k]
                n += 1
        return n
    # EvictLIFO: the latest started running requests until the rest fits
    total = 0
    for k in range(n_holders):
        total += held_after[k]
    excess = total - kv_capacity
    if excess <= 0 or n_running == 0:
        return 0
    freed = 0
    n = 0
    for k in range(n_running - 1, -1, -1):
        freed += held_after[k]
        victims[n] = holders[k]
        n += 1
        if freed >= excess:
            break
    return n


# ------------------------------------------------------------- WAIT and Nested WAIT
@njit(cache=True)
def _first_per_group(keys, limits, n, keep):
    """policies.common.staging.first_per_group over ``keys[:n]``: ``keep[k]`` is True for the first
    ``limits[k]`` elements of each key, in input order."""
    order = stable_argsort(keys, n)
    rank = 0
    for i in range(n):
        j = order[i]
        if i > 0 and keys[j] != keys[order[i - 1]]:
            rank = 0
        keep[j] = rank < limits[j]
        rank += 1


@njit(cache=True)
def _ranked_advance(params, per_stage, ready, type_id, generated, running, n_run, advance,
                    active, keys, keep):
    """WAIT's advancing requests, ranked within each stage key by a stable sort; returns
    how many. For stage keys beyond the per-key table of :func:`wait_decide`."""
    n_active = np.int64(0)
    for k in range(n_run):
        if ready[type_id[running[k]]]:
            active[n_active] = running[k]
            n_active += 1
    limits = np.empty(n_active, dtype=np.int64)
    for k in range(n_active):
        rid = active[k]
        keys[k] = type_id[rid] * params[0] + generated[rid]
        limits[k] = per_stage[type_id[rid]]
    _first_per_group(keys, limits, n_active, keep)
    n_adv = 0
    for k in range(n_active):
        if keep[k]:
            advance[n_adv] = active[k]
            n_adv += 1
    return n_adv


@njit(cache=True)
def wait_decide(params, floats, now, more_arrivals, type_id, arrival, generated, queue, head,
                tail, running, n_run, start, advance, scratch, scratch2, keep, type_waiting):
    """policies.wait.Wait.decide. ``params``: the stage-key multiplier, whether every request
    of the run has one of the policy's types (then the per-step type check is skipped and
    ``type_waiting`` holds the number of waiting requests of each type, as the step loop
    keeps it; otherwise the queue is counted here), then the per-type thresholds;
    ``floats``: whether there is a ``max_wait``, and its value. ``running[:n_run]`` must be
    in ascending id order (the Python twin sorts the running set; the step loop keeps it
    sorted as requests start and leave, instead of sorting hundreds of ids every step)."""
    types = params.size - 2
    per_stage = params[2:]
    if params[1]:
        count = type_waiting
    else:
        for q in range(head, tail):
            if type_id[queue[q]] < 0 or type_id[queue[q]] >= types:
                return 0, 0, 0, 0, ASK_PYTHON
        for k in range(n_run):
            if type_id[running[k]] < 0 or type_id[running[k]] >= types:
                return 0, 0, 0, 0, ASK_PYTHON
        # Requests at stage 0 per type.
        count = np.zeros(types, dtype=np.int64)
        for q in range(head, tail):
            count[type_id[queue[q]]] += 1
    ready = count >= per_stage
    if not more_arrivals:
        ready[:] = True
    elif floats[0] != 0.0:
        cutoff = now - floats[1]
        for q in range(head, tail):
            if arrival[queue[q]] < cutoff:
                ready[type_id[queue[q]]] = True
        for k in range(n_run):
            if arrival[running[k]] < cutoff:
                ready[type_id[running[k]]] = True
    if not ready.any():
        return 0, 0, 0, 0, 0
    wanted = 0  # what the scan below finds: it stops there instead of at the queue's end
    for t in range(types):
        if ready[t]:
            wanted += min(per_stage[t], count[t])
    taken = np.zeros(types, dtype=np.int64)
    n_start = 0
    for q in range(head, tail):
        if n_start == wanted:
            break
        rid = queue[q]
        t = type_id[rid]
        if ready[t] and taken[t] < per_stage[t]:
            taken[t] += 1
            start[n_start] = rid
            n_start += 1
    # The first per_stage[type] of each stage key (type, generated), oldest first, of the
    # ready types: counted per key in one pass while the keys stay in the table, else
    # ranked by a stable sort.
    size = types * params[0]
    counted = np.zeros(size, dtype=np.int64)
    n_adv = 0
    for k in range(n_run):
        rid = running[k]
        t = type_id[rid]
        if not ready[t]:
            continue
        key = t * params[0] + generated[rid]
        if key >= size:  # a request beyond its type's output length (no type of the run has it)
            return n_start, _ranked_advance(params, per_stage, ready, type_id, generated,
                                            running, n_run, advance, scratch, scratch2,
                                            keep), 0, 0, 0
        if counted[key] < per_stage[t]:
            advance[n_adv] = rid
            n_adv += 1
        counted[key] += 1
    return n_start, n_adv, 0, 0, 0


@njit(cache=True)
def nested_wait_decide(params, floats, now, more_arrivals, arrival, generated, queue, head,
                       tail, running, n_run, start, advance, scratch):
    """policies.nested_wait.NestedWait.decide. ``params``: the number of segments ``K``, the
    ``K`` thresholds, then the ``K - 1`` inner stage boundaries; ``floats`` as for WAIT.
    ``running[:n_run]`` must be in ascending id order, as for :func:`wait_decide`."""
    segments = params[0]
    per_stage = params[1:1 + segments]
    inner = params[1 + segments:]
    entry = np.zeros(segments, dtype=np.int64)
    entry[0] = tail - head
    segment = scratch
    top = 0
    for k in range(n_run):
        stage = generated[running[k]]
        top = max(top, stage)
        p = search_left(inner, stage)
        at_entry = inner.size > 0 and inner[min(p, inner.size - 1)] == stage
        if at_entry:
            entry[1 + p] += 1
        segment[k] = p + (1 if at_entry else 0)
    open_segments = segments
    for i in range(segments):
        if entry[i] < per_stage[i]:
            open_segments = i
            break
    if not more_arrivals:
        open_segments = segments
    elif floats[0] != 0.0:
        cutoff = now - floats[1]
        late = tail > head and arrival[queue[head]] < cutoff
        for k in range(n_run):
            if arrival[running[k]] < cutoff:
                late = True
        if late:
            open_segments = segments
    if open_segments == 0:
        return 0, 0, 0, 0, 0
    # The first per_stage[segment] at each stage of the open segments, oldest first: a
    # count per stage, in one pass over the running set in id order.
    counted = np.zeros(top + 1, dtype=np.int64)
    n_adv = 0
    for k in range(n_run):
        if segment[k] >= open_segments:
            continue
        rid = running[k]
        stage = generated[rid]
        if counted[stage] < per_stage[segment[k]]:
            advance[n_adv] = rid
            n_adv += 1
        counted[stage] += 1
    n_start = min(per_stage[0], tail - head)
    for k in range(n_start):
        start[k] = queue[head + k]
    return n_start, n_adv, 0, 0, 0
