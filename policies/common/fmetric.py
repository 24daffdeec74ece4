"""Phase 1 of Sorted-F (docs/policies/sorted-f.md): split a backlog into batches by the F metric.

``F(X) = sum_{i in X} o_i / |X|^2`` (smaller is better). Phase 1 repeatedly picks a
feasible ``X``, sorts it by ascending ``(o, id)``, appends it to the order list and
removes it. Every solver, LP-Swap's improvement step and the A_min variants call
this module; nothing else selects by F.

Feasibility of a set (``feasibility=``):

* ``peak_sum``: ``sum (s + o) <= M``, the rule of the paper's proof and solvers;
* ``staggered``: all of ``X`` started together stay within ``M`` at every member's
  completion, ``sum_{o_i >= o_j} (s_i + o_j) <= M`` for every ``j``. That is the
  lookahead peak with ``base = s`` and ``remaining = o``, so it is computed by
  :func:`policies.common.lookahead.peak_kv`. Weaker than ``peak_sum`` (every ``peak_sum``
  set passes), offered for ``swap`` and ``quantile`` only.

Arrays passed in are the pool's prompt lengths ``s``, (estimated) outputs ``o`` and
request ids (used only to break ties); functions return positions into them.
"""

from __future__ import annotations

import numpy as np

from policies.common.lookahead import peak_kv
from replay.errors import ConfigError

SOLVERS = ("dp", "swap", "quantile")
FEASIBILITY = ("peak_sum", "staggered")
#: The quantile solver's sample quantile (docs/policies/sorted-f.md).
QUANTILE = 0.3
#: Largest DP table (cells) the exact solver builds: 400 MB of float64.
DP_CELLS = 50_000_000


def f_metric(o_sum: float, size: int) -> float:
    return o_sum / size**2 if size else float("inf")


def check_options(solver: str, feasibility: str) -> None:
    if solver not in SOLVERS:
        raise ConfigError(f"policy.solver={solver!r}: choose one of {', '.join(SOLVERS)}")
    if feasibility not in FEASIBILITY:
        raise ConfigError(f"policy.phase1_feasibility={feasibility!r}: choose one of "
                          f"{', '.join(FEASIBILITY)}")
    if solver == "dp" and feasibility != "peak_sum":
        raise ConfigError("policy.solver=dp is exact for phase1_feasibility=peak_sum only; use "
                          "solver=swap or quantile with staggered")


def fits(s: np.ndarray, o: np.ndarray, members, kv_capacity: int, feasibility: str) -> bool:
    members = np.asarray(members, dtype=np.int64)
    if feasibility == "peak_sum":
        return int((s[members] + o[members]).sum()) <= kv_capacity
    return peak_kv(s[members], o[members]) <= kv_capacity


def greedy_fill(order: np.ndarray, s: np.ndarray, o: np.ndarray, kv_capacity: int,
                feasibility: str, members=()) -> list[int]:
    """Walk ``order`` and add each position that still fits to ``members``; skip misfits."""
    members = list(members)
    if feasibility == "staggered":
        for i in order.tolist():
            if fits(s, o, [*members, i], kv_capacity, feasibility):
                members.append(i)
        return members
    # peak_sum: a run of consecutive fits is one cumsum; after a misfit, jump to the
    # next request small enough for what is left. O(n) per misfit, and misfits are
    # at most |X| + 1 because each run ends by one.
    peak = (s + o)[order]
    budget = kv_capacity - int((s[members] + o[members]).sum()) if members else kv_capacity
    position = 0
    while position < order.size:
        take = int(np.searchsorted(np.cumsum(peak[position:]), budget, side="right"))
        members.extend(order[position: position + take].tolist())
        budget -= int(peak[position: position + take].sum())
        position += take
        small = np.flatnonzero(peak[position:] <= budget)
        if small.size == 0:
            break
        position += int(small[0])
    return members


