"""The hindsight benchmark (docs/policies/hindsight.md), not an online policy: the time-indexed
integer program over a whole instance known in advance, its LP relaxation (also the
plan of Sorted-LP and LP-Swap, docs/policies/sorted-f.md) and an exhaustive reference for tests.

Modules: :mod:`~replay.bounds.instance` (instances, schedules, tails),
:mod:`~replay.bounds.lp` (the LP relaxation), :mod:`~replay.bounds.ip` (the
integer-program solvers).

Unit time, every length and arrival known. Request ``i`` started at round ``p``
holds ``s_i + j`` slots after its ``j``-th iteration (round ``p + j - 1``) and
completes at ``p + o_i``; TEL ``= sum_i (p_i + o_i - a_i)``. The memory
constraint is written per *iteration round* ``tau``: the KV held after
iteration ``tau`` is ``sum_i (s_i + tau - p_i + 1)`` over the requests with
``p_i <= tau <= p_i + o_i - 1``. This is docs/policies/hindsight.md's row ``t = tau + 1``.

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

from replay.bounds.instance import Instance, is_feasible, kv_profile, latest_starts, tel
from replay.bounds.ip import SOLVERS, SolveResult, exhaustive_optimum, solve
from replay.bounds.lp import LPBound, lp_bound

__all__ = ["SOLVERS", "Instance", "LPBound", "SolveResult", "exhaustive_optimum", "is_feasible",
           "kv_profile", "latest_starts", "lp_bound", "solve", "tel"]
