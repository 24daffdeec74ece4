"""Fast-forwarding steady stretches (``Batch.steady_steps``) changes speed, never results."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.paper_fcfs import PaperFCFS
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from replay.engine.histogram import LogHistogram
from replay.engine.loop import DecisionError
from replay.engine.overflow import ClearAll, EvictLIFO
from replay.engine.paging import BlockGrowth, blocks
from replay.engine.policy import UNTIL_CHANGE, Batch, PolicyView
from replay.timing import LinearTiming, UnitTiming
from tests.conftest import replay, stretch_and_steps
from tests.test_serving_policies import paged_instances

POLICIES = {
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "paper_fcfs": lambda: PaperFCFS(EvictLIFO()),
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
    "sarathi_reserve": lambda: SarathiLike(EvictLIFO(), chunk_size=16, reserve_prompt=True),
    # A fifth of M kept free: first chunks cut by the watermark promise nothing.
    "sarathi_watermark": lambda: SarathiLike(EvictLIFO(), chunk_size=16, watermark=0.2),
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


@pytest.mark.slow
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


@pytest.mark.parametrize("caps", [dict(max_running=2), dict(max_starts_per_round=1)])
@pytest.mark.parametrize("policy", ["sarathi", "sarathi_reserve"])
@settings(max_examples=25, deadline=None)
@given(instance=paged_instances(max_n=12))
def test_fast_forward_gives_the_step_loops_results_under_the_engine_caps(policy, caps,
                                                                         instance):
    # The caps cut starts that Sarathi-like names first chunks for (a DecisionError before
    # the engine dropped them); a promise that comes with a cut start is the hand case below.
    kv, block, s, o, arrival = instance
    runs = [replay(s, o, POLICIES[policy](), kv, arrival=arrival, timing=TIMINGS["linear"](),
                   block_size=block, livelock_window=3000, fast_forward=switch, **caps)
            for switch in (True, False)]
    assert_same_run(*runs)


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
@pytest.mark.parametrize("chunks", [([], []), ([16, 1], [40, 3]), ([7], [0])])
@pytest.mark.parametrize("decode_context", [[5, 17, 40], []])
def test_closed_form_backends_price_a_stretch_like_single_steps(timing, chunks,
                                                                decode_context):
    if not decode_context and not chunks[0]:
        return
    stretch, single = stretch_and_steps(decode_context, *chunks, 25)
    assert timing.stretch_durations(stretch, 25).tolist() == [timing.duration(s)
                                                              for s in single]


def test_a_chunked_prompt_asks_the_policy_once_per_phase():
    """A lone 100-token prompt in chunks of 16 (6 full chunks, then 4 tokens): the start,
    promising the next five chunks, the last chunk; then the first decode, whose stretch
    ends with the completing step. 16 steps, 3 decisions, results as if asked every
    step."""
    for reserve in (False, True):
        runs = [replay([100], [10], SarathiLike(EvictLIFO(), chunk_size=16,
                                                reserve_prompt=reserve), 200,
                       timing=LinearTiming(0.01, 1e-4), block_size=4, fast_forward=switch)
                for switch in (True, False)]
        assert_same_run(*runs)
        assert runs[0].iterations["prefill_tokens"].tolist()[:8] == [16] * 6 + [4, 0]
        assert (len(runs[0].iterations), runs[0].decisions) == (16, 3)


def serving_view(block: int, capacity: int, prompt, prefilled, generated) -> PolicyView:
    """A paged view: requests with nothing prefilled wait (in id order), the others run."""
    prompt, prefilled, generated = (np.asarray(a, dtype=np.int64)
                                    for a in (prompt, prefilled, generated))
    held, n = prefilled + generated, prompt.size
    zeros = np.zeros(n, dtype=np.int64)
    return PolicyView(kv_capacity=capacity, arrival=np.zeros(n), prompt_len=prompt,
                      prefill_len=prompt.copy(), predicted_output=zeros + 50,
                      predicted_lo=zeros + 50, predicted_hi=zeros + 50, type_id=zeros - 1,
                      prefilled=prefilled, generated=generated, held=held,
                      start_iteration=zeros, rng=np.random.default_rng(0),
                      kv_block_size=block, kv_held=int(held.sum()),
                      waiting=np.flatnonzero(held == 0), running=np.flatnonzero(held > 0))


@st.composite
def chunking_views(draw):
    """A paged view with decoding and part-way-prefilled running requests and a queue."""
    block = draw(st.sampled_from([1, 2, 4]))
    n = draw(st.integers(1, 12))
    prompt = np.array(draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)))
    prefilled, generated = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for i, what in enumerate(draw(st.lists(st.sampled_from(["waiting", "decoding",
                                                             "prefilling"]),
                                           min_size=n, max_size=n))):
        if what == "decoding":
            prefilled[i], generated[i] = prompt[i], draw(st.integers(1, 40))
        elif what == "prefilling" and prompt[i] > 1:
            prefilled[i] = draw(st.integers(1, int(prompt[i]) - 1))
    # Room above what the running requests hold, or above what they reserve (their whole
    # prompts), so that either count can be the one that runs short first.
    held = prefilled + generated
    reserved = np.where(prefilled < prompt, prompt + 1, held)
    used = int(blocks(draw(st.sampled_from([held, reserved])), block).sum())
    return serving_view(block, block * (used + draw(st.integers(0, 60))), prompt, prefilled,
                        generated)


@pytest.mark.parametrize("prefilled", [4, 0])
def test_a_reserved_prompt_promises_until_the_decodes_run_out_of_blocks(prefilled):
    # Blocks of 4, 30 of them: the 100-token prompt reserves 26 (101 slots), so the decode
    # (7 slots, 8 after this step) fits while it needs at most 4 blocks: 16 slots, 8 steps
    # more. Its chunks of 4 would go on for 22 steps before the last one (23 when the
    # decision starts it: prefilled=0, where the promise must count its reservation too).
    view = serving_view(4, 120, prompt=[4, 100], prefilled=[4, prefilled], generated=[3, 0])
    batch = SarathiLike(EvictLIFO(), chunk_size=5, reserve_prompt=True).decide(view)
    assert batch.prefill_chunks == {1: 4}
    assert list(batch.start) == ([1] if prefilled == 0 else [])
    assert batch.steady_steps == 8
    unreserved = SarathiLike(EvictLIFO(), chunk_size=5).decide(view)
    assert unreserved.steady_steps == UNTIL_CHANGE  # the engine's KV check is the bound


@pytest.mark.parametrize("watermark, chunk, promised", [(0.1, 5, 0), (0.0, 15, UNTIL_CHANGE)])
def test_a_first_chunk_the_watermark_cut_promises_nothing(watermark, chunk, promised):
    # Token-exact, M = 100: the decode holds 85 after this step, 15 slots stay free. A
    # 10-slot watermark leaves the newcomer a first chunk of 5; as a running prefill it
    # would take 9 of the 9 then free (no watermark for it), so its chunk does not repeat.
    # Without the watermark it takes all 15, which no later step can repeat: the engine's
    # KV check ends that stretch.
    view = serving_view(1, 100, prompt=[5, 200], prefilled=[5, 0], generated=[79, 0])
    batch = SarathiLike(EvictLIFO(), chunk_size=64, watermark=watermark).decide(view)
    assert list(batch.start) == [1] and batch.prefill_chunks == {1: chunk}
    assert batch.steady_steps == promised


@pytest.mark.parametrize("capacity, promised", [(36, 0), (40, 3)])
def test_a_reserved_prompt_promise_counts_a_decode_crossing_into_a_new_block(capacity,
                                                                             promised):
    # Blocks of 4: the decode holds 8 slots after this step (2 full blocks) and its next
    # token needs a third; the 24-token prompt reserves 7 blocks and has 3 more chunks of 4
    # before its last. With 9 blocks nothing is left for the decode's third block (the
    # next decision preempts); with 10 it fits through all 3 steps.
    view = serving_view(4, capacity, prompt=[4, 24], prefilled=[4, 4], generated=[3, 0])
    batch = SarathiLike(EvictLIFO(), chunk_size=5, reserve_prompt=True).decide(view)
    assert batch.prefill_chunks == {1: 4}
    assert batch.steady_steps == promised


def members(batch: Batch, view: PolicyView) -> np.ndarray:
    """The batch's members in the engine's order: ``advance`` (or all running), then starts."""
    advance = view.running if batch.advance is None else np.asarray(batch.advance)
    return np.concatenate((advance, np.asarray(batch.start, dtype=np.int64)))


def repeats(again: Batch, first: Batch, view: PolicyView, first_view: PolicyView) -> bool:
    """``again`` (decided from ``view``) runs what ``first`` did, starting nothing new."""
    return (np.array_equal(members(again, view), members(first, first_view))
            and (again.prefill_chunks or {}) == (first.prefill_chunks or {})
            and len(again.start) == len(again.preempt) == 0)


@settings(max_examples=400, deadline=None)
@given(view=chunking_views(), chunk_size=st.integers(1, 64), reserve=st.booleans(),
       watermark=st.sampled_from([0.0, 0.1]))
def test_a_sarathi_promise_holds_for_every_step_it_names(view, chunk_size, reserve, watermark):
    policy = SarathiLike(EvictLIFO(), chunk_size=chunk_size, reserve_prompt=reserve,
                         watermark=watermark)
    batch, first_view = policy.decide(view), view
    chunks = batch.prefill_chunks or {}  # a prefill not named takes the rest of its prompt
    ran = members(batch, view)
    prefilling = [r for r in ran if view.prefilled[r] < view.prefill_len[r]]
    if (not batch.steady_steps or len(batch.preempt)
            or any(r not in chunks for r in prefilling)):
        return  # the engine reads a promise only when no prompt finishes or is preempted
    decoding = [r for r in ran if r not in chunks]
    started = np.asarray(batch.start, dtype=np.int64)

    def step(view: PolicyView) -> PolicyView:
        """``view`` after the batch runs once more."""
        held, prefilled, generated = view.held.copy(), view.prefilled.copy(), \
            view.generated.copy()
        held[decoding] += 1
        generated[decoding] += 1
        for r, c in chunks.items():
            held[r] += c
            prefilled[r] += c
        return dataclasses.replace(view, held=held, prefilled=prefilled, generated=generated,
                                   kv_held=int(held.sum()))

    # The engine appends the started requests to the running ones.
    view = dataclasses.replace(step(view), running=np.concatenate((view.running, started)),
                               waiting=view.waiting[~np.isin(view.waiting, started)])
    # The promise holds for every step it names, and (short of the engine's own stops) it
    # names them all: the step after it decides otherwise.
    for ahead in range(1, min(batch.steady_steps, 60) + 2):
        after = step(view)
        if any(view.prefilled[r] + c >= view.prefill_len[r] for r, c in chunks.items()):
            break  # this chunk would be the prompt's last: the engine stops before it
        if (blocks(after.held, view.kv_block_size).sum() * view.kv_block_size
                > view.kv_capacity):
            break  # as it does before a step that would not fit
        assert repeats(policy.decide(view), batch, view, first_view) == (
            ahead <= batch.steady_steps)
        view = after


@settings(max_examples=200, deadline=None)
@given(held=st.lists(st.integers(0, 70), max_size=30), block=st.integers(1, 17))
def test_block_growth_counts_the_blocks_each_request_gains(held, block):
    held = np.array(held, dtype=np.int64)
    j = np.arange(0, 3 * block + 2)
    expected = [int((blocks(held + k, block) - blocks(held, block)).sum()) for k in j]
    assert BlockGrowth(held, block)(j).tolist() == expected