def select_dp(s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int) -> list[int]:
    """Exact F-minimiser under ``peak_sum``: a 0/1 knapsack over ``(size, sum(s + o))``.

    ``best[i][k][m]`` is the least ``sum o`` of a ``k``-subset of requests ``i..`` (in
    ascending id) whose peaks sum to exactly ``m``; the chosen ``(k, m)`` minimises
    ``best / k^2`` (ties: larger ``k``, then smaller ``m``). Reading the table forward
    and taking a request whenever some optimal completion uses it yields the subset
    with the lexicographically smallest ids. ``O(n^2 M)`` time and memory.
    """
    n = s.size
    if (n + 1) ** 2 * (kv_capacity + 1) > DP_CELLS:
        raise ConfigError(f"policy.solver=dp: {n} requests with M = {kv_capacity} need a table of "
                          f"{(n + 1) ** 2 * (kv_capacity + 1):.3g} cells (limit {DP_CELLS:.0g}); "
                          f"use solver=swap or quantile at this size")
    by_id = np.argsort(ids, kind="stable")
    peak = (s + o)[by_id]
    out = o[by_id].astype(np.float64)
    width = kv_capacity + 1
    best = np.full((n + 1, n + 1, width), np.inf)
    best[n, 0, 0] = 0.0
    for i in range(n - 1, -1, -1):
        best[i] = best[i + 1]
        if peak[i] <= kv_capacity:
            shifted = best[i + 1, :-1, : width - peak[i]] + out[i]
            np.minimum(best[i, 1:, peak[i]:], shifted, out=best[i, 1:, peak[i]:])
    sizes = np.arange(1, n + 1)[:, None]
    score = best[0, 1:] / sizes**2
    # Ties: larger k, then smaller m: scan k descending, m ascending.
    flat = score[::-1].ravel()
    pick = int(np.argmin(flat))
    k = n - pick // width
    m = pick % width
    chosen: list[int] = []
    for i in range(n):
        if k == 0:
            break
        if peak[i] <= m and np.isclose(best[i + 1, k - 1, m - peak[i]] + out[i], best[i, k, m],
                                       rtol=0, atol=1e-9):
            chosen.append(int(by_id[i]))
            k, m = k - 1, m - peak[i]
    return chosen


def select_swap(s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
                feasibility: str, initial_order: np.ndarray | None = None) -> list[int]:
    """Greedy start, then first-improvement one-in-one-out swaps (docs/policies/sorted-f.md).

    The start takes requests in ascending ``(s + o, id)`` (LP-Swap passes its own
    ``initial_order``), skipping misfits. A scan walks ``X`` in insertion order (a
    swapped-in request goes to the end) and, for each member, the outsiders in
    ascending ``(s + o, id)``; the first swap that stays feasible and lowers ``F``
    is applied and the scan restarts. ``|X|`` is fixed by a swap, so lowering ``F``
    means a shorter output.
    """
    by_peak = np.lexsort((ids, s + o))
    start = by_peak if initial_order is None else initial_order
    members = greedy_fill(start, s, o, kv_capacity, feasibility)
    return improve_by_swaps(members, by_peak, s, o, kv_capacity, feasibility)


def improve_by_swaps(members: list[int], by_peak: np.ndarray, s: np.ndarray, o: np.ndarray,
                     kv_capacity: int, feasibility: str) -> list[int]:
    members = list(members)
    inside = np.zeros(s.size, dtype=bool)
    inside[members] = True
    peak = s + o
    while members:
        outside = by_peak[~inside[by_peak]]
        if outside.size == 0:
            break
        if feasibility == "peak_sum":
            swap = _first_peak_sum_swap(members, outside, peak, o, kv_capacity)
        else:
            swap = _first_staggered_swap(members, outside, s, o, kv_capacity)
        if swap is None:
            break
        position, incoming = swap
        inside[members.pop(position)] = False
        members.append(incoming)
        inside[incoming] = True
    return members


