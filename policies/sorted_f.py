"""Sorted-F (docs/policies/sorted-f.md): batches by the F metric, executed with the lookahead check.

Phase 1 (:mod:`policies.common.fmetric`) splits the waiting requests into sets minimising
``F(X) = sum o / |X|^2`` under ``phase1_feasibility`` (``peak_sum``, the paper's
rule, or ``staggered``), each sorted by ``(o, id)``; Phase 2 admits from the
resulting order while the shared lookahead check passes and stops at the first
failure (:mod:`policies.common.planned`). Choices the spec settles and this implements:

* a request is active for ``o`` rounds, not the ``o + 1`` of the paper's
  Algorithm 1 (that is what reproduces the worked example C3);
* ties in F go to the larger set (``dp``); ``swap`` and ``quantile`` follow the
  spec's scan orders and quantile rule (see :mod:`policies.common.fmetric`);
* with arrivals over time, Phase 1 is rerun over all waiting requests whenever a
  new one waits (receding horizon); running requests are never touched;
* Phase 1 plans with the view's point estimate of ``o`` (the truth under
  ``prediction=exact``), minus tokens a waiting request kept from a recompute
  preemption; ``s`` is what it must prefill.

``quantile`` draws its samples from the engine's seeded policy generator, so a
run stays a function of its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from policies.common.fmetric import check_options, phase1_order
from policies.common.lookahead import admissible_prefix, remaining_iterations
from policies.common.planned import PlannedQueue
from replay.engine.policy import Batch, OverflowRule, PolicyView


@dataclass
class SortedF:
    overflow: OverflowRule
    solver: str = "swap"
    phase1_feasibility: str = "peak_sum"
    queue: PlannedQueue = field(default_factory=PlannedQueue, init=False, repr=False)

    def __post_init__(self) -> None:
        check_options(self.solver, self.phase1_feasibility)

    def estimate(self, view: PolicyView) -> np.ndarray:
        """The output lengths both phases plan with."""
        return view.predicted_output

    def plan(self, view: PolicyView, waiting: np.ndarray, estimate: np.ndarray) -> np.ndarray:
        remaining = remaining_iterations(view, waiting, estimate)
        return phase1_order(self.solver, view.prefill_len[waiting], remaining, waiting,
                            view.kv_capacity, self.phase1_feasibility, view.rng)

    def evict(self, view: PolicyView, estimate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kept, evicted)`` running requests before admitting; Sorted-F never evicts."""
        return view.running, np.zeros(0, dtype=np.int64)

    def decide(self, view: PolicyView) -> Batch:
        estimate = self.estimate(view)
        running, evicted = self.evict(view, estimate)
        order = self.queue.ordered_waiting(view, lambda w: self.plan(view, w, estimate))
        count = admissible_prefix(view, order, estimate, running)
        self.queue.admitted(count)
        return Batch(start=order[:count], preempt=evicted)

    def describe(self) -> dict:
        return {"solver": self.solver, "phase1_feasibility": self.phase1_feasibility,
                **self.queue.describe()}
