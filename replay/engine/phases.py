"""The phases of one engine step, each a compiled function over the engine's state record.

A step (:func:`replay.engine.loop.run_steps` runs them in order):

1. :func:`release_arrivals`: requests whose arrival time has come join the waiting queue;
2. the policy decides (its own compiled function, or Python through the bridge of
   :mod:`replay.engine.rules`); :func:`apply_decision` carries out its preemptions,
   applies the engine's caps and lays out the batch's members;
3. :func:`price`: the batch's shape (chunks, KV gains, blocks), its duration from the timing
   backend and the KV it would hold afterwards;
4. :func:`fail_attempt` when that exceeds the capacity (the attempt is charged and the
   overflow rule evicts), otherwise :func:`execute`: admissions, progress, token times,
   completions and the iteration's row in the log;
5. :func:`run_stretch` after a step the policy promised steady: the same batch again,
   without asking the policy, for as long as the promise and the run's own stops allow.

The KV and queue rules every phase relies on are here too: :func:`evict` (free a running
request and requeue it), :func:`complete`, :func:`queue_append`. Nothing here knows any
policy or timing backend: they are the function pointers the loop is given.

:func:`release_arrivals`, :func:`apply_decision`, :func:`fail_attempt` and the decode
stretch are compiled into their one caller (``inline="always"``): numba compiles every
function on its own and then optimises it again inside each caller, so a phase of its own
costs the optimisation of everything it calls once more, and the first run's compile is the
slower for it.
"""

from __future__ import annotations

import numpy as np

from replay.engine.histogram import fold_values
from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.prefix_cache import (
    acquire,
    blocks_in_use,
    insert_blocks,
    insert_full_blocks,
    lookup_hits,
    new_pins,
    pin_hits,
    reclaim,
    reclaimable,
    release,
)
from replay.engine.sessions import arrive, later_turns, next_turn_time, turn_completed
from replay.engine.sorting import stable_argsort
from replay.engine.state import DONE, DROPPED, RUNNING, WAITING

#: ``EngineState.outcome`` once the run stops: why.
COMPLETED, LIVELOCK, STALLED, STEP_LIMIT = 1, 2, 3, 4
#: Integer columns of the iteration log (``log_ints`` rows), after start_time and duration
#: (``log_times``) and before failed (``log_failed``).
(L_BATCH, L_STARTED, L_PREFILL, L_DECODE, L_PEAK, L_AFTER, L_COMPLETED, L_EVICTED) = range(8)
LOG_COLUMNS = 8


# ---------------------------------------------------------------------------- the queue
@jit
def queue_append(s, ids, k):
    """Queue ``ids[:k]`` behind everything waiting (moving the queue to the buffer's front when
    the tail would pass its end; the buffer holds every request and one more)."""
    queue = s.queue
    head, tail = s.qhead, s.qtail
    if tail + k > queue.size:
        size = tail - head
        for i in range(size):
            queue[i] = queue[head + i]
        head, tail = 0, size
    for i in range(k):
        queue[tail + i] = ids[i]
    s.qhead, s.qtail = head, tail + k
    s.queue_version += 1


@jit(inline="always")
def note_joined(s, rid):
    """``rid`` joined the waiting queue (an arrival or an eviction) since the last decision."""
    s.joined[s.n_joined] = rid
    s.n_joined += 1


@jit(inline="always")
def release_arrivals(s):
    """Every request that arrived by ``now`` joins the queue; ``next_arrival`` is the first
    that has not."""
    if s.dynamic:
        _release_turns(s)
        return
    n, arrival, released = s.n, s.arrival, s.released
    if released < n and arrival[released] <= s.now:
        upto = released
        while upto < n and arrival[upto] <= s.now:
            upto += 1
        k = upto - released
        scratch, status = s.scratch, s.status
        for i in range(k):
            rid = released + i
            status[rid] = WAITING
            scratch[i] = rid
            note_joined(s, rid)
        if s.next_key > n:  # a `back` requeue happened: queue behind it
            for i in range(k):
                s.queue_key[released + i] = s.next_key + i
            s.next_key += k
        queue_append(s, scratch, k)
        s.released = released = upto
    s.next_arrival = arrival[released] if released < n else np.inf


