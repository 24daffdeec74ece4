"""Solvers of the hindsight integer program (see :mod:`replay.bounds`)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from replay.bounds.instance import (
    Instance,
    canonical_hint,
    disjoint_tails,
    is_feasible,
    latest_starts,
    symmetry_groups,
    tel,
    tel_constant,
)
from replay.bounds.lp import time_indexed

SOLVERS = ("cpsat", "cpsat_cumulative", "highs")


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
    # CP-SAT catches SIGINT by default and ends the search as if its time ran out: a Ctrl-C
    # was lost (the study went on to its last trial) and the trial it cut short was kept
    # as a result. Left to Python, the Ctrl-C ends the run once this solve returns (within
    # its time limit).
    cp.parameters.catch_sigint_signal = False
    code = cp.solve(model)
    constant = tel_constant(inst)
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
    # highspy's Highs() registers its Python callbacks in its constructor, which from
    # highspy 1.16 prints HiGHS's banner before output_flag can be turned off: a line on
    # stdout per solve (per trial of a study). Its base class is HiGHS's solver itself,
    # without those callbacks, which this solve does not use.
    h = highspy._Highs()
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
    constant = tel_constant(inst)
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
    tels = grid.sum(axis=1) + tel_constant(inst)
    tels = np.where(feasible, tels, np.iinfo(np.int64).max)
    best = int(np.argmin(tels))
    return int(tels[best]), grid[best]
