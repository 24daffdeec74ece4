"""The compiled step loop: ``Engine.run``'s loop as one ``@njit`` function over the engine's
state arrays, one per policy and timing backend (:data:`STEP_LOOPS`).

A step loop runs steps (arrivals, decision, caps, shape, price, KV check, overflow,
execution, completions, token gaps, the iteration row) exactly as ``Engine.run`` does
without fast-forwarding, which the engine defines to give the same results as with it.
It returns to its caller (:mod:`replay.compiled.driver`) at a step boundary when

* the run ends (:data:`EXIT_DONE`; ``ints[I_STATUS]`` says how),
* the iteration columns are full (:data:`EXIT_LOG_FULL`: the driver grows them),

or in the middle of a step where the Python twin raises (:data:`EXIT_ASK_POLICY`,
:data:`EXIT_PRICE_ERROR`: the driver asks the Python code to raise the same error).
Every loop variable lives in ``ints``/``now`` so the loop resumes where it stopped.

Token gaps go into the engine's :class:`~replay.engine.histogram.LogHistogram` inside the
loop: its buffer, its counts and the same fold rule
(:func:`replay.engine.histogram.fold_values`) at the same fold points, so the histogram is
bit-identical to the Python path's.

The KV and queue rules are plain functions (:func:`evict`, :func:`complete`,
:func:`release_arrivals`) so that a Python path can share them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from replay.compiled.decisions import (
    ASK_PYTHON,
    FCFS,
    MCSF,
    NESTED_WAIT,
    PROTECTION,
    SARATHI,
    VLLM,
    WAIT,
    blocks,
    lookahead_decide,
    nested_wait_decide,
    overflow_evict,
    protection_decide,
    sarathi_decide,
    vllm_decide,
    wait_decide,
)
from replay.compiled.pricing import (
    LINEAR,
    UNIT,
    V_GRANULARITY,
    V_MAX_BATCH,
    V_MAX_TOKENS,
    VIDUR,
    linear_duration,
    vidur_duration,
)
from replay.compiled.sorting import sorted_copy, stable_argsort
from replay.engine.histogram import fold_values
from replay.timing.vidur_tables import TOKEN_ROUNDING

FUTURE, WAITING, RUNNING, DONE = 0, 1, 2, 3

EXIT_DONE, EXIT_LOG_FULL, EXIT_ASK_POLICY, EXIT_PRICE_ERROR = range(4)
STATUS_COMPLETED, STATUS_LIVELOCK, STATUS_STALLED, STATUS_STEP_LIMIT = range(4)

# ``ints``: the loop's integer variables
(I_RELEASED, I_ITERATION, I_STEPS, I_IDLE, I_COMPLETED, I_KV_HELD, I_BLOCKS_HELD, I_NEXT_KEY,
 I_QHEAD, I_QTAIL, I_NRUN, I_LOG, I_FILLED, I_GAP_COUNT, I_STATUS, I_DECISIONS, I_M,
 I_MC_LEN, I_JOINED, I_LEFT, I_HINT, I_BY_ID_LEN) = range(22)
N_INTS = 22
# ``hist_floats``: the token-gap histogram's fold constants and running total and maximum
H_LOG_LO, H_LOG_RATIO, H_TOTAL, H_MAX = range(4)
# ``config``: the run's options
(C_N, C_CAPACITY, C_BLOCK, C_LIVELOCK, C_MAX_STEPS, C_MAX_RUNNING, C_MAX_STARTS, C_RECOMPUTE,
 C_REQUEUE_BACK, C_OVERFLOW, C_FAST_FORWARD) = range(11)
N_CONFIG = 11
# integer iteration columns (``log_ints``), after start_time and duration, before failed
(L_BATCH, L_STARTED, L_PREFILL, L_DECODE, L_PEAK, L_AFTER, L_COMPLETED, L_EVICTED) = range(8)


@njit(cache=True, inline="always")
def queue_append(queue, ints, ids, k):
    """Queue ``ids[:k]`` behind everything waiting (moving the queue to the buffer's front
    when the tail would pass its end; the buffer holds every request)."""
    head, tail = ints[I_QHEAD], ints[I_QTAIL]
    if tail + k > queue.size:
        size = tail - head
        for i in range(size):
            queue[i] = queue[head + i]
        head, tail = 0, size
    for i in range(k):
        queue[tail + i] = ids[i]
    ints[I_QHEAD], ints[I_QTAIL] = head, tail + k


@njit(cache=True, inline="always")
def release_arrivals(arrival, now, status, queue_key, queue, ints, n, scratch, joined):
    """Engine.run's arrivals: every request that arrived by ``now`` joins the queue."""
    released = ints[I_RELEASED]
    if released >= n or arrival[released] > now:
        return
    upto = released
    while upto < n and arrival[upto] <= now:
        upto += 1
    k = upto - released
    for i in range(k):
        rid = released + i
        status[rid] = WAITING
        scratch[i] = rid
        joined[ints[I_JOINED] + i] = rid
    ints[I_JOINED] += k
    if ints[I_NEXT_KEY] > n:  # a `back` requeue happened: queue behind it
        for i in range(k):
            queue_key[released + i] = ints[I_NEXT_KEY] + i
        ints[I_NEXT_KEY] += k
    queue_append(queue, ints, scratch, k)
    ints[I_RELEASED] = upto


