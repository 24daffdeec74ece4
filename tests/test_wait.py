"""WAIT and Nested WAIT (POLICIES.md §6-7): hand-worked schedules, the throughput and
stability claims, the B0 cascade, and invariants. Unit time unless stated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.nested_wait import NestedWait
from policies.wait import Wait
from replay.config import compose_config
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.overflow import EvictLIFO
from replay.engine.requests import Requests
from replay.errors import ConfigError
from replay.run import build_and_run
from replay.timing import UnitTiming
from tests.test_engine_invariants import TIMINGS, check_invariants

ONE_TYPE = [{"prompt_len": 1, "output_len": 2, "rate": 4}]


def typed_replay(s, o, types, arrival, policy, kv, timing=None):
    requests = Requests(np.asarray(s), np.asarray(o), arrival=np.asarray(arrival, float),
                        type_id=np.asarray(types))
    return Engine(requests, policy, timing or UnitTiming(), explicit(kv)).run()


def test_wait_batches_only_at_its_threshold_and_takes_the_oldest():
    # n = 2 for (s, o) = (1, 2). Arrivals 0, 1, 1, 2, and a late one at 9 (so that no drain
    # starts early). t=0: one waiting < 2, wait. t=1: start 0, 1 (the oldest two; 2 waits).
    # t=2: stage 0 holds 2, 3 -> start them, advance 0, 1 (done at 3). t=3: stage 0 is empty:
    # 2, 3 pause at stage 1 until t=9, when the last arrival ends the stream and the drain
    # runs 2, 3 (done at 10) with 4 (done at 11).
    policy = Wait(EvictLIFO(), ONE_TYPE, n=[2])
    result = typed_replay([1] * 5, [2] * 5, [0] * 5, [0, 1, 1, 2, 9], policy, 100)
    req = result.requests
    assert req["start"].tolist() == [1, 1, 2, 2, 9]
    assert req["completion"].tolist() == [3, 3, 10, 10, 11]
    it = result.iterations
    assert it["batch_size"].tolist()[:2] == [2, 4]


def test_wait_runs_only_the_types_at_their_threshold():
    # Type 0 (o=3, n=1) and type 1 (o=3, n=2). At t=0 one request of each: only type 0 runs.
    # Type 1's second request arrives at 1: from then both run; a late arrival at 20 keeps
    # the stream open, so nothing drains before.
    types = [{"prompt_len": 1, "output_len": 3, "rate": 1}] * 2
    policy = Wait(EvictLIFO(), types, n=[1, 2])
    result = typed_replay([1] * 4, [3] * 4, [0, 1, 1, 0], [0, 0, 1, 20], policy, 100)
    assert result.requests["start"].tolist() == [0, 1, 1, 20]


def test_wait_rejects_untyped_requests_and_bad_thresholds():
    policy = Wait(EvictLIFO(), ONE_TYPE, n=[1])
    with pytest.raises(ConfigError, match="typed"):
        typed_replay([1], [2], [-1], [0], policy, 10)
    with pytest.raises(ConfigError, match="one threshold"):
        Wait(EvictLIFO(), ONE_TYPE, n=[1, 2])


def test_nested_wait_pauses_in_flight_requests_below_the_entry_threshold():
    # Segments {0, 1} and {2, ...}, n = (2, 2). Four requests at 0 (o = 1, 3, 3, 3) and one at
    # 100. t=0: start 0, 1 (0 completes at 1). t=1: start 2, 3; 1 moves to stage 2. t=2: the
    # entry queue of segment 1 is empty -> everything pauses until 100, when the stream ends
    # and the drain finishes 1 (101), 2, 3 (102) and 4 (101).
    policy = NestedWait(EvictLIFO(), boundaries=[2], max_stage=3, n=[2, 2])
    result = typed_replay([1] * 5, [1, 3, 3, 3, 1], [0] * 5, [0, 0, 0, 0, 100], policy, 100)
    req = result.requests
    assert req["start"].tolist() == [0, 0, 1, 1, 100]
    assert req["completion"].tolist() == [1, 101, 102, 102, 101]
    assert policy.describe()["edges"] == [0, 2, 3]


def test_nested_wait_opens_a_later_segment_only_when_its_entry_queue_is_full():
    # Segments {0} and {1, ...}, n = (1, 2), all o = 3, arrivals 0, 1, 2, 3 and 50. Segment 2
    # opens when two requests wait at stage 1: request 0 waits at stage 1 from t=1 until
    # request 1 joins it at t=2.
    policy = NestedWait(EvictLIFO(), boundaries=[1], max_stage=3, n=[1, 2])
    result = typed_replay([1] * 5, [3] * 5, [0] * 5, [0, 1, 2, 3, 50], policy, 100)
    it = result.iterations
    assert it["batch_size"].tolist()[:3] == [1, 1, 3]


def test_nested_thresholds_from_ratios_and_from_rates():
    ratios = NestedWait(EvictLIFO(), boundaries=[20, 40, 80], max_stage=160,
                        ratios=[15, 14, 12, 8], batch_limit=1700)
    assert ratios.per_stage.tolist() == [15, 14, 12, 8]
    types = [{"prompt_len": 10, "output_len": o, "rate": o} for o in (20, 40, 80, 160)]
    generated = NestedWait(EvictLIFO(), boundaries=[20, 40, 80], types=types,
                           batch_limit=33_000 / 20, epsilon=0.0)
    assert generated.per_stage.tolist() == [15, 14, 12, 8]
    assert not generated.describe()["condition_12"]["strict"]
    with pytest.raises(ConfigError, match="boundaries"):
        NestedWait(EvictLIFO(), boundaries=None, segment_width=None, max_stage=5, n=[1])


STABLE = ["experiment=b1_wait_low", "timing=linear", "policy=wait", "workload.load=0.6",
          "policy.thresholds=condition_11", "workload.duration_s=40", "seed=1"]


def test_wait_reaches_the_fluid_throughput_when_stable():
    result, requests, _ = build_and_run(compose_config(STABLE))
    assert result.status == "completed"
    assert result.requests["evictions"].sum() == 0
    assert result.policy_info["holds"]  # condition (11)
    assert result.policy_info["m_pi"] <= result.kv.tokens
    done = result.requests
    throughput = done["output_len"].sum() / float(
        (result.iterations["start_time"] + result.iterations["duration"]).max())
    assert throughput >= 0.97 * result.fluid["throughput_star"]


def test_violating_condition_11_makes_latency_grow_with_the_horizon():
    # One request per stage and type cannot keep up with these rates: the backlog, and with it
    # the latency, grows with the horizon.
    latency = {}
    for duration in (5, 10):
        result, _, _ = build_and_run(compose_config(
            [*STABLE[:-3], "policy.n=[1,1]", f"workload.duration_s={duration}"]))
        assert result.status == "completed"
        latency[duration] = result.requests["latency"].mean()
    assert latency[10] > 1.6 * latency[5]


def test_b0_both_fcfs_conventions_lose_throughput_to_wait():
    runs = {name: build_and_run(compose_config(["experiment=b0_cascade",
                                                f"paper_policy={name}",
                                                "workload.duration_s=400"]))[0]
            for name in ("greedy_fcfs", "paper_fcfs", "wait_b0")}
    completed = {k: int(r.requests["completed"].sum()) for k, r in runs.items()}
    assert runs["wait_b0"].status == "completed"
    assert runs["wait_b0"].requests["evictions"].sum() == 0
    assert completed["greedy_fcfs"] < 0.9 * completed["wait_b0"]
    assert runs["greedy_fcfs"].requests["evictions"].sum() > 0
    # The paper's FCFS finishes, but its cascade of evictions costs it the paper's 12-25 %
    # of WAIT's throughput (completions per round over the makespan); it never fails an
    # attempt, it evicts before the iteration.
    paper = runs["paper_fcfs"]
    assert paper.status == "completed" and not paper.iterations["failed"].any()
    assert paper.requests["evictions"].sum() > 0
    per_round = {k: completed[k] / float((r.iterations["start_time"]
                                          + r.iterations["duration"]).max())
                 for k, r in runs.items()}
    assert 0.12 <= 1 - per_round["paper_fcfs"] / per_round["wait_b0"] <= 0.25


def test_nested_wait_finishes_a_b3_sized_run():
    result, requests, _ = build_and_run(compose_config(
        ["experiment=b3_nested_lmsys", "paper_policy=nested_lmsys", "timing=linear"]))
    assert result.status == "completed"
    assert result.requests["completed"].all()
    assert len(requests) > 3000  # 55/s for 60 s


@st.composite
def typed_instances(draw):
    m = draw(st.integers(1, 3))
    types = [{"prompt_len": draw(st.integers(1, 6)), "output_len": draw(st.integers(1, 8)),
              "rate": 1} for _ in range(m)]
    kv = max(t["prompt_len"] + t["output_len"] for t in types) * draw(st.integers(1, 6))
    n = draw(st.integers(1, 30))
    kind = np.array(draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n)))
    arrival = np.array(draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)), float)
    thresholds = [draw(st.integers(1, 3)) for _ in range(m)]
    return types, kv, kind, arrival, thresholds


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("nested", [False, True])
@settings(max_examples=40, deadline=None)
@given(instance=typed_instances())
def test_threshold_policy_invariants(nested, timing, instance):
    types, kv, kind, arrival, thresholds = instance
    s = np.array([types[k]["prompt_len"] for k in kind])
    o = np.array([types[k]["output_len"] for k in kind])
    if nested:
        policy = NestedWait(EvictLIFO(), boundaries=[2, 4], max_stage=8,
                            n=[thresholds[0], 1, 1])
    else:
        policy = Wait(EvictLIFO(), types, n=thresholds)
    requests = Requests(s, o, arrival=arrival, type_id=kind)
    result = Engine(requests, policy, TIMINGS[timing](), explicit(kv), livelock_window=3000).run()
    check_invariants(result, s, o, arrival, kv)
