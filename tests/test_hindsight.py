"""The hindsight integer program (docs/policies/hindsight.md) against exhaustive enumeration."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import sparse
from scipy.optimize import linprog

from policies.mcsf import MCSF
from replay.bounds.instance import (
    Instance,
    disjoint_tails,
    is_feasible,
    kv_profile,
    latest_starts,
    max_overlap,
    symmetry_groups,
    tel,
)
from replay.bounds.ip import exhaustive_optimum, solve
from replay.bounds.lp import lp_bound, tail_rows, time_indexed
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.overflow import EvictLIFO
from replay.engine.policy import Batch
from replay.engine.requests import Requests
from replay.timing.simple import UnitTiming


def tiny_instances(count: int, seed: int = 7):
    """Random tiny instances; every other one has staggered arrivals."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        n = int(rng.integers(1, 5))
        kv = int(rng.integers(4, 9))
        s = rng.integers(1, 3, size=n)
        o = np.array([rng.integers(1, min(3, kv - si) + 1) for si in s])
        a = rng.integers(0, 3, size=n) if k % 2 else np.zeros(n, dtype=int)
        yield Instance(s, o, a, kv)


def random_instance(rng, n: tuple[int, int], kv: tuple[int, int], max_arrival: int = 0
                    ) -> Instance:
    """``n`` requests with ``s ~ U{1..3}``, ``o ~ U{1..M - s}`` and arrivals in
    ``0..max_arrival - 1`` (all at 0 when ``max_arrival`` is 0)."""
    count, capacity = int(rng.integers(*n)), int(rng.integers(*kv))
    s = rng.integers(1, 4, size=count)
    o = np.array([rng.integers(1, capacity - si + 1) for si in s])
    a = rng.integers(0, max_arrival, size=count) if max_arrival else np.zeros(count, dtype=int)
    return Instance(s, o, a, capacity)


def mcsf_starts(inst: Instance) -> tuple[np.ndarray, float]:
    requests = Requests(inst.prompt_len, inst.output_len, arrival=inst.arrival.astype(float))
    result = Engine(requests, MCSF(EvictLIFO()), UnitTiming(), explicit(inst.kv_capacity)).run()
    return result.requests["start"].to_numpy().astype(int), result.requests["latency"].sum()


def test_model_conventions_by_hand():
    # docs/model.md: s=1, o=2 started at round 1 holds 2 after round 1, 3 after round 2,
    # completes at 3; latency 3 - a.
    inst = Instance([1, 63], [2, 1], [1, 0], 64)
    assert kv_profile(inst, [1, 0]).tolist() == [64, 2, 3]
    assert tel(inst, [1, 0]) == (1 + 2 - 1) + (0 + 1 - 0)
    assert is_feasible(inst, [1, 0])
    assert not is_feasible(inst, [0, 0])  # 63+1 + 1+1 > 64
    assert not is_feasible(inst, [0, 1])  # request 0 starts before it arrives


def test_c3_example_optimum():
    # docs/reproducing/sorted-f.md C3: one (63, 1) and 21 (1, 2) at time 0, M = 64. Short ones first
    # in batches of 21 (peak 21*3 = 63) then the long one alone: 21*2 + 3 = 45.
    inst = Instance([63] + [1] * 21, [1] + [2] * 21, [0] * 22, 64)
    starts, engine_tel = mcsf_starts(inst)
    result = solve(inst, starts, time_limit_s=30)
    assert result.status == "optimal"
    assert result.objective == 45 == tel(inst, result.starts)
    assert engine_tel == 64
    assert lp_bound(inst, engine_tel).bound <= 45


@pytest.mark.parametrize("solver", ["cpsat", "cpsat_cumulative"])
def test_optimum_matches_exhaustive_enumeration(solver):
    for inst in tiny_instances(40):
        starts, engine_tel = mcsf_starts(inst)
        assert tel(inst, starts) == engine_tel and is_feasible(inst, starts)
        best, best_starts = exhaustive_optimum(inst)
        assert is_feasible(inst, best_starts)
        result = solve(inst, starts, solver=solver, time_limit_s=20)
        assert result.status == "optimal", result
        assert result.objective == best == result.bound
        assert is_feasible(inst, result.starts) and tel(inst, result.starts) == best


