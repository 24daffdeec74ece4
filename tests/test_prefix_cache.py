"""The prefix cache on hand-checkable cases: what a hit saves, which free entry a reclaim
takes, and an admission's own hits kept from a reclaim of the same step.

Blocks hold 4 tokens; a prompt's content ids name its blocks (``block_unit=4``), so two
prompts with the same leading ids share those full blocks. Unit timing: one step, one unit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from replay.engine.kv import KVCapacity
from replay.engine.loop import Engine
from replay.engine.overflow import EvictLIFO
from replay.engine.policy import Batch, PolicyView
from replay.engine.requests import Requests
from replay.timing.simple import UnitTiming
from tests.oracle import engine as oracle
from tests.oracle.policies import OracleEvictLIFO
from tests.test_oracle import CACHE_POLICIES, assert_identical, prefix_workloads

BLOCK = 4


def run(prompt, output, arrival, ids, kv_tokens, cache="block_hash", eviction="lru",
        policy=FCFSLookahead):
    """A run of requests whose prompts start with the content ids ``ids[i]``."""
    offsets = np.cumsum([0] + [len(i) for i in ids])
    requests = Requests(np.array(prompt), np.array(output), arrival=np.array(arrival, float),
                        block_ids=np.array([k for i in ids for k in i], np.int64),
                        block_offsets=offsets.astype(np.int64), block_unit=BLOCK)
    kv = KVCapacity(tokens=kv_tokens, mode="explicit", block_size=BLOCK, prefix_cache=cache,
                    cache_eviction=eviction)
    return Engine(requests, policy(EvictLIFO()), UnitTiming(), kv).run()


def step_of(result, request_id):
    """The iteration row in which ``request_id`` started."""
    start = result.requests.set_index("request_id").loc[request_id, "start"]
    return result.iterations[result.iterations["start_time"] == start].iloc[0]


def test_a_shared_prefix_is_computed_and_held_once():
    # A runs 8 decode steps; B arrives while A runs, with A's two leading blocks.
    args = dict(prompt=[9, 9], output=[8, 1], arrival=[0, 2], ids=[[1, 2], [1, 2]],
                kv_tokens=64)
    on, off = run(**args), run(**args, cache="none")
    b_on, b_off = step_of(on, 1), step_of(off, 1)
    assert b_off["prefill_tokens"] == 9 and b_on["prefill_tokens"] == 1  # 2 blocks cached
    assert b_on["cached_tokens"] == 8
    assert b_off["kv_peak"] - b_on["kv_peak"] == 2 * BLOCK  # B references A's blocks
    assert on.requests["cached_tokens"].tolist() == [0, 8]
    assert on.prefix_cache["hit_blocks"] == 2 and on.prefix_cache["lookup_blocks"] == 4


def test_a_whole_prompt_in_the_cache_still_computes_its_last_token():
    # B's 8-token prompt is two full cached blocks: one token is computed anyway, as vLLM.
    result = run([8, 8], [1, 1], [0, 5], [[1, 2], [1, 2]], kv_tokens=64)
    assert step_of(result, 1)["prefill_tokens"] == 4  # the second block is looked up no more
    assert result.requests["cached_tokens"].tolist() == [0, 4]


@pytest.mark.parametrize(("eviction", "b_cached"), [("lru", 4), ("fifo", 0)])
def test_a_reclaim_takes_a_prefix_tail_first_under_lru_and_its_head_under_fifo(eviction,
                                                                             b_cached):
    # A (ids 1, 2) leaves two free entries; its tail is freed first, so LRU reclaims the
    # tail when C needs a block, while FIFO takes the oldest entry, A's head, which breaks
    # the chain for B (a block is a hit only after every block before it).
    result = run([9, 5, 9], [1, 1, 1], [0, 3, 10], [[1, 2], [], [1, 2]], kv_tokens=12,
                 eviction=eviction)
    assert result.status == "completed"
    assert result.requests["cached_tokens"].tolist() == [0, 0, b_cached]
    assert result.prefix_cache["reclaimed_blocks"] >= 1


def test_an_admissions_own_hits_are_not_reclaimed_for_the_same_step():
    # B hits A's two free entries; C, admitted in the same decision, needs a block that only
    # a reclaim of those entries would give. B's hits are pinned: C waits for B.
    result = run([9, 9, 3], [1, 1, 1], [0, 5, 5], [[1, 2], [1, 2], [7]], kv_tokens=12)
    assert result.status == "completed"
    assert not result.iterations["failed"].any()
    assert (result.iterations["kv_peak"] <= 12).all()
    assert result.requests["start"].tolist() == [0.0, 5.0, 6.0]
    assert result.requests["cached_tokens"].tolist() == [0, 8, 0]


def test_with_the_cache_off_nothing_is_cached():
    result = run([9, 9], [8, 1], [0, 2], [[1, 2], [1, 2]], kv_tokens=64, cache="none")
    assert result.prefix_cache is None
    assert "cached_tokens" not in result.iterations
    assert "cached_tokens" not in result.requests


@pytest.mark.parametrize("policy", ["fcfs", "mcsf", "vllm", "sarathi", "vllm_v1", "lpm"])
@settings(max_examples=20, deadline=None)
@given(workload=prefix_workloads())
def test_the_cache_keeps_memory_within_capacity_and_frees_every_entry(policy, workload):
    requests, kv, options = workload
    result = Engine(requests, CACHE_POLICIES[policy](), UnitTiming(), kv, seed=0,
                    livelock_window=500, **options).run()
    executed = result.iterations[~result.iterations["failed"]]
    assert (executed["kv_after"] <= kv.tokens).all()
    assert (executed["kv_peak"] <= kv.tokens).all()
    # a request never takes from the cache all of its prompt: its last token is computed
    # (one admitted again after a preemption looks up again, its own blocks included)
    cached = result.requests["cached_tokens"].to_numpy()
    once = result.requests["evictions"].to_numpy() == 0
    assert (cached[once] <= requests.prompt_len[once] - 1).all()
    assert (cached % kv.block_size == 0).all()
    totals = result.prefix_cache
    assert totals["hit_blocks"] <= totals["lookup_blocks"]
    assert totals["entries_at_end"] * kv.block_size <= kv.tokens
    if result.status == "completed":  # every request released its references
        assert result.iterations["kv_after"].iloc[-1] == \
            totals["entries_at_end"] * kv.block_size


class OneAtATime:
    """A user's policy written in Python: the queue's head starts alone when nothing runs.
    It records what ``view.cached_tokens`` says of every waiting request at each step."""

    def __init__(self, overflow) -> None:
        self.overflow, self.seen = overflow, []

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting
        self.seen.append((waiting.tolist(), view.cached_tokens(waiting).tolist()))
        return Batch(start=waiting[:1] if view.running.size == 0 else waiting[:0])


def test_a_python_policy_sees_the_cached_prefix_of_each_waiting_request():
    # A (ids 1, 2) runs first; B shares both of its blocks, C only the first, D none: while
    # A decodes, its prompt's two full blocks are cached. B's 9-token prompt may take both
    # (8 tokens, its last token computed), C's 5-token prompt one, D nothing.
    policy = OneAtATime(EvictLIFO())
    offsets = np.array([0, 2, 4, 6, 7], np.int64)
    requests = Requests(np.array([9, 9, 5, 9]), np.array([3, 1, 1, 1]), arrival=np.zeros(4),
                        block_ids=np.array([1, 2, 1, 2, 1, 3, 7], np.int64),
                        block_offsets=offsets, block_unit=BLOCK)
    kv = KVCapacity(tokens=64, mode="explicit", block_size=BLOCK, prefix_cache="block_hash",
                    cache_eviction="lru")
    Engine(requests, policy, UnitTiming(), kv).run()
    assert policy.seen[0] == ([0, 1, 2, 3], [0, 0, 0, 0])  # nothing cached yet
    assert policy.seen[1] == ([1, 2, 3], [8, 4, 0])  # A prefilled: its blocks are entries


@settings(max_examples=25, deadline=None)
@given(workload=prefix_workloads())
def test_a_python_policy_sees_the_oracles_cached_prefixes(workload):
    requests, kv, options = workload
    ours, theirs = OneAtATime(EvictLIFO()), OneAtATime(OracleEvictLIFO())
    result = Engine(requests, ours, UnitTiming(), kv, seed=0, livelock_window=500,
                    **options).run()
    options.pop("fast_forward")
    reference = oracle.Engine(requests, theirs, UnitTiming(), kv, seed=0, livelock_window=500,
                              **options).run()
    assert ours.seen == theirs.seen
    assert_identical(result, reference)


def test_mcsf_admits_more_with_the_cache_when_memory_binds():
    # A runs; five more with A's 8-token prefix arrive in 40 tokens of KV. MC-SF's check
    # leaves the prefix out of their footprints, so more start at once and all finish
    # sooner than without the cache; the plan missed the prefix that outlives A, so the
    # engine's own check overflows once (model.md says so).
    args = dict(prompt=[9] * 6, output=[4] * 6, arrival=[0] + [1] * 5, ids=[[1, 2]] * 6,
                kv_tokens=40, policy=MCSF)
    on, off = run(**args), run(**args, cache="none")
    assert on.iterations["batch_size"].iloc[1] == 6 and off.iterations["batch_size"].iloc[1] == 3
    assert on.iterations["start_time"].iloc[-1] < off.iterations["start_time"].iloc[-1]
    assert on.iterations["failed"].sum() == 1 and off.iterations["failed"].sum() == 0


def _cache_run(policy: str, fast_forward: bool):
    # Memory full of free cache entries: stretches must reclaim as steps do.
    from replay.config import compose_config
    from replay.run import build_engine

    cfg = compose_config([f"policy={policy}", "workload=shared_prefix", "workload.n=150",
                          "kv=explicit", "kv.tokens=8000", "kv.block_size=16",
                          "kv.prefix_cache=block_hash", "arrivals.rate=0.5", "timing=linear",
                          f"engine.fast_forward={fast_forward}"])
    return build_engine(cfg)[0].run()


@pytest.mark.parametrize("policy", ["fcfs", "mcsf", "vllm", "sarathi"])
def test_fast_forward_gives_the_step_by_steps_results_with_the_cache(policy):
    # A promise holds although the waiting requests' cached prefixes change (this caught
    # MC-SF promising with its whole prompt where its check used the uncached rest).
    fast, steps = _cache_run(policy, True), _cache_run(policy, False)
    assert fast.prefix_cache["hit_blocks"] > 0 and fast.prefix_cache["reclaimed_blocks"] > 0
    assert steps.decisions == len(steps.iterations)
    assert fast.decisions < steps.decisions  # stretches ran: the comparison compares something
    assert fast.iterations.equals(steps.iterations)
    assert fast.requests.equals(steps.requests)


@pytest.mark.parametrize("policy", ["vllm_v1", "lpm"])
def test_policies_that_promise_nothing_with_the_cache_are_asked_at_every_step(policy):
    # LPM does not promise with the cache on (a reclaim can reorder its window) and the
    # vLLM v1 scheduler never does: fast-forwarding leaves their runs step by step.
    fast = _cache_run(policy, True)
    assert fast.prefix_cache["hit_blocks"] > 0
    assert fast.decisions == len(fast.iterations)
