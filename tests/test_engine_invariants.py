"""Engine invariants on randomised instances (docs/model.md), for every policy and backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.paper_fcfs import PaperFCFS
from policies.protection import AlphaProtection
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.timing import LinearTiming, UnitTiming
from tests.conftest import replay


@st.composite
def instances(draw, max_n: int = 25):
    kv = draw(st.integers(8, 120))
    n = draw(st.integers(1, max_n))
    s = draw(st.lists(st.integers(1, kv // 2), min_size=n, max_size=n))
    o = [draw(st.integers(1, kv - si)) for si in s]
    arrival = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    return kv, np.array(s), np.array(o), np.array(arrival, dtype=float)


POLICIES = {
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "protection": lambda: AlphaProtection(0.3, ClearAll()),
    "clearing": lambda: AlphaProtection(0.2, ClearEachWithProb(0.3)),
    "paper_fcfs": lambda: PaperFCFS(EvictLIFO()),
}
TIMINGS = {"unit": UnitTiming, "linear": lambda: LinearTiming(0.01, 1e-4, 5e-4)}


def check_invariants(result, s, o, arrival, kv):
    it, req = result.iterations, result.requests
    executed = it[~it["failed"]]
    assert (executed["kv_peak"] <= kv).all(), "KV over capacity in an executed iteration"
    assert (it["kv_after"] <= kv).all()
    starts = it["start_time"].to_numpy()
    assert (np.diff(starts) >= 0).all(), "time went backwards"
    assert (starts[1:] >= (starts + it["duration"].to_numpy())[:-1] - 1e-12).all()
    assert (req["tokens_generated"] <= req["output_len"]).all()
    done = req["completed"].to_numpy()
    assert int(executed["n_completed"].sum()) == int(done.sum()), "a request completed twice"
    if result.status == "completed":
        assert done.all()
    else:
        assert result.status in {"livelock", "stalled", "step_limit"} and result.message
    finished = req[done]
    assert (finished["tokens_generated"] == finished["output_len"]).all()
    assert (finished["completion"] >= finished["first_token"]).all()
    assert (finished["first_token"] > finished["arrival"]).all()
    assert (finished["start"] >= finished["arrival"]).all()


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None)
@given(instance=instances())
def test_invariants_hold_on_random_instances(policy, timing, instance):
    kv, s, o, arrival = instance
    result = replay(s, o, POLICIES[policy](), kv, arrival=arrival, timing=TIMINGS[timing](),
                    livelock_window=2000)
    check_invariants(result, s, o, arrival, kv)


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("policy", ["fcfs", "mcsf"])
@settings(max_examples=60, deadline=None)
@given(instance=instances(max_n=40))
def test_lookahead_policies_never_overflow(policy, timing, instance):
    kv, s, o, arrival = instance
    result = replay(s, o, POLICIES[policy](), kv, arrival=arrival, timing=TIMINGS[timing]())
    assert result.status == "completed"
    assert not result.iterations["failed"].any()
    assert result.requests["evictions"].sum() == 0
    assert (result.iterations["kv_peak"] <= kv).all()


@settings(max_examples=30, deadline=None)
@given(instance=instances(), seed=st.integers(0, 10))
def test_same_seed_same_result(instance, seed):
    kv, s, o, arrival = instance
    first = replay(s, o, POLICIES["clearing"](), kv, arrival=arrival, seed=seed,
                   livelock_window=2000)
    second = replay(s, o, POLICIES["clearing"](), kv, arrival=arrival, seed=seed,
                    livelock_window=2000)
    assert first.status == second.status
    assert first.requests.equals(second.requests)
    assert first.iterations.equals(second.iterations)


@settings(max_examples=40, deadline=None)
@given(instance=instances())
def test_unit_time_latency_convention(instance):
    """Under unit time a request started at round p completes at p + o (docs/model.md)."""
    kv, s, o, arrival = instance
    req = replay(s, o, MCSF(EvictLIFO()), kv, arrival=arrival).requests
    assert (req["completion"] == req["start"] + req["output_len"]).all()
    assert (req["first_token"] == req["start"] + 1).all()


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=30, deadline=None)
@given(instance=instances(), cap=st.integers(1, 4))
def test_max_running_is_never_exceeded(policy, instance, cap):
    kv, s, o, arrival = instance
    result = replay(s, o, POLICIES[policy](), kv, arrival=arrival, livelock_window=2000,
                    max_running=cap)
    check_invariants(result, s, o, arrival, kv)
    # These policies advance every running request: the batch is the running set.
    assert (result.iterations["batch_size"] <= cap).all()
    if cap == 1 and result.status == "completed":
        # One request at a time: no two requests overlap in time.
        req = result.requests.sort_values("start")
        assert (req["start"].to_numpy()[1:] >= req["completion"].to_numpy()[:-1]).all()
