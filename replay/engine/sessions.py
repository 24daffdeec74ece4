"""Multi-turn sessions: a later turn arrives a think time after its previous turn completes.

A session's first turn arrives at its trace or arrival-process time; every later turn's
arrival is known only once the turn before it completes (a closed loop per session). Engine
ids are arrival order, so with sessions they are given as requests arrive: the engine
releases the next request in arrival order from two sources (the first turns, sorted, and
a heap of later turns whose time is known) and copies its fields from the workload's rows
into the slot of its new engine id. Without sessions (``dynamic = 0``) ids are given before
the run and nothing here runs.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit


@jit(inline="always")
def _before(s, i, j):
    """Heap order: earlier time first, then the earlier workload row."""
    ti, tj = s.heap_time[i], s.heap_time[j]
    return ti < tj or (ti == tj and s.heap_id[i] < s.heap_id[j])


@jit(inline="always")
def _swap(s, i, j):
    s.heap_time[i], s.heap_time[j] = s.heap_time[j], s.heap_time[i]
    s.heap_id[i], s.heap_id[j] = s.heap_id[j], s.heap_id[i]


@jit
def schedule_turn(s, time, row):
    """The turn at workload ``row`` arrives at ``time``."""
    i = s.heap_size
    s.heap_time[i], s.heap_id[i] = time, row
    s.heap_size += 1
    while i > 0:
        parent = (i - 1) // 2
        if not _before(s, i, parent):
            break
        _swap(s, i, parent)
        i = parent


@jit
def _pop(s):
    s.heap_size -= 1
    last = s.heap_size
    _swap(s, 0, last)
    i = 0
    while True:
        left, right, smallest = 2 * i + 1, 2 * i + 2, i
        if left < last and _before(s, left, smallest):
            smallest = left
        if right < last and _before(s, right, smallest):
            smallest = right
        if smallest == i:
            break
        _swap(s, i, smallest)
        i = smallest
    return s.heap_time[last], s.heap_id[last]


@jit
def next_turn_time(s):
    """When the next request arrives (the earlier of the two sources), or inf."""
    first = np.inf
    if s.next_first < s.first_turns.size:
        first = s.w_arrival[s.first_turns[s.next_first]]
    if s.heap_size and s.heap_time[0] < first:
        return s.heap_time[0]
    return first


@jit
def arrive(s):
    """The next request in arrival order takes the next engine id; returns it. Ties between
    the two sources go to the earlier workload row."""
    first_time, first_row = np.inf, -1
    if s.next_first < s.first_turns.size:
        first_row = s.first_turns[s.next_first]
        first_time = s.w_arrival[first_row]
    if s.heap_size and (s.heap_time[0] < first_time or (
            s.heap_time[0] == first_time and s.heap_id[0] < first_row)):
        time, row = _pop(s)
    else:
        time, row = first_time, first_row
        s.next_first += 1
    rid = s.released
    s.workload_of[rid] = row
    s.arrival[rid] = time
    s.prompt_len[rid] = s.w_prompt[row]
    s.prefill_len[rid] = s.w_prompt[row]
    s.output_len[rid] = s.w_output[row]
    s.estimate[rid] = s.w_estimate[row]
    s.predicted_lo[rid] = s.w_lo[row]
    s.predicted_hi[rid] = s.w_hi[row]
    s.type_id[rid] = s.w_type[row]
    if s.cache_on:
        s.hash_start[rid] = s.w_hash_start[row]
        s.hash_count[rid] = s.w_hash_count[row]
    return rid


@jit
def turn_completed(s, rid, end):
    """``rid`` completed at ``end``: its session's next turn, if any, now has a time."""
    row = s.successor[s.workload_of[rid]]
    if row >= 0:
        schedule_turn(s, end + s.think[row], row)


@jit
def later_turns(s, rid):
    """How many turns of ``rid``'s session come after it (they will never arrive if it is
    dropped)."""
    count = 0
    row = s.successor[s.workload_of[rid]]
    while row >= 0:
        count += 1
        row = s.successor[row]
    return count
