"""LP-Swap (docs/policies/sorted-f.md): Sorted-LP's order, regrouped into F-improved sets.

Walking the remaining requests in ascending LP mean start ``y`` (ties by id), take
the greedy set under ``sum (s + o) <= M`` (skipping misfits), improve it with
Sorted-F's one-in-one-out swap (:func:`policies.common.fmetric.improve_by_swaps`), sort it
by ``(o, id)``, append it and remove it; then Phase 2. Everything else (LP, grid,
method, recording, replanning) is :class:`policies.sorted_lp.SortedLP`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.common.fmetric import batches_to_order, greedy_fill, improve_by_swaps
from policies.sorted_lp import SortedLP


@dataclass
class LPSwap(SortedLP):
    def order(self, s, o, ids, kv_capacity, mean_start) -> np.ndarray:
        def choose(pool: np.ndarray) -> list[int]:
            sub_s, sub_o, sub_ids = s[pool], o[pool], ids[pool]
            by_y = np.lexsort((sub_ids, mean_start[pool]))
            members = greedy_fill(by_y, sub_s, sub_o, kv_capacity, "peak_sum")
            by_peak = np.lexsort((sub_ids, sub_s + sub_o))
            return improve_by_swaps(members, by_peak, sub_s, sub_o, kv_capacity, "peak_sum")

        return batches_to_order(s, o, ids, kv_capacity, choose)