@jit
def _release_turns(s):
    """release_arrivals with sessions: requests take their engine ids as they arrive."""
    while s.released < s.n and next_turn_time(s) <= s.now:
        rid = arrive(s)
        s.status[rid] = WAITING
        if s.next_key > s.n:  # a `back` requeue happened: queue behind it
            s.queue_key[rid] = s.next_key
            s.next_key += 1
        note_joined(s, rid)
        s.scratch[0] = rid
        queue_append(s, s.scratch, np.int64(1))
        s.released += 1
    s.next_arrival = next_turn_time(s)


# ------------------------------------------------------------------ the running set
@jit
def keep_running(s):
    """Drop from the running set, in place and in order, the requests no longer running."""
    running, status = s.running, s.status
    kept = 0
    for i in range(s.n_run):
        if status[running[i]] == RUNNING:
            running[kept] = running[i]
            kept += 1
    s.n_run = kept
    s.running_version += 1


@jit
def evict(s, victims, nv):
    """Free the KV of the running ones among ``victims[:nv]`` and return them to the waiting
    queue; how many. Under ``restart`` they lose every token; under ``recompute`` they keep
    the tokens emitted so far and must prefill ``s + generated`` when readmitted.
    ``victims`` is reordered in place."""
    status, held = s.status, s.held
    k = np.int64(0)
    for i in range(nv):
        if status[victims[i]] == RUNNING:
            victims[k] = victims[i]
            k += 1
    if k == 0:
        return 0
    block = s.block
    freed = 0
    for i in range(k):
        rid = victims[i]
        freed += held[rid]
        if s.cache_on:
            release(s, rid)
        status[rid] = WAITING
        s.prefilled[rid] = 0
        if not s.recompute:
            s.generated[rid] = 0
            s.first_token_time[rid] = np.nan
            s.last_token_time[rid] = np.nan
            s.max_token_gap[rid] = np.nan
        s.prefill_len[rid] = s.prompt_len[rid] + s.generated[rid]
        if block > 1:
            s.blocks_held -= blocks(held[rid], block)
        held[rid] = 0
        s.start_iteration[rid] = -1
        s.evictions[rid] += 1
        note_joined(s, rid)
    s.kv_held -= freed
    keep_running(s)
    queue_key, scratch = s.queue_key, s.scratch
    if k > 1:  # in queue-key order (keys are unique)
        for i in range(k):
            scratch[i] = queue_key[victims[i]]
        order = stable_argsort(scratch, k)
        for i in range(k):
            scratch[i] = victims[order[i]]
        for i in range(k):
            victims[i] = scratch[i]
    if s.requeue_back:
        for i in range(k):
            queue_key[victims[i]] = s.next_key + i
        s.next_key += k
        queue_append(s, victims, k)
        return k
    # Insert each victim at its key's place (the queue is in key order): binary search, then
    # move the shorter side by one slot (there is room before the head or after the tail:
    # the buffer holds every request plus one).
    queue = s.queue
    head, tail = s.qhead, s.qtail
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
    s.qhead, s.qtail = head, tail
    s.queue_version += 1
    return k


@jit
def complete(s, finished, nf, end):
    """Record ``finished[:nf]`` as completed at ``end`` and free their KV."""
    block, held = s.block, s.held
    for i in range(nf):
        rid = finished[i]
        s.completion_time[rid] = end
        s.status[rid] = DONE
        if s.cache_on:
            release(s, rid)
        if s.dynamic:
            turn_completed(s, rid, end)
        s.kv_held -= held[rid]
        if block > 1:
            s.blocks_held -= blocks(held[rid], block)
        held[rid] = 0
    keep_running(s)
    s.completed += nf
    s.idle_steps = 0


@jit
def drop(s, ids, k):
    """The policy drops ``ids[:k]`` (waiting or running): they leave the run for good and never
    complete; a running one frees its KV."""
    status, held, block = s.status, s.held, s.block
    running_left = False
    waiting_left = False
    for i in range(k):
        rid = ids[i]
        if status[rid] == RUNNING:
            if s.cache_on:
                release(s, rid)
            s.kv_held -= held[rid]
            if block > 1:
                s.blocks_held -= blocks(held[rid], block)
            held[rid] = 0
            running_left = True
        elif status[rid] == WAITING:
            waiting_left = True
        else:
            continue
        status[rid] = DROPPED
        s.dropped += 1
        if s.dynamic:  # its session's later turns will never arrive
            s.dropped += later_turns(s, rid)
    if running_left:
        keep_running(s)
    if waiting_left:
        queue, kept = s.queue, s.qhead
        for q in range(s.qhead, s.qtail):
            if status[queue[q]] == WAITING:
                queue[kept] = queue[q]
                kept += 1
        s.qtail = kept
        s.queue_version += 1
    s.idle_steps = 0


