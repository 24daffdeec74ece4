"""The lookahead memory check shared by FCFS, MC-SF and the Sorted-F family.

A set of requests can start now if, assuming every running and newly started request
advances one token per iteration until its (predicted) completion, the KV they hold never
exceeds ``M``. Request ``i`` holds ``base_i + t`` slots ``t`` iterations from now while
``t <= remaining_i`` and nothing afterwards, so the KV only peaks at a checkpoint
``t = remaining_j`` (the iteration a request completes); with paging, at a checkpoint each
request's slots are rounded up to whole blocks.

``base`` is a running request's ``prompt_len + generated`` (a request still prefilling in
chunks counts as if its prompt were in KV: conservative) and a candidate's
``prefill_len``; ``remaining`` is its (estimated) iterations left, at least one (a request
that has generated its estimate is assumed to need one more).

With the prefix cache, a candidate's base leaves out the prompt tokens it finds in blocks
a running request holds already (a hit on a free cache entry counts in the base: the
entry is reclaimable memory until the candidate takes it). The check then bounds the
memory the batch adds, not the memory each request will hold alone: a request whose
shared prefix outlives the requests that shared it holds those blocks by itself, which the
check did not count; the engine's KV check and overflow rule catch what the plan misses
(docs/model.md, "The prefix cache").

The rules are compiled functions (the step loop calls them inside FCFS's and MC-SF's
decisions); :func:`peak_kv`, :func:`running_profile`, :func:`remaining_iterations` and
:func:`admissible_prefix` call the same functions from Python for the policies written
in Python.
"""

from __future__ import annotations

import numpy as np

from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.policy import PolicyView
from replay.engine.prefix_cache import cached_blocks, free_among_hits
from replay.engine.sorting import stable_argsort


@jit(inline="always")
def iterations_left(estimate, generated, rid):
    """Iterations request ``rid`` still needs by ``estimate`` (at least one)."""
    return max(estimate[rid] - generated[rid], 1)


@jit
def _peak_and_checkpoint(base, remaining, n, n_sorted, order_key):
    """Token-exact peak KV of ``(base[:n], remaining[:n])`` and a checkpoint where it is
    reached: in descending ``remaining`` order, checkpoint ``remaining[k]`` holds
    ``cumsum(base)[k] + (k + 1) * remaining[k]``. The first ``n_sorted`` rows are in that
    order already; the rest are sorted and merged in. Neither result depends on the order of
    rows with equal ``remaining`` (within them the KV grows), so no order of ties is kept."""
    tail = n - n_sorted
    for k in range(tail):
        order_key[k] = -remaining[n_sorted + k]
    order = stable_argsort(order_key, tail)
    best = 0
    at = 0
    cumulative = 0
    i = 0
    j = 0
    for k in range(n):
        if j >= tail or (i < n_sorted and remaining[i] >= remaining[n_sorted + order[j]]):
            row = i
            i += 1
        else:
            row = n_sorted + order[j]
            j += 1
        cumulative += base[row]
        kv = cumulative + (k + 1) * remaining[row]
        if kv > best:
            best, at = kv, remaining[row]
    return best, at


@jit
def compiled_peak_kv(base, remaining, n, n_sorted, block, order_key):
    """The largest KV requests ``(base[:n], remaining[:n])`` hold at any future checkpoint,
    in whole blocks of ``block`` slots (token-exact at 1). The first ``n_sorted`` rows are in
    descending ``remaining`` order (any other order of them gives the same answer)."""
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
    return _peak_and_checkpoint(base, remaining, n, n_sorted, order_key)[0]


@jit
def profile_into(ids, n, prompt_len, generated, estimate, base, remaining):
    """``base`` and ``remaining`` of the running requests ``ids[:n]`` (see the module
    docstring), written to ``base[:n]``, ``remaining[:n]``; returns their base sum."""
    total = 0
    for k in range(n):
        rid = ids[k]
        base[k] = prompt_len[rid] + generated[rid]
        remaining[k] = iterations_left(estimate, generated, rid)
        total += base[k]
    return total


@jit
def _by_iterations_left(ids, n, estimate, generated, order_key, out):
    """``ids[:n]`` in descending iterations left, written to ``out[:n]``."""
    for k in range(n):
        order_key[k] = -iterations_left(estimate, generated, ids[k])
    order = stable_argsort(order_key, n)
    for k in range(n):
        out[k] = ids[order[k]]


