"""What the threshold policies (WAIT, Nested WAIT) share: the running set in id order, kept
across steps, "the first ``n`` of each group" over it, and the WAIT authors' ``force_clear``
(drop every unfinished request).

Both take "the ``n`` oldest requests at every stage" of some group of running requests.
Engine ids are arrival order, so the oldest are the smallest ids: walking the running set
in ascending id answers it in one pass. Sorting hundreds of running ids at every step would
cost more than the decision itself, so the policy keeps the set sorted as requests start and
leave.
"""

from __future__ import annotations

from replay.engine.jit import jit
from replay.engine.sorting import stable_argsort
from replay.engine.state import RUNNING


@jit
def running_by_id(s, by_id, length):
    """``by_id[:length]``, the running set in ascending id as this policy kept it, brought up
    to date: the requests started since the last decision merged in, those no longer running
    (completed or evicted) dropped. Returns the new length."""
    started, k, scratch = s.started, s.n_started, s.scratch3
    for i in range(k):  # insertion sort: a step starts a few requests
        item = started[i]
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
    status = s.status
    kept = 0
    for i in range(length + k):
        if status[by_id[i]] == RUNNING:
            by_id[kept] = by_id[i]
            kept += 1
    return kept


@jit
def first_per_group(keys, limits, n, keep):
    """``keep[k]``: element ``k`` of ``keys[:n]`` is among the first ``limits[k]`` of its key,
    in input order (``limits`` is the same for every element of a key)."""
    order = stable_argsort(keys, n)
    rank = 0
    for i in range(n):
        j = order[i]
        if i > 0 and keys[j] != keys[order[i - 1]]:
            rank = 0
        keep[j] = rank < limits[j]
        rank += 1


@jit
def drop_unfinished(s, by_id, length):
    """The decision that ends the run as the WAIT authors' ``force_clear`` does: drop every
    waiting request and every running one (``by_id[:length]``, from :func:`running_by_id`),
    and run nothing."""
    n_drop = 0
    for q in range(s.qhead, s.qtail):
        s.drop[n_drop] = s.queue[q]
        n_drop += 1
    for k in range(length):
        s.drop[n_drop] = by_id[k]
        n_drop += 1
    s.n_drop = n_drop
    s.n_start = 0
    s.n_advance = 0