# ------------------------------------------------------------- token gaps and the log
@jit
def fold_gaps(s, values, k):
    """Fold ``values[:k]`` into the token-gap histogram's counts."""
    total, largest = fold_values(values, k, s.gap_counts, s.gap_log_lo, s.gap_log_ratio)
    s.gap_count += k
    s.gap_total += total
    s.gap_max = max(s.gap_max, largest)


@jit(inline="always")
def add_gaps(s, gaps, k):
    """Add ``gaps[:k]`` to the histogram: buffered, folded where LogHistogram.add folds.
    Inlined: most adds only copy into the buffer."""
    filled = s.gap_filled
    if filled + k > s.gap_buffer.size:
        _fold_for_gaps(s, gaps, k)
        return
    buffer = s.gap_buffer
    for i in range(k):
        buffer[filled + i] = gaps[i]
    s.gap_filled = filled + k


@jit
def _fold_for_gaps(s, gaps, k):
    """add_gaps where ``gaps[:k]`` do not fit the buffer's room: fold the buffer, then buffer
    them, or fold them too if they are more than the buffer holds."""
    buffer = s.gap_buffer
    if s.gap_filled:
        fold_gaps(s, buffer, s.gap_filled)
    if k > buffer.size:
        fold_gaps(s, gaps, k)
        s.gap_filled = 0
        return
    for i in range(k):
        buffer[i] = gaps[i]
    s.gap_filled = k


@jit
def _grow_log(s):
    """Twice the room in the log (element by element: numba's 2-D slice assignment costs
    seconds of compile time)."""
    rows = s.log_failed.size
    old_times, old_ints, old_failed = s.log_times, s.log_ints, s.log_failed
    times = np.empty((2, 2 * rows), dtype=np.float64)
    ints = np.empty((LOG_COLUMNS, 2 * rows), dtype=np.int64)
    failed = np.empty(2 * rows, dtype=np.bool_)
    for row in range(rows):
        times[0, row] = old_times[0, row]
        times[1, row] = old_times[1, row]
        for column in range(LOG_COLUMNS):
            ints[column, row] = old_ints[column, row]
        failed[row] = old_failed[row]
    s.log_times, s.log_ints, s.log_failed = times, ints, failed
    if s.cache_on:
        old_cache = s.log_cache
        cache = np.empty((2, 2 * rows), dtype=np.int64)
        for row in range(rows):
            cache[0, row] = old_cache[0, row]
            cache[1, row] = old_cache[1, row]
        s.log_cache = cache


@jit(inline="always")
def log_row(s, start, duration, batch, started, prefill, decode, peak, after, completed,
            evicted, failed):
    """One row of the iteration log (:data:`replay.engine.results.ITERATION_COLUMNS`)."""
    row = s.n_log
    if row == s.log_failed.size:
        _grow_log(s)
    s.log_times[0, row] = start
    s.log_times[1, row] = duration
    ints = s.log_ints
    ints[L_BATCH, row] = batch
    ints[L_STARTED, row] = started
    ints[L_PREFILL, row] = prefill
    ints[L_DECODE, row] = decode
    ints[L_PEAK, row] = peak
    ints[L_AFTER, row] = after
    ints[L_COMPLETED, row] = completed
    ints[L_EVICTED, row] = evicted
    s.log_failed[row] = failed
    if s.cache_on:
        s.log_cache[0, row] = s.step_hit_tokens
        s.log_cache[1, row] = s.cache_entries
    s.n_log = row + 1


@jit(inline="always")
def kv_after(s):
    """The KV the log records after an iteration: the slots the running requests hold, or,
    with the prefix cache, the physical blocks in use (cache entries included), in slots."""
    if s.cache_on:
        return blocks_in_use(s) * s.block
    return s.kv_held


# ------------------------------------------------------------------ the step's phases
@jit(inline="always")
def _idle_steps_left(s):
    """Steps that may still run, none completing or dropping a request, before the livelock
    stop."""
    return s.livelock_window + 1 - s.idle_steps


@jit(inline="always")
def _steps_left(s):
    """Steps that may still run before the step limit (``max_steps`` < 0: none)."""
    return s.max_steps - s.steps if s.max_steps >= 0 else np.iinfo(np.int64).max


