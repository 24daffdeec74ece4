"""The LP relaxation of the hindsight program (see :mod:`replay.bounds`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from replay.bounds.instance import Instance, disjoint_tails, latest_starts, tel_constant
from replay.errors import LimitError

log = logging.getLogger(__name__)

#: The most memory-matrix nonzeros one LP may have (~60 bytes each across SciPy and HiGHS,
#: so about 2 GB); a larger LP is refused before it is built, naming the estimate.
LP_MAX_NONZEROS = 30_000_000
#: An LP of at least this many nonzeros, or a solve longer than LOG_AFTER_S, is logged.
LOG_NONZEROS = 2_000_000
LOG_AFTER_S = 10.0


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


# ------------------------------------------------------------ coarse time grid
def _held_prefix(s: np.ndarray, o: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``sum_{j <= last} (s + j + 1)`` over a request's iterations ``j = 0..o-1`` (0 before)."""
    x = np.clip(last, -1, o - 1)
    return (x + 1) * (s + 1) + x * (x + 1) // 2


def bucket_coefficients(s: int, o: int, grid: int) -> np.ndarray:
    """The least average KV a request holds in each bucket ``k = 0, 1, ...`` after the
    bucket it starts in, over the ``grid`` start rounds of that bucket.

    Started ``t0`` rounds into its bucket, it holds ``s + j + 1`` in round ``j`` of its
    life, so bucket ``k`` sums a window of ``grid`` consecutive values starting at
    ``k g - t0``. That window sum rises then falls as the window slides (the footprint
    grows, then ends), so its least value over ``t0`` is at ``t0 = 0`` or ``g - 1``.
    """
    k = np.arange((o + 2 * grid - 2) // grid)

    def window(first):
        return _held_prefix(s, o, first + grid - 1) - _held_prefix(s, o, first - 1)

    return np.minimum(window(k * grid), window(k * grid - grid + 1)) / grid


def bucket_patterns(inst: Instance, grid: int) -> list[np.ndarray]:
    """:func:`bucket_coefficients` of every request (built once per LP, used per round)."""
    return [bucket_coefficients(int(s), int(o), grid)
            for s, o in zip(inst.prompt_len, inst.output_len, strict=True)]


def bucketed(inst: Instance, latest: np.ndarray, grid: int,
             patterns: list[np.ndarray] | None = None) -> TimeIndexed:
    """The relaxation on buckets of ``grid`` rounds: column ``(i, b)`` starts ``i`` somewhere
    in bucket ``b`` at a cost of its earliest allowed round there; memory row ``r``
    bounds the bucket's average KV by ``M`` with each column's least average
    (:func:`bucket_coefficients`). Every schedule maps to a feasible point of no
    larger cost, so the LP stays a lower bound; at ``grid = 1`` it is the fine model.
    """
    a = inst.arrival
    first, last = a // grid, latest // grid
    width = last - first + 1
    request = np.repeat(np.arange(len(inst)), width)
    bucket = np.arange(width.sum()) - np.repeat(np.cumsum(width) - width, width) + first[request]
    start = np.maximum(bucket * grid, a[request])
    patterns = bucket_patterns(inst, grid) if patterns is None else patterns
    length = np.array([p.size for p in patterns])
    first_bucket = int(first.min(initial=0))
    n_rows = int((last + length).max(initial=first_bucket)) - first_bucket
    per_column = length[request]
    column = np.repeat(np.arange(request.size), per_column)
    step = np.arange(per_column.sum()) - np.repeat(np.cumsum(per_column) - per_column, per_column)
    offsets = np.concatenate([[0], np.cumsum(length)])
    flat = np.concatenate(patterns)
    coefficient = flat[offsets[request[column]] + step]
    rows = bucket[column] + step - first_bucket
    memory = sparse.csr_matrix((coefficient, (rows, column)), shape=(n_rows, request.size))
    assign = sparse.csr_matrix((np.ones(request.size), (request, np.arange(request.size))),
                               shape=(len(inst), request.size))
    return TimeIndexed(request, start, first_bucket * grid, n_rows, memory, assign)


def _pricing_grid(inst: Instance, latest: np.ndarray, multiplier: np.ndarray, grid: int,
                  patterns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pricing` on the bucketed model: per request, the cheapest bucket in
    ``[a_i // g, latest_i // g]`` (as its start round) and its cost."""
    a = inst.arrival
    first_bucket = int((a // grid).min())
    best_start = np.empty(len(inst), dtype=np.int64)
    best_cost = np.empty(len(inst))
    for i in range(len(inst)):
        pattern = patterns[i]
        lo, hi = int(a[i] // grid) - first_bucket, int(latest[i] // grid) - first_bucket
        y = np.zeros(hi - lo + pattern.size)
        known = multiplier[lo: hi + pattern.size]
        y[: known.size] = known
        buckets = np.arange(lo, hi + 1)
        cost = (np.maximum((buckets + first_bucket) * grid, a[i])
                + np.correlate(y, pattern, mode="valid"))
        j = int(np.argmin(cost))
        best_start[i] = max((buckets[j] + first_bucket) * grid, int(a[i]))
        best_cost[i] = cost[j]
    return best_start, best_cost


def auto_grid(inst: Instance, max_columns: int, max_nonzeros: int | None = None) -> int:
    """The finest grid whose first LP (memory-area horizon) has at most ``max_columns``
    start columns and, if given, at most ``max_nonzeros`` memory-matrix entries (a
    column has about ``o / g + 1``: long outputs make big LPs even with few columns)."""
    a, o = inst.arrival, inst.output_len
    horizon = int(a.max()) - int(a.min()) + area_rounds(inst) + int(o.max())
    grid = max(1, math.ceil(len(inst) * (horizon + 1) / max_columns))

    def nonzeros(g: int) -> int:
        return int(((horizon // g + 1) * ((o + 2 * g - 2) // g)).sum())

    if max_nonzeros is not None:
        while nonzeros(grid) > max_nonzeros:
            grid = math.ceil(grid * 1.25)
    return grid


def lp_size(inst: Instance, window: np.ndarray, grid: int = 1) -> tuple[int, int]:
    """``(columns, nonzeros)`` of the LP :func:`time_indexed` (``grid = 1``) or
    :func:`bucketed` builds for ``window``, computed from the lengths alone (nothing of
    that size is allocated): the memory rows' entries plus one per column in the
    assignment rows."""
    a, o = inst.arrival.astype(np.int64), inst.output_len.astype(np.int64)
    if grid == 1:
        width = window.astype(np.int64) - a + 1
        per_column = o
    else:
        width = window.astype(np.int64) // grid - a // grid + 1
        per_column = (o + 2 * grid - 2) // grid
    columns = int(width.sum())
    return columns, int((width * per_column).sum()) + columns


def first_window(inst: Instance, upper_bound_tel: int | None = None) -> np.ndarray:
    """The last start round per request of the first LP: the memory-area horizon."""
    a, o = inst.arrival, inst.output_len
    latest = latest_starts(inst, upper_bound_tel)
    return np.maximum(a, np.minimum(latest, int(a.max()) + area_rounds(inst) + int(o.max())))


def check_lp_size(inst: Instance, window: np.ndarray, grid: int, limit: int | None,
                  keys: str) -> tuple[int, int]:
    """``lp_size``, after refusing an LP above ``limit`` nonzeros (:class:`LimitError` naming
    the estimate, the limit and ``keys``, the options that change it)."""
    columns, nonzeros = lp_size(inst, window, grid)
    limit = LP_MAX_NONZEROS if limit is None else limit
    if nonzeros > limit:
        raise LimitError(f"an LP over {len(inst)} requests at grid {grid} would have "
                         f"~{nonzeros:.3g} nonzeros ({columns:,} columns, "
                         f"~{nonzeros * 60 / 1e9:.1f} GB; limit {limit:.3g}); {keys}")
    return columns, nonzeros


# ----------------------------------------------------- interruptible HiGHS solves
_SIMPLEX_INTERRUPT, _IPM_INTERRUPT = 1, 2  # HiGHS callback types (kCallback*Interrupt)


class _Interrupt:
    """Ends a HiGHS solve at a deadline and logs progress of long solves.

    SciPy's ``linprog`` runs HiGHS in C++, where SciPy's time limit is not checked by the
    interior point method. While active, SciPy's HiGHS object gets an interrupt callback
    that stops the solve at the deadline (the solve and its result are otherwise
    unchanged). HiGHS also stops at a callback point on Ctrl-C; for large LPs, whose
    first callback can be many seconds away, see :func:`_solve_in_worker`.
    """

    def __init__(self, deadline: float, label: str) -> None:
        self.deadline, self.label = deadline, label
        self.started = self.last_log = time.perf_counter()
        self.timed_out = False

    def callback(self, kind, message, data_out, data_in, user_data) -> None:
        now = time.perf_counter()
        if now >= self.deadline:
            self.timed_out = True
        if self.timed_out:
            data_in.user_interrupt = True
        if now - self.last_log >= LOG_AFTER_S:
            self.last_log = now
            log.info("%s: still solving after %.0f s", self.label, now - self.started)


    @contextlib.contextmanager
    def active(self):
        try:
            import scipy.optimize._highspy._highs_wrapper as wrapper

            core = wrapper._h
            core._Highs().setCallback  # noqa: B018 - this SciPy's HiGHS has callbacks
        except (ImportError, AttributeError):
            yield  # an unknown SciPy: its own time limit only
            return
        owner = self

        class Proxy:
            def __getattr__(self, name):
                return getattr(core, name)

            @staticmethod
            def _Highs():  # noqa: N802 - the name SciPy calls
                highs = core._Highs()
                highs.setCallback(owner.callback, None)
                highs.startCallbackInt(_SIMPLEX_INTERRUPT)
                highs.startCallbackInt(_IPM_INTERRUPT)
                return highs

        wrapper._h = Proxy()
        try:
            yield
        finally:
            wrapper._h = core


def _solve_here(deadline: float, label: str, **problem):
    """``linprog(**problem)`` in this process, ended by the deadline inside HiGHS."""
    interrupt = _Interrupt(deadline, label)
    with interrupt.active():
        result = linprog(**problem)
    return result, interrupt.timed_out


def result_fields(result) -> dict:
    """What :func:`lp_bound` reads of a ``linprog`` result, as plain data (a worker's answer)."""
    return {"status": result.status, "message": result.message, "x": result.get("x"),
            "fun": result.get("fun"),
            "ineqlin": {"marginals": result.ineqlin.marginals} if result.status == 0 else None,
            "eqlin": {"marginals": result.eqlin.marginals} if result.status == 0 else None}


def _solve_in_worker(deadline: float, label: str, **problem):
    """``linprog(**problem)`` in a child process (``python -m replay.bounds.lp_worker``)
    that this process stops at the deadline (plus a grace second) or on Ctrl-C, whatever
    phase HiGHS is in: HiGHS holds the GIL and handles SIGINT itself only at its own checks,
    which a large LP reaches only after many seconds (presolve, the interior point's
    start). The same SciPy and HiGHS solve the same LP, so the result is the one an
    in-process solve gives.

    A plain child process, not multiprocessing's ``spawn``: inside a joblib (loky) worker,
    as in every multirun job, a spawned child inherits the start method ``loky``, which it
    cannot find, and exits at once, while the parent, which still holds the read end of
    the pipe, blocks for ever writing the problem into it (the multirun then hangs)."""
    import pickle
    import subprocess
    import sys
    from types import SimpleNamespace

    payload = pickle.dumps((deadline - time.perf_counter(), label, problem),
                           protocol=pickle.HIGHEST_PROTOCOL)
    worker = subprocess.Popen([sys.executable, "-m", "replay.bounds.lp_worker"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        answer, _ = worker.communicate(payload, timeout=max(deadline + 1.0 - time.perf_counter(),
                                                            0.1))
    except subprocess.TimeoutExpired:
        return SimpleNamespace(status=1, message="time limit (worker stopped)"), True
    finally:  # the deadline, Ctrl-C or any error: the worker goes too
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    if worker.returncode != 0:
        raise RuntimeError(f"{label}: the LP worker exited with status {worker.returncode} "
                           f"(out of memory?)")
    fields, timed_out = pickle.loads(answer)
    for name in ("ineqlin", "eqlin"):
        if fields[name] is not None:
            fields[name] = SimpleNamespace(**fields[name])
    return SimpleNamespace(**fields), timed_out


#: LPs of at least this many nonzeros are solved in a worker process (stoppable at once).
WORKER_NONZEROS = 2_000_000


def area_rounds(inst: Instance) -> int:
    """``ceil(sum_i o_i (s_i + (o_i + 1) / 2) / M)``: rounds the KV area needs at full M."""
    s, o = inst.prompt_len, inst.output_len
    return math.ceil(float((o * (s + (o + 1) / 2)).sum()) / inst.kv_capacity)




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
    method: str = "highs-ipm"
    grid: int = 1
    horizon: int | None = None  # the last start round the final LP allowed
    memory_rows: int = 0

    def describe(self) -> dict:
        """What a result records about the LP (Sorted-LP, LP-Swap, the studies)."""
        return {"lp_method": self.method, "lp_status": self.status, "lp_value": self.value,
                "lp_bound": self.bound, "lp_time_s": self.solve_time_s, "lp_grid": self.grid,
                "lp_horizon": self.horizon, "lp_columns": self.columns,
                "lp_memory_rows": self.memory_rows, "lp_generation_rounds": self.rounds,
                "lp_message": self.message}


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


#: lp_bound's optimal results by problem, inside :func:`shared_solves` (``None``: outside).
_shared_solves: dict[str, LPBound] | None = None


@contextlib.contextmanager
def shared_solves():
    """Inside this block :func:`lp_bound` answers a problem it has already solved to
    optimality in the block (the same instance and options) with that solution instead of
    solving it again: for an experiment that runs several LP-based policies on one instance
    (C1's Sorted-LP and LP-Swap plan with the same LP). A solve the time limit ended is not
    shared (a second solve might get further). The answer's ``solve_time_s`` is the first
    solve's."""
    global _shared_solves
    outer = _shared_solves
    _shared_solves = {} if outer is None else outer
    try:
        yield
    finally:
        _shared_solves = outer


def _problem_key(inst: Instance, options: tuple) -> str:
    digest = hashlib.sha256(repr((inst.kv_capacity, options)).encode())
    for values in (inst.prompt_len, inst.output_len, inst.arrival):
        digest.update(np.ascontiguousarray(values, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def lp_bound(inst: Instance, upper_bound_tel: int | None = None, time_limit_s: float = 60.0,
             max_rounds: int = 40, tail_cuts: bool = True, max_new_cuts: int = 300,
             grid: int = 1, method: str = "highs-ipm", max_nonzeros: int | None = None,
             size_keys: str = "coarsen the grid or solve fewer requests") -> LPBound:
    """:func:`solve_lp_bound`, or inside :func:`shared_solves` the optimal answer it already
    gave to the same problem."""
    solve = functools.partial(solve_lp_bound, inst, upper_bound_tel, time_limit_s, max_rounds,
                              tail_cuts, max_new_cuts, grid, method, max_nonzeros, size_keys)
    if _shared_solves is None:
        return solve()
    key = _problem_key(inst, (upper_bound_tel, time_limit_s, max_rounds, tail_cuts,
                              max_new_cuts, grid, method, max_nonzeros))
    if key not in _shared_solves:
        result = solve()
        if result.status != "optimal":
            return result
        _shared_solves[key] = result
    shared = _shared_solves[key]
    return dataclasses.replace(shared, mean_start=None if shared.mean_start is None
                               else shared.mean_start.copy())


def solve_lp_bound(inst: Instance, upper_bound_tel: int | None = None,
                   time_limit_s: float = 60.0, max_rounds: int = 40, tail_cuts: bool = True,
                   max_new_cuts: int = 300, grid: int = 1, method: str = "highs-ipm",
                   max_nonzeros: int | None = None,
                   size_keys: str = "coarsen the grid or solve fewer requests") -> LPBound:
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

    ``grid > 1`` solves the coarser relaxation of :func:`bucketed` instead (no tail
    cuts): still a lower bound, weaker, with ``grid`` times fewer columns. ``method``
    is SciPy's HiGHS method (``highs-ipm``: interior point with crossover;
    ``highs-ds``: dual simplex; ``highs``: HiGHS chooses); the LP often has several
    optima, so the method is part of a Sorted-LP result and is recorded with it.

    Every LP is sized before it is built (:func:`check_lp_size`: above ``max_nonzeros``,
    default :data:`LP_MAX_NONZEROS`, a :class:`~replay.errors.LimitError` naming
    ``size_keys``), ``time_limit_s`` is enforced inside HiGHS (interior point too) and
    Ctrl-C ends a solve within a moment (:class:`_Interrupt`); large or slow solves log.
    """
    started = time.perf_counter()
    if grid > 1 and tail_cuts:
        raise ValueError("lp_bound: tail cuts are defined on the fine grid only (grid=1)")
    if len(inst) == 0:
        return LPBound("optimal", 0.0, 0.0, np.zeros(0), 0, 0, 0.0, method=method, grid=grid)
    a = inst.arrival
    latest = latest_starts(inst, upper_bound_tel)
    window = first_window(inst, upper_bound_tel)
    families = disjoint_tails(inst) if tail_cuts else []
    patterns = bucket_patterns(inst, grid) if grid > 1 else None
    cut_rounds = [np.zeros(0, dtype=np.int64) for _ in families]  # per family, absolute rounds
    constant = tel_constant(inst)
    bound, status, message = None, "time_limit", "time limit before the first LP finished"
    for rounds in range(1, max_rounds + 1):
        remaining = time_limit_s - (time.perf_counter() - started)
        if remaining <= 0:
            break
        columns, nonzeros = check_lp_size(inst, window, grid, max_nonzeros, size_keys)
        label = (f"LP over {len(inst)} requests (grid {grid}, {columns:,} columns, "
                 f"{nonzeros:,} nonzeros)")
        if nonzeros >= LOG_NONZEROS:
            log.info("%s: building and solving (%s, time limit %.0f s)", label, method, remaining)
        model = (time_indexed(inst, window) if grid == 1
                 else bucketed(inst, window, grid, patterns))
        tails = [tail_rows(inst, model, members, heads) for members, heads in families]
        cut_rows = [t[r - model.first_round] for t, r in zip(tails, cut_rounds, strict=True)]
        n_cuts = sum(r.size for r in cut_rounds)
        solve = _solve_in_worker if nonzeros >= WORKER_NONZEROS else _solve_here
        solve_started = time.perf_counter()
        result, timed_out = solve(
            started + time_limit_s, label,
            c=model.start.astype(float), A_ub=sparse.vstack([model.memory, *cut_rows]),
            b_ub=np.concatenate([np.full(model.n_rounds, inst.kv_capacity), np.ones(n_cuts)]),
            A_eq=model.assign, b_eq=np.ones(len(inst)), bounds=(0, 1), method=method,
            options={"time_limit": float(remaining)})
        if time.perf_counter() - solve_started >= LOG_AFTER_S:
            log.info("%s: solve ended after %.1f s (%s)", label,
                     time.perf_counter() - solve_started, result.message)
        if result.status != 0:
            status = "time_limit" if result.status == 1 or timed_out else "error"
            message = (f"time limit of {time_limit_s:g} s reached inside HiGHS"
                       if timed_out else result.message)
            break
        duals = np.maximum(-result.ineqlin.marginals, 0.0)
        multiplier = duals[: model.n_rounds]
        cut_duals, offset = [], model.n_rounds
        for (members, heads), r in zip(families, cut_rounds, strict=True):
            z = np.zeros(model.n_rounds)
            z[r - model.first_round] = duals[offset: offset + r.size]
            cut_duals.append((members, heads, z))
            offset += r.size
        if grid == 1:
            best_start, best_cost = _pricing(inst, latest, multiplier, model.first_round,
                                             cut_duals)
        else:
            best_start, best_cost = _pricing_grid(inst, latest, multiplier, grid, patterns)
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
                           model.n_columns, rounds, time.perf_counter() - started, method=method,
                           grid=grid, horizon=int(window.max()), memory_rows=model.n_rounds)
        cut_rounds = [np.union1d(r, v) for r, v in zip(cut_rounds, violated, strict=True)]
        window = np.where(grow, np.minimum(latest, np.maximum(best_start, 2 * window - a + 1)),
                          window)
        message = f"column and cut generation stopped after {rounds} rounds"
    return LPBound(status, bound, None, None, 0, rounds, time.perf_counter() - started, message,
                   method=method, grid=grid, horizon=int(window.max()))

