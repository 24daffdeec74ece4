"""The WAIT paper's FCFS (policies/paper_fcfs.py): new requests first, the latest-started
running ones evicted until the iteration fits, the rest of the batch runs. Hand-checked in
unit time, against the greedy FCFS under the engine's own overflow convention."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.paper_fcfs import PaperFCFS
from policies.protection import AlphaProtection
from replay.engine.overflow import EvictLIFO
from tests.conftest import replay

# Four requests (s, o) = (1, 2): after its prefill a request holds 2 slots, after its
# decode 3 (then it completes and frees them). M = 6. Requests 0, 1 arrive at round 0,
# requests 2, 3 at round 1.
HAND = dict(prompt_len=[1] * 4, output_len=[2] * 4, kv_tokens=6, arrival=[0, 0, 1, 1])


def test_hand_case_evicted_work_is_lost_and_the_rest_of_the_batch_runs():
    # Round 0: nothing held; admit 0 and 1 (2 + 2 <= 6). Peak 4.
    # Round 1: held 4, free 2: admit 2 (2 <= 2). Next iteration: 0 and 1 grow to 3 each,
    #   2 takes 2: 8 > 6, 2 too many. Evict the latest started running request, 1 (it
    #   would hold 3), and its round-0 prefill is lost. The rest runs: 0 decodes and
    #   completes at 2, 2 prefills. Peak 3 + 2 = 5, after 2 (request 2).
    # Round 2: queue 1, 3 (1 by its original arrival). Held 2, free 4: admit both.
    #   Next: 2 would hold 3, plus 2 + 2: 7 > 6; evict 2, the only running request, which
    #   loses the prefill it had. The rest runs: 1 and 3 prefill. Peak 4, after 4.
    # Round 3: queue 2. Held 4, free 2: admit 2. Next: 1 and 3 -> 3 each, plus 2: 8 > 6;
    #   evict 3 (started with 1 at round 2, admitted after it). 1 completes at 4, 2
    #   prefills. Peak 5, after 2.
    # Round 4: queue 3. Held 2, free 4: admit 3. Next: 3 + 2 = 5 fits. 2 completes at 5.
    # Round 5: 3 decodes alone (peak 3) and completes at 6.
    result = replay(HAND["prompt_len"], HAND["output_len"], PaperFCFS(EvictLIFO()),
                    HAND["kv_tokens"], arrival=HAND["arrival"])
    assert result.status == "completed"
    it = result.iterations
    assert it["start_time"].tolist() == [0, 1, 2, 3, 4, 5]
    assert it["batch_size"].tolist() == [2, 2, 2, 2, 2, 1]
    assert it["n_started"].tolist() == [2, 1, 2, 1, 1, 0]
    assert it["decode_requests"].tolist() == [0, 1, 0, 1, 1, 1]
    assert it["kv_peak"].tolist() == [4, 5, 4, 5, 5, 3]
    assert it["kv_after"].tolist() == [4, 2, 4, 2, 2, 0]
    assert it["n_evicted"].tolist() == [0, 1, 1, 1, 0, 0]
    assert it["n_completed"].tolist() == [0, 1, 0, 1, 1, 1]
    assert not it["failed"].any()  # the engine never saw an overflow: no attempt charged
    req = result.requests
    assert req["completion"].tolist() == [2, 4, 5, 6]
    assert req["start"].tolist() == [0, 2, 3, 4]  # the last (successful) start
    assert req["evictions"].tolist() == [0, 1, 1, 1]
    assert req["latency"].tolist() == [2, 4, 4, 5]
    assert req["tokens_generated"].tolist() == [2, 2, 2, 2]


def test_hand_case_greedy_fcfs_under_the_engines_convention_never_completes():
    # Same admissions, but an overflow fails the whole attempt (charged one round), EvictLIFO
    # evicts and the step is retried. Round 1: 0, 1 and new 2 need 3 + 3 + 2 = 8 > 6: fail,
    # evict 1. Round 2: held 2, admit 1 and 2 (2 + 2 <= 4): 3 + 4 = 7 > 6: fail, evict 0.
    # Round 3: nothing held, admit 0, 1, 2 (6): runs. Round 4: held 6, nothing admitted,
    # 3 + 3 + 3 = 9 > 6: fail, evict 2. Round 5: held 4, admit 2: 8 > 6: fail, evict 1.
    # Round 6: held 2, admit 1 and 2: 7 > 6: fail, evict 0. Round 7 is round 3 again: every
    # executed iteration is a prefill, and no decode is ever allowed to finish.
    result = replay(HAND["prompt_len"], HAND["output_len"], AlphaProtection(0.0, EvictLIFO()),
                    HAND["kv_tokens"], arrival=HAND["arrival"], livelock_window=20)
    assert result.status == "livelock"
    assert not result.requests["completed"].any()
    it = result.iterations
    assert it["failed"].tolist()[:15] == [False, True, True] + [False, True, True, True] * 3
    assert it["n_evicted"].tolist()[:8] == [0, 1, 1, 0, 1, 1, 1, 0]
    assert it.loc[~it["failed"], "decode_requests"].eq(0).all()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 25), block=st.sampled_from([1, 2, 4]), seed=st.integers(0, 10 ** 6),
       preemption=st.sampled_from(["restart", "recompute"]))
def test_paper_fcfs_never_overflows_the_engine(n, block, seed, preemption):
    rng = np.random.default_rng(seed)
    s, o = rng.integers(1, 6, n), rng.integers(1, 6, n)
    arrival = np.sort(rng.integers(0, 15, n)).astype(float)
    kv = int((s + o).max()) * block * 2
    result = replay(s, o, PaperFCFS(EvictLIFO()), kv, arrival=arrival, block_size=block,
                    preemption=preemption)
    assert not result.iterations["failed"].any()
    assert (result.iterations["kv_peak"] <= kv).all()
    assert result.status in ("completed", "livelock"), result.message  # see the ping-pong
    done = result.requests[result.requests["completed"]]
    assert (done["tokens_generated"] == done["output_len"]).all()


def test_new_requests_first_can_ping_pong_two_requests_forever():
    # The rule's own failure mode, which the engine reports as a livelock. M = 6, A = (1, 3)
    # at round 0, B = (3, 2) at round 1. Round 1: A holds 2, free 4 = B's first step: admit
    # B; A would grow to 3, 3 + 4 > 6: evict A. Round 2: B holds 4, free 2 = A's first
    # step: admit A; B would grow to 5, 5 + 2 > 6: evict B. And so on: each admission
    # evicts the request that would have finished next.
    result = replay([1, 3], [3, 2], PaperFCFS(EvictLIFO()), 6, arrival=[0, 1],
                    livelock_window=10)
    assert result.status == "livelock"
    it = result.iterations
    assert it["kv_peak"].tolist()[:5] == [2, 4, 2, 4, 2]
    assert it["n_evicted"].tolist()[:5] == [0, 1, 1, 1, 1]
    assert not it["failed"].any()
