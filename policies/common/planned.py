"""The order list of the two-phase policies (Sorted-F, Sorted-LP, LP-Swap, A_min).

Phase 1 turns the waiting requests into one execution order; Phase 2 admits from
that order with the lookahead check, stopping at the first failure
(docs/policies/sorted-f.md). This module keeps the order between steps:

* Receding horizon (arrivals over time, beyond the papers): when a request that
  no plan has seen is waiting, Phase 1 is rerun over every waiting request.
  Running requests are never replanned.
* A request returning to the queue (evicted or preempted) takes its old place:
  queue positions are ranks handed out plan after plan, so it sorts before the
  requests planned after it.
* Admission takes a prefix of the order, so between replans the waiting order
  is a pointer into one array (no per-step sort). Requests leave the waiting
  queue only by starting, so "as many waiting as expected" means "exactly the
  expected ones"; any other count rebuilds the order from the ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from replay.engine.policy import PolicyView

_EMPTY = np.zeros(0, dtype=np.int64)


class PlannedQueue:
    def __init__(self) -> None:
        self.rank: np.ndarray | None = None
        self.planned: np.ndarray | None = None
        self.queue = _EMPTY
        self.head = 0
        self.next_rank = 0
        self.plans = 0
        self.plan_time_s = 0.0

    def ordered_waiting(self, view: PolicyView,
                        plan: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The waiting requests in execution order; ``plan(waiting)`` returns the
        waiting ids in Phase-1 order and is called only when new requests wait."""
        if self.rank is None:
            n = view.arrival.size
            self.rank = np.zeros(n, dtype=np.int64)
            self.planned = np.zeros(n, dtype=bool)
        waiting = view.waiting
        if waiting.size != self.queue.size - self.head:
            if not self.planned[waiting].all():
                started = time.perf_counter()
                order = np.asarray(plan(waiting), dtype=np.int64)
                self.plan_time_s += time.perf_counter() - started
                self.plans += 1
                self.rank[order] = self.next_rank + np.arange(order.size)
                self.next_rank += order.size
                self.planned[order] = True
            self.queue = waiting[np.argsort(self.rank[waiting], kind="stable")]
            self.head = 0
        return self.queue[self.head:]

    def admitted(self, count: int) -> None:
        """The first ``count`` of the order were started this step."""
        self.head += count

    def describe(self) -> dict:
        return {"phase1_plans": self.plans, "phase1_time_s": self.plan_time_s}
