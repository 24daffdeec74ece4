"""Fast-forwarding steady stretches (``Batch.steady_steps``) changes speed, never results.

The oracle comparison (tests/test_oracle.py) draws ``engine.fast_forward`` both ways for
every built-in policy; these are the hand-checked cases, and promises made by a policy
written in Python.
"""

from __future__ import annotations

import numpy as np
import pytest

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from replay.engine.loop import DecisionError
from replay.engine.overflow import EvictLIFO
from replay.engine.policy import UNTIL_CHANGE, Batch
from replay.engine.rules import price_shape
from replay.engine.timing import BatchShape
from replay.timing import LinearTiming, UnitTiming
from tests.conftest import replay
from tests.test_oracle import fake_vidur

POLICIES = {
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
}


def assert_same_run(fast, slow):
    assert (fast.status, fast.message) == (slow.status, slow.message)
    assert fast.requests.equals(slow.requests)
    assert fast.iterations.equals(slow.iterations)
    fast_gaps, slow_gaps = fast.token_gaps.summary(), slow.token_gaps.summary()
    assert fast_gaps == slow_gaps  # count, exact float mean and max, quantiles
    assert (fast.token_gaps.counts == slow.token_gaps.counts).all()
    assert slow.decisions == len(slow.iterations)
    assert fast.decisions <= slow.decisions


def test_a_lone_request_asks_the_policy_twice():
    """Prefill step, then the first decode (steady), whose stretch runs through the step that
    completes the request: 2 decisions, 50 steps, the last one logging the completion."""
    for make in (POLICIES["fcfs"], POLICIES["mcsf"], POLICIES["vllm"], POLICIES["sarathi"]):
        result = replay([4], [50], make(), 100, timing=LinearTiming(0.01, 1e-4))
        assert len(result.iterations) == 50 and result.decisions == 2
        assert result.iterations["n_completed"].tolist() == [0] * 49 + [1]
        assert result.iterations["kv_after"].tolist()[-2:] == [53, 0]
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


class _StartsAllSteadily:
    """Starts everything waiting with a first chunk of one token, every prefill going on by
    one token, and promises the batch repeats (true only if the engine starts them all)."""

    overflow = EvictLIFO()

    def decide(self, view):
        prefills = np.concatenate((view.running, view.waiting))
        return Batch(start=view.waiting, prefill_chunks={
            int(r): 1 for r in prefills if view.prefill_len[r] - view.prefilled[r] > 1},
            steady_steps=UNTIL_CHANGE)


def test_the_caps_cut_a_start_its_chunk_and_its_promise():
    # Two prompts of 4 wait at 0 and the engine starts one per step: request 1's chunk is
    # dropped with it, and the promise is not read (it would hold request 1 back until
    # request 0's last chunk).
    runs = [replay([4, 4], [6, 6], _StartsAllSteadily(), 100, max_starts_per_round=1,
                   fast_forward=switch) for switch in (True, False)]
    assert_same_run(*runs)
    assert runs[0].requests["start"].tolist() == [0, 1]
    assert runs[0].iterations["prefill_tokens"].tolist()[:2] == [1, 2]
    assert runs[0].decisions < len(runs[0].iterations)  # promises read once both started


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


def test_a_chunked_prompt_asks_the_policy_once_per_phase():
    """A lone 100-token prompt in chunks of 16 (6 full chunks, then 4 tokens), then its
    decodes, whose stretch ends with the completing step: results as if asked every step."""
    for reserve in (False, True):
        runs = [replay([100], [10], SarathiLike(EvictLIFO(), chunk_size=16,
                                                reserve_prompt=reserve), 200,
                       timing=LinearTiming(0.01, 1e-4), block_size=4, fast_forward=switch)
                for switch in (True, False)]
        assert_same_run(*runs)
        assert runs[0].iterations["prefill_tokens"].tolist()[:8] == [16] * 6 + [4, 0]
        assert len(runs[0].iterations) == 16 and runs[0].decisions < 16


class _ChunksSteadily:
    """Starts what waits, then feeds every running prompt 3 tokens a step (a chunk that is
    not its last), promising the batch repeats: a Python policy's promise with chunks."""

    overflow = EvictLIFO()

    def decide(self, view):
        if view.waiting.size:
            return Batch(start=view.waiting[:1], prefill_chunks={int(view.waiting[0]): 3})
        chunks = {int(r): 3 for r in view.running
                  if view.prefill_len[r] - view.prefilled[r] > 3}
        return Batch(prefill_chunks=chunks or None, steady_steps=UNTIL_CHANGE)


def test_a_python_policys_promise_with_chunks_gives_the_step_loops_results():
    runs = [replay([20, 11], [6, 9], _ChunksSteadily(), 200, arrival=[0.0, 4.0],
                   timing=LinearTiming(0.01, 1e-4, 5e-4), fast_forward=switch)
            for switch in (True, False)]
    assert_same_run(*runs)
    assert runs[0].decisions < runs[1].decisions


@pytest.mark.parametrize("timing", [UnitTiming(), LinearTiming(0.01, 1e-4, 5e-4, 3e-5, 2e-4),
                                    fake_vidur()])
def test_decodes_are_priced_in_one_step_as_member_by_member(timing):
    """The O(1) price of a batch of decodes (from its context sum and maximum) is the price
    of the same batch member by member, to the last bit, wherever it has an answer."""
    rng = np.random.default_rng(5)
    record = timing.timing_state()
    for _ in range(500):
        m = int(rng.integers(1, 9))
        context = rng.integers(0, 70, m)
        whole = price_shape(timing, BatchShape(np.ones(m, dtype=np.int64), context,
                                               np.zeros(m, dtype=bool)), record)
        quick = type(timing).price_decodes(record, m, int(context.sum()), int(context.max()))
        assert np.isnan(quick) or quick == whole
