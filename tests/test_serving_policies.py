"""vLLM-like and Sarathi-like policies, the preemption modes and the requeue position.

Every number below was worked out by hand from docs/policies/serving.md and docs/model.md
(unit time; ``block_size=1`` unless a case is about blocks).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from replay.engine.overflow import ClearAll, EvictLIFO
from replay.engine.policy import Batch
from replay.errors import ConfigError
from replay.timing import LinearTiming
from tests.conftest import replay
from tests.test_engine_invariants import TIMINGS, check_invariants


def vllm(**options) -> VLLMLike:
    return VLLMLike(EvictLIFO(), **{"watermark": 0.0, **options})


def sarathi(**options) -> SarathiLike:
    return SarathiLike(EvictLIFO(), **{"watermark": 0.0, **options})


# ---------------------------------------------------------------------------- vLLM-like
def test_vllm_admits_in_queue_order_within_the_batch_token_budget():
    # Prompts 3, 4, 5 with a 7-token budget: iteration 0 prefills requests 0 and 1 (7 tokens),
    # iteration 1 prefills request 2 alone (running decodes pause), then all three decode.
    result = replay([3, 4, 5], [3, 3, 3], vllm(max_num_batched_tokens=7), 100)
    it = result.iterations
    assert it["n_started"].tolist()[:3] == [2, 1, 0]
    assert it["prefill_tokens"].tolist()[:3] == [7, 5, 0]
    assert it["decode_requests"].tolist()[:3] == [0, 0, 3]
    assert result.requests["start"].tolist() == [0, 0, 1]
    # 0 and 1 emitted token 1 at time 1, paused during iteration 1, then decode at 2 and 3.
    assert result.requests["completion"].tolist() == [4, 4, 4]
    assert result.requests["tbt_max"].tolist() == [2, 2, 1]


def test_vllm_caps_running_requests_at_max_num_seqs():
    result = replay([1, 1, 1], [2, 2, 2], vllm(max_num_seqs=2), 100)
    # 0 and 1 run (prefill at 0, decode at 1, done at 2); 2 is admitted at 2, done at 4.
    assert result.requests["start"].tolist() == [0, 0, 2]
    assert result.requests["completion"].tolist() == [2, 2, 4]


@pytest.mark.parametrize(("watermark", "starts"), [(0.0, [0, 0]), (0.1, [0, 5])])
def test_vllm_keeps_the_watermark_free_at_admission(watermark, starts):
    # M = 100. Request 0 (s=50, o=5) takes 51 slots after its prefill; request 1 (s=40) needs
    # 41: 100 - 51 - 41 = 8 free, below a 10-slot watermark, so it waits until request 0
    # completes at 5 (request 0 holds 55 at its peak: 45 free, still 4 short of 41 + 10).
    result = replay([50, 40], [5, 5], vllm(watermark=watermark), 100)
    assert result.requests["start"].tolist() == starts


@pytest.mark.parametrize("policy", [vllm, sarathi])
def test_a_lone_request_is_admitted_past_the_watermark(policy):
    # M = 100 with half kept free: request 0 (s=60) needs 61 slots, which breaks the
    # watermark, but with nothing running it starts at once (else nothing could ever run).
    # Request 1 (s=30, arriving at 1) needs 31 and waits until request 0 completes at 3.
    result = replay([60, 30], [3, 2], policy(watermark=0.5), 100, arrival=[0, 1])
    assert result.requests["start"].tolist() == [0, 3]


def preemption_case(mode: str, timing=None):
    # M = 20: A and B (s=5, o=10) start together (6 + 6 slots) and grow by 2 per decode. After
    # iteration 4 they hold 10 each; iteration 5 would need 22, so B (the later arrival) is
    # preempted with 5 tokens emitted. A runs alone until it completes at 10 (holding 11..15,
    # so B's 11-slot readmission never fits before), then B is readmitted at 10.
    return replay([5, 5], [10, 10], vllm(), 20, timing=timing, preemption=mode)


def test_vllm_preempts_the_latest_arrival():
    result = preemption_case("recompute")
    assert result.requests["evictions"].tolist() == [0, 1]
    assert result.iterations["n_evicted"].tolist()[5] == 1
    assert not result.iterations["failed"].any()


def test_recompute_keeps_emitted_tokens_and_charges_the_re_prefill():
    req = preemption_case("recompute").requests
    # B re-prefills s + 5 = 10 tokens at 10 (emitting token 6), then decodes 7..10 at 11..14.
    assert req["completion"].tolist() == [10, 15]
    assert req["first_token"].tolist() == [1, 1]  # token 1 was kept
    assert req["tbt_max"].tolist() == [1, 6]      # token 5 at 5, token 6 at 11
    it = preemption_case("recompute").iterations
    assert it.loc[10, ["prefill_tokens", "n_started", "kv_peak"]].tolist() == [10, 1, 11]
    # The re-prefill is priced as a 10-token prefill from an empty cache (10 KV tokens
    # touched, 10 prefill tokens), not as the 5-token prompt a restart would prefill.
    timed = preemption_case("recompute", LinearTiming(d0=1.0, d1=0.1, d2=0.01)).iterations
    restarted = timed[timed["n_started"] == 1]
    assert restarted["duration"].tolist() == pytest.approx([1.0 + 0.1 * 10 + 0.01 * 10])


def test_restart_loses_emitted_tokens():
    result = preemption_case("restart")
    req = result.requests
    # Restarted, B needs only its prompt plus one token (6 slots), so vLLM readmits it as soon
    # as A leaves 6 free (prefill-only iterations 6, 9, 11, A paused) and preempts it again at
    # the next decode that would overflow (8, 10, 12). A's ten tokens: 1-5 at 0-4, 6 at 5, then
    # 7, 8, 9, 10 at 7, 8, 10, 12: done at 13. B then runs alone from 13: done at 23.
    assert result.iterations["n_evicted"].tolist()[5:13] == [1, 0, 0, 1, 0, 1, 0, 1]
    assert req["evictions"].tolist() == [0, 4]
    assert req["completion"].tolist() == [13, 23]
    assert req["first_token"].tolist() == [1, 14]  # the final attempt's token 1
    assert req["tbt_max"].tolist() == [2, 1]


# ------------------------------------------------------------------------- Sarathi-like
def test_sarathi_continues_the_partial_prefill_first():
    # Budget 4. Iteration 0: A (s=6) takes a 4-token chunk. Iteration 1: A's last 2 tokens (it
    # emits token 1), then B (s=3) takes the remaining 2. Iteration 2: A decodes (done), B's
    # last token. Iteration 3: B decodes (done).
    result = replay([6, 3], [2, 2], sarathi(chunk_size=4), 100)
    it, req = result.iterations, result.requests
    assert it["prefill_tokens"].tolist() == [4, 4, 1, 0]
    assert it["decode_requests"].tolist() == [0, 0, 1, 1]
    assert req["start"].tolist() == [0, 1]
    assert req["first_token"].tolist() == [2, 3]
    assert req["completion"].tolist() == [3, 4]


@pytest.mark.parametrize(("chunk_size", "c_start"), [(2, 3), (3, 1)])
def test_sarathi_decodes_first_and_counts_them_in_the_budget(chunk_size, c_start):
    # A, B (s=1, o=3) prefill at 0 and decode at 1 and 2; C (s=1) arrives at 1. With a 2-token
    # budget the two decodes use it all, so C starts only at 3; with 3 tokens C joins at 1.
    result = replay([1, 1, 1], [3, 3, 1], sarathi(chunk_size=chunk_size), 100,
                    arrival=[0, 0, 1])
    assert result.requests["start"].tolist() == [0, 0, c_start]


@pytest.mark.parametrize(("reserve", "b_start", "b_done"), [(False, 1, 3), (True, 2, 4)])
def test_sarathi_reserve_prompt_reserves_the_whole_prefill(reserve, b_start, b_done):
    # M = 8, budget 3, A and B (s=4, o=1). Iteration 0: A's first 3 tokens. Iteration 1: A's
    # last token (it completes holding 5). Without reservation A holds 3 when iteration 1 is
    # planned, so B fits a 2-token chunk (3 + 2 + 2 <= 8); with reservation A's whole prefill
    # (5 slots) is taken and B (5 slots) must wait for A to finish.
    result = replay([4, 4], [1, 1], sarathi(chunk_size=3, reserve_prompt=reserve), 8)
    assert result.requests["start"].tolist() == [0, b_start]
    assert result.requests["completion"].tolist() == [2, b_done]


@pytest.mark.parametrize(("reserve", "evictions", "prefill_tokens"),
                         [(False, 3, [10, 8, 6, 10]), (True, 1, [10, 10])])
def test_sarathi_preempts_the_latest_arrival(reserve, evictions, prefill_tokens):
    # As in the vLLM case, B is preempted at 5 with 5 tokens kept (re-prefill: 10 tokens).
    # Per-chunk KV: at 6 A holds 12 after its decode, so B takes an 8-token chunk (20 slots)
    # that cannot grow: preempted at 7; again with 6 tokens at 8, preempted at 9. Reserving
    # the whole prefill, B (11 slots) waits until A completes at 10. Either way B re-prefills
    # at 10 and completes at 15; without reservation 14 prefill tokens were wasted.
    result = replay([5, 5], [10, 10], sarathi(chunk_size=64, reserve_prompt=reserve), 20,
                    preemption="recompute")
    assert result.requests["evictions"].tolist() == [0, evictions]
    assert result.requests["completion"].tolist() == [10, 15]
    it = result.iterations
    assert it.loc[it["prefill_tokens"] > 0, "prefill_tokens"].tolist() == prefill_tokens


# ----------------------------------------------------------------- blocks and bad options
def test_vllm_counts_whole_blocks():
    # Blocks of 4, M = 16 (4 blocks): three s=3 requests take 1 block each at prefill
    # (4 slots, 12 of 16 counted in blocks); their first decode needs 2 blocks each (5
    # slots), 6 blocks: vLLM preempts the latest, request 2, which starts again at 2. Counted
    # in tokens (block_size=1) all three would fit, and nothing would be preempted.
    result = replay([3, 3, 3], [2, 2, 2], vllm(), 16, block_size=4)
    assert result.requests["start"].tolist() == [0, 0, 2]
    assert result.requests["evictions"].tolist() == [0, 0, 1]
    assert result.iterations["kv_peak"].tolist() == [12, 16, 4, 8]
    assert not result.iterations["failed"].any()


@pytest.mark.parametrize("make", [
    lambda: VLLMLike(EvictLIFO(), max_num_seqs=0),
    lambda: VLLMLike(EvictLIFO(), watermark=1.0),
    lambda: SarathiLike(EvictLIFO(), chunk_size=0),
])
def test_bad_options_are_config_errors(make):
    with pytest.raises(ConfigError, match="policy."):
        make()


def test_a_prompt_beyond_the_batch_token_budget_is_a_config_error():
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        replay([10], [2], vllm(max_num_batched_tokens=8), 100)


# ---------------------------------------------------------------------- requeue position
class ClearFirstThenWatch:
    """Starts the first two requests, lets them grow into an overflow (the engine clears
    both), then only records the waiting queue at each later decision."""

    overflow = ClearAll()

    def __init__(self):
        self.started = False
        self.queues = []

    def decide(self, view):
        if not self.started:
            self.started = True
            return Batch(start=view.waiting[:2])
        if view.running.size == 0:
            self.queues.append(view.waiting.tolist())
        return Batch()


@pytest.mark.parametrize(("requeue", "queues"), [
    ("front", [[0, 1, 2, 3], [0, 1, 2, 3, 4]]),
    ("back", [[2, 3, 0, 1], [2, 3, 0, 1, 4]]),
])
def test_requeue_position_of_cleared_requests(requeue, queues):
    # M = 8: 0 and 1 (s=2, o=5) start at 0 (3 + 3), grow to 8 at 1, and overflow at 2 (10):
    # both are cleared while 2 and 3 (arrived at 0) wait. At 3 the queue is shown; request 4
    # arrives at 3.5 and queues behind the cleared requests in both modes.
    policy = ClearFirstThenWatch()
    result = replay([2, 2, 1, 1, 1], [5, 5, 1, 1, 1], policy, 8, arrival=[0, 0, 0, 0, 3.5],
                    requeue=requeue)
    assert result.status == "stalled"
    assert result.requests["evictions"].tolist() == [1, 1, 0, 0, 0]
    assert policy.queues == queues


@pytest.mark.parametrize(("requeue", "start", "completion"), [
    ("back", 9.0, 10.0),
    ("front", np.nan, np.nan),
])
def test_protection_serves_a_waiting_request_when_cleared_ones_requeue_behind_it(
        requeue, start, completion):
    # Unit time, M = 20, alpha = 0.5: a start must fit 10 less the KV held. Requests 0 and 1
    # (s=2, o=10) start at 0 (3 + 3); request 2 (s=6: 7) waits while they hold 6, 8, ...
    # The attempt at 8 would hold 2 x 11 = 22 > 20: ClearAll clears both at 9. Requeued
    # behind request 2 (back), 2 and 0 start at 9 (7 + 3 = 10) and 2 completes at 10;
    # requeued in front of it, 0 and 1 start again and overflow again: 2 never starts. (0
    # and 1 never both fit, 2 x 12 > 20: both runs end livelocked.)
    result = replay([2, 2, 6], [10, 10, 1], AlphaProtection(0.5, ClearAll()), 20,
                    requeue=requeue, livelock_window=100)
    assert result.status == "livelock"
    assert (result.requests["evictions"][:2] >= 1).all()
    assert_allclose(result.requests[["start", "completion"]].iloc[2], [start, completion])


# ---------------------------------------------------------------------------- invariants
@st.composite
def paged_instances(draw, max_n: int = 20):
    block = draw(st.sampled_from([1, 4]))
    kv = block * draw(st.integers(max(3, 8 // block), 120 // block))
    n = draw(st.integers(1, max_n))
    s = draw(st.lists(st.integers(1, kv // 2), min_size=n, max_size=n))
    o = [draw(st.integers(1, kv - si)) for si in s]
    arrival = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    return kv, block, np.array(s), np.array(o), np.array(arrival, dtype=float)


SERVING = {
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
    "sarathi_reserve": lambda: SarathiLike(EvictLIFO(), chunk_size=16, reserve_prompt=True),
}


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("requeue", ["front", "back"])
@pytest.mark.parametrize("preemption", ["restart", "recompute"])
@pytest.mark.parametrize("policy", SERVING)
@settings(max_examples=25, deadline=None)
@given(instance=paged_instances())
def test_serving_invariants(policy, preemption, requeue, timing, instance):
    kv, block, s, o, arrival = instance
    result = replay(s, o, SERVING[policy](), kv, arrival=arrival, timing=TIMINGS[timing](),
                    block_size=block, preemption=preemption, requeue=requeue)
    assert result.status == "completed", result.message
    check_invariants(result, s, o, arrival, kv)
    assert not result.iterations["failed"].any(), "the policy should preempt, not overflow"
    req = result.requests
    assert (req["tbt_max"].fillna(0) >= 0).all()
    assert (req["tbt_mean"].dropna() <= req["tbt_max"].dropna() + 1e-9).all()


@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.integers(-50, 400),
       st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)  # the first example compiles
def test_the_latest_arrivals_are_preempted_until_the_rest_fit(blocks_after, capacity, rng):
    """vLLM's preemption order (the latest arrival first, until the rest fit), against the
    oracle's sort: with few victims (found one pass at a time) and with many (sorted). A
    capacity below zero (blocks shared under the prefix cache) preempts every one."""
    from policies.common.serving import preempt_latest_until_fit
    from tests.oracle.policies import preempt_latest_until_fit as oracle

    ids = np.array(rng.sample(range(1000), len(blocks_after)), dtype=np.int64)
    after = np.array(blocks_after, dtype=np.int64)
    keep = oracle(ids, after, capacity)
    cut = preempt_latest_until_fit(ids, after, ids.size, capacity)
    if keep is None:
        assert cut == -1
    else:
        assert cut == ids[~keep].min()
        assert np.array_equal(keep, ids < cut)


@pytest.mark.parametrize("capacity", [5, 4, 3, 2, 0])
def test_preemptions_past_the_few_found_by_passes_go_on_in_id_order(capacity):
    """Twelve requests of one block each: 7, 8, 9, 10 and 12 of them must go, the latest
    arrivals first, on both sides of the eighth (past which the ids are sorted)."""
    from policies.common.serving import preempt_latest_until_fit

    ids = np.array([35, 7, 63, 0, 21, 77, 14, 49, 70, 28, 56, 42], dtype=np.int64)
    cut = preempt_latest_until_fit(ids, np.ones(12, dtype=np.int64), 12, capacity)
    assert cut == np.sort(ids)[capacity]