#: The lookahead's memory across calls (:func:`lookahead_memory`): the hint (an absolute
#: iteration where the first candidate's check last failed, -1: none), the number of the
#: last call, the length of the kept order, then the kept order of the running set
#: (``n`` slots) and, per request, the number of the last call that kept it (``n`` slots).
#: A memory for fewer requests than the run has (``lookahead_memory(0)``) keeps only the hint:
#: the running set is sorted afresh at every call.
HINT, CALL, LENGTH, ORDER = 0, 1, 2, 3


def lookahead_memory(n: int) -> np.ndarray:
    """A fresh memory for the lookahead of a run of ``n`` requests (the record array a policy
    that admits through :func:`start_admissible` gives as its rule state's ``counts``)."""
    memory = np.zeros(ORDER + 2 * n, dtype=np.int64)
    memory[HINT] = -1
    memory[CALL] = 1  # no request is kept by call 1: none is kept yet
    return memory


@jit
def ordered_profile_into(memory, running, n_run, prompt_len, generated, estimate, base,
                         remaining, order_key):
    """:func:`profile_into` of the running set ``running[:n_run]``, its rows in descending
    iterations left; returns the base sum.

    The order is kept in ``memory`` from one call to the next: requests that still run keep
    their places, and those that joined since are sorted and merged in, so a call costs a
    sort of the newcomers, not of the whole set. While every running request advances one
    token per iteration, iterations left fall together and the kept order stays right; when
    it does not (chunked prefill, a request evicted and readmitted between two calls), the
    walk finds it out of order and sorts it all again. Speed only: the peak does not depend
    on the order of the rows."""
    n = (memory.size - ORDER) // 2
    if n < estimate.size:  # no memory (a call from Python; or a record that gave its
        # counts some other size, which must not be indexed by request): sort afresh
        _by_iterations_left(running, n_run, estimate, generated, order_key, base)
        # base holds the ids until profile_into fills it (each row's id is read first)
        return profile_into(base, n_run, prompt_len, generated, estimate, base, remaining)
    kept_order = memory[ORDER:ORDER + n]
    kept_by = memory[ORDER + n:]
    previous = memory[CALL]
    current = previous + 1
    memory[CALL] = current
    joined = np.int64(0)  # (a literal 0 would type a second signature of the callee below)
    for k in range(n_run):
        rid = running[k]
        if kept_by[rid] != previous:
            order_key[joined] = rid
            joined += 1
        kept_by[rid] = current
    kept = 0
    in_order = True
    last = 2 ** 62
    for i in range(memory[LENGTH]):
        rid = kept_order[i]
        if kept_by[rid] == current:  # still running
            kept_order[kept] = rid
            kept += 1
            left = iterations_left(estimate, generated, rid)
            in_order &= left <= last
            last = left
    for j in range(joined):
        kept_order[kept + j] = order_key[j]
    memory[LENGTH] = n_run
    if in_order:  # sort the newcomers (into base, until profile_into fills it), merge them
        # in from the back
        _by_iterations_left(kept_order[kept:], joined, estimate, generated, order_key, base)
        i, j = kept - 1, joined - 1
        for out in range(n_run - 1, -1, -1):
            if j < 0:
                break
            if i >= 0 and (iterations_left(estimate, generated, kept_order[i])
                           < iterations_left(estimate, generated, base[j])):
                kept_order[out] = kept_order[i]
                i -= 1
            else:
                kept_order[out] = base[j]
                j -= 1
    else:
        _by_iterations_left(kept_order, n_run, estimate, generated, order_key, base)
        for k in range(n_run):
            kept_order[k] = base[k]
    return profile_into(kept_order, n_run, prompt_len, generated, estimate, base, remaining)