@pytest.mark.slow
def test_highs_matches_exhaustive_in_its_own_process():
    # highspy and ortools cannot be loaded into one process (their HiGHS builds clash).
    code = (
        "from tests.test_hindsight import tiny_instances, mcsf_starts\n"
        "from replay.bounds import solve, exhaustive_optimum\n"
        "for inst in tiny_instances(20):\n"
        "    r = solve(inst, mcsf_starts(inst)[0], solver='highs', time_limit_s=20)\n"
        "    assert r.status == 'optimal' and r.objective == exhaustive_optimum(inst)[0], r\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("tail_cuts", [False, True])
def test_lp_bound_never_exceeds_optimum(tail_cuts):
    gaps = []
    for inst in tiny_instances(40, seed=11):
        starts, engine_tel = mcsf_starts(inst)
        best = exhaustive_optimum(inst)[0]
        for upper in (None, engine_tel):
            lp = lp_bound(inst, upper, tail_cuts=tail_cuts)
            assert lp.status == "optimal" and lp.bound <= best
        gaps.append(best - lp.bound)
    assert max(gaps) > 0  # the relaxation is not trivially tight on these instances


def test_tail_cuts_close_the_gap_on_requests_that_cannot_overlap():
    # Three (1, 8) with M = 10: any two together exceed M before either completes, so they
    # run one after another: TEL = 8 + 16 + 24. The plain LP spreads them over many starts.
    inst = Instance([1, 1, 1], [8, 8, 8], [0, 0, 0], 10)
    assert exhaustive_optimum(inst)[0] == 48
    assert lp_bound(inst, tail_cuts=False).bound == 42
    assert lp_bound(inst, tail_cuts=True).bound == 48


def test_max_overlap_matches_pairs_placed_by_hand():
    rng = np.random.default_rng(2)
    for _ in range(30):
        kv = int(rng.integers(6, 16))
        s = rng.integers(1, 4, size=2)
        o = np.array([rng.integers(1, kv - si + 1) for si in s])
        inst = Instance(s, o, [0, 0], kv)
        expected = 0
        for d in range(o[0] + 1):  # request 1 starts d rounds after request 0
            if is_feasible(inst, [0, d]):
                expected = max(expected, min(o[0], d + o[1]) - d)
        assert max_overlap(inst)[0, 1] == expected


def test_disjoint_tails_never_overlap_in_a_feasible_schedule():
    rng = np.random.default_rng(4)
    checked = 0
    for _ in range(25):
        n, kv = int(rng.integers(2, 4)), int(rng.integers(5, 9))
        s = rng.integers(1, 3, size=n)
        o = np.array([rng.integers(1, min(5, kv - si) + 1) for si in s])
        inst = Instance(s, o, np.zeros(n, dtype=int), kv)
        families = disjoint_tails(inst)
        last = int(o.sum())
        for starts in itertools.product(range(last + 1), repeat=n):
            if not is_feasible(inst, starts):
                continue
            for members, heads in families:
                first = np.asarray(starts)[members] + heads
                end = np.asarray(starts)[members] + o[members]
                order = np.argsort(first)
                assert np.all(end[order][:-1] <= first[order][1:]), (inst, starts, members)
                checked += 1
    assert checked > 1000


def full_horizon_lp(inst: Instance, tail_cuts: bool) -> float:
    model = time_indexed(inst, latest_starts(inst))
    cuts = [tail_rows(inst, model, members, heads)
            for members, heads in (disjoint_tails(inst) if tail_cuts else [])]
    result = linprog(model.start.astype(float), A_ub=sparse.vstack([model.memory, *cuts]),
                     b_ub=np.concatenate([np.full(model.n_rounds, inst.kv_capacity),
                                          np.ones(model.n_rounds * len(cuts))]),
                     A_eq=model.assign, b_eq=np.ones(len(inst)), bounds=(0, 1), method="highs")
    return result.fun + inst.output_len.sum() - inst.arrival.sum()


@pytest.mark.parametrize("tail_cuts", [False, True])
def test_column_and_cut_generation_reach_the_full_horizon_lp(tail_cuts):
    rng = np.random.default_rng(5)
    for k in range(12):
        inst = random_instance(rng, n=(3, 9), kv=(10, 25), max_arrival=6 if k % 2 else 0)
        lp = lp_bound(inst, tail_cuts=tail_cuts)
        assert lp.status == "optimal"
        assert lp.value == pytest.approx(full_horizon_lp(inst, tail_cuts), abs=1e-6)
        assert lp.bound == np.ceil(lp.value - 1e-6)
        assert np.all(lp.mean_start >= inst.arrival - 1e-9)


def test_lp_time_out_is_reported_not_called_optimal():
    rng = np.random.default_rng(3)
    s = rng.integers(1, 6, size=40)
    o = np.array([rng.integers(1, 40 - si + 1) for si in s])
    lp = lp_bound(Instance(s, o, np.zeros(40, dtype=int), 40), time_limit_s=1e-3)
    assert lp.status == "time_limit" and lp.value is None


def test_latest_starts_uses_the_smaller_bound():
    inst = Instance([1, 1, 1], [2, 3, 4], [0, 1, 5], 10)
    # Non-idling: max a + sum o - o_i = 5 + 9 - o.
    assert latest_starts(inst).tolist() == [12, 11, 10]
    # From a TEL upper bound UB: a_i + UB - sum o. UB = 12 gives a + 3.
    assert latest_starts(inst, 12).tolist() == [3, 4, 8]
    with pytest.raises(ValueError, match="not a feasible TEL"):
        latest_starts(inst, 8)


def test_solver_never_returns_worse_than_hint_and_reports_limit():
    rng = np.random.default_rng(3)
    s = rng.integers(1, 6, size=30)
    o = np.array([rng.integers(1, 40 - si + 1) for si in s])
    inst = Instance(s, o, np.zeros(30, dtype=int), 40)
    starts, engine_tel = mcsf_starts(inst)
    result = solve(inst, starts, time_limit_s=0.5)
    assert result.status in ("optimal", "time_limit")
    assert result.objective <= engine_tel
    assert result.bound is None or result.bound <= result.objective
    if result.status == "time_limit" and result.bound is not None:
        assert result.gap == pytest.approx((result.objective - result.bound) / result.objective)


def test_symmetry_groups_and_bad_input():
    inst = Instance([1, 2, 1, 1], [3, 3, 3, 2], [0, 0, 0, 0], 10)
    assert [g.tolist() for g in symmetry_groups(inst)] == [[0, 2]]
    with pytest.raises(ValueError, match="request 0 needs s \\+ o = 11 > M = 10"):
        Instance([5], [6], [0], 10)
    with pytest.raises(ValueError, match="violates the memory limit"):
        solve(Instance([3, 3], [3, 3], [0, 0], 10), [0, 0])
    with pytest.raises(ValueError, match="unknown solver 'gurobi'"):
        solve(Instance([1], [1], [0], 10), [0], solver="gurobi")


class FixedStarts:
    """Starts each request at a given round (engine ids); replays a solver's schedule."""

    def __init__(self, starts_by_engine_id: np.ndarray) -> None:
        self.starts = starts_by_engine_id
        self.overflow = EvictLIFO()

    def decide(self, view):
        waiting = view.waiting
        return Batch(start=waiting[self.starts[waiting] <= view.now])


@pytest.mark.parametrize("seed", [0, 1])
def test_engine_replays_the_optimal_schedule_with_its_tel(seed):
    # The program's schedule is feasible in the engine's physics and has the TEL it claims.
    rng = np.random.default_rng(seed)
    for k in range(6):
        inst = random_instance(rng, n=(4, 9), kv=(12, 25), max_arrival=4 if k % 2 else 0)
        s, o, a, n = inst.prompt_len, inst.output_len, inst.arrival, len(inst)
        hint, _ = mcsf_starts(inst)
        result = solve(inst, hint, solver="cpsat_cumulative", time_limit_s=20)
        requests = Requests(s, o, arrival=a.astype(float))
        order = np.lexsort((np.arange(n), a))
        replay = Engine(requests, FixedStarts(result.starts[order]), UnitTiming(),
                        explicit(inst.kv_capacity)).run()
        assert replay.status == "completed"
        assert replay.requests["evictions"].sum() == 0
        assert replay.requests["start"].tolist() == result.starts.tolist()
        assert replay.requests["latency"].sum() == result.objective