@jit
def stop_reason(s):
    """The outcome that stops the run before this step, or 0."""
    if _idle_steps_left(s) <= 0:
        return LIVELOCK
    if _steps_left(s) <= 0:
        return STEP_LIMIT
    return 0


@jit
def idle_steps_before_stop(s):
    """How many more steps, each adding one to the step and the idle-step counts, can run
    before :func:`stop_reason` stops the run (0: it stops now)."""
    return max(0, min(_idle_steps_left(s), _steps_left(s)))


@jit(inline="always")
def apply_decision(s):
    """Carry out the decision's preemptions, cut its admissions to the engine's caps and lay
    out the batch: ``members[:m]`` are the advancing requests, then the admissions. Returns
    ``(requests evicted, whether every admission was kept)``."""
    if s.n_drop:
        drop(s, s.drop, s.n_drop)
    n_evicted = 0
    if s.n_preempt:
        n_evicted = evict(s, s.preempt, s.n_preempt)
    n_start = s.n_start
    requested = n_start
    if s.max_running >= 0 and s.n_run + n_start > s.max_running:
        # A cap on running requests for every policy (a serving engine's batch limit): the
        # policy's admissions are cut to the first ones in its order.
        n_start = min(n_start, max(0, s.max_running - s.n_run))
    if s.max_starts >= 0:
        n_start = min(n_start, s.max_starts)
    if n_start < requested:  # no prompt chunk for an admission the caps cut
        for i in range(n_start, requested):
            s.chunk_of[s.start[i]] = 0
        s.n_start = n_start
    members = s.members
    if s.n_advance < 0:
        m = s.n_run
        running = s.running
        for i in range(m):
            members[i] = running[i]
    else:
        m = s.n_advance
        advance = s.advance
        for i in range(m):
            members[i] = advance[i]
    start = s.start
    if s.cache_on:
        new_pins(s)
    for i in range(n_start):
        members[m + i] = start[i]
        if s.cache_on:
            hits = lookup_hits(s, start[i])
            s.hit_blocks[start[i]] = hits
            pin_hits(s, start[i], hits)
    s.m = m + n_start
    return n_evicted, n_start == requested


@jit
def clear_chunks(s):
    """Forget the decision's named prompt chunks (the next decision names its own)."""
    chunk_of, chunk_ids = s.chunk_of, s.chunk_ids
    for i in range(s.n_chunks):
        chunk_of[chunk_ids[i]] = 0
    s.n_chunks = 0


@jit
def price(s, timing, price_batch, price_decodes):
    """The batch's shape (``chunk``, ``gain``, ``new_tokens``, ``context``, ``is_prefill``), its
    duration and the KV it would hold after the iteration. Returns ``(duration, KV peak,
    prompt tokens, members that decode, decode only)``; the duration is NaN where the
    backend refuses the batch.

    A batch of decodes only (most steps) is priced from its context sum and maximum
    (``price_decodes``, O(1)), the same operations as pricing it member by member; where
    that has no answer (a backend without it, or beyond a profile) it is priced whole."""
    m = s.m
    members, chunk, context = s.members, s.chunk, s.context
    prefill_len, prefilled, held, chunk_of = s.prefill_len, s.prefilled, s.held, s.chunk_of
    block = s.block
    # an admission's blocks found in the prefix cache are context, not computed (a step
    # without admissions, most of them, needs no look at each member's status)
    cache_hits = s.cache_on != 0 and s.n_start > 0
    status, hit_blocks = s.status, s.hit_blocks  # read once: each read of a record's array
    # takes and drops a reference
    s.step_hit_tokens = 0
    prefill_total = 0
    context_sum = 0
    context_max = 0
    for i in range(m):
        rid = members[i]
        skip = hit_blocks[rid] * block if cache_hits and status[rid] == WAITING else 0
        c = prefill_len[rid] - prefilled[rid] - skip
        if chunk_of[rid] > 0:
            c = chunk_of[rid]
        chunk[i] = c
        prefill_total += c
        h = held[rid] + skip
        context[i] = h
        context_sum += h
        context_max = max(context_max, h)
    decode_only = prefill_total == 0
    gain_total = 0
    new_blocks = 0
    n_prefill = 0
    duration = np.nan
    gain, new_tokens, is_prefill = s.gain, s.new_tokens, s.is_prefill
    if decode_only:
        # Every member decodes one token (a gain of 1).
        gain_total = m
        if block > 1:
            for i in range(m):
                new_blocks += blocks(context[i] + 1, block) - blocks(context[i], block)
        duration = price_decodes(timing, m, context_sum, context_max)
    if np.isnan(duration):  # a prefill, or decodes the O(1) price does not cover
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
                if cache_hits and status[rid] == WAITING:
                    remaining -= hit_blocks[rid] * block
                is_prefill[i] = remaining > 0
                if remaining > 0:
                    n_prefill += 1
                g = chunk[i] + (1 if chunk[i] == remaining else 0)
                new_tokens[i] = max(chunk[i], 1)
            gain[i] = g
            gain_total += g
            if block > 1:
                new_blocks += blocks(context[i] + g, block) - blocks(context[i], block)
        duration = price_batch(s, timing)
    kv_peak = s.kv_held + gain_total  # after the decision's preemptions
    if block > 1:
        kv_peak = (blocks_in_use(s) + new_blocks) * block
    return duration, kv_peak, prefill_total, m - n_prefill, decode_only, gain_total, new_blocks


