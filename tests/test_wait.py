"""WAIT and Nested WAIT (docs/policies/wait.md): hand-worked schedules, the throughput and
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
from replay.engine.metrics import summarize
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


# ------------------------------------------------------ the WAIT authors' options
B1_HIGH = [{"prompt_len": 20, "output_len": o, "rate": r}
           for o, r in ((100, 6000), (200, 4000), (300, 2000))]


def test_the_authors_thresholds_and_limits_on_b1_high():
    # WAIT: w = rate (o + 1) = 606,000, 804,000, 602,000 (sum 2,012,000); at B = 500,
    # L = 150.60, 199.80, 149.60 and L / (o + 1) = 1.49, 0.99, 0.50 -> n = 1, 1, 1; at
    # B = 2,100, L = 632.5, 839.2, 628.3 -> n = int(6.26), int(4.18), int(2.09) = 6, 4, 2.
    for cap, n in ((500, [1, 1, 1]), (2100, [6, 4, 2])):
        wait = Wait(EvictLIFO(), B1_HIGH, thresholds="authors", batch_limit=cap,
                    in_flight_limit="per_type")
        assert wait.per_stage.tolist() == n
        assert wait.in_flight_limits == pytest.approx(
            [cap * w / 2_012_000 for w in (606_000, 804_000, 602_000)])
    # Nested WAIT: segments of 101, 100, 100 stages (0..100, 101..200, 201..300) with
    # weights 101 x 12,000, 100 x 6,000, 100 x 2,000 (sum 2,012,000); at B = 500 the
    # per-stage shares are 2.98, 1.49, 0.50 -> 2, 1, 1; at B = 2,100: 12.5, 6.3, 2.1.
    for cap, n in ((500, [2, 1, 1]), (2100, [12, 6, 2])):
        nested = NestedWait(EvictLIFO(), types=B1_HIGH, thresholds="authors", batch_limit=cap)
        assert nested.per_stage.tolist() == n
        assert nested.edges.tolist() == [0, 101, 201, 301]
    # Segment 2 starts at stage 101, not 100: boundaries [100, 200] are not theirs.
    with pytest.raises(ConfigError, match=r"boundaries=\[100, 200\].*\[101, 201\]"):
        NestedWait(EvictLIFO(), types=B1_HIGH, thresholds="authors", boundaries=[100, 200])
    NestedWait(EvictLIFO(), types=B1_HIGH, thresholds="authors", boundaries=[101, 201])
    with pytest.raises(ConfigError, match="policy.ratios must be null"):
        NestedWait(EvictLIFO(), types=B1_HIGH, thresholds="authors", ratios=[6, 3, 1])


def test_a_per_type_limit_cuts_admissions():
    # One type (s, o) = (1, 3), n = 2, B = 2.5: the type owns L = 2.5 and may admit
    # min(2, int(2.5 - in flight)). Four requests at t=0, a late one at 50. t=0: room 2,
    # start 0, 1. t=1, 2: room int(0.5) = 0, nothing starts (2 and 3 wait; 0 and 1 run on).
    # t=3: 0 and 1 are done, start 2, 3 (done at 6). At 50 the last arrival drains: 4 starts.
    # The paper's per-stage limit starts 2 and 3 at t=1 instead.
    types = [{"prompt_len": 1, "output_len": 3, "rate": 1}]
    per_type = Wait(EvictLIFO(), types, n=[2], batch_limit=2.5, in_flight_limit="per_type")
    result = typed_replay([1] * 5, [3] * 5, [0] * 5, [0, 0, 0, 0, 50], per_type, 100)
    assert result.requests["start"].tolist() == [0, 0, 3, 3, 50]
    assert result.requests["completion"].tolist() == [3, 3, 6, 6, 53]
    assert result.iterations["batch_size"].tolist() == [2, 2, 2, 2, 2, 2, 1, 1, 1]
    per_stage = Wait(EvictLIFO(), types, n=[2])
    result = typed_replay([1] * 5, [3] * 5, [0] * 5, [0, 0, 0, 0, 50], per_stage, 100)
    assert result.requests["start"].tolist() == [0, 0, 1, 1, 50]


def test_any_type_readiness_admits_every_type_and_a_full_type_counts_as_ready():
    # Types 0 and 1, (s, o) = (1, 4), rates 1 and 3, B = 4: w = 5, 15, so L = 1 and 3;
    # n = (1, 3). Request 0 (type 0) at t=0, 1 (type 1) at t=1, 2 (type 0) at 50.
    # t=0: type 0 has min(1, int(1 - 0)) = 1 waiting: ready; 0 starts. t=1: type 0 has no
    # room left (int(1 - 1) = 0), which counts as ready; type 1 has 1 < min(3, 3) waiting.
    # With any_type a ready type 0 lets type 1 admit too: 1 starts at t=1. With own_type,
    # type 1 waits for the drain at 50.
    types = [{"prompt_len": 1, "output_len": 4, "rate": 1},
             {"prompt_len": 1, "output_len": 4, "rate": 3}]
    starts = {}
    for readiness in ("any_type", "own_type"):
        policy = Wait(EvictLIFO(), types, n=[1, 3], batch_limit=4, in_flight_limit="per_type",
                      readiness=readiness)
        assert policy.in_flight_limits.tolist() == [1.0, 3.0]
        result = typed_replay([1] * 3, [4] * 3, [0, 1, 0], [0, 1, 50], policy, 100)
        starts[readiness] = result.requests["start"].tolist()
    assert starts == {"any_type": [0, 1, 50], "own_type": [0, 50, 50]}


def test_until_a_type_is_ready_nothing_runs_in_flight_included():
    # Paper limits, any_type readiness: n = (1, 2), (s, o) = (1, 3). t=0: type 0 is ready, so
    # 0 (type 0) and 1 (type 1) both start. t=1: 2 (type 1) arrives, no type is ready: 0 and
    # 1 pause at stage 1 until the last arrival (3, type 0) at 20 drains everything.
    types = [{"prompt_len": 1, "output_len": 3, "rate": 1}] * 2
    policy = Wait(EvictLIFO(), types, n=[1, 2], readiness="any_type")
    result = typed_replay([1] * 4, [3] * 4, [0, 1, 1, 0], [0, 0, 1, 20], policy, 100)
    req = result.requests
    assert req["start"].tolist() == [0, 0, 20, 20]
    assert req["completion"].tolist() == [22, 22, 23, 23]
    assert result.iterations["start_time"].tolist()[:2] == [0, 20]


def test_force_clear_drops_the_rest_and_ends_the_run():
    # One type (s, o) = (1, 2), n = 2, arrivals 0, 0, 1, 1, 2. t=0: start 0, 1. t=1: start
    # 2, 3; 0 and 1 finish at t=2. t=2: 4 arrives, the last; one waits (< 2): no type is
    # ready, so 4 (waiting) and 2, 3 (in flight, stage 1) are dropped and the run ends.
    types = [{"prompt_len": 1, "output_len": 2, "rate": 1}]
    policy = Wait(EvictLIFO(), types, n=[2], force_clear=True)
    requests = Requests(np.ones(5, int), np.full(5, 2), arrival=np.array([0, 0, 1, 1, 2.0]),
                        type_id=np.zeros(5, int))
    result = Engine(requests, policy, UnitTiming(), explicit(100)).run()
    assert result.status == "completed" and result.dropped == 3
    assert result.requests["completed"].tolist() == [True, True, False, False, False]
    assert result.requests["completion"].tolist()[:2] == [2, 2]
    assert len(result.iterations) == 2  # nothing ran after the clear
    assert summarize(result)["n_dropped"] == 3 and summarize(result)["n_completed"] == 2
    # Without it the drain rule finishes every request.
    drained = Engine(requests, Wait(EvictLIFO(), types, n=[2]), UnitTiming(),
                     explicit(100)).run()
    assert drained.dropped == 0 and drained.requests["completed"].all()


def test_nested_force_clear_opens_segments_on_their_own_after_the_last_arrival():
    # Segments {0} and {1, ...}, n = (2, 1), force_clear. 0 and 1 (o = 3) at t=0, 2 (o = 1)
    # at t=2, the last. t=0: start 0, 1. t=1: one segment-1 entry short (0 < 2) -> pause.
    # t=2: segment 1 stays shut (1 < 2) but segment 2 opens on its own (stage 1 holds 2 >=
    # 1): 0 advances (1 per stage). t=3: 1 to stage 2, 0 to stage 3 (done at 4). t=4:
    # neither segment can open: 1 (in flight) and 2 (waiting) are dropped.
    policy = NestedWait(EvictLIFO(), boundaries=[1], max_stage=3, n=[2, 1], force_clear=True)
    result = typed_replay([1] * 3, [3, 3, 1], [0] * 3, [0, 0, 2], policy, 100)
    assert result.status == "completed" and result.dropped == 2
    assert result.requests["completion"].tolist()[0] == 4
    assert result.requests["completed"].tolist() == [True, False, False]
    assert result.iterations["batch_size"].tolist() == [2, 1, 2]


def test_the_authors_paper_policies_are_their_variant():
    from replay.experiments.authors import their_variant

    for paper_policy, theirs in (("wait_authors", True), ("nested_authors", True),
                                 ("wait", False)):
        cfg = compose_config([f"paper_policy={paper_policy}", "workload=typed",
                              "arrivals=trace"])
        assert their_variant(cfg.policy) is theirs
    cfg = compose_config(["paper_policy=wait", "workload=typed", "arrivals=trace",
                          "policy.force_clear=true"])
    assert not their_variant(cfg.policy)  # force_clear alone is not their scheduler


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