@njit(cache=True, inline="always")
def keep_running(running, status, ints):
    """Drop from the running list, in place and in order, the requests no longer running."""
    n_run = 0
    for i in range(ints[I_NRUN]):
        if status[running[i]] == RUNNING:
            running[n_run] = running[i]
            n_run += 1
    ints[I_NRUN] = n_run


@njit(cache=True)
def evict(victims, nv, config, ints, status, prompt_len, prefill_len, prefilled, generated,
          held, start_iteration, evictions, queue_key, first_token_time, last_token_time,
          max_token_gap, running, queue, scratch, joined):
    """Engine._evict: free the KV of the running ``victims[:nv]`` and requeue them; returns
    how many were evicted. ``victims`` is reordered in place."""
    k = np.int64(0)
    for i in range(nv):
        if status[victims[i]] == RUNNING:
            victims[k] = victims[i]
            k += 1
    if k == 0:
        return 0
    block = config[C_BLOCK]
    freed = 0
    for i in range(k):
        rid = victims[i]
        freed += held[rid]
        status[rid] = WAITING
        prefilled[rid] = 0
        if not config[C_RECOMPUTE]:
            generated[rid] = 0
            first_token_time[rid] = np.nan
            last_token_time[rid] = np.nan
            max_token_gap[rid] = np.nan
        prefill_len[rid] = prompt_len[rid] + generated[rid]
        if block > 1:
            ints[I_BLOCKS_HELD] -= blocks(held[rid], block)
        held[rid] = 0
        start_iteration[rid] = -1
        evictions[rid] += 1
        joined[ints[I_JOINED] + i] = rid
    ints[I_JOINED] += k
    ints[I_KV_HELD] -= freed
    keep_running(running, status, ints)
    if k > 1:  # in queue-key order (keys are unique)
        for i in range(k):
            scratch[i] = queue_key[victims[i]]
        order = stable_argsort(scratch, k)
        for i in range(k):
            scratch[i] = victims[order[i]]
        for i in range(k):
            victims[i] = scratch[i]
    if config[C_REQUEUE_BACK]:
        for i in range(k):
            queue_key[victims[i]] = ints[I_NEXT_KEY] + i
        ints[I_NEXT_KEY] += k
        queue_append(queue, ints, victims, k)
    else:
        # Insert each victim at its key's place (the queue is in key order): binary search,
        # then move the shorter side by one slot (there is room before the head or after
        # the tail: the buffer holds every request plus one).
        head, tail = ints[I_QHEAD], ints[I_QTAIL]
        for i in range(k):
            rid = victims[i]
            key = queue_key[rid]
            lo, hi = head, tail
            while lo < hi:
                mid = (lo + hi) // 2
                if queue_key[queue[mid]] < key:
                    lo = mid + 1
                else:
                    hi = mid
            if head > 0 and (lo - head <= tail - lo or tail >= queue.size):
                for j in range(head, lo):
                    queue[j - 1] = queue[j]
                head -= 1
                queue[lo - 1] = rid
            else:
                for j in range(tail, lo, -1):
                    queue[j] = queue[j - 1]
                queue[lo] = rid
                tail += 1
        ints[I_QHEAD], ints[I_QTAIL] = head, tail
    return k