@jit
def make_room(s, kv_peak):
    """The KV peak after reclaiming free prefix-cache entries, if that is enough to fit the
    capacity (none is reclaimed otherwise: the overflow rule's turn)."""
    if not s.cache_on or kv_peak <= s.capacity:
        return kv_peak
    needed = -(-(kv_peak - s.capacity) // s.block)
    if needed > reclaimable(s):
        return kv_peak
    reclaim(s, needed)
    return kv_peak - needed * s.block


@jit(inline="always")
def fail_attempt(s, rule, evict_victims, duration, kv_peak, prefill_total, n_decode,
                 decode_only, n_evicted):
    """The batch would exceed the capacity: the attempt fails, its time is charged, and the
    overflow rule evicts (``evict_victims`` writes its victims to ``preempt``)."""
    m, n_run, n_start = s.m, s.n_run, s.n_start
    members, running, start, held = s.members, s.running, s.start, s.held
    holders, held_after, gain_of = s.scratch, s.scratch3, s.scratch2
    # holders: the running requests in start order, then the admissions; what each would
    # hold after the iteration (a member's gain, nothing more for the others)
    for i in range(n_run):
        gain_of[running[i]] = 0
    gain = s.gain
    for i in range(m):  # (a batch of decodes priced in O(1) left gain unset: all 1)
        gain_of[members[i]] = 1 if decode_only else gain[i]
    for i in range(n_run):
        rid = running[i]
        holders[i] = rid
        held_after[i] = held[rid] + gain_of[rid]
    for i in range(n_start):
        rid = start[i]
        holders[n_run + i] = rid
        held_after[n_run + i] = held[rid] + gain_of[rid]
    victims = evict_victims(s, rule, n_run + n_start, n_run)
    n_evicted += evict(s, s.preempt, victims)
    log_row(s, s.now, duration, m, n_start, prefill_total, n_decode, kv_peak, kv_after(s), 0,
            n_evicted, True)
    s.now += duration
    s.idle_steps += 1


@jit
def _take_cached_prefix(s, rid):
    """An admission takes its blocks found in the prefix cache: held as references, already
    prefilled; the cache's totals count them."""
    block = s.block
    hits = s.hit_blocks[rid]
    acquire(s, rid, hits)
    tokens = hits * block
    s.prefilled[rid] += tokens
    s.held[rid] += tokens
    s.kv_held += tokens
    s.blocks_held += hits
    s.cached_tokens[rid] = tokens
    s.step_hit_tokens += tokens
    s.cache_hit_blocks += hits
    s.cache_lookup_blocks += min(s.hash_count[rid], s.prefill_len[rid] // block)
    s.cache_hit_tokens += tokens
    s.cache_prompt_tokens += s.prefill_len[rid]
    s.hit_blocks[rid] = 0


@jit
def _admit(s):
    """The admissions start: running, at this iteration, and out of the queue."""
    n_start, n_run = s.n_start, s.n_run
    start, running, status = s.start, s.running, s.status
    iteration, now = s.iteration, s.now
    for i in range(n_start):
        rid = start[i]
        if s.cache_on:
            _take_cached_prefix(s, rid)
        status[rid] = RUNNING
        s.start_iteration[rid] = iteration
        s.start_time[rid] = now
        running[n_run + i] = rid
        s.started[s.n_started + i] = rid
    s.n_started += n_start
    s.n_run = n_run + n_start
    s.running_version += 1
    # The queue without the admissions, which are its only entries not waiting: its first
    # n_start (its head moves), unless evictions requeued at the front since the decision.
    # Only the stretch up to the last admission is compacted, its waiting entries moved
    # back to end there in order: a few entries, not the whole queue of a loaded run.
    queue, head, tail = s.queue, s.qhead, s.qtail
    end, found = head, 0
    while found < n_start and end < tail:
        if status[queue[end]] != WAITING:
            found += 1
        end += 1
    kept = end
    for q in range(end - 1, head - 1, -1):
        if status[queue[q]] == WAITING:
            kept -= 1
            queue[kept] = queue[q]
    s.qhead = kept
    s.queue_version += 1


@jit
def execute(s, duration, kv_peak, prefill_total, n_decode, decode_only, gain_total,
            new_blocks, n_evicted):
    """Run the batch: admissions, progress, token times, completions and the log row.
    Returns ``(completions, members that emitted a token)``."""
    now = s.now
    n_start = s.n_start
    if n_start:
        _admit(s)
    end = now + duration
    m = s.m
    members, chunk, gain = s.members, s.chunk, s.gain
    prefill_len, prefilled, generated, held = s.prefill_len, s.prefilled, s.generated, s.held
    last_token_time, max_token_gap = s.last_token_time, s.max_token_gap
    output_len, first_token_time = s.output_len, s.first_token_time
    gaps, finished = s.float_scratch, s.scratch
    n_gaps = np.int64(0)
    n_finished = np.int64(0)
    emitters = 0
    for i in range(m):
        rid = members[i]
        if decode_only:
            generated[rid] += 1
            held[rid] += 1
            emits = True
        else:
            emits = chunk[i] == prefill_len[rid] - prefilled[rid]
            prefilled[rid] += chunk[i]
            if emits:
                generated[rid] += 1
            held[rid] += gain[i]
        if not emits:
            continue
        emitters += 1
        tokens = generated[rid]
        if not decode_only and tokens == 1:
            first_token_time[rid] = end
        else:
            gap = end - last_token_time[rid]
            gaps[n_gaps] = gap
            n_gaps += 1
            max_token_gap[rid] = np.fmax(max_token_gap[rid], gap)
        last_token_time[rid] = end
        if tokens == output_len[rid]:  # (a record's array read in a loop would take and
            # drop a reference per member)
            finished[n_finished] = rid
            n_finished += 1
    s.kv_held += gain_total
    if s.block > 1:
        s.blocks_held += new_blocks
    if s.cache_on:
        _cache_full_blocks(s)
    add_gaps(s, gaps, n_gaps)
    if n_finished:
        complete(s, finished, n_finished, end)
    else:
        s.idle_steps += 1
    log_row(s, now, duration, m, n_start, prefill_total, n_decode, kv_peak, kv_after(s),
            n_finished, n_evicted, False)
    s.now = end
    s.iteration += 1
    return n_finished, emitters


@jit
def _cache_full_blocks(s):
    """The members' newly full blocks of known content join the prefix cache (a pass of its
    own, so that the step's member loop is the same with the cache off)."""
    n_ref, hash_count, held, block, members = s.n_ref, s.hash_count, s.held, s.block, s.members
    for i in range(s.m):
        rid = members[i]
        have = n_ref[rid]  # held // block > have, as a product: no division per member
        if have < hash_count[rid] and held[rid] >= (have + 1) * block:
            insert_full_blocks(s, rid)


# ------------------------------------------------------------------ the steady stretch
@jit
def run_stretch(s, timing, price_batch, price_decodes, room, decode_only):
    """Repeat the batch just executed, which the policy promised would repeat for ``room``
    more steps, without asking it: until the next step would start at or after the next
    arrival, take a prompt's last chunk, exceed the KV capacity or meet the run's own stops,
    or until a step has completed a request. Results are those of the step loop (the
    engine defines a kept promise to change nothing but speed)."""
    s.n_start = 0  # the batch's admissions run now: they repeat as members, not as starts
    chunk_of, prefill_len, prefilled, members = s.chunk_of, s.prefill_len, s.prefilled, s.members
    while room > 0:
        if decode_only:  # O(1) steps up to one the step-by-step path must take
            done, go_on = _decode_stretch(s, timing, price_decodes, room)
            if not go_on:
                return
            room -= done
            if room == 0:
                return
        room -= 1
        if s.now >= s.next_arrival or stop_reason(s):
            return
        for i in range(s.m):  # a chunk that is its prompt's last emits: the batch changes
            rid = members[i]
            remaining = prefill_len[rid] - prefilled[rid]
            if remaining > 0 and (chunk_of[rid] == 0 or chunk_of[rid] >= remaining):
                return
        duration, kv_peak, prefill_total, n_decode, only_decodes, gain_total, new_blocks = \
            price(s, timing, price_batch, price_decodes)
        if np.isnan(duration):
            return
        kv_peak = make_room(s, kv_peak)
        if kv_peak > s.capacity:
            return
        s.steps += 1
        n_finished, _ = execute(s, duration, kv_peak, prefill_total, n_decode, only_decodes,
                                gain_total, new_blocks, np.int64(0))
        if n_finished:
            return


@jit(inline="always")
def _decode_stretch(s, timing, price_decodes, room):
    """The stretch of a batch of decodes, each step priced in O(1) from the context sum and
    maximum and every member's tokens written once at the end, up to (not including) the
    step that completes a request. Returns ``(steps done, whether the stretch goes on step
    by step)``: it does where the O(1) price had no answer, and for the completing step.
    With the prefix cache, the members whose block fills at a step (a ``block``-th of them
    on average) insert it there."""
    m, members = s.m, s.members
    output_len, generated, held = s.output_len, s.generated, s.held
    completing = output_len[members[0]] - generated[members[0]]
    context_sum = 0
    context_max = 0
    block, capacity = s.block, s.capacity
    for i in range(m):
        rid = members[i]
        completing = min(completing, output_len[rid] - generated[rid])
        context_sum += held[rid]
        context_max = max(context_max, held[rid])
    if s.cache_on:  # members by the step (mod block) that fills their block, in member order
        fill_start = np.zeros(block + 1, dtype=np.int64)
        for i in range(m):
            fill_start[block - held[members[i]] % block] += 1
        for d in range(block):
            fill_start[d + 1] += fill_start[d]
        fillers = np.empty(m, dtype=np.int64)
        slot = fill_start[:block].copy()
        for i in range(m):
            d = block - 1 - held[members[i]] % block
            fillers[slot[d]] = members[i]
            slot[d] += 1
    growth = np.zeros(block, dtype=np.int64)  # members by held % block
    if block > 1:
        for i in range(m):
            growth[held[members[i]] % block] += 1
    gaps = s.float_scratch
    done = 0
    longest = 0.0
    now = s.now
    go_on = False
    # Each step counts one step and one idle step, so the run's own stops are a step budget;
    # kept in a local, as is everything the steps read or write without a call (every call
    # that takes the state record counts a reference to it up and down: atomically, unless
    # replay.engine.jit.count_references_plainly ran).
    before_stop = idle_steps_before_stop(s)
    next_arrival = s.next_arrival
    while done < room:
        if done == completing - 1:
            go_on = True
            break
        if now >= next_arrival or done >= before_stop:
            break
        duration = price_decodes(timing, m, context_sum + done * m, context_max + done)
        if np.isnan(duration):
            go_on = True
            break
        new_blocks = growth[(-done) % block] if block > 1 else 0
        peak = (blocks_in_use(s) + new_blocks) * block if block > 1 else s.kv_held + m
        if peak > capacity:  # make_room changes only a peak over the capacity
            peak = make_room(s, peak)
            if peak > capacity:
                break
        end = now + duration
        gap = end - now
        for i in range(m):
            gaps[i] = gap
        add_gaps(s, gaps, m)
        longest = max(longest, gap)
        s.kv_held += m
        s.blocks_held += new_blocks
        if s.cache_on:
            d = done % block
            for j in range(fill_start[d], fill_start[d + 1]):
                rid = fillers[j]
                insert_blocks(s, rid, (held[rid] + done + 1) // block)
        log_row(s, now, duration, m, 0, 0, m, peak, kv_after(s), 0, 0, False)
        s.steps += 1
        s.iteration += 1
        s.idle_steps += 1
        now = end
        done += 1
    s.now = now
    if done:
        last_token_time, max_token_gap = s.last_token_time, s.max_token_gap
        for i in range(m):
            rid = members[i]
            generated[rid] += done
            held[rid] += done
            last_token_time[rid] = now
            max_token_gap[rid] = np.fmax(max_token_gap[rid], longest)
    return done, go_on