@jit(inline="always")
def admissible_count(candidates, n_cand, kv_capacity, block, kv_held, check_held, prompt_len,
                     prefill_len, generated, estimate, running, n_run, start, base, remaining,
                     order_key, memory, iteration, cache):
    """How many of ``candidates[:n_cand]``, walked in order, can start now beside
    ``running[:n_run]``: the longest prefix that passes the lookahead check (written to
    ``start``): :func:`first_candidate_fits`, then :func:`admissible_after_first`.

    ``cache``: None, or the engine state, whose prefix cache (when on) shortens each
    candidate's footprint (:func:`footprint`; a reduced footprint, see the module
    docstring). The cache is searched only for the candidates the check reads: the first,
    and when it fits, those the walk reaches."""
    if n_cand == 0:
        return 0
    first = first_candidate_fits(
        candidates, footprint(cache, prefill_len, candidates[0]), kv_capacity, block, kv_held,
        check_held, prompt_len, generated, estimate, running, n_run, base, remaining,
        order_key, memory, iteration)
    if first < 0:
        return 0
    return admissible_after_first(candidates, n_cand, kv_capacity, block, first, prefill_len,
                                  generated, estimate, n_run, start, base, remaining,
                                  order_key, cache)


@jit
def footprint(cache, prefill_len, rid):
    """The KV slots waiting ``rid`` adds when it starts: its prefill, less (``cache``: the
    engine state, whose prefix cache may be off, or None) the prompt tokens it finds cached
    that its admission would not take from the free memory: hits on free entries are
    memory the batch takes."""
    if cache is None:
        return prefill_len[rid]
    hits = cached_blocks(cache, rid)
    if hits:
        hits -= free_among_hits(cache, rid, hits)
    return prefill_len[rid] - hits * cache.block


@jit(inline="always")
def first_candidate_fits(candidates, first_new, kv_capacity, block, kv_held, check_held,
                         prompt_len, generated, estimate, running, n_run, base, remaining,
                         order_key, memory, iteration):
    """Whether ``candidates[0]``, whose footprint is ``first_new`` slots, can start beside
    ``running[:n_run]``: the running set's KV at the first checkpoint if so (profiles of the
    running set, in descending iterations left, then the candidate written to ``base``,
    ``remaining``), else -1.

    ``check_held``: first test the KV held now (``kv_held``), a lower bound of the running
    set's KV at the first checkpoint (each holds at most ``s + generated`` slots and grows by
    one): when the first candidate cannot join even that, no prefix can. ``memory`` (see
    :func:`lookahead_memory`) keeps the running set's order and a hint: an absolute
    iteration where the first candidate's check last failed (token-exact, speed only): a
    decoding request's KV at a fixed future iteration does not move, so the KV
    there, a lower bound of the peak, usually still rules the candidate out."""
    if check_held and kv_held + n_run + first_new + 1 > kv_capacity:
        return -1
    first = ordered_profile_into(memory, running, n_run, prompt_len, generated, estimate,
                                 base, remaining, order_key)
    first += n_run
    budget = kv_capacity
    base[n_run] = first_new
    remaining[n_run] = iterations_left(estimate, generated, candidates[0])
    if block > 1 or n_run == 0:
        if compiled_peak_kv(base, remaining, n_run + 1, n_run, block, order_key) > budget:
            return -1
    else:
        checkpoint = memory[HINT] - iteration
        if checkpoint > 1:  # checkpoint 1 is what the held-KV test rules out
            excess = -budget
            for k in range(n_run):
                if remaining[k] >= checkpoint:
                    excess += base[k] + checkpoint
            if checkpoint <= remaining[n_run]:
                excess += base[n_run] + checkpoint
            if excess > 0:
                return -1
        peak, at = _peak_and_checkpoint(base, remaining, n_run + 1, n_run, order_key)
        if peak > budget:
            memory[HINT] = iteration + at
            return -1
    return first


