"""Sorted-F, its Phase-1 solvers and the A_min variants (docs/policies/sorted-f.md)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.a_min import AMin
from policies.common.fmetric import (
    batches_to_order,
    check_options,
    f_metric,
    fits,
    phase1_order,
    select,
    select_dp,
    select_quantile,
    select_swap,
)
from policies.common.lookahead import peak_kv
from policies.mcsf import MCSF
from policies.sorted_f import SortedF
from replay.engine.overflow import EvictLIFO
from replay.errors import ConfigError
from replay.timing import LinearTiming
from replay.workloads.prediction import Bucketed, Exact, Noisy, Ratio, predict
from tests.conftest import replay
from tests.test_engine_invariants import check_invariants, instances

C3 = ([63] + [1] * 21, [1] + [2] * 21, 64)


def brute_force_best_f(s, o, kv):
    best = np.inf
    for k in range(1, s.size + 1):
        for members in itertools.combinations(range(s.size), k):
            if (s[list(members)] + o[list(members)]).sum() <= kv:
                best = min(best, f_metric(o[list(members)].sum(), k))
    return best


@pytest.mark.parametrize("solver", ["dp", "swap", "quantile"])
def test_c3_gives_45_for_sorted_f_and_64_for_mcsf(solver):
    s, o, kv = C3
    result = replay(s, o, SortedF(EvictLIFO(), solver=solver), kv)
    assert result.requests["latency"].sum() == 45
    assert replay(s, o, MCSF(EvictLIFO()), kv).requests["latency"].sum() == 64


def test_c3_order_puts_the_long_prompt_last():
    s, o, kv = np.array(C3[0]), np.array(C3[1]), C3[2]
    order = phase1_order("dp", s, o, np.arange(s.size), kv, "peak_sum", np.random.default_rng(0))
    # Sets of 21 short requests (F = 42/441) first; the (63, 1) request alone (F = 1) last.
    assert order[-1] == 0 and sorted(order[:-1].tolist()) == list(range(1, 22))


@settings(max_examples=60, deadline=None)
@given(kv=st.integers(5, 40), data=st.data())
def test_dp_choice_equals_brute_force(kv, data):
    n = data.draw(st.integers(1, 8))
    s = np.array(data.draw(st.lists(st.integers(1, kv // 2), min_size=n, max_size=n)))
    o = np.array([data.draw(st.integers(1, kv - x)) for x in s])
    chosen = select_dp(s, o, np.arange(n), kv)
    assert fits(s, o, chosen, kv, "peak_sum")
    assert f_metric(o[chosen].sum(), len(chosen)) == pytest.approx(brute_force_best_f(s, o, kv))


def test_dp_prefers_the_larger_set_on_ties():
    # M = 6: request 0 (s + o = 5) fits only alone, F = 1/1; {1, 2} (3 + 3) has F = 4/4.
    chosen = select_dp(np.array([4, 1, 1]), np.array([1, 2, 2]), np.arange(3), 6)
    assert sorted(chosen) == [1, 2]


def test_swap_replaces_a_long_member_by_a_shorter_outsider():
    # Greedy by s + o takes 0 (s+o = 3, o = 2) and 1 (s+o = 4, o = 3); budget 8 leaves 2
    # (s+o = 5, o = 1) out. Swapping 1 for 2 fits (3 + 5 = 8) and lowers sum o from 5 to 3.
    s, o = np.array([1, 1, 4]), np.array([2, 3, 1])
    assert sorted(select_swap(s, o, np.arange(3), 8, "peak_sum")) == [0, 2]


def test_quantile_takes_small_requests_first_then_by_output_share():
    s = np.array([1, 1, 1, 30, 1, 1])
    o = np.array([1, 1, 1, 1, 20, 20])
    chosen = select_quantile(s, o, np.arange(6), 35, "peak_sum", np.random.default_rng(0))
    assert fits(s, o, chosen, 35, "peak_sum")
    assert {0, 1, 2} <= set(chosen)  # below both quantiles


@settings(max_examples=60, deadline=None)
@given(kv=st.integers(5, 60), data=st.data(), feasibility=st.sampled_from(["peak_sum",
                                                                          "staggered"]))
def test_every_solver_returns_a_feasible_plan_of_every_request(kv, data, feasibility):
    n = data.draw(st.integers(1, 12))
    s = np.array(data.draw(st.lists(st.integers(1, kv // 2), min_size=n, max_size=n)))
    o = np.array([data.draw(st.integers(1, kv - x)) for x in s])
    for solver in (["dp"] if feasibility == "peak_sum" else []) + ["swap", "quantile"]:
        rng, batches = np.random.default_rng(0), []

        def choose(pool, solver=solver, rng=rng, batches=batches):
            chosen = select(solver, s[pool], o[pool], pool, kv, feasibility, rng)
            batches.append(pool[np.asarray(chosen, dtype=np.int64)])
            return chosen

        order = batches_to_order(s, o, np.arange(n), kv, choose)
        assert sorted(order.tolist()) == list(range(n))
        assert all(fits(s, o, batch, kv, feasibility) for batch in batches)
        assert order.tolist() == phase1_order(solver, s, o, np.arange(n), kv, feasibility,
                                              np.random.default_rng(0)).tolist()


def test_staggered_is_the_lookahead_peak_and_weaker_than_peak_sum():
    s, o = np.array([10, 10]), np.array([10, 1])
    # Both start together: at the short one's completion 10+1 + 10+1 = 22, at the long
    # one's 20: staggered needs 22, peak_sum needs 31.
    assert peak_kv(s, o) == 22
    assert fits(s, o, [0, 1], 22, "staggered") and not fits(s, o, [0, 1], 30, "peak_sum")


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="solver"):
        check_options("knapsack", "peak_sum")
    with pytest.raises(ConfigError, match="staggered"):
        SortedF(EvictLIFO(), solver="dp", phase1_feasibility="staggered")
    with pytest.raises(ConfigError, match="variant"):
        AMin(EvictLIFO(), variant="a_mid")


SORTED_POLICIES = {
    "sorted_f_swap": lambda: SortedF(EvictLIFO(), solver="swap"),
    "sorted_f_quantile": lambda: SortedF(EvictLIFO(), solver="quantile"),
    "sorted_f_staggered": lambda: SortedF(EvictLIFO(), solver="swap",
                                          phase1_feasibility="staggered"),
    "a_min": lambda: AMin(EvictLIFO(), variant="a_min"),
    "a_max": lambda: AMin(EvictLIFO(), variant="a_max"),
    "optimistic": lambda: AMin(EvictLIFO(), variant="optimistic"),
}


@pytest.mark.parametrize("policy", SORTED_POLICIES)
@settings(max_examples=30, deadline=None)
@given(instance=instances())
def test_invariants_for_every_sorted_policy(policy, instance):
    kv, s, o, arrival = instance
    for timing in (None, LinearTiming(0.01, 1e-4, 5e-4)):
        result = replay(s, o, SORTED_POLICIES[policy](), kv, arrival=arrival, timing=timing)
        check_invariants(result, s, o, arrival, kv)
        assert result.status == "completed"
        assert result.requests["evictions"].sum() == 0  # exact predictions


@settings(max_examples=40, deadline=None)
@given(instance=instances(), seed=st.integers(0, 5))
def test_a_min_a_max_optimistic_equal_sorted_f_under_exact_predictions(instance, seed):
    kv, s, o, _ = instance
    reference = replay(s, o, SortedF(EvictLIFO()), kv, seed=seed).requests["latency"].sum()
    for variant in ("a_min", "a_max", "optimistic"):
        result = replay(s, o, AMin(EvictLIFO(), variant=variant), kv, seed=seed)
        assert result.requests["latency"].sum() == reference
        assert result.requests["evictions"].sum() == 0


def run_with_intervals(s, o, kv, policy, lo, hi, arrival=None):
    from replay.engine.kv import explicit
    from replay.engine.loop import Engine
    from replay.engine.requests import Requests
    from replay.timing import UnitTiming

    a = np.zeros(len(s)) if arrival is None else arrival
    requests = Requests(np.array(s), np.array(o), arrival=a, predicted_lo=np.array(lo),
                        predicted_hi=np.array(hi))
    return Engine(requests, policy, UnitTiming(), explicit(kv)).run()


def test_a_min_evicts_the_shortest_estimate_when_the_plan_overflows():
    # M = 10, all planned with l = 1: A (s=3, o=3), B (s=3, o=3), C (s=1, o=1) start at 0
    # (3+1 + 3+1 + 1+1 = 10). After round 1 A and B hold 5 each and their estimates rise to
    # 2, so the projection is 5+1 + 5+1 = 12 > 10: A (smallest estimate, then id) is
    # evicted and loses its progress. B finishes at 3; A, kept at estimate 2, restarts at 3
    # and finishes at 6.
    result = run_with_intervals([3, 3, 1], [3, 3, 1], 10, AMin(EvictLIFO(), variant="a_min"),
                                [1, 1, 1], [5, 5, 1])
    table = result.requests
    assert table["evictions"].tolist() == [1, 0, 0]
    assert table["completion"].tolist() == [6, 3, 1]
    assert (result.iterations["kv_peak"] <= 10).all()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(instance=instances(), alpha=st.sampled_from([0.2, 0.5, 0.8, 1.0]))
def test_interval_policies_complete_under_ratio_predictions(instance, alpha):
    kv, s, o, arrival = instance
    lo, hi = predict(Ratio(alpha), s, o, kv, np.random.default_rng(1))
    for variant in ("a_min", "a_max", "optimistic"):
        result = run_with_intervals(s, o, kv, AMin(EvictLIFO(), variant=variant), lo, hi,
                                    arrival=arrival)
        check_invariants(result, s, o, arrival, kv)
        assert result.status == "completed"
        if variant == "a_max":
            assert result.requests["evictions"].sum() == 0


@settings(max_examples=100, deadline=None)
@given(o=st.lists(st.integers(1, 5000), min_size=1, max_size=50),
       alpha=st.floats(0.01, 1.0), width=st.integers(1, 300), seed=st.integers(0, 100))
def test_interval_predictions_always_contain_the_truth(o, alpha, width, seed):
    o = np.array(o)
    s = np.ones_like(o)
    for predictor in (Exact(), Ratio(alpha), Bucketed(width)):
        lo, hi = predict(predictor, s, o, 10_000, np.random.default_rng(seed))
        assert (lo >= 1).all() and (lo <= o).all() and (o <= hi).all()
        assert (hi <= 10_000 - s).all()


def test_ratio_and_noisy_predictions_have_the_specified_shape():
    o = np.full(20_000, 100)
    lo, hi = Ratio(0.5).interval(o, np.random.default_rng(0))
    assert (lo / hi).mean() == pytest.approx(0.5, abs=0.01)
    assert hi.max() <= 200 and hi.min() >= 100
    point, same = Noisy(0.0).interval(o, np.random.default_rng(0))
    assert (point == o).all() and (same == point).all()
    point, _ = Noisy(0.5).interval(o, np.random.default_rng(0))
    assert np.median(point) == pytest.approx(100, abs=2) and point.std() > 20