def _first_peak_sum_swap(members, outside, peak, o, kv_capacity):
    """Vectorised over members: the outsiders that fit in place of member ``x`` are a
    prefix (ascending peak) and the first of them with ``o < o_x`` is found on the
    prefix minimum of ``o``."""
    x = np.asarray(members)
    outside_peak = peak[outside]
    room = kv_capacity - int(peak[x].sum()) + peak[x]
    fitting = np.searchsorted(outside_peak, room, side="right")
    running_min = np.minimum.accumulate(o[outside])
    shorter = np.searchsorted(-running_min, -o[x], side="right")
    ok = shorter < fitting
    if not ok.any():
        return None
    position = int(np.argmax(ok))
    return position, int(outside[shorter[position]])


def _first_staggered_swap(members, outside, s, o, kv_capacity):
    for position, x in enumerate(members):
        rest = members[:position] + members[position + 1:]
        for c in outside[o[outside] < o[x]].tolist():
            if fits(s, o, [*rest, c], kv_capacity, "staggered"):
                return position, c
    return None


def select_quantile(s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
                    feasibility: str, rng: np.random.Generator) -> list[int]:
    """Two greedy passes around sample quantiles (docs/policies/sorted-f.md).

    A sample of ``max(1, floor(n / 2))`` requests, drawn without replacement from
    ``rng`` at every call, gives ``Q_p`` and ``Q_o``, the 0.3-quantiles (numpy's
    linear interpolation) of ``s + o`` and ``o``. Pass 1 walks ascending ``(o, id)``
    and takes the requests with ``s + o <= Q_p`` and ``o <= Q_o`` that fit; pass 2
    walks the rest in ascending ``(o / (s + o), id)`` and takes each that fits.
    """
    n = s.size
    sample = rng.choice(n, size=max(1, n // 2), replace=False)
    peak = s + o
    q_peak = np.quantile(peak[sample], QUANTILE)
    q_out = np.quantile(o[sample], QUANTILE)
    by_out = np.lexsort((ids, o))
    small = by_out[(peak[by_out] <= q_peak) & (o[by_out] <= q_out)]
    members = greedy_fill(small, s, o, kv_capacity, feasibility)
    taken = np.zeros(n, dtype=bool)
    taken[members] = True
    rest = np.flatnonzero(~taken)
    rest = rest[np.lexsort((ids[rest], o[rest] / peak[rest]))]
    return greedy_fill(rest, s, o, kv_capacity, feasibility, members)


def select(solver: str, s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
           feasibility: str, rng: np.random.Generator) -> list[int]:
    """One Phase-1 set (positions into the arrays) by ``solver``."""
    if solver == "dp":
        return select_dp(s, o, ids, kv_capacity)
    if solver == "swap":
        return select_swap(s, o, ids, kv_capacity, feasibility)
    return select_quantile(s, o, ids, kv_capacity, feasibility, rng)


def batches_to_order(s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
                     choose) -> np.ndarray:
    """Phase 1's loop: ``choose(pool_positions)`` returns one set (positions into the
    pool); each set, sorted by ``(o, id)``, is appended to the order. Returns ids."""
    pool = np.arange(ids.size)
    order = []
    while pool.size:
        chosen = np.asarray(choose(pool), dtype=np.int64)
        if chosen.size == 0:
            i = int(pool[np.argmax(s[pool] + o[pool])])
            raise ValueError(f"Phase 1 found no feasible set: request {int(ids[i])} needs "
                             f"s + o = {int(s[i] + o[i])} > M = {kv_capacity}")
        members = pool[chosen]
        order.append(members[np.lexsort((ids[members], o[members]))])
        keep = np.ones(pool.size, dtype=bool)
        keep[chosen] = False
        pool = pool[keep]
    return ids[np.concatenate(order)] if order else ids[:0]


def phase1_order(solver: str, s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
                 feasibility: str, rng: np.random.Generator) -> np.ndarray:
    """The whole Phase 1: the request ids in execution order."""
    return batches_to_order(
        s, o, ids, kv_capacity,
        lambda pool: select(solver, s[pool], o[pool], ids[pool], kv_capacity, feasibility, rng))
