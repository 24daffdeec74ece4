"""Hindsight optimum (POLICIES.md §11): the time-indexed integer program, its LP bound,
and an exhaustive reference for tests.

Unit time, every length and arrival known. Request ``i`` started at round ``p``
holds ``s_i + j`` slots after its ``j``-th iteration (round ``p + j - 1``) and
completes at ``p + o_i``; TEL ``= sum_i (p_i + o_i - a_i)``. The memory
constraint is written per *iteration round* ``tau``: the KV held after
iteration ``tau`` is ``sum_i (s_i + tau - p_i + 1)`` over the requests with
``p_i <= tau <= p_i + o_i - 1``. This is POLICIES.md's row ``t = tau + 1``.

Horizon: request ``i`` may start no later than
``min(a_i + UB - sum_j o_j, max_j a_j + sum_j o_j - o_i)`` (the two valid bounds
of §11; ``UB`` is the TEL of a known feasible schedule), so the restricted
program has the same optimum as the unrestricted one.

Solvers (compared on A1s-sized instances, see the README; the studies use
``cpsat_cumulative``):

* ``cpsat_cumulative``: OR-Tools CP-SAT on a compact model: integer starts
  ``p_i`` and one cumulative constraint; request ``i``'s growing footprint is
  a base interval of height ``s_i + 1`` over its ``o_i`` rounds plus
  ``o_i - 1`` unit-height intervals starting one round later each. Redundant
  no-overlap of the iterations holding more than ``M / 2`` (two such can never
  coexist) and of the tails of :func:`disjoint_tails` (``tail_families``), and
  scheduling cuts (``linearization_level=2``).
* ``cpsat``: CP-SAT on the time-indexed model (one Boolean per admissible
  start, memory as one linear constraint per round), starts channelled into
  ``p_i``.
* ``highs``: the time-indexed MIP in HiGHS (``highspy``).

All three get the known schedule as a hint / start solution; the CP-SAT models
also order the starts of identical requests ``(s, o, a)`` (symmetry breaking:
swapping two identical requests changes nothing). The LP relaxation (:func:`lp_bound`),
strengthened by the same tails as cuts, gives a second, usually stronger, lower bound.

Tails: two requests that, on their own, can overlap by at most ``h`` rounds whichever
starts first run their iterations after the first ``h`` at disjoint times
(:func:`max_overlap`, :func:`disjoint_tails`). The time-indexed LP ignores this: it
spreads a long request over many starts at a fraction each, so it never holds its
peak, which is what keeps its bound near 2/3 of MC-SF's TEL at A1 size.

``highspy`` and ``ortools`` each bundle a HiGHS library whose symbols clash,
so the two cannot be imported into one process (either import order fails).
Both are imported lazily here; the LP bound uses SciPy's HiGHS build, which
coexists with either.

Nothing is called optimal unless the solver proved it: statuses are
``optimal``, ``time_limit`` (best schedule and bound when the limit hit),
``infeasible`` (cannot happen with a valid horizon and hint; kept as a signal
of a bug) and ``error``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

SOLVERS = ("cpsat", "cpsat_cumulative", "highs")


@dataclass(frozen=True)
class Instance:
    """One unit-time instance: prompt lengths ``s``, outputs ``o``, integer arrivals ``a``."""

    prompt_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray
    kv_capacity: int

    def __post_init__(self) -> None:
        s, o, a = (np.asarray(x) for x in (self.prompt_len, self.output_len, self.arrival))
        if not len(s) == len(o) == len(a):
            raise ValueError("Instance: prompt_len, output_len and arrival differ in length")
        if np.any(np.mod(a, 1) != 0) or np.any(a < 0):
            raise ValueError("Instance: the integer program needs arrivals on rounds >= 0")
        if np.any(s < 1) or np.any(o < 1):
            raise ValueError("Instance: prompt and output lengths must be >= 1")
        if np.any(s + o > self.kv_capacity):
            i = int(np.flatnonzero(s + o > self.kv_capacity)[0])
            raise ValueError(f"Instance: request {i} needs s + o = {s[i] + o[i]} > M = "
                             f"{self.kv_capacity} slots and can never run")
        for name, x in (("prompt_len", s), ("output_len", o), ("arrival", a)):
            object.__setattr__(self, name, x.astype(np.int64))

    @classmethod
    def from_requests(cls, requests, kv_capacity: int) -> Instance:
        return cls(requests.prompt_len, requests.output_len, requests.arrival, int(kv_capacity))

    def __len__(self) -> int:
        return len(self.prompt_len)


@dataclass
class SolveResult:
    """Outcome of one solve. ``objective`` is the TEL of ``starts`` (the best schedule
    known at the end, possibly the hint); ``bound`` a proven lower bound on the optimum."""

    solver: str
    status: str
    objective: float | None
    bound: float | None
    starts: np.ndarray | None
    solve_time_s: float
    message: str = ""

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None or self.objective == 0:
            return None
        return max(0.0, (self.objective - self.bound) / self.objective)


# ------------------------------------------------------------------ schedules
def tel(inst: Instance, starts) -> int:
    starts = np.asarray(starts, dtype=np.int64)
    return int((starts + inst.output_len - inst.arrival).sum())


def kv_profile(inst: Instance, starts) -> np.ndarray:
    """KV held after each iteration round ``0..max(p + o) - 1`` under ``starts``."""
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64)
    o, s = inst.output_len, inst.prompt_len
    owner = np.repeat(np.arange(len(inst)), o)
    step = np.arange(o.sum()) - np.repeat(np.cumsum(o) - o, o)  # 0..o_i-1
    profile = np.zeros(int((starts + o).max()), dtype=np.int64)
    np.add.at(profile, starts[owner] + step, s[owner] + step + 1)
    return profile


def is_feasible(inst: Instance, starts) -> bool:
    starts = np.asarray(starts, dtype=np.int64)
    return bool(np.all(starts >= inst.arrival)) and bool(
        np.all(kv_profile(inst, starts) <= inst.kv_capacity))


def latest_starts(inst: Instance, upper_bound_tel: int | None = None) -> np.ndarray:
    """Per request, the last start round some optimal schedule needs (§11's two bounds)."""
    total_output = int(inst.output_len.sum())
    latest = inst.arrival.max(initial=0) + total_output - inst.output_len
    if upper_bound_tel is not None:
        latest = np.minimum(latest, inst.arrival + int(upper_bound_tel) - total_output)
    if np.any(latest < inst.arrival):
        raise ValueError(f"latest_starts: upper bound {upper_bound_tel} is below the TEL of "
                         f"running every request alone at its arrival; it is not a feasible TEL")
    return latest


def symmetry_groups(inst: Instance) -> list[np.ndarray]:
    """Ids of requests with identical ``(s, o, a)``, each group ascending (size >= 2)."""
    keys = np.stack([inst.prompt_len, inst.output_len, inst.arrival], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    groups = [np.flatnonzero(inverse.ravel() == g) for g in range(inverse.max(initial=-1) + 1)]
    return [g for g in groups if g.size > 1]


def max_overlap(inst: Instance) -> np.ndarray:
    """``overlap[i, j]``: the most rounds ``i`` and ``j`` can run together, on their own,
    when ``j`` starts no earlier than ``i``.

    Started ``d < o_i`` rounds after ``i``, ``j`` overlaps it up to ``i``'s iteration
    ``t_end + 1 = min(o_i, d + o_j)``, where the pair holds the most:
    ``s_i + s_j + 2 t_end - d + 2`` (it grows by two per round)."""
    s, o, kv = inst.prompt_len, inst.output_len, inst.kv_capacity
    overlap = np.zeros((len(inst), len(inst)), dtype=np.int64)
    for i in range(len(inst)):
        d = np.arange(o[i])[:, None]
        t_end = np.minimum(o[i], d + o[None, :]) - 1
        fits = s[i] + s[None, :] + 2 * t_end - d + 2 <= kv
        overlap[i] = np.where(fits, t_end - d + 1, 0).max(axis=0)
    return overlap


def disjoint_tails(inst: Instance) -> list[tuple[np.ndarray, np.ndarray]]:
    """Families ``(requests, heads)`` whose tails (request ``j`` without its first
    ``heads[j]`` iterations) never run at the same time in a feasible schedule.

    For the requests whose peak ``s + o`` reaches a threshold, ``heads[j]`` is the most
    any other of them can overlap ``j`` when starting no later (:func:`max_overlap`):
    if ``i`` starts first, it completes at most ``heads[j]`` rounds after ``p_j``, so before
    ``j``'s tail starts. One family per distinct set with two or more non-empty tails.
    """
    overlap = max_overlap(inst)
    np.fill_diagonal(overlap, 0)
    peaks = inst.prompt_len + inst.output_len
    families, seen = [], set()
    for threshold in np.unique(peaks):
        members = np.flatnonzero(peaks >= threshold)
        heads = overlap[np.ix_(members, members)].max(axis=0)
        keep = heads < inst.output_len[members]
        key = (tuple(members[keep]), tuple(heads[keep]))
        if keep.sum() < 2 or key in seen:
            continue
        seen.add(key)
        families.append((members[keep], heads[keep]))
    return families


def canonical_hint(inst: Instance, starts) -> np.ndarray:
    """``starts`` with identical requests' starts sorted by id (same TEL, same profile)."""
    starts = np.asarray(starts, dtype=np.int64).copy()
    for g in symmetry_groups(inst):
        starts[g] = np.sort(starts[g])
    return starts


# ------------------------------------------------------- time-indexed matrix
@dataclass(frozen=True)
class TimeIndexed:
    """Columns ``(request[j], start[j])``; memory rows are iteration rounds ``first_round + r``."""

    request: np.ndarray
    start: np.ndarray
    first_round: int
    n_rounds: int
    memory: sparse.csr_matrix  # rows: rounds, columns: (request, start) pairs
    assign: sparse.csr_matrix  # rows: requests

    @property
    def n_columns(self) -> int:
        return self.request.size


def time_indexed(inst: Instance, latest: np.ndarray) -> TimeIndexed:
    a, s, o = inst.arrival, inst.prompt_len, inst.output_len
    width = latest - a + 1
    request = np.repeat(np.arange(len(inst)), width)
    start = np.arange(width.sum()) - np.repeat(np.cumsum(width) - width, width) + a[request]
    first_round = int(a.min(initial=0))
    n_rounds = int((latest + o).max(initial=first_round)) - first_round
    per_column = o[request]
    column = np.repeat(np.arange(request.size), per_column)
    step = np.arange(per_column.sum()) - np.repeat(np.cumsum(per_column) - per_column, per_column)
    rows = start[column] + step - first_round
    coefficient = s[request[column]] + step + 1
    memory = sparse.csr_matrix((coefficient, (rows, column)), shape=(n_rounds, request.size))
    assign = sparse.csr_matrix((np.ones(request.size), (request, np.arange(request.size))),
                               shape=(len(inst), request.size))
    return TimeIndexed(request, start, first_round, n_rounds, memory, assign)


def _tel_constant(inst: Instance) -> int:
    return int(inst.output_len.sum() - inst.arrival.sum())


# ------------------------------------------------------------------ LP bound
@dataclass
class LPBound:
    """The LP relaxation's outcome.

    ``bound``: a valid lower bound on the optimal TEL (rounded up: TEL is integral).
    ``value``: the LP optimum over the full horizon, when column generation converged.
    ``mean_start``: ``sum_t t x_it`` of the LP solution per request (Sorted-LP's ``y_i``).
    """

    status: str
    bound: float | None
    value: float | None
    mean_start: np.ndarray | None
    columns: int
    rounds: int
    solve_time_s: float
    message: str = ""


def _window_sums(values: np.ndarray, length: int, first: np.ndarray, last: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``sum values[r]`` and ``sum r values[r]`` over rounds ``first <= r < last``
    (elementwise; rounds offset by the first round, ``values`` padded with zeros)."""
    v = np.zeros(length + 1)
    v[: min(values.size, length)] = values[:length]
    rounds = np.arange(v.size)
    prefix0 = np.concatenate([[0.0], np.cumsum(v)])
    prefix1 = np.concatenate([[0.0], np.cumsum(rounds * v)])
    return prefix0[last] - prefix0[first], prefix1[last] - prefix1[first]


def _pricing(inst: Instance, latest: np.ndarray, multiplier: np.ndarray, first_round: int,
             cuts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = ()
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the cheapest start in ``[a_i, latest_i]`` and its cost
    ``k + sum_j (s_i + j) y[k + j - 1] + sum_f sum_{r in tail_f(k)} z_f[r]`` under memory
    multipliers ``y >= 0`` and tail-cut multipliers ``z_f >= 0`` (``cuts``: per family
    ``(members, heads, z_f)``)."""
    a, s, o = inst.arrival, inst.prompt_len, inst.output_len
    length = int((latest + o).max()) - first_round
    head = [dict(zip(members.tolist(), heads.tolist(), strict=True)) for members, heads, _ in cuts]
    best_start = np.empty(len(inst), dtype=np.int64)
    best_cost = np.empty(len(inst))
    for i in range(len(inst)):
        k = np.arange(a[i], latest[i] + 1) - first_round
        window0, window1 = _window_sums(multiplier, length, k, k + o[i])
        cost = k + first_round + (s[i] + 1) * window0 + window1 - k * window0
        for f, (_, _, z) in enumerate(cuts):
            if i in head[f]:
                cost += _window_sums(z, length, k + head[f][i], k + o[i])[0]
        j = int(np.argmin(cost))
        best_start[i], best_cost[i] = k[j] + first_round, cost[j]
    return best_start, best_cost


def tail_rows(inst: Instance, model: TimeIndexed, members: np.ndarray, heads: np.ndarray
              ) -> sparse.csr_matrix:
    """Rows (rounds) x columns: 1 where the column's request is in the family and its tail
    (iterations ``heads + 1 .. o``) covers the round."""
    head = np.full(len(inst), -1)
    head[members] = heads
    columns = np.flatnonzero(head[model.request] >= 0)
    length = inst.output_len[model.request[columns]] - head[model.request[columns]]
    column = np.repeat(columns, length)
    step = np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
    rows = model.start[column] + head[model.request[column]] + step - model.first_round
    return sparse.csr_matrix((np.ones(column.size), (rows, column)),
                             shape=(model.n_rounds, model.n_columns))


def _most_violated(excess: list[np.ndarray], limit: int, first_round: int) -> list[np.ndarray]:
    """Per family, the rounds (absolute) of the ``limit`` largest positive ``excess`` values
    over all families."""
    flat = np.concatenate(excess) if excess else np.zeros(0)
    chosen = np.zeros(flat.size, dtype=bool)
    chosen[np.argsort(-flat)[:limit]] = True
    chosen &= flat > 1e-6
    bounds = np.cumsum([0] + [e.size for e in excess])
    return [np.flatnonzero(chosen[lo:hi]) + first_round
            for lo, hi in itertools.pairwise(bounds)]


def lp_bound(inst: Instance, upper_bound_tel: int | None = None, time_limit_s: float = 60.0,
             max_rounds: int = 40, tail_cuts: bool = True, max_new_cuts: int = 300
             ) -> LPBound:
    """The LP relaxation of the time-indexed program, solved by column generation,
    strengthened by tail cuts when ``tail_cuts``.

    The first LP (SciPy's HiGHS, interior point with crossover: faster than the dual simplex
    once cuts are in) allows starts only up to
    ``max a + ceil(sum_i o_i (s_i + (o_i + 1) / 2) / M) + max o`` (the memory-area
    horizon); its memory duals ``y`` price every start up to :func:`latest_starts`,
    and starts with a negative reduced cost are added until none is left. Tail cuts:
    per round and family of :func:`disjoint_tails`, at most one tail covers the round
    (valid for every integral schedule, not implied by the memory rows: the LP spreads
    a long request over many starts and so never holds its peak); the ``max_new_cuts``
    most violated ones are added per round of generation (smaller LPs, so a time-out
    still leaves most of the gain on A1-sized instances). Whatever the stage, the Lagrangian value
    ``sum_i min_k [k + sum_j (s_i + j) y + tail duals] - M sum y - sum z`` is a valid
    lower bound (weak duality, ``y, z >= 0``), so a time-out still leaves a bound; at
    convergence it equals the LP optimum (with the cuts) over the full horizon.
    """
    started = time.perf_counter()
    if len(inst) == 0:
        return LPBound("optimal", 0.0, 0.0, np.zeros(0), 0, 0, 0.0)
    a, s, o = inst.arrival, inst.prompt_len, inst.output_len
    latest = latest_starts(inst, upper_bound_tel)
    area = float((o * (s + (o + 1) / 2)).sum())
    window = np.maximum(a, np.minimum(latest, int(a.max()) + math.ceil(area / inst.kv_capacity)
                                      + int(o.max())))
    families = disjoint_tails(inst) if tail_cuts else []
    cut_rounds = [np.zeros(0, dtype=np.int64) for _ in families]  # per family, absolute rounds
    constant = _tel_constant(inst)
    bound, status, message = None, "time_limit", "time limit before the first LP finished"
    for rounds in range(1, max_rounds + 1):
        remaining = time_limit_s - (time.perf_counter() - started)
        if remaining <= 0:
            break
        model = time_indexed(inst, window)
        tails = [tail_rows(inst, model, members, heads) for members, heads in families]
        cut_rows = [t[r - model.first_round] for t, r in zip(tails, cut_rounds, strict=True)]
        n_cuts = sum(r.size for r in cut_rounds)
        result = linprog(
            c=model.start.astype(float), A_ub=sparse.vstack([model.memory, *cut_rows]),
            b_ub=np.concatenate([np.full(model.n_rounds, inst.kv_capacity), np.ones(n_cuts)]),
            A_eq=model.assign, b_eq=np.ones(len(inst)), bounds=(0, 1), method="highs-ipm",
            options={"time_limit": float(remaining)})
        if result.status != 0:
            status = "time_limit" if result.status == 1 else "error"
            message = result.message
            break
        duals = np.maximum(-result.ineqlin.marginals, 0.0)
        multiplier = duals[: model.n_rounds]
        cut_duals, offset = [], model.n_rounds
        for (members, heads), r in zip(families, cut_rounds, strict=True):
            z = np.zeros(model.n_rounds)
            z[r - model.first_round] = duals[offset: offset + r.size]
            cut_duals.append((members, heads, z))
            offset += r.size
        best_start, best_cost = _pricing(inst, latest, multiplier, model.first_round, cut_duals)
        lagrangian = (best_cost.sum() - inst.kv_capacity * multiplier.sum()
                      - duals[model.n_rounds:].sum() + constant)
        bound = max(bound or -math.inf, float(math.ceil(lagrangian - 1e-6 * max(1.0, lagrangian))))
        reduced = best_cost - result.eqlin.marginals
        grow = (best_start > window) & (reduced < -1e-9)
        violated = _most_violated([t @ result.x - 1 for t in tails], max_new_cuts,
                                  model.first_round)
        if not grow.any() and not any(v.size for v in violated):
            mean_start = np.bincount(model.request, weights=model.start * result.x,
                                     minlength=len(inst))
            return LPBound("optimal", bound, result.fun + constant, mean_start,
                           model.n_columns, rounds, time.perf_counter() - started)
        cut_rounds = [np.union1d(r, v) for r, v in zip(cut_rounds, violated, strict=True)]
        window = np.where(grow, np.minimum(latest, np.maximum(best_start, 2 * window - a + 1)),
                          window)
        message = f"column and cut generation stopped after {rounds} rounds"
    return LPBound(status, bound, None, None, 0, rounds, time.perf_counter() - started, message)


# ------------------------------------------------------------------- solvers
def solve(inst: Instance, hint_starts, solver: str = "cpsat_cumulative",
          time_limit_s: float = 10.0, workers: int = 1, symmetry_breaking: bool = True,
          tail_disjunction: bool = True, tail_families: bool = True) -> SolveResult:
    """Minimise TEL; ``hint_starts`` (a feasible schedule) bounds the horizon and warm-starts.

    The returned ``objective``/``starts`` are never worse than the hint.
    """
    hint = canonical_hint(inst, hint_starts)
    if not is_feasible(inst, hint):
        raise ValueError("solve: the hint schedule violates the memory limit or an arrival")
    if len(inst) == 0:
        return SolveResult(solver, "optimal", 0, 0, hint, 0.0)
    latest = latest_starts(inst, tel(inst, hint))
    started = time.perf_counter()
    if solver == "cpsat":
        result = _solve_cpsat(inst, latest, hint, time_limit_s, workers, symmetry_breaking,
                              tail_disjunction, tail_families, cumulative=False)
    elif solver == "cpsat_cumulative":
        result = _solve_cpsat(inst, latest, hint, time_limit_s, workers, symmetry_breaking,
                              tail_disjunction, tail_families, cumulative=True)
    elif solver == "highs":
        result = _solve_highs(inst, latest, hint, time_limit_s, workers)
    else:
        raise ValueError(f"solve: unknown solver {solver!r}; known: {', '.join(SOLVERS)}")
    result.solve_time_s = time.perf_counter() - started
    if result.starts is None or tel(inst, result.starts) > tel(inst, hint):
        result.starts = hint
    result.objective = tel(inst, result.starts)
    return result


def _solve_cpsat(inst, latest, hint, time_limit_s, workers, symmetry_breaking, tail_disjunction,
                 tail_families, cumulative):
    from ortools.sat.python import cp_model

    a, s, o = inst.arrival, inst.prompt_len, inst.output_len
    model = cp_model.CpModel()
    p = [model.new_int_var(int(a[i]), int(latest[i]), f"p{i}") for i in range(len(inst))]
    if cumulative:
        intervals, demands = [], []
        for i in range(len(inst)):
            oi = int(o[i])
            intervals.append(model.new_fixed_size_interval_var(p[i], oi, f"base{i}"))
            demands.append(int(s[i]) + 1)
            for r in range(1, oi):
                intervals.append(model.new_fixed_size_interval_var(p[i] + r, oi - r, f"g{i}_{r}"))
                demands.append(1)
        model.add_cumulative(intervals, demands, inst.kv_capacity)
    else:
        ti = time_indexed(inst, latest)
        x = [model.new_bool_var(f"x{j}") for j in range(ti.n_columns)]
        bounds = np.concatenate([[0], np.cumsum(latest - a + 1)])
        for i in range(len(inst)):
            cols = x[bounds[i]:bounds[i + 1]]
            model.add_exactly_one(cols)
            model.add(p[i] == cp_model.LinearExpr.weighted_sum(
                cols, [int(k) for k in ti.start[bounds[i]:bounds[i + 1]]]))
        memory = ti.memory
        for r in range(ti.n_rounds):
            lo, hi = memory.indptr[r], memory.indptr[r + 1]
            coefficients = memory.data[lo:hi]
            if coefficients.sum() <= inst.kv_capacity:
                continue
            model.add(cp_model.LinearExpr.weighted_sum(
                [x[j] for j in memory.indices[lo:hi]], [int(c) for c in coefficients])
                <= inst.kv_capacity)
        for i in range(len(inst)):
            model.add_hint(x[int(bounds[i] + hint[i] - a[i])], True)
    if tail_disjunction:
        # Iterations in which a request holds more than M/2 can never overlap: a
        # redundant disjunctive constraint that CP-SAT propagates and cuts much more
        # strongly than the cumulative one it is implied by.
        first_heavy = np.maximum(inst.kv_capacity // 2 - s + 1, 1)  # iteration index j
        tails = [model.new_fixed_size_interval_var(p[i] + int(first_heavy[i]) - 1,
                                                   int(o[i] - first_heavy[i] + 1), f"tail{i}")
                 for i in range(len(inst)) if first_heavy[i] <= o[i]]
        if len(tails) > 1:
            model.add_no_overlap(tails)
    if tail_families:
        for f, (members, heads) in enumerate(disjoint_tails(inst)):
            model.add_no_overlap([
                model.new_fixed_size_interval_var(p[i] + int(h), int(o[i] - h), f"f{f}_{i}")
                for i, h in zip(members, heads, strict=True)])
    if symmetry_breaking:
        for group in symmetry_groups(inst):
            for i, j in itertools.pairwise(group):
                model.add(p[i] <= p[j])
    for i in range(len(inst)):
        model.add_hint(p[i], int(hint[i]))
    model.minimize(sum(p))
    cp = cp_model.CpSolver()
    cp.parameters.max_time_in_seconds = float(time_limit_s)
    cp.parameters.num_workers = int(workers)
    # Level 2 adds scheduling cuts to CP-SAT's LP: on A1s-sized instances, same proofs
    # in the same time, much better bounds and schedules on the unproven ones.
    cp.parameters.linearization_level = 2
    code = cp.solve(model)
    constant = _tel_constant(inst)
    name = "cpsat_cumulative" if cumulative else "cpsat"
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = np.array([cp.value(v) for v in p], dtype=np.int64)
        bound = math.ceil(cp.best_objective_bound - 1e-9) + constant
        status = "optimal" if code == cp_model.OPTIMAL else "time_limit"
        return SolveResult(name, status, None, float(bound), starts, 0.0)
    if code == cp_model.INFEASIBLE:
        return SolveResult(name, "infeasible", None, None, None, 0.0, "CP-SAT: infeasible")
    if code == cp_model.UNKNOWN:
        return SolveResult(name, "time_limit", None, None, None, 0.0,
                           "CP-SAT: no solution or bound within the limit")
    return SolveResult(name, "error", None, None, None, 0.0, f"CP-SAT: {cp.status_name(code)}")


def _solve_highs(inst, latest, hint, time_limit_s, workers):
    import highspy

    ti = time_indexed(inst, latest)
    a = inst.arrival
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("threads", int(workers))
    h.setOptionValue("mip_rel_gap", 0.0)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ti.n_columns, ti.n_rounds + len(inst)
    lp.col_cost_ = ti.start.astype(float)
    lp.col_lower_ = np.zeros(ti.n_columns)
    lp.col_upper_ = np.ones(ti.n_columns)
    lp.row_lower_ = np.concatenate([np.full(ti.n_rounds, -inf), np.ones(len(inst))])
    lp.row_upper_ = np.concatenate([np.full(ti.n_rounds, float(inst.kv_capacity)),
                                    np.ones(len(inst))])
    matrix = sparse.vstack([ti.memory, ti.assign]).tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data.astype(float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * ti.n_columns
    h.passModel(lp)
    start_values = np.zeros(ti.n_columns)
    offsets = np.concatenate([[0], np.cumsum(latest - a + 1)])
    start_values[offsets[:-1] + hint - a] = 1.0
    solution = highspy.HighsSolution()
    solution.col_value = start_values
    h.setSolution(solution)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    constant = _tel_constant(inst)
    starts = None
    if info.primal_solution_status == 2:  # feasible point available
        values = np.asarray(h.getSolution().col_value)
        chosen = values > 0.5
        starts = np.zeros(len(inst), dtype=np.int64)
        starts[ti.request[chosen]] = ti.start[chosen]
    bound = (float(math.ceil(info.mip_dual_bound - 1e-6) + constant)
             if np.isfinite(info.mip_dual_bound) else None)
    if status == highspy.HighsModelStatus.kOptimal:
        return SolveResult("highs", "optimal", None, bound, starts, 0.0)
    if status == highspy.HighsModelStatus.kTimeLimit:
        return SolveResult("highs", "time_limit", None, bound, starts, 0.0)
    if status == highspy.HighsModelStatus.kInfeasible:
        return SolveResult("highs", "infeasible", None, None, None, 0.0, "HiGHS: infeasible")
    return SolveResult("highs", "error", None, bound, starts, 0.0,
                       f"HiGHS: {h.modelStatusToString(status)}")


# ---------------------------------------------------------- exhaustive check
def exhaustive_optimum(inst: Instance, max_candidates: int = 2_000_000) -> tuple[int, np.ndarray]:
    """Minimum TEL by trying every start vector with ``a_i <= p_i <= max a + sum o``.

    A reference for tests on tiny instances: it assumes nothing beyond the
    model (its horizon is looser than :func:`latest_starts`).
    """
    last = int(inst.arrival.max(initial=0) + inst.output_len.sum())
    choices = [np.arange(int(a), last + 1) for a in inst.arrival]
    count = math.prod(len(c) for c in choices)
    if count > max_candidates:
        raise ValueError(f"exhaustive_optimum: {count} candidate schedules exceed "
                         f"{max_candidates}; use a smaller instance")
    grid = np.stack(np.meshgrid(*choices, indexing="ij"), axis=-1).reshape(-1, len(inst))
    rounds = np.arange(last + int(inst.output_len.max()))
    elapsed = rounds[None, None, :] - grid[:, :, None]  # iterations done before round
    active = (elapsed >= 0) & (elapsed < inst.output_len[None, :, None])
    held = np.where(active, inst.prompt_len[None, :, None] + elapsed + 1, 0).sum(axis=1)
    feasible = np.all(held <= inst.kv_capacity, axis=1)
    tels = grid.sum(axis=1) + _tel_constant(inst)
    tels = np.where(feasible, tels, np.iinfo(np.int64).max)
    best = int(np.argmin(tels))
    return int(tels[best]), grid[best]