@njit(cache=True, inline="always")
def complete(finished, nf, end, config, ints, status, held, completion_time, running):
    """Engine._complete: record ``finished[:nf]`` as completed at ``end`` and free their KV."""
    block = config[C_BLOCK]
    for i in range(nf):
        rid = finished[i]
        completion_time[rid] = end
        status[rid] = DONE
        ints[I_KV_HELD] -= held[rid]
        if block > 1:
            ints[I_BLOCKS_HELD] -= blocks(held[rid], block)
        held[rid] = 0
    keep_running(running, status, ints)


@njit(cache=True)
def fold_gaps(values, k, hist_counts, hist_floats, ints):
    """LogHistogram._fold of ``values[:k]``."""
    total, largest = fold_values(values, k, hist_counts, hist_floats[H_LOG_LO],
                                 hist_floats[H_LOG_RATIO])
    ints[I_GAP_COUNT] += k
    hist_floats[H_TOTAL] += total
    hist_floats[H_MAX] = max(hist_floats[H_MAX], largest)


@njit(cache=True, inline="always")
def add_gaps(gaps, k, hist_buffer, hist_counts, hist_floats, ints):
    """LogHistogram.add of ``gaps[:k]``: buffered, and folded where it folds."""
    if k == 0:
        return
    filled = ints[I_FILLED]
    size = hist_buffer.size
    if filled + k > size:
        if filled:
            fold_gaps(hist_buffer, filled, hist_counts, hist_floats, ints)
            filled = 0
        if k > size:
            fold_gaps(gaps, k, hist_counts, hist_floats, ints)
            ints[I_FILLED] = 0
            return
    for i in range(k):
        hist_buffer[filled + i] = gaps[i]
    ints[I_FILLED] = filled + k


@njit(cache=True)
def insert_by_id(by_id, length, ids, k, scratch):
    """Insert ``ids[:k]`` (ids not in it) into the ascending ``by_id[:length]``; returns the
    new length. ``scratch`` holds the sorted ``ids`` meanwhile."""
    for i in range(k):  # insertion sort: a step starts a few requests
        item = ids[i]
        j = i
        while j > 0 and scratch[j - 1] > item:
            scratch[j] = scratch[j - 1]
            j -= 1
        scratch[j] = item
    a, b, out = length - 1, k - 1, length + k - 1
    while b >= 0:  # merge from the back, in place: what is above every new id stays put
        if a >= 0 and by_id[a] > scratch[b]:
            by_id[out] = by_id[a]
            a -= 1
        else:
            by_id[out] = scratch[b]
            b -= 1
        out -= 1
    return length + k


@njit(cache=True)
def keep_by_id(by_id, length, status):
    """Drop from ``by_id[:length]``, in order, the requests no longer running; returns the
    new length."""
    kept = 0
    for i in range(length):
        if status[by_id[i]] == RUNNING:
            by_id[kept] = by_id[i]
            kept += 1
    return kept


@njit(cache=True)
def mcsf_order(mc_order, mc_member, joined, estimate, status, ints, n, scratch, scratch2):
    """The waiting queue in ascending (estimate, id), kept across steps as
    policies.common.ordering.KeptOrder keeps it: drop what left, merge in what joined."""
    length = ints[I_MC_LEN]
    if ints[I_LEFT]:
        kept = 0
        for i in range(length):
            rid = mc_order[i]
            if status[rid] == WAITING:
                mc_order[kept] = rid
                kept += 1
            else:
                mc_member[rid] = False
        length = kept
        ints[I_LEFT] = 0
    nj = np.int64(0)
    for i in range(ints[I_JOINED]):
        rid = joined[i]
        if status[rid] == WAITING and not mc_member[rid]:
            mc_member[rid] = True
            scratch[nj] = estimate[rid] * n + rid
            nj += 1
    ints[I_JOINED] = 0
    if nj:
        keys = sorted_copy(scratch, nj)
        for i in range(length):
            scratch2[i] = mc_order[i]
        a = 0
        b = 0
        out = 0
        while a < length or b < nj:
            if b >= nj or (a < length and estimate[scratch2[a]] * n + scratch2[a] < keys[b]):
                mc_order[out] = scratch2[a]
                a += 1
            else:
                mc_order[out] = keys[b] % n
                b += 1
            out += 1
        length += nj
    ints[I_MC_LEN] = length
    return length


