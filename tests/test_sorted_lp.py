"""Sorted-LP, LP-Swap and the LP relaxation they share with the hindsight study (§9, §11)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.lp_swap import LPSwap
from policies.mcsf import MCSF
from policies.sorted_f import SortedF
from policies.sorted_lp import SortedLP
from replay.bounds.instance import Instance
from replay.bounds.lp import auto_grid, bucket_coefficients, bucketed, lp_bound, time_indexed
from replay.engine.overflow import EvictLIFO
from replay.errors import ConfigError, SolverError
from tests.conftest import replay
from tests.test_engine_invariants import check_invariants, instances
from tests.test_sorted_f import C3


@pytest.mark.parametrize("policy", [SortedLP, LPSwap])
def test_c3_gives_45(policy):
    s, o, kv = C3
    assert replay(s, o, policy(EvictLIFO(), grid=1), kv).requests["latency"].sum() == 45


def test_bucket_coefficients_by_hand():
    # s = 2, o = 3 holds 3, 4, 5 in its three rounds. Grid 2, started at offset 0: buckets
    # hold (3+4)/2, 5/2; at offset 1: 3/2, (4+5)/2. The least per bucket: 1.5, 2.5.
    assert bucket_coefficients(2, 3, 2).tolist() == [1.5, 2.5]
    assert bucket_coefficients(2, 3, 1).tolist() == [3, 4, 5]


@settings(max_examples=30, deadline=None)
@given(instance=instances(max_n=8))
def test_grid_one_is_the_fine_model(instance):
    kv, s, o, arrival = instance
    inst = Instance(s, o, arrival.astype(np.int64), kv)
    latest = arrival.astype(np.int64) + int(o.sum())
    fine, coarse = time_indexed(inst, latest), bucketed(inst, latest, 1)
    assert (fine.memory != coarse.memory).nnz == 0
    assert (fine.start == coarse.start).all()


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(instance=instances(max_n=10), grid=st.integers(2, 6))
def test_lp_values_never_exceed_any_policys_tel(instance, grid):
    kv, s, o, arrival = instance
    inst = Instance(s, o, arrival.astype(np.int64), kv)
    fine = lp_bound(inst, tail_cuts=False)
    coarse = lp_bound(inst, tail_cuts=False, grid=grid)
    assert fine.status == coarse.status == "optimal"
    tels = [replay(s, o, policy, kv, arrival=arrival).requests["latency"].sum()
            for policy in (MCSF(EvictLIFO()), FCFSLookahead(EvictLIFO()), SortedF(EvictLIFO()),
                           SortedLP(EvictLIFO(), grid=1), LPSwap(EvictLIFO(), grid=grid))]
    assert coarse.bound <= fine.bound + 1e-9 <= min(tels) + 1e-9
    assert fine.value <= min(tels) + 1e-9


def test_auto_grid_caps_the_first_lp():
    inst = Instance(np.full(100, 25), np.full(100, 25), np.zeros(100, dtype=np.int64), 100)
    grid = auto_grid(inst, 20_000)
    assert grid > 1
    assert lp_bound(inst, tail_cuts=False, grid=grid).columns <= 20_000 * 1.05


@pytest.mark.slow
@pytest.mark.parametrize("policy", [SortedLP, LPSwap])
@settings(max_examples=20, deadline=None)
@given(instance=instances(max_n=15))
def test_invariants_for_the_lp_policies(policy, instance):
    kv, s, o, arrival = instance
    result = replay(s, o, policy(EvictLIFO(), grid="auto", max_columns=2_000), kv,
                    arrival=arrival)
    check_invariants(result, s, o, arrival, kv)
    assert result.status == "completed" and result.requests["evictions"].sum() == 0


def test_lp_records_what_produced_the_plan():
    s, o, kv = C3
    policy = SortedLP(EvictLIFO(), grid=2, method="highs-ds")
    replay(s, o, policy, kv)
    info = policy.describe()
    assert info["lp_method"] == "highs-ds" and info["lp_grid"] == 2
    assert info["lp_status"] == "optimal" and info["lp_solves"] == 1
    assert info["lp_bound"] <= 45 and info["lp_horizon"] >= 1


def test_lp_failures_and_bad_options_are_clear_errors():
    with pytest.raises(ConfigError, match="method"):
        SortedLP(EvictLIFO(), method="simplex")
    with pytest.raises(ConfigError, match="grid"):
        SortedLP(EvictLIFO(), grid=0)
    s, o, kv = C3
    with pytest.raises(SolverError, match="status time_limit"):
        replay(s, o, SortedLP(EvictLIFO(), grid=1, time_limit_s=1e-9), kv)


def test_shared_solves_answer_a_repeated_problem_without_solving_it_again(monkeypatch):
    import replay.bounds.lp as lp
    from replay.bounds.instance import Instance

    calls = []
    solve_here = lp._solve_here
    monkeypatch.setattr(lp, "_solve_here", lambda *a, **k: calls.append(1) or solve_here(*a, **k))
    inst = Instance(np.array([3, 1, 2, 4]), np.array([2, 5, 3, 1]), np.zeros(4), 10)
    alone = lp.lp_bound(inst, tail_cuts=False)
    solves = len(calls)
    with lp.shared_solves():
        first = lp.lp_bound(inst, tail_cuts=False)
        again = lp.lp_bound(inst, tail_cuts=False)
        other = lp.lp_bound(inst, tail_cuts=False, method="highs-ds")  # another problem
    assert len(calls) == 3 * solves  # alone, first, other: `again` solved nothing
    assert again.value == first.value == alone.value and again.status == "optimal"
    assert np.array_equal(again.mean_start, first.mean_start)
    again.mean_start[:] = -1  # each answer is the caller's own
    assert not np.array_equal(again.mean_start, first.mean_start)
    assert other.value == alone.value
    lp.lp_bound(inst, tail_cuts=False)  # outside the block: solved again
    assert len(calls) == 4 * solves


def test_sorted_lp_and_lp_swap_share_their_lp_in_c1_without_changing_a_result():
    import contextlib

    import replay.experiments.studies.c1_synthetic as c1

    params = {"seed": 0, "n": 30, "n_mixed": 40, "kv_tokens": 100, "lp_max_columns": 50000,
              "lp_method": "highs-ipm", "max_starts_per_round": None,
              "policies": ["sorted_lp", "lp_swap"]}
    shared = c1.run_trial("uniform", 0, params)
    c1_shared = c1.shared_solves
    try:
        c1.shared_solves = contextlib.nullcontext
        separate = c1.run_trial("uniform", 0, params)
    finally:
        c1.shared_solves = c1_shared
    timed = ("time_sorted_lp", "time_lp_swap", "lp_time_s")
    assert {k: v for k, v in shared.items() if k not in timed} == \
        {k: v for k, v in separate.items() if k not in timed}
