"""Fast-forwarding steady decode stretches (``Batch.steady_steps``) changes speed, never results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from replay.engine import DecisionError
from replay.histogram import LogHistogram
from replay.overflow import ClearAll, EvictLIFO
from replay.policy import UNTIL_CHANGE, Batch
from replay.timing import LinearTiming, UnitTiming
from replay.timing.base import BatchShape
from tests.conftest import replay
from tests.test_serving_policies import paged_instances

POLICIES = {
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
    "sarathi_reserve": lambda: SarathiLike(EvictLIFO(), chunk_size=16, reserve_prompt=True),
    # Never steady: the switch must make no difference at all.
    "protection": lambda: AlphaProtection(0.3, ClearAll()),
}
TIMINGS = {"unit": UnitTiming, "linear": lambda: LinearTiming(0.01, 1e-4, 5e-4)}


def assert_same_run(fast, slow):
    assert (fast.status, fast.message) == (slow.status, slow.message)
    assert fast.requests.equals(slow.requests)
    assert fast.iterations.equals(slow.iterations)
    fast_gaps, slow_gaps = fast.token_gaps.summary(), slow.token_gaps.summary()
    assert fast_gaps == slow_gaps  # count, exact float mean and max, quantiles
    assert (fast.token_gaps.counts == slow.token_gaps.counts).all()
    assert slow.decisions == len(slow.iterations)
    assert fast.decisions <= slow.decisions


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("preemption", ["restart", "recompute"])
@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(instance=paged_instances(max_n=12), long_output=st.integers(0, 200))
def test_fast_forward_gives_the_step_loops_results(policy, preemption, timing, instance,
                                                   long_output):
    kv, block, s, o, arrival = instance
    # One request may decode for long, so that stretches cross block boundaries.
    o = o.copy()
    o[0] = min(o[0] + long_output, kv - s[0])
    runs = [replay(s, o, POLICIES[policy](), kv, arrival=arrival, timing=TIMINGS[timing](),
                   block_size=block, preemption=preemption, livelock_window=3000,
                   fast_forward=switch) for switch in (True, False)]
    assert_same_run(*runs)


def test_a_lone_request_asks_the_policy_three_times():
    """Prefill step, first decode (steady), then the completing step: 3 decisions, 50 steps."""
    for make in (POLICIES["fcfs"], POLICIES["mcsf"], POLICIES["vllm"], POLICIES["sarathi"]):
        result = replay([4], [50], make(), 100, timing=LinearTiming(0.01, 1e-4))
        assert len(result.iterations) == 50 and result.decisions == 3
        # Touched KV: 4 prompt tokens, then 6, 7, ..., 54 (the context before + the new token).
        assert result.requests["completion"].iloc[0] == pytest.approx(
            50 * 0.01 + 1e-4 * (4 + sum(range(6, 55))))


def test_a_stretch_ends_at_an_arrival_and_at_the_kv_limit():
    # The second request arrives at 10 rounds; under unit time the stretch stops there.
    result = replay([4, 4], [30, 5], POLICIES["fcfs"](), 100, arrival=[0.0, 10.0])
    it = result.iterations
    assert it.loc[10, "n_started"] == 1 and result.decisions < len(it)
    # Two requests of 20 + 30 slots at peak in 40 slots: the lookahead starts one, FCFS-like
    # vLLM starts both and must preempt when the KV runs out, which the stretch must leave
    # to the policy.
    s, o = [10, 10], [10, 20]
    for preemption in ("restart", "recompute"):
        runs = [replay(s, o, POLICIES["vllm"](), 36, preemption=preemption,
                       fast_forward=switch) for switch in (True, False)]
        assert_same_run(*runs)
        assert runs[0].requests["evictions"].sum() >= 1


@pytest.mark.parametrize("limit", [dict(max_steps=10), dict(livelock_window=7)])
def test_a_stretch_stops_where_the_run_would_stop(limit):
    runs = [replay([4], [50], POLICIES["fcfs"](), 100, fast_forward=switch, **limit)
            for switch in (True, False)]
    assert_same_run(*runs)
    assert runs[0].status in ("step_limit", "livelock")


class _SteadyLiar:
    """Says steady while it would pause its only request at the next step."""

    overflow = EvictLIFO()

    def __init__(self):
        self.calls = 0

    def decide(self, view):
        self.calls += 1
        if view.waiting.size:
            return Batch(start=view.waiting)
        return Batch(steady_steps=UNTIL_CHANGE)


def test_the_engine_trusts_the_promise_only_for_pure_decode_steps():
    # A start step flagged steady is executed as a normal step.
    policy = _SteadyLiar()
    result = replay([4, 4], [6, 6], policy, 100, arrival=[0.0, 2.0])
    assert result.status == "completed"
    assert policy.calls == result.decisions < len(result.iterations)


class _VaguePromise:
    """Starts what waits, then promises a number of steps that is not a whole number."""

    overflow = EvictLIFO()

    def __init__(self, promise):
        self.promise = promise

    def decide(self, view):
        if view.waiting.size:
            return Batch(start=view.waiting)
        return Batch(steady_steps=self.promise)


@pytest.mark.parametrize("promise", [True, 2.5, "3", -1])
def test_a_promise_that_is_not_a_step_count_is_a_clear_error(promise):
    with pytest.raises(DecisionError, match=r"_VaguePromise: steady_steps must be a whole"):
        replay([4], [6], _VaguePromise(promise), 100)


def test_the_switch_is_a_validated_config_value():
    from replay.errors import ConfigError
    with pytest.raises(ConfigError, match="engine.fast_forward"):
        replay([4], [5], POLICIES["fcfs"](), 100, fast_forward="yes")


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.floats(1e-3, 10.0), st.integers(0, 9)), max_size=40),
       buffer_size=st.integers(1, 12), prefill=st.integers(0, 12))
def test_add_repeated_folds_at_the_same_points_as_separate_adds(rows, buffer_size, prefill):
    one_by_one, bulk = (LogHistogram(buffer_size=buffer_size) for _ in range(2))
    start = np.linspace(0.5, 2.0, prefill)
    for histogram in (one_by_one, bulk):
        histogram.add(start)
    for value, each in rows:
        one_by_one.add(np.full(each, value))
    # Consecutive rows of the same width go in one call, as the engine does per stretch.
    k = 0
    while k < len(rows):
        width = rows[k][1]
        end = k
        while end < len(rows) and rows[end][1] == width:
            end += 1
        bulk.add_repeated(np.array([v for v, _ in rows[k:end]]), width)
        k = end
    assert (bulk.count, bulk.total, bulk.max) == (one_by_one.count, one_by_one.total,
                                                  one_by_one.max)
    assert bulk._filled == one_by_one._filled
    assert (bulk._buffer[:bulk._filled] == one_by_one._buffer[:one_by_one._filled]).all()
    assert (bulk.counts == one_by_one.counts).all()


@pytest.mark.parametrize("timing", [UnitTiming(), LinearTiming(0.01, 1e-4, 5e-4),
                                    LinearTiming(0.0, 3e-7)])
def test_closed_form_backends_price_a_stretch_like_single_steps(timing):
    size, context = 3, np.array([5, 17, 40])
    stretch = timing.decode_durations(size, int(context.sum()), int(context.max()), 25)
    single = [timing.duration(BatchShape(np.ones(size, dtype=np.int64), context + k,
                                         np.zeros(size, dtype=bool))) for k in range(25)]
    assert stretch.tolist() == single