def _step_loop(policy, timing):
    """The step loop of one policy and timing backend (see :data:`STEP_LOOPS`)."""
    # Numba prunes the branches on these constants: a loop types and compiles only the
    # callees its policy and backend reach.
    preempts = policy in (VLLM, SARATHI)  # the decisions that preempt
    # Decisions that may promise UNTIL_CHANGE: only their loops stretch steady decodes.
    may_stretch = policy in (VLLM, SARATHI, FCFS, MCSF)
    # Decisions that read the running set in id order: the loop keeps it so.
    keeps_by_id = policy in (WAIT, NESTED_WAIT)

    def step_loop(config, policy_ints, policy_floats, overflow_beta, rng, timing_linear,
                  token_ms, decode_ms, prefill_ms, vidur_ints, out_of_range, arrival, prompt_len,
                  output_len, estimate, type_id, status, prefill_len, prefilled, generated, held,
                  start_iteration, evictions, queue_key, start_time, first_token_time,
                  completion_time, last_token_time, max_token_gap, ints, now_box, queue, running,
                  log_times, log_ints, log_failed, hist_buffer, hist_counts, hist_floats, mc_order,
                  mc_member, running_by_id, joined, chunk_of, start, advance, preempt, chunk_ids,
                  members, chunk, gain, new_tokens, context, is_prefill, scratch, scratch2,
                  scratch3, float_scratch, type_waiting):
        n = config[C_N]
        capacity = config[C_CAPACITY]
        block = config[C_BLOCK]
        now = now_box[0]
        while ints[I_COMPLETED] < n:
            if ints[I_LOG] >= log_failed.size:
                now_box[0] = now
                return EXIT_LOG_FULL
            # -- arrivals
            release_arrivals(arrival, now, status, queue_key, queue, ints, n, scratch, joined)
            released = ints[I_RELEASED]
            next_arrival = arrival[released] if released < n else np.inf
            n_run = ints[I_NRUN]
            head, tail = ints[I_QHEAD], ints[I_QTAIL]
            if tail == head and n_run == 0:
                now = next_arrival
                continue
            if ints[I_IDLE] > config[C_LIVELOCK]:
                ints[I_STATUS] = STATUS_LIVELOCK
                break
            if config[C_MAX_STEPS] >= 0 and ints[I_STEPS] >= config[C_MAX_STEPS]:
                ints[I_STATUS] = STATUS_STEP_LIMIT
                break

            # -- the policy's decision
            if keeps_by_id and ints[I_BY_ID_LEN] != n_run:
                # the running set in id order is kept across steps (starts are merged in as
                # they start): here those that finished or were evicted since leave it
                ints[I_BY_ID_LEN] = keep_by_id(running_by_id, ints[I_BY_ID_LEN], status)
            kv_held = ints[I_KV_HELD]
            n_chunks = 0
            n_pre = 0
            n_adv = -1
            error = 0
            if policy == VLLM:
                n_start, n_adv, n_pre, n_chunks, error = vllm_decide(
                    policy_ints, capacity, block, prefill_len, held, queue, head, tail, running,
                    n_run, start, advance, preempt, scratch)
            elif policy == SARATHI:
                n_start, n_adv, n_pre, n_chunks, error = sarathi_decide(
                    policy_ints, capacity, block, prefill_len, prefilled, held, queue, head, tail,
                    running, n_run, start, advance, preempt, chunk_of, chunk_ids, scratch,
                    scratch2)
            elif policy == FCFS:
                n_start = lookahead_decide(queue[head:tail], tail - head, capacity, block, kv_held,
                                           prompt_len, prefill_len, generated, estimate, running,
                                           n_run, start, scratch, scratch2, scratch3,
                                           ints[I_HINT:I_HINT + 1], ints[I_ITERATION])
            elif policy == MCSF:
                if tail == head:
                    n_start = 0
                else:
                    length = mcsf_order(mc_order, mc_member, joined, estimate, status, ints, n,
                                        scratch, scratch2)
                    n_start = lookahead_decide(mc_order, length, capacity, block, kv_held,
                                               prompt_len, prefill_len, generated, estimate,
                                               running, n_run, start, scratch, scratch2, scratch3,
                                               ints[I_HINT:I_HINT + 1], ints[I_ITERATION])
            elif policy == PROTECTION:
                n_start = protection_decide(policy_floats[0], capacity, kv_held, prompt_len, queue,
                                            head, tail, start)
            elif policy == WAIT:
                if policy_ints[1]:  # every type in range: count who joined the queue since
                    for i in range(ints[I_JOINED]):
                        type_waiting[type_id[joined[i]]] += 1
                n_start, n_adv, n_pre, n_chunks, error = wait_decide(
                    policy_ints, policy_floats, now, released < n, type_id, arrival, generated,
                    queue, head, tail, running_by_id, n_run, start, advance, scratch, scratch2,
                    is_prefill, type_waiting)
            else:  # NESTED_WAIT
                n_start, n_adv, n_pre, n_chunks, error = nested_wait_decide(
                    policy_ints, policy_floats, now, released < n, arrival, generated, queue, head,
                    tail, running_by_id, n_run, start, advance, scratch)
            if policy != MCSF:
                ints[I_JOINED] = 0
            # Whether the Python decision promises UNTIL_CHANGE (Batch.steady_steps): it then
            # repeats until an arrival, a completion or the KV limit.
            if policy == VLLM:
                steady = n_adv < 0 and n_start == 0
            elif policy == SARATHI:
                steady = n_start == 0 and n_pre == 0 and n_adv == n_run
            elif policy == FCFS:
                steady = n_start == 0 and (tail == head or kv_held + n_run
                                           + prefill_len[queue[head]] + 1 > capacity)
            elif policy == MCSF:
                steady = n_start == 0 and (tail == head or kv_held + n_run
                                           + prefill_len[mc_order[0]] + 1 > capacity)
            else:
                steady = False
            if error == ASK_PYTHON:
                now_box[0] = now
                return EXIT_ASK_POLICY
            ints[I_DECISIONS] += 1

            n_evicted = 0
            if preempts and n_pre:
                n_evicted = evict(preempt, n_pre, config, ints, status, prompt_len, prefill_len,
                                  prefilled, generated, held, start_iteration, evictions, queue_key,
                                  first_token_time, last_token_time, max_token_gap, running, queue,
                                  scratch, joined)
                n_run = ints[I_NRUN]
            if config[C_MAX_RUNNING] >= 0 and n_run + n_start > config[C_MAX_RUNNING]:
                n_start = min(n_start, max(0, config[C_MAX_RUNNING] - n_run))
            if config[C_MAX_STARTS] >= 0:
                n_start = min(n_start, config[C_MAX_STARTS])
            if n_adv < 0:
                m = n_run
                for i in range(n_run):
                    members[i] = running[i]
            else:
                m = n_adv
                for i in range(n_adv):
                    members[i] = advance[i]
            for i in range(n_start):
                members[m + i] = start[i]
            m += n_start
            if m == 0:
                for i in range(n_chunks):
                    chunk_of[chunk_ids[i]] = 0
                if released < n:
                    now = next_arrival
                    continue
                ints[I_STATUS] = STATUS_STALLED
                break

            # -- the iteration's shape, price and KV peak
            prefill_total = 0
            gain_total = 0
            n_prefill = 0
            new_blocks = 0
            context_sum = 0
            context_max = 0
            for i in range(m):
                rid = members[i]
                c = prefill_len[rid] - prefilled[rid]
                if chunk_of[rid] > 0:
                    c = chunk_of[rid]
                chunk[i] = c
                prefill_total += c
                h = held[rid]
                context[i] = h
                context_sum += h
                context_max = max(context_max, h)
            for i in range(n_chunks):
                chunk_of[chunk_ids[i]] = 0
            decode_only = prefill_total == 0
            duration = np.nan
            if decode_only:
                # Every member decodes one token (a gain of 1), and the batch is priced from
                # its context sum and maximum, as a steady stretch prices it: the same
                # operations as the backend's, without the per-member shape arrays.
                gain_total = m
                if block > 1:
                    for i in range(m):
                        new_blocks += blocks(context[i] + 1, block) - blocks(context[i], block)
                duration = decode_price(timing, m, context_sum, context_max, timing_linear,
                                        token_ms, decode_ms, vidur_ints)
            if np.isnan(duration):  # a prefill, or decodes beyond Vidur's profile
                gain_total = 0
                new_blocks = 0
                for i in range(m):
                    rid = members[i]
                    if decode_only:
                        g = 1
                        is_prefill[i] = False
                        new_tokens[i] = 1
                    else:
                        remaining = prefill_len[rid] - prefilled[rid]
                        is_prefill[i] = remaining > 0
                        if remaining > 0:
                            n_prefill += 1
                        g = chunk[i] + (1 if chunk[i] == remaining else 0)
                        new_tokens[i] = max(chunk[i], 1)
                    gain[i] = g
                    gain_total += g
                    if block > 1:
                        new_blocks += blocks(context[i] + g, block) - blocks(context[i], block)
                if timing == LINEAR:
                    duration = linear_duration(new_tokens, context, is_prefill, m,
                                               timing_linear[0], timing_linear[1],
                                               timing_linear[2], timing_linear[4],
                                               timing_linear[5])
                elif timing == VIDUR:
                    duration = vidur_duration(new_tokens, context, m, token_ms, decode_ms,
                                              prefill_ms, timing_linear[3], vidur_ints,
                                              out_of_range, float_scratch)
                else:
                    duration = 1.0
                if np.isnan(duration):
                    ints[I_M] = m
                    now_box[0] = now
                    return EXIT_PRICE_ERROR
            n_decode = m - n_prefill
            kv_peak = ints[I_KV_HELD] + gain_total  # after the decision's preemptions
            if block > 1:
                kv_peak = (ints[I_BLOCKS_HELD] + new_blocks) * block
            ints[I_STEPS] += 1
            row = ints[I_LOG]

            # -- overflow: the attempt fails, its time is charged and the overflow rule evicts
            if kv_peak > capacity:
                # holders: the running requests, then the starts; gains by membership
                n_holders = n_run + n_start
                for i in range(n_run):
                    scratch2[running[i]] = 0
                for i in range(m):  # (a decode batch priced whole left gain unset: all 1)
                    scratch2[members[i]] = 1 if decode_only else gain[i]
                for i in range(n_run):
                    rid = running[i]
                    scratch[i] = rid
                    scratch3[i] = held[rid] + scratch2[rid]
                for i in range(n_start):
                    rid = start[i]
                    scratch[n_run + i] = rid
                    scratch3[n_run + i] = held[rid] + scratch2[rid]
                nv = overflow_evict(config[C_OVERFLOW], overflow_beta, rng, scratch, scratch3,
                                    n_holders, capacity, n_run, preempt)
                n_evicted += evict(preempt, nv, config, ints, status, prompt_len, prefill_len,
                                   prefilled, generated, held, start_iteration, evictions,
                                   queue_key, first_token_time, last_token_time, max_token_gap,
                                   running, queue, scratch, joined)
                _log(log_times, log_ints, log_failed, row, now, duration, m, n_start, prefill_total,
                     n_decode, kv_peak, ints[I_KV_HELD], 0, n_evicted, True)
                ints[I_LOG] = row + 1
                now += duration
                ints[I_IDLE] += 1
                continue

            # -- execution: admissions, progress, token times, completions
            iteration = ints[I_ITERATION]
            if n_start:
                for i in range(n_start):
                    rid = start[i]
                    if policy == WAIT and policy_ints[1]:
                        type_waiting[type_id[rid]] -= 1
                    status[rid] = RUNNING
                    start_iteration[rid] = iteration
                    start_time[rid] = now
                    running[n_run + i] = rid
                if keeps_by_id:
                    ints[I_BY_ID_LEN] = insert_by_id(running_by_id, ints[I_BY_ID_LEN], start,
                                                     n_start, scratch3)
                n_run += n_start
                ints[I_NRUN] = n_run
                ints[I_LEFT] = 1
                # the queue without the starts (a prefix: its head moves); evictions may have
                # rebuilt it since the decision
                head, tail = ints[I_QHEAD], ints[I_QTAIL]
                prefix = True
                for i in range(n_start):
                    if status[queue[head + i]] == WAITING:
                        prefix = False
                        break
                if prefix:
                    ints[I_QHEAD] = head + n_start
                else:
                    kept = head
                    for q in range(head, tail):
                        if status[queue[q]] == WAITING:
                            queue[kept] = queue[q]
                            kept += 1
                    ints[I_QTAIL] = kept
            end = now + duration
            n_gaps = np.int64(0)
            n_finished = np.int64(0)
            for i in range(m):
                rid = members[i]
                if decode_only:
                    generated[rid] += 1
                    held[rid] += 1
                    emits = True
                else:
                    remaining = prefill_len[rid] - prefilled[rid]
                    emits = chunk[i] == remaining
                    prefilled[rid] += chunk[i]
                    if emits:
                        generated[rid] += 1
                    held[rid] += gain[i]
                if not emits:
                    continue
                tokens = generated[rid]
                if not decode_only and tokens == 1:
                    first_token_time[rid] = end
                else:
                    gap = end - last_token_time[rid]
                    float_scratch[n_gaps] = gap
                    n_gaps += 1
                    max_token_gap[rid] = np.fmax(max_token_gap[rid], gap)
                last_token_time[rid] = end
                if tokens == output_len[rid]:
                    scratch[n_finished] = rid
                    n_finished += 1
            ints[I_KV_HELD] += gain_total
            if block > 1:
                ints[I_BLOCKS_HELD] += new_blocks
            add_gaps(float_scratch, n_gaps, hist_buffer, hist_counts, hist_floats, ints)
            if n_finished:
                complete(scratch, n_finished, end, config, ints, status, held, completion_time,
                         running)
                ints[I_COMPLETED] += n_finished
                ints[I_IDLE] = 0
            else:
                ints[I_IDLE] += 1
            _log(log_times, log_ints, log_failed, row, now, duration, m, n_start, prefill_total,
                 n_decode, kv_peak, ints[I_KV_HELD], n_finished, n_evicted, False)
            ints[I_LOG] = row + 1
            now = end
            ints[I_ITERATION] = iteration + 1
            if (may_stretch and steady and config[C_FAST_FORWARD] and decode_only
                    and n_start == 0 and n_evicted == 0 and n_finished == 0):
                now = decode_stretch(
                    timing, members, m, now, next_arrival, config, ints, output_len, generated,
                    held, last_token_time, max_token_gap, timing_linear, token_ms, decode_ms,
                    vidur_ints, log_times, log_ints, log_failed, hist_buffer, hist_counts,
                    hist_floats, float_scratch)
        now_box[0] = now
        return EXIT_DONE

    # numba names a cached function's index file by its qualified name, which every loop
    # made here shares, and updates the index by read, add, write: two processes compiling
    # two loops at once (a sweep's workers, pytest -n 2, on a cold cache) could each lose
    # the other's entry, or map it to the other's machine code, so that a later process
    # loaded one policy's loop for another's. A name of its own gives each loop its index.
    step_loop.__qualname__ = f"step_loop_policy{policy}_timing{timing}"
    return njit(cache=True)(step_loop)


