"""Sorted-LP (docs/policies/sorted-f.md): order by the LP relaxation's mean start times, execute
with the lookahead check.

Phase 1 solves the LP relaxation of the hindsight program
(:func:`replay.bounds.lp.lp_bound`, the same LP as the hindsight study's bound,
here without tail cuts) over the waiting requests, all treated as arriving now,
and orders them by ``y_i = sum_t t x_it`` ascending (ties by id). Phase 2 is
Sorted-F's (:mod:`policies.common.planned`, shared lookahead check).

* Time grid: ``grid`` rounds per LP bucket, or ``auto``: the finest grid whose
  first LP has at most ``max_columns`` start variables and ``max_nonzeros``
  memory-matrix entries. ``grid = 1`` is the
  paper's LP; coarser grids solve a weaker relaxation (:func:`replay.bounds.lp.bucketed`).
* ``method``: SciPy's HiGHS method. The LP often has several optima, and which
  one the solver returns changes the order, so the method is recorded.
* The LP's method, status, objective, bound, time, horizon and grid of every plan
  are in ``describe()`` (the run summary's ``policy_info``). An LP that does not
  reach optimality is an error naming its status, never a silent fallback.
* With arrivals over time the LP is re-solved over the waiting requests when new
  ones arrive (receding horizon); the running requests' memory is left to Phase 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.lookahead import admissible_prefix, remaining_iterations
from policies.common.planned import PlannedQueue
from replay.bounds.instance import Instance
from replay.bounds.lp import LP_MAX_NONZEROS, LPBound, auto_grid, lp_bound
from replay.engine.policy import Batch, OverflowRule, PolicyView
from replay.errors import ConfigError, SolverError
from replay.params import check

METHODS = ("highs-ipm", "highs-ds", "highs")


@dataclass
class SortedLP:
    overflow: OverflowRule
    grid: int | Literal["auto"] = field(default="auto", metadata=check(ge=1))
    max_columns: int = field(default=50_000, metadata=check(ge=1))
    max_nonzeros: int | None = field(default=None, metadata=check(ge=1))
    method: Literal["highs-ipm", "highs-ds", "highs"] = "highs-ipm"
    time_limit_s: float = field(default=600.0, metadata=check(gt=0))
    queue: PlannedQueue = field(default_factory=PlannedQueue, init=False, repr=False)
    lp_runs: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"policy.method={self.method!r}: choose one of {', '.join(METHODS)}")
        if self.grid != "auto" and (isinstance(self.grid, str) or int(self.grid) != self.grid
                                    or int(self.grid) < 1):
            raise ConfigError(f"policy.grid={self.grid!r}: an integer >= 1 or auto")

    def solve_lp(self, s: np.ndarray, o: np.ndarray, kv_capacity: int) -> LPBound:
        inst = Instance(s, o, np.zeros(s.size, dtype=np.int64), kv_capacity)
        grid = (auto_grid(inst, self.max_columns, self.max_nonzeros) if self.grid == "auto"
                else int(self.grid))
        keys = ("use policy.grid=auto or a coarser policy.grid" if self.grid != "auto" else
                "set policy.max_columns or policy.max_nonzeros lower")
        lp = lp_bound(inst, tail_cuts=False, grid=grid, method=self.method,
                      time_limit_s=self.time_limit_s,
                      max_nonzeros=max(LP_MAX_NONZEROS, self.max_nonzeros or 0),
                      size_keys=f"{keys} (policy.max_nonzeros raises the limit)")
        self.lp_runs.append(lp.describe())
        if lp.status != "optimal":
            raise SolverError(f"policy {type(self).__name__}: the LP over {s.size} requests "
                              f"(grid {grid}, {self.method}) ended with status {lp.status}: "
                              f"{lp.message}; raise policy.time_limit_s or coarsen policy.grid")
        return lp

    def order(self, s: np.ndarray, o: np.ndarray, ids: np.ndarray, kv_capacity: int,
              mean_start: np.ndarray) -> np.ndarray:
        return ids[np.lexsort((ids, mean_start))]

    def plan(self, view: PolicyView, waiting: np.ndarray) -> np.ndarray:
        s = view.prefill_len[waiting]
        o = remaining_iterations(view, waiting, view.predicted_output)
        lp = self.solve_lp(s, o, view.kv_capacity)
        return self.order(s, o, waiting, view.kv_capacity, lp.mean_start)

    def decide(self, view: PolicyView) -> Batch:
        order = self.queue.ordered_waiting(view, lambda w: self.plan(view, w))
        count = admissible_prefix(view, order)
        self.queue.admitted(count)
        return Batch(start=order[:count])

    def describe(self) -> dict:
        """The last plan's LP in full, plus totals over every plan."""
        return {**self.queue.describe(), **(self.lp_runs[-1] if self.lp_runs else {}),
                "lp_solves": len(self.lp_runs),
                "lp_time_total_s": sum(r["lp_time_s"] for r in self.lp_runs)}
