"""Hand-checked replays: every number below was worked out on paper from docs/model.md."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.protection import AlphaProtection
from replay.engine import loop
from replay.engine.kv import explicit
from replay.engine.loop import DecisionError, Engine
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.engine.policy import Batch
from replay.engine.requests import Requests
from replay.timing import LinearTiming, UnitTiming
from tests.conftest import replay

C3_BIG_FIRST = ([63] + [1] * 21, [1] + [2] * 21)
C3_SMALL_FIRST = ([1] * 21 + [63], [2] * 21 + [1])


def tel(result) -> float:
    return float(result.requests["latency"].sum())


def test_c3_fcfs_depends_on_tie_order():
    assert tel(replay(*C3_BIG_FIRST, FCFSLookahead(EvictLIFO()), 64)) == 64
    assert tel(replay(*C3_SMALL_FIRST, FCFSLookahead(EvictLIFO()), 64)) == 45


def test_c3_mcsf_starts_the_shortest_output_first():
    # MC-SF sorts by o: the o=1 request (s=63) goes first in either order, TEL 1 + 21 * 3.
    for order in (C3_BIG_FIRST, C3_SMALL_FIRST):
        assert tel(replay(*order, MCSF(EvictLIFO()), 64)) == 64


def test_model_md_completion_example():
    # s=63, o=1 started at 0 completes at 1; s=1, o=2 arriving (and started) at 1 completes at 3.
    req = replay([63, 1], [1, 2], FCFSLookahead(EvictLIFO()), 64, arrival=[0, 1]).requests
    assert req["completion"].tolist() == [1, 3]
    assert req["latency"].tolist() == [1, 2]


def test_mcsf_and_fcfs_differ():
    # M=6, A=(s1,o5) then B=(s2,o2) at time 0. Together they need 3+4=7 at B's completion.
    # FCFS: A runs 0..5, B cannot join until A is done: B runs 5..7. TEL 5 + 7 = 12.
    # MC-SF: B runs 0..2; at round 1 A fits (B holds 4 at its last round, A holds 2): A 1..6.
    fcfs = replay([1, 2], [5, 2], FCFSLookahead(EvictLIFO()), 6).requests
    mcsf = replay([1, 2], [5, 2], MCSF(EvictLIFO()), 6).requests
    assert fcfs["start"].tolist() == [0, 5] and fcfs["latency"].sum() == 12
    assert mcsf["start"].tolist() == [1, 0] and mcsf["latency"].sum() == 8


def test_kv_timeline_of_a_single_request():
    it = replay([3], [4], FCFSLookahead(EvictLIFO()), 7).iterations
    assert it["kv_peak"].tolist() == [4, 5, 6, 7]
    assert it["kv_after"].tolist() == [4, 5, 6, 0]
    assert it["prefill_tokens"].tolist() == [3, 0, 0, 0]
    assert it["decode_requests"].tolist() == [0, 1, 1, 1]


def test_linear_timing_prices_the_exact_batch():
    # Iteration 1: prefill 3 tokens -> touched 4 (3 prompt + token 1), prefill 3.
    # Iteration 2: decode with context 4 -> touched 5.
    timing = LinearTiming(d0=1.0, d1=0.1, d2=0.01)
    it = replay([3], [2], FCFSLookahead(EvictLIFO()), 10, timing=timing).iterations
    assert it["duration"].tolist() == pytest.approx([1.0 + 0.3 + 0.03, 1.0 + 0.5])


class ChunkedFirstCome:
    """Test policy: start one request at a time, prefilling it in chunks of ``chunk``."""

    def __init__(self, chunk: int):
        self.chunk = chunk
        self.overflow = EvictLIFO()

    def decide(self, view):
        prefilling = [int(r) for r in view.running
                      if view.prefilled[r] < view.prompt_len[r]]
        start = view.waiting[:1] if view.running.size == 0 else view.waiting[:0]
        chunks = {r: min(self.chunk, int(view.prompt_len[r] - view.prefilled[r]))
                  for r in prefilling + [int(r) for r in start]}
        return Batch(start=start, prefill_chunks=chunks)


def test_chunked_prefill_emits_first_token_with_the_last_chunk():
    # s=10 in chunks 4,4,2 then one decode: KV 4, 8, 11 (token 1), 12 (token 2, done).
    result = replay([10], [2], ChunkedFirstCome(4), 12)
    assert result.iterations["prefill_tokens"].tolist() == [4, 4, 2, 0]
    assert result.iterations["kv_peak"].tolist() == [4, 8, 11, 12]
    req = result.requests.iloc[0]
    assert (req["first_token"], req["completion"]) == (3, 4)


@pytest.mark.parametrize("chunks, valid", [
    ({0: 4}, True), ({0: 4, 1: 10}, True), ({0: np.int64(10), 1: 1}, True),
    ({0: 0}, False), ({0: 11}, False), ({2: 4}, False), ({0: 2.5}, False), ({0: True}, False),
    ({0: 4, 1: 0}, False), ({0: 4, 1: 11}, False), ({0: 4, 2: 4}, False), ({0: 4, -1: 4}, False),
    ({0: 4, 1: 2.5}, False), ({0: 4, 1.5: 3}, False), ({1.0: 4}, False),
])
def test_prefill_chunks_must_be_whole_tokens_of_a_remaining_prompt(chunks, valid):
    # Requests 0 and 1 (prompts of 10) start with the chunks; request 2 is not in the batch.
    class FirstStepChunks:
        overflow = EvictLIFO()

        def decide(self, view):
            if view.iteration == 0:
                return Batch(start=view.waiting[:2], prefill_chunks=chunks)
            return Batch(start=view.waiting)

    if valid:
        result = replay([10, 10, 10], [2, 2, 2], FirstStepChunks(), 100)
        assert result.iterations["prefill_tokens"].iloc[0] == sum(
            chunks.get(r, 10) for r in (0, 1))
    else:
        with pytest.raises(DecisionError, match="is not in 1..remaining prompt"):
            replay([10, 10, 10], [2, 2, 2], FirstStepChunks(), 100)


class PauseSecond:
    """Test policy: start everything, then advance only the first running request."""

    overflow = EvictLIFO()

    def decide(self, view):
        if view.waiting.size:
            return Batch(start=view.waiting)
        return Batch(advance=view.running[:1])


def test_paused_requests_keep_their_kv():
    it = replay([2, 2], [3, 2], PauseSecond(), 20).iterations
    # Both start (KV 3+3); then only request 0 advances; request 1 holds 3 meanwhile.
    assert it["kv_peak"].tolist()[:3] == [6, 7, 8]
    assert it["batch_size"].tolist()[:3] == [2, 1, 1]


def test_alpha_protection_livelocks_and_keeps_partial_metrics():
    # M=100, eight (s=10, o=80) requests fit the admission budget (8 * 11 <= 90) but need 720
    # at their peak: admit, overflow after two rounds, clear all, readmit... forever.
    result = replay([10] * 8 + [1], [80] * 8 + [1], AlphaProtection(0.1, ClearAll()), 100,
                    arrival=[0] * 8 + [0], livelock_window=500)
    assert result.status == "livelock"
    assert "no request completed" in result.message
    assert result.iterations["failed"].any()
    assert result.requests["evictions"].sum() > 0
    # The tiny request was admitted with the first eight and finished: metrics were kept.
    assert result.requests["completed"].sum() == 1


def test_larger_alpha_finishes():
    # alpha=0.8: only one (s=10) request is admitted at a time (11 <= 20 < 22), peak 90 <= 100.
    result = replay([10] * 8, [80] * 8, AlphaProtection(0.8, ClearAll()), 100)
    assert result.status == "completed"
    assert result.requests["evictions"].sum() == 0


def test_clearing_counts_evictions_and_latency_runs_from_arrival():
    s, o = [5] * 6, [30] * 6
    result = replay(s, o, AlphaProtection(0.5, ClearEachWithProb(0.5)), 60,
                    arrival=[0, 0, 0, 1, 2, 3], seed=3)
    assert result.status == "completed"
    req, it = result.requests, result.iterations
    assert req["evictions"].sum() == it["n_evicted"].sum() > 0
    evicted = req[req["evictions"] > 0]
    assert (evicted["latency"] == evicted["completion"] - evicted["arrival"]).all()
    # A cleared request restarted: its final start is after its arrival plus the lost work.
    assert (evicted["start"] > evicted["arrival"]).all()


def test_clearing_is_reproducible_for_a_seed_and_varies_across_seeds():
    s, o = [5] * 12, [30] * 12
    runs = {seed: replay(s, o, AlphaProtection(0.5, ClearEachWithProb(0.3)), 80, seed=seed)
            for seed in (1, 1, 2)}
    again = replay(s, o, AlphaProtection(0.5, ClearEachWithProb(0.3)), 80, seed=1)
    assert runs[1].requests.equals(again.requests)
    assert not runs[1].requests.equals(runs[2].requests)


def test_evict_lifo_evicts_most_recent_first():
    rule = EvictLIFO()
    holders = np.array([7, 3, 9])
    assert rule.evict(holders, np.array([5, 5, 5]), 10, None, 3).tolist() == [9]
    assert rule.evict(holders, np.array([5, 5, 5]), 4, None, 3).tolist() == [9, 3, 7]
    assert rule.evict(holders, np.array([5, 5, 5]), 15, None, 3).tolist() == []
    # 9 is being started by the batch (holds nothing yet): the running 3, then 7, go first.
    assert rule.evict(holders, np.array([5, 5, 5]), 10, None, 2).tolist() == [3]
    assert rule.evict(holders, np.array([5, 5, 5]), 4, None, 2).tolist() == [3, 7]


class Idle:
    overflow = EvictLIFO()

    def decide(self, view):
        return Batch()


def test_a_policy_that_never_schedules_ends_stalled():
    result = replay([1, 1], [1, 1], Idle(), 10, arrival=[0, 5])
    assert result.status == "stalled"
    assert result.requests["completed"].sum() == 0


class StartsRunning:
    overflow = EvictLIFO()

    def decide(self, view):
        return Batch(start=view.running if view.running.size else view.waiting)


def test_invalid_decisions_are_rejected_with_a_reason():
    with pytest.raises(DecisionError, match="running"):
        replay([1, 1], [3, 3], StartsRunning(), 10, arrival=[0, 1])


class StartsTwice:
    overflow = EvictLIFO()

    def decide(self, view):
        return Batch(start=np.repeat(view.waiting[:1], 2))


def test_a_repeated_request_id_is_rejected():
    # Counted twice, the request would be charged twice the KV it holds.
    with pytest.raises(DecisionError, match="repeats a request id"):
        replay([1, 1], [3, 3], StartsTwice(), 10)


class Scripted:
    """Starts everything at the first step, then returns ``second`` (a function of the view)."""

    overflow = EvictLIFO()

    def __init__(self, second) -> None:
        self.second, self.calls = second, 0

    def decide(self, view):
        self.calls += 1
        return Batch(start=view.waiting) if self.calls == 1 else self.second(view)


@pytest.mark.parametrize("second, reason", [
    # Three requests, so ids 3 and -1 (which numpy would wrap to 2) name none of them.
    (lambda v: Batch(advance=np.array([0, 3])), "advance has unknown request ids"),
    (lambda v: Batch(advance=np.array([-1, 0])), "advance has unknown request ids"),
    (lambda v: Batch(advance=np.array([-1])), "advance has unknown request ids"),
    (lambda v: Batch(preempt=np.array([3])), "preempt has unknown request ids"),
    (lambda v: Batch(advance=np.array([1, 0, 1])), "advance repeats a request id"),
    (lambda v: Batch(preempt=np.array([2, 2])), "preempt repeats a request id"),
])
def test_unknown_or_repeated_ids_are_rejected(second, reason):
    with pytest.raises(DecisionError, match=reason):
        replay([1, 1, 1], [5, 5, 5], Scripted(second), 30)


def completed_unless_refused(run, reason):
    """``run()``'s result when ``reason`` is None; else None, once ``run()`` has raised the
    DecisionError that ``reason`` matches."""
    if reason is None:
        return run()
    with pytest.raises(DecisionError, match=reason):
        run()
    return None


@pytest.mark.parametrize("start, reason", [
    ([2, 1], None),  # waiting, out of queue order: allowed
    ([1, 2, 2], "start repeats a request id"),
    ([1, 0], "start names request 0 which is running"),
    ([1, 3], "start has unknown request ids"),
])
def test_starts_out_of_queue_order_are_checked_one_by_one(start, reason):
    # Request 0 arrives first and starts alone; 1 and 2 wait, in that order.
    class StartsLater:
        overflow = EvictLIFO()

        def decide(self, view):
            if view.iteration == 0:
                return Batch(start=view.waiting[:1])
            return Batch(start=np.array(start) if view.waiting.size == 2 else view.waiting)

    result = completed_unless_refused(
        lambda: replay([1, 1, 1], [3, 3, 3], StartsLater(), 30, arrival=[0, 0.5, 0.5]), reason)
    assert result is None or result.status == "completed"


@pytest.mark.parametrize("drop, reason", [
    ([2, 1], None),  # one waiting, one running: both may be dropped
    ([2, 0], "drop names request 0 which is completed"),
    ([0, 2], "drop names request 0 which is completed"),
])
def test_a_drop_names_only_waiting_or_running_requests(drop, reason):
    # Request 0 (one token) completes at the first step; 1 runs on; 2 arrives later and waits.
    class DropsAtTheSecondStep:
        overflow = EvictLIFO()

        def decide(self, view):
            if view.iteration == 0:
                return Batch(start=view.waiting)
            if view.iteration == 1:
                return Batch(drop=np.array(drop))
            return Batch()

    result = completed_unless_refused(
        lambda: replay([1, 1, 1], [1, 5, 5], DropsAtTheSecondStep(), 30, arrival=[0, 0, 0.5]),
        reason)
    if result is not None:
        assert result.status == "completed" and result.dropped == 2
        assert result.requests["completed"].tolist() == [True, False, False]


def test_block_size_counts_whole_blocks():
    from replay.engine.kv import explicit
    from replay.engine.loop import Engine
    from replay.engine.requests import Requests
    from replay.timing import UnitTiming

    # Blocks of 4: a request holding 4 slots needs 1 block, at 5 slots 2 blocks (8 slots).
    requests = Requests(np.array([3]), np.array([3]), arrival=np.zeros(1))
    result = Engine(requests, FCFSLookahead(EvictLIFO()), UnitTiming(),
                    explicit(8, block_size=4)).run()
    assert result.iterations["kv_peak"].tolist() == [4, 8, 8]
    # Two such requests run together token-exactly (2 * 6 = 12 <= 12) but not in blocks of 4
    # (2 * 8 = 16 > 12). The block-aware lookahead starts the second at round 2, when the
    # first needs 2 blocks at its last step and the newcomer 1 (12 slots), then 2 (8 slots).
    pair = Requests(np.array([3, 3]), np.array([3, 3]), arrival=np.zeros(2))
    token_exact = Engine(pair, FCFSLookahead(EvictLIFO()), UnitTiming(), explicit(12)).run()
    assert token_exact.requests["start"].tolist() == [0, 0]
    blocked = Engine(pair, FCFSLookahead(EvictLIFO()), UnitTiming(),
                     explicit(12, block_size=4)).run()
    assert blocked.status == "completed"
    assert not blocked.iterations["failed"].any()
    assert blocked.requests["start"].tolist() == [0, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)),
                min_size=1, max_size=40), st.integers(0, 10_000))
def test_kept_order_equals_sorting_the_waiting_queue_every_step(steps, seed):
    """KeptOrder under arbitrary joins and departures gives lexsort's order each step."""
    from policies.common.ordering import KeptOrder

    rng = np.random.default_rng(seed)
    n = 40
    key = rng.integers(1, 8, n)  # many ties, broken by id
    kept, waiting = KeptOrder(), np.zeros(0, dtype=np.int64)
    for joins, leaves in steps:
        outside = np.setdiff1d(np.arange(n), waiting)
        waiting = np.concatenate((rng.permutation(waiting)[min(leaves, waiting.size):],
                                  rng.choice(outside, min(joins, outside.size), replace=False)))
        expected = waiting[np.lexsort((waiting, key[waiting]))]
        assert np.array_equal(kept.ordered(waiting, key), expected)