@njit(cache=True, inline="always")
def decode_price(kind, m, context_sum, context_max, linear, token_ms, decode_ms, vidur_ints):
    """pricing.price of ``m`` decodes whose contexts sum to ``context_sum`` (largest
    ``context_max``), in O(1): the same operations; NaN where Vidur leaves its profile."""
    if kind == LINEAR:
        return linear[0] + linear[1] * (context_sum + m) + linear[2] * 0 + linear[4] * m \
            + linear[5] * 0
    if kind == VIDUR:
        if m > vidur_ints[V_MAX_BATCH] or context_max >= vidur_ints[V_MAX_TOKENS]:
            return np.nan
        granularity = vidur_ints[V_GRANULARITY]
        return (token_ms[-(-m // TOKEN_ROUNDING) * TOKEN_ROUNDING]
                + decode_ms[m, -(-(context_sum // m) // granularity)]) * linear[3]
    return 1.0


@njit(cache=True)
def decode_stretch(timing, members, m, now, next_arrival, config, ints, output_len, generated,
                   held, last_token_time, max_token_gap, linear, token_ms, decode_ms, vidur_ints,
                   log_times, log_ints, log_failed, hist_buffer, hist_counts, hist_floats, gaps):
    """Engine._fast_forward for a batch of decodes whose decision promises to repeat until a
    change: the same steps as the loop's, each priced in O(1), up to (not including) the
    step that completes a request, and stopping before a step that starts at or after
    ``next_arrival``, would exceed the KV capacity, leaves Vidur's profile, or that the
    loop's livelock, step-limit or table-size checks would stop. Returns ``now``."""
    completing = output_len[members[0]] - generated[members[0]]
    context_sum = 0
    context_max = 0
    for i in range(m):
        rid = members[i]
        completing = min(completing, output_len[rid] - generated[rid])
        context_sum += held[rid]
        context_max = max(context_max, held[rid])
    block = config[C_BLOCK]
    capacity = config[C_CAPACITY]
    growth = np.zeros(block, dtype=np.int64)  # members by held % block
    if block > 1:
        for i in range(m):
            growth[held[members[i]] % block] += 1
    done = 0
    longest = 0.0
    while done < completing - 1:
        if ints[I_IDLE] > config[C_LIVELOCK] or ints[I_LOG] >= log_failed.size:
            break
        if config[C_MAX_STEPS] >= 0 and ints[I_STEPS] >= config[C_MAX_STEPS]:
            break
        if now >= next_arrival:
            break
        duration = decode_price(timing, m, context_sum + done * m,
                                context_max + done, linear, token_ms, decode_ms, vidur_ints)
        if np.isnan(duration):
            break
        new_blocks = growth[(-done) % block] if block > 1 else 0
        peak = ((ints[I_BLOCKS_HELD] + new_blocks) * block if block > 1
                else ints[I_KV_HELD] + m)
        if peak > capacity:
            break
        end = now + duration
        gap = end - now
        for i in range(m):
            gaps[i] = gap
        add_gaps(gaps, m, hist_buffer, hist_counts, hist_floats, ints)
        longest = max(longest, gap)
        ints[I_KV_HELD] += m
        ints[I_BLOCKS_HELD] += new_blocks
        row = ints[I_LOG]
        _log(log_times, log_ints, log_failed, row, now, duration, m, 0, 0, m, peak,
             ints[I_KV_HELD], 0, 0, False)
        ints[I_LOG] = row + 1
        ints[I_STEPS] += 1
        ints[I_ITERATION] += 1
        ints[I_IDLE] += 1
        now = end
        done += 1
    if done:
        for i in range(m):
            rid = members[i]
            generated[rid] += done
            held[rid] += done
            last_token_time[rid] = now
            max_token_gap[rid] = np.fmax(max_token_gap[rid], longest)
    return now


@njit(cache=True, inline="always")
def _log(log_times, log_ints, log_failed, row, now, duration, batch, started, prefill, decode,
         peak, after, completed, evicted, failed):
    log_times[0, row] = now
    log_times[1, row] = duration
    log_ints[L_BATCH, row] = batch
    log_ints[L_STARTED, row] = started
    log_ints[L_PREFILL, row] = prefill
    log_ints[L_DECODE, row] = decode
    log_ints[L_PEAK, row] = peak
    log_ints[L_AFTER, row] = after
    log_ints[L_COMPLETED, row] = completed
    log_ints[L_EVICTED, row] = evicted
    log_failed[row] = failed


#: The step loop of each (policy, timing backend) pair, e.g. ``STEP_LOOPS[VLLM, VIDUR]``.
#: Each is compiled when first needed (or loaded from numba's disk cache, which keeps one
#: entry per pair) with only its own decision and pricing: numba prunes the branches of the
#: other policies and backends before typing, so their functions are never compiled for it.
STEP_LOOPS = {(policy, timing): _step_loop(policy, timing)
              for policy in (VLLM, SARATHI, FCFS, MCSF, PROTECTION, WAIT, NESTED_WAIT)
              for timing in (UNIT, LINEAR, VIDUR)}
