"""policy=vllm_v1 (vLLM 0.19's V1 scheduler): hand-checked cases and invariants.

Unit time (one step per round) and ``recompute`` preemption (vLLM's) throughout; every number
below was worked out by hand from the rules in policies/vllm_v1.py. ``reserved_blocks=0``
unless a case is about it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.vllm_v1 import VLLMV1
from replay.engine.overflow import EvictLIFO
from replay.errors import ConfigError
from tests.conftest import replay as replay_with
from tests.test_engine_invariants import TIMINGS, check_invariants, instances


def replay(*args, **options):
    return replay_with(*args, preemption="recompute", **options)


def v1(**options) -> VLLMV1:
    return VLLMV1(EvictLIFO(), **{"reserved_blocks": 0, "max_num_batched_tokens": 2048,
                                  **options})


def test_the_budget_is_split_between_a_decode_and_a_chunk():
    # Budget 8. A (s=4, o=5) prefills alone at 0. B (s=20) arrives at 1: from then on A
    # decodes one token per step and B takes the other 7 (chunks 7, 7, 6; the last emits its
    # first token at 4). A completes at 5; B decodes its second token at 4 and completes too.
    result = replay([4, 20], [5, 2], v1(max_num_batched_tokens=8), 100, arrival=[0, 1])
    it = result.iterations
    assert it["prefill_tokens"].tolist() == [4, 7, 7, 6, 0]
    assert it["decode_requests"].tolist() == [0, 1, 1, 1, 2]
    assert result.requests["first_token"].tolist() == [1, 4]
    assert result.requests["completion"].tolist() == [5, 5]


def test_the_most_recently_admitted_request_is_preempted_when_blocks_run_out():
    # Blocks of 4, 10 blocks. A and B (s=7, o=20) start at 0 with 2 blocks each and grow a
    # block at 9, 13, 17 and 21 slots. At step 13 both hold 20 slots (10 blocks): A needs a
    # new block, so B (the running list's tail) is preempted with 13 tokens emitted. C (s=1,
    # o=1) arrives at 13: nothing is admitted in a step that preempted, and from 14 B (20
    # slots to recompute, 5 blocks) heads the queue and does not fit beside A, so C waits
    # behind it. A completes at 20; then B recomputes its 20 tokens (emitting token 14) and
    # C prefills in the same step (C completes at 21); B decodes 6 more and completes at 27.
    result = replay([7, 7, 1], [20, 20, 1], v1(), 40, arrival=[0, 0, 13], block_size=4)
    req, it = result.requests, result.iterations
    assert req["evictions"].tolist() == [0, 1, 0]
    assert req["start"].tolist() == [0, 20, 20]
    assert req["completion"].tolist() == [20, 27, 21]
    assert it["n_evicted"].tolist()[13] == 1
    assert it["n_started"].tolist()[13:20] == [0] * 7
    assert (it["kv_peak"] <= 40).all()


def test_running_requests_stay_within_max_num_seqs():
    # Two seats: requests 0 and 1 run (prefill at 0, decode at 1, done at 2); request 2 is
    # admitted at 2 and completes at 4.
    result = replay([1, 1, 1], [2, 2, 2], v1(max_num_seqs=2), 100)
    assert result.requests["start"].tolist() == [0, 0, 2]
    assert result.requests["completion"].tolist() == [2, 2, 4]


@pytest.mark.parametrize(("gate", "start", "evictions"), [(True, 9, 0), (False, 8, 1)])
def test_the_whole_sequence_must_fit_at_admission(gate, start, evictions):
    # M = 30, budget 4. A (s=20, o=5) prefills 4 tokens a step (steps 0-4) and decodes at
    # 5-8, completing at 9. B (s=12, o=2) waits from 0. At step 5 the free slots (8 after
    # A's decode) hold B's first 3-token chunk but not its 12 tokens: with the gate B waits
    # for A and starts at 9; without it B starts at 5, runs out of room at 7 (preempting
    # itself, the running list's tail), restarts at 8. B completes at 13 either way.
    result = replay([20, 12], [5, 2], v1(max_num_batched_tokens=4, reserve_full_isl=gate), 30)
    req = result.requests
    assert req["start"].tolist() == [0, start]
    assert req["evictions"].tolist() == [0, evictions]
    assert req["completion"].tolist() == [9, 13]


def test_a_long_prefill_is_cut_to_the_threshold():
    result = replay([10], [1], v1(long_prefill_token_threshold=3), 100)
    assert result.iterations["prefill_tokens"].tolist() == [3, 3, 3, 1]
    assert result.requests["first_token"].tolist() == [4]


def test_reserved_blocks_are_never_handed_out():
    # 10 blocks of 1 slot, one reserved: a request needing 10 slots (s=9 and its first
    # token) never starts; with none reserved it does.
    assert replay([9], [1], v1(), 10).requests["completed"].tolist() == [True]
    result = replay([9], [1], v1(reserved_blocks=1), 10)
    assert result.status == "stalled"


@pytest.mark.parametrize(("options", "key"), [
    (dict(max_num_seqs=0), "max_num_seqs"), (dict(max_num_batched_tokens=0),
                                             "max_num_batched_tokens"),
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    (dict(reserved_blocks=-1), "reserved_blocks")])
def test_bad_limits_are_config_errors(options, key):
    with pytest.raises(ConfigError, match=f"policy.{key}"):
        v1(**options)


def test_a_reserve_of_every_block_is_a_config_error():
    with pytest.raises(ConfigError, match="policy.reserved_blocks=10 leaves no KV block"):
        replay([1], [1], v1(reserved_blocks=10), 10)


@pytest.mark.parametrize("timing", TIMINGS)
@settings(max_examples=40, deadline=None)
@given(instance=instances(), budget=st.integers(1, 40), seats=st.integers(1, 6),
       block=st.sampled_from([1, 4]))
def test_steps_keep_vllms_limits(timing, instance, budget, seats, block):
    kv, s, o, arrival = instance
    kv = max(kv // block * block, block * 2)
    s, o = np.minimum(s, kv // 2), np.minimum(o, kv // 2)
    result = replay(s, o, v1(max_num_batched_tokens=budget, max_num_seqs=seats), kv,
                    arrival=arrival, timing=TIMINGS[timing](), block_size=block,
                    livelock_window=2000)
    check_invariants(result, s, o, arrival, kv)
    it = result.iterations
    assert not it["failed"].any(), "the policy asked for a batch beyond the KV capacity"
    assert (it["prefill_tokens"] + it["decode_requests"] <= budget).all()
    assert not ((it["n_evicted"] > 0) & (it["n_started"] > 0)).any(), \
        "a step that preempted also admitted"
    running = np.cumsum(it["n_started"] - it["n_completed"] - it["n_evicted"])
    assert (running <= seats).all()