def test_kept_order_reuses_its_order_only_for_the_same_read_only_queue():
    from policies.common.ordering import KeptOrder

    key = np.array([5, 1, 3, 2])
    kept, queue = KeptOrder(), np.array([0, 1, 2])
    assert kept.ordered(queue, key).tolist() == [1, 2, 0]
    queue[2] = 3  # a caller's writable array may change in place: never trusted
    assert kept.ordered(queue, key).tolist() == [1, 3, 0]
    frozen = np.array([0, 2])
    frozen.flags.writeable = False
    first = kept.ordered(frozen, key)
    assert first.tolist() == [2, 0] and kept.ordered(frozen, key) is first


def test_a_long_replay_says_where_it_is(monkeypatch, caplog):
    """The heartbeat (where the step loop hands back to Python, at most every HEARTBEAT_S)
    reaches the log."""
    monkeypatch.setattr(loop, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(loop, "YIELD_STEPS", 1024)
    with caplog.at_level(logging.INFO, logger="replay.engine.loop"):
        result = replay([1] * 5000, [2] * 5000, FCFSLookahead(EvictLIFO()), kv_tokens=3,
                        arrival=np.arange(5000.0))
    assert result.status == "completed"
    beats = [r.getMessage() for r in caplog.records if "requests completed" in r.getMessage()]
    assert beats and beats[0].startswith("replay: ") and " of 5000 requests completed" in beats[0]


def test_the_progress_bar_counts_completed_requests(monkeypatch):
    """With ``output.progress=true`` the bar moves as the step loop hands back to Python;
    without it, no bar is made."""
    counts, made = [], []

    class Bar:
        n = 0

        def __init__(self, total, **options):
            assert total == 5000 and not options.get("disable")
            made.append(self)

        def update(self, k):
            self.n += k
            counts.append(self.n)

        def close(self):
            pass

    monkeypatch.setattr(loop, "tqdm", Bar)
    monkeypatch.setattr(loop, "YIELD_STEPS", 1024)
    result = replay([1] * 5000, [2] * 5000, FCFSLookahead(EvictLIFO()), kv_tokens=3,
                    arrival=np.arange(5000.0), progress=True)
    assert result.status == "completed"
    assert len(counts) > 5 and counts == sorted(counts) and counts[-1] == 5000
    assert len(made) == 1
    replay([1] * 5000, [2] * 5000, FCFSLookahead(EvictLIFO()), kv_tokens=3,
           arrival=np.arange(5000.0), progress=False)
    assert len(made) == 1


class _DropsTheQueueAtTheEnd:
    """Starts the first request only; once no arrival is left, drops every other one
    (a running one too), as the WAIT authors' force_clear does."""

    overflow = EvictLIFO()

    def decide(self, view):
        if not view.more_arrivals and view.generated[0] >= 2:
            others = np.concatenate((view.waiting, view.running[view.running != 0]))
            return Batch(drop=others)
        return Batch(start=view.waiting[view.waiting == 0])


@pytest.mark.parametrize("engine", ["engine", "oracle"])
def test_dropped_requests_leave_for_good_and_free_their_kv(engine):
    from tests.oracle.engine import Engine as Oracle

    requests = Requests(np.array([3, 4, 5]), np.array([6, 2, 2]), arrival=np.zeros(3))
    runner = Engine if engine == "engine" else Oracle
    result = runner(requests, _DropsTheQueueAtTheEnd(), UnitTiming(), explicit(50)).run()
    assert result.status == "completed" and result.dropped == 2
    assert result.requests["completed"].tolist() == [True, False, False]
    # request 0 runs alone: 1 prefill, then decodes; the others never start or finish
    assert result.requests["completion"].isna().tolist() == [False, True, True]
    assert result.iterations["kv_after"].iloc[-1] == 0