@jit(inline="always")
def admissible_after_first(candidates, n_cand, kv_capacity, block, first, prefill_len,
                           generated, estimate, n_run, start, base, remaining, order_key,
                           cache):
    """The longest prefix of ``candidates[:n_cand]`` that passes the lookahead check, once
    :func:`first_candidate_fits` has passed the first (``first``: the running set's KV at
    the first checkpoint; ``base``, ``remaining`` as it left them). Feasibility is monotone
    in the prefix (adding a request never lowers the KV at any checkpoint), so the answer is
    found by galloping then bisection. A necessary condition at the first checkpoint bounds
    the prefix: each candidate holds at least its footprint and one token after its first
    iteration, and the walk reads a candidate's footprint (``cache``: see
    :func:`admissible_count`) only up to the first candidate past it."""
    budget = kv_capacity
    # A candidate holds at least two slots after its first iteration (a prompt token and the
    # token it emits), so at most (budget - first) // 2 can start.
    limit = min(n_cand, max(0, (budget - first) // 2) + 1)
    upper = 0
    total = 0
    for k in range(limit):
        rid = candidates[k]
        added = footprint(cache, prefill_len, rid)
        total += added + 1
        if total > budget - first:
            break
        base[n_run + k] = added
        remaining[n_run + k] = iterations_left(estimate, generated, rid)
        upper += 1
    if upper > 1 and compiled_peak_kv(base, remaining, n_run + upper, n_run, block,
                                      order_key) > budget:
        good, bad = 1, 2
        while bad < upper and compiled_peak_kv(base, remaining, n_run + bad, n_run, block,
                                               order_key) <= budget:
            good, bad = bad, min(2 * bad, upper)
        while bad - good > 1:
            mid = (good + bad) // 2
            if compiled_peak_kv(base, remaining, n_run + mid, n_run, block,
                                order_key) <= budget:
                good = mid
            else:
                bad = mid
        upper = good
    for k in range(upper):
        start[k] = candidates[k]
    return upper


# Compiled into each decision that calls it (once per decision): on its own, it and all it
# calls would be optimised once more inside the decision.
@jit(inline="always")
def start_admissible(s, rule, candidates, n_cand):
    """The decision of a policy that walks ``candidates[:n_cand]`` and starts what the
    lookahead admits (``rule.counts`` is the lookahead's memory: :func:`lookahead_memory`).
    With nothing to start because
    nothing waits or the first candidate cannot join the KV held now, that stays so until
    a request arrives or completes: the decision promises it (``steady``)."""
    s.n_start = admissible_count(
        candidates, n_cand, s.capacity, s.block, s.kv_held, np.bool_(True), s.prompt_len,
        s.prefill_len, s.generated, s.estimate, s.running, s.n_run, s.start, s.scratch,
        s.scratch2, s.scratch3, rule.counts, s.iteration, s)
    # The promise rests on the held-KV test, which only grows harder: the KV held grows and
    # the first candidate's cached prefix can only shrink (a reclaim) until the next event.
    if s.n_start == 0 and (n_cand == 0 or s.kv_held + s.n_run + 1 > s.capacity - footprint(
            s, s.prefill_len, candidates[0])):
        s.steady = 2 ** 62
    return 0


# ------------------------------------------------------------ the same rules from Python
def _ids(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def peak_kv(base: np.ndarray, remaining: np.ndarray, block_size: int = 1) -> int:
    """The largest KV requests ``(base, remaining)`` hold at any future checkpoint (see the
    module docstring)."""
    base, remaining = _ids(base), _ids(remaining)
    return int(compiled_peak_kv(base, remaining, base.size, 0, block_size,
                                np.empty(base.size, dtype=np.int64)))


def remaining_iterations(view: PolicyView, ids: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """Iterations requests ``ids`` still need by ``estimate`` (at least one each)."""
    return np.maximum(_ids(estimate)[ids] - view.generated[ids], 1)


def running_profile(view: PolicyView, estimate: np.ndarray | None = None,
                    running: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(base, remaining)`` of the running set (or of ``running``), planned with ``estimate``
    (default: the view's ``predicted_output``)."""
    run = _ids(view.running if running is None else running)
    base, remaining = np.empty(run.size, dtype=np.int64), np.empty(run.size, dtype=np.int64)
    profile_into(run, run.size, _ids(view.prompt_len), _ids(view.generated),
                 _ids(view.predicted_output if estimate is None else estimate), base, remaining)
    return base, remaining


def admissible_prefix(view: PolicyView, candidates: np.ndarray,
                      estimate: np.ndarray | None = None, running: np.ndarray | None = None
                      ) -> int:
    """Length of the longest prefix of ``candidates`` that can start now beside the running
    set (or beside ``running``: a policy that evicts some first), planned with ``estimate``
    (default: the view's ``predicted_output``)."""
    candidates = _ids(candidates)
    run = _ids(view.running if running is None else running)
    size = run.size + candidates.size + 1
    return int(admissible_count(
        candidates, candidates.size, view.kv_capacity, view.kv_block_size, view.kv_held,
        running is None, _ids(view.prompt_len), _ids(view.prefill_len), _ids(view.generated),
        _ids(view.predicted_output if estimate is None else estimate), run, run.size,
        np.empty(max(candidates.size, 1), dtype=np.int64), *(np.empty(size, dtype=np.int64)
                                                            for _ in range(3)),
        lookahead_memory(0), view.iteration, None))
