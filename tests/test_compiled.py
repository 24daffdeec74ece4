"""The compiled fast path (replay.compiled) gives Engine.run()'s results, bit for bit."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.nested_wait import NestedWait
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from policies.wait import Wait
from replay.bench_compiled import assert_identical
from replay.compiled import decisions as dec
from replay.compiled import (
    kernels,
    pricing,
    run_compiled,
    sorting,
    supports_compiled,
    unsupported_reason,
)
from replay.compiled.driver import compiled_decision
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.engine.requests import Requests
from replay.timing import LinearTiming, UnitTiming
from replay.timing.vidur import VidurTiming
from replay.timing.vidur_tables import VidurTables
from tests.test_fast_forward import chunking_views, serving_view
from tests.test_timing_vidur import cache_dir, timings  # noqa: F401 (fixtures, shared)

TYPES = [{"prompt_len": 4, "output_len": 8, "rate": 1.0},
         {"prompt_len": 10, "output_len": 3, "rate": 0.5}]
POLICIES = {
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
    "sarathi_reserve": lambda: SarathiLike(EvictLIFO(), chunk_size=16, reserve_prompt=True),
    "sarathi_watermark": lambda: SarathiLike(EvictLIFO(), chunk_size=16, watermark=0.2),
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "protection": lambda: AlphaProtection(0.3, ClearAll()),
    "clearing": lambda: AlphaProtection(0.2, ClearEachWithProb(0.5)),
    "protection_lifo": lambda: AlphaProtection(0.1, EvictLIFO()),
    "wait": lambda: Wait(EvictLIFO(), TYPES, n=[2, 1]),
    "wait_max_wait": lambda: Wait(EvictLIFO(), TYPES, n=[3, 2], max_wait=4.0),
    "nested_wait": lambda: NestedWait(EvictLIFO(), boundaries=[2, 5], max_stage=20,
                                      n=[2, 2, 1]),
    "nested_wait_max_wait": lambda: NestedWait(EvictLIFO(), boundaries=[3], max_stage=20,
                                               n=[3, 2], max_wait=3.0),
}


def fake_vidur(out_of_range: str = "extrapolate", seed: int = 0) -> VidurTiming:
    """A Vidur backend on random tables with small profiled limits (64 tokens per request
    and iteration, 6 decodes, chunks up to 32), so that small workloads leave the range."""
    rng = np.random.default_rng(seed)
    max_tokens, granularity, max_batch, chunk_steps = 64, 8, 6, 1
    tables = VidurTables(token_ms=rng.random(max_tokens + 1) * 0.1,
                         decode_ms=rng.random((max_batch + 1, max_tokens // granularity + 1))
                         * 0.05,
                         prefill_ms=rng.random((max_tokens // granularity + 1, chunk_steps + 1))
                         * 0.2, num_layers=80, kv_granularity=granularity)
    timing = VidurTiming.__new__(VidurTiming)
    timing.out_of_range, timing.beyond_profile = out_of_range, "linear"
    timing.out_of_range_batches = {"tokens": 0, "decode_batch": 0, "context": 0}
    timing._bind_tables(tables)
    return timing


TIMINGS = {"unit": UnitTiming, "linear": lambda: LinearTiming(0.01, 1e-4, 5e-4),
           "vidur": fake_vidur}


@st.composite
def workloads(draw, max_n: int = 14):
    block = draw(st.sampled_from([1, 4]))
    kv = block * draw(st.integers(max(3, 8 // block), 120 // block))
    n = draw(st.integers(1, max_n))
    s = np.array(draw(st.lists(st.integers(1, kv // 2), min_size=n, max_size=n)))
    o = np.array([draw(st.integers(1, kv - si)) for si in s])
    arrival = np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), dtype=float)
    # Predictions off by up to 50 % (the lookahead policies plan with the upper end).
    noise = np.array(draw(st.lists(st.floats(0.5, 1.5), min_size=n, max_size=n)))
    hi = np.maximum(1, np.round(o * noise)).astype(np.int64)
    options = dict(preemption=draw(st.sampled_from(["restart", "recompute"])),
                   requeue=draw(st.sampled_from(["front", "back"])),
                   max_running=draw(st.sampled_from([None, 3])),
                   max_starts_per_round=draw(st.sampled_from([None, 1])))
    types = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    return Requests(s, o, arrival=arrival, predicted_lo=np.minimum(hi, o), predicted_hi=hi,
                    type_id=types), explicit(kv, block), options


def both(requests, policy, timing, kv, **options):
    def make():
        return Engine(requests, POLICIES[policy](), TIMINGS[timing](), kv,
                      livelock_window=500, **options)

    python = make().run()
    compiled_engine = make()
    assert supports_compiled(compiled_engine)
    return python, run_compiled(compiled_engine)


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=20, deadline=None)
@given(workload=workloads())
def test_compiled_path_gives_the_python_paths_results(policy, timing, workload):
    requests, kv, options = workload
    python, compiled = both(requests, policy, timing, kv, **options)
    assert_identical(python, compiled)


# ------------------------------------------------------------------ whole configs
SMALL = ["arrivals.rate=50", "workload.n=600", "kv.tokens=3000"]
CONFIGS = {  # the regression pins' configs (tests/test_regression_pins.py)
    "vllm_recompute": ["policy=vllm", "arrivals.rate=50", "workload.n=600", "kv.tokens=4000"],
    "sarathi_chunks": ["policy=sarathi", "arrivals.rate=50", "workload.n=600",
                       "kv.tokens=4000"],
    "sarathi_reserve_unit": ["policy=sarathi", "policy.reserve_prompt=true", "timing=unit",
                             "arrivals=poisson_rounds", "arrivals.rate=3",
                             "arrivals.horizon=60", "workload=synthetic", "kv.tokens=400"],
    "mcsf_requeue_back": ["policy=mcsf", "prediction=noisy", "prediction.sigma=1", *SMALL,
                          "engine.requeue=back", "engine.preemption=recompute"],
    "fcfs_paged": ["policy=fcfs", "arrivals.rate=50", "workload.n=400", "kv.tokens=4200",
                   "kv.block_size=16"],
    "protection_livelock": ["policy=protection", "policy.alpha=0.3", *SMALL],
    "clearing": ["policy=clearing", *SMALL, "seed=3"],
    "mcsf_overloaded": ["policy=mcsf", "arrivals.rate=200", "workload.n=3000",
                        "kv.tokens=3000"],
}


@pytest.mark.parametrize("name", CONFIGS)
def test_compiled_path_gives_the_python_paths_results_on_whole_configs(name):
    from replay.bench_compiled import build_engine
    from replay.config import compose_config

    cfg = compose_config(CONFIGS[name])
    python, compiled = build_engine(cfg).run(), run_compiled(build_engine(cfg))
    assert_identical(python, compiled)
    assert compiled.decisions >= python.decisions  # every step decided: no fast-forward


# ----------------------------------------------------- each kernel against its twin
@settings(max_examples=300, deadline=None)
@given(tokens=st.integers(-2 ** 40, 2 ** 40) | st.integers(-40, 40),
       block=st.sampled_from([1, 2, 16, 64, 2 ** 20]) | st.integers(1, 300))
def test_blocks_is_the_python_ceiling_division(tokens, block):
    # powers of two take a shift instead of a division: the same number either way
    assert dec.blocks(np.int64(tokens), np.int64(block)) == -(-tokens // block)


@settings(max_examples=200, deadline=None)
@given(ids=st.sets(st.integers(0, 60), max_size=40), data=st.data())
def test_the_running_set_kept_in_id_order(ids, data):
    # insert_by_id merges starts in; keep_by_id drops who left: always sorted(running)
    ids = list(ids)
    split = data.draw(st.integers(0, len(ids)))
    kept, started = ids[:split], ids[split:]
    by_id = np.zeros(64, dtype=np.int64)
    by_id[:len(kept)] = sorted(kept)
    scratch = np.zeros(64, dtype=np.int64)
    length = kernels.insert_by_id(by_id, len(kept), np.array(started + [0], dtype=np.int64),
                                  len(started), scratch)
    assert by_id[:length].tolist() == sorted(ids)
    status = np.full(64, kernels.DONE, dtype=np.int8)
    still = data.draw(st.sets(st.sampled_from(ids))) if ids else set()
    status[list(still)] = kernels.RUNNING
    length = kernels.keep_by_id(by_id, length, status)
    assert by_id[:length].tolist() == sorted(still)


def test_pairwise_sum_is_numpys_sum():
    rng = np.random.default_rng(3)
    for n in [0, 1, 7, 8, 9, 127, 128, 129, 300, 1000, 4097]:
        a = rng.random(n) * 10.0 ** rng.integers(-4, 4, n)
        assert pricing.pairwise_sum(a) == float(a.sum())


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-2 ** 62, 2 ** 62) | st.integers(-3, 3), max_size=100),
       extra=st.integers(0, 3), probe=st.integers(-4, 4))
def test_sorting_helpers_are_numpys(values, extra, probe):
    # small ranges too, for many ties; the buffer is longer than the sorted prefix
    keys = np.array(values + [7] * extra, dtype=np.int64)
    n = len(values)
    order = sorting.stable_argsort(keys, n)
    assert np.array_equal(order, np.argsort(keys[:n], kind="stable"))
    assert np.array_equal(sorting.sorted_copy(keys, n), np.sort(keys[:n]))
    ascending = np.sort(keys[:n])
    for value in [probe, *values[:5]]:
        assert sorting.search_left(ascending, value) == np.searchsorted(ascending, value)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(0, 50), min_size=17, max_size=300),
       swaps=st.lists(st.tuples(st.integers(0, 299), st.integers(0, 299)), max_size=4))
def test_stable_argsort_of_nearly_sorted_keys(values, swaps):
    # sorted runs longer than the insertion-sorted ones, where merges are skipped
    keys = np.sort(np.array(values, dtype=np.int64))
    for a, b in swaps:
        a, b = a % keys.size, b % keys.size
        keys[a], keys[b] = keys[b], keys[a]
    assert np.array_equal(sorting.stable_argsort(keys, keys.size),
                          np.argsort(keys, kind="stable"))


def _batches(rng, count, max_size=10, max_new=80, max_context=80):
    for _ in range(count):
        size = int(rng.integers(1, max_size + 1))
        prefill = rng.random(size) < rng.choice([0.0, 0.3, 0.8])
        new_tokens = np.where(prefill, rng.integers(1, max_new, size), 1).astype(np.int64)
        context = rng.integers(0, max_context, size).astype(np.int64)
        yield new_tokens, context, prefill


def test_linear_and_vidur_pricing_are_their_backends_duration():
    from replay.timing.base import BatchShape

    rng = np.random.default_rng(0)
    linear = LinearTiming(0.01, 1e-4, 5e-4)
    with_compute = LinearTiming(0.01, 1e-4, 5e-4, 3e-5, 2e-4)  # per decode token, per prompt
    vidur = fake_vidur()
    scratch = np.zeros(64)
    counts = np.zeros(3, dtype=np.int64)
    vidur_ints = _vidur_ints(vidur)
    for new_tokens, context, prefill in _batches(rng, 2000):
        shape = BatchShape(new_tokens, context, prefill)
        m = new_tokens.size
        assert pricing.linear_duration(new_tokens, context, prefill, m, 0.01, 1e-4,
                                       5e-4, 0.0, 0.0) == linear.duration(shape)
        assert pricing.linear_duration(new_tokens, context, prefill, m, 0.01, 1e-4, 5e-4, 3e-5,
                                       2e-4) == with_compute.duration(shape)
        assert pricing.vidur_duration(new_tokens, context, m, vidur._token_ms, vidur._decode_ms,
                                      vidur._prefill_ms, vidur._ms_to_s, vidur_ints, counts,
                                      scratch) == vidur.duration(shape)
    # out of the (small) profiled range many times, counted by kind as the backend counts
    assert counts.tolist() == list(vidur.out_of_range_batches.values())
    assert counts.min() > 0


def test_vidur_pricing_leaves_an_out_of_range_error_to_the_backend():
    from replay.timing.vidur import VidurRangeError

    strict = fake_vidur("error")
    requests = Requests(np.array([40, 30]), np.array([20, 5]), arrival=np.zeros(2))
    engine = Engine(requests, VLLMLike(EvictLIFO()), strict, explicit(120))
    with pytest.raises(VidurRangeError, match="outside the profiled range"):
        run_compiled(engine)


def _vidur_ints(vidur):
    from replay.compiled.driver import _timing_params

    return _timing_params(vidur)[4]


def same_batch(compiled, python, view):
    def members(batch):
        advance = view.running if batch.advance is None else np.asarray(batch.advance)
        return np.concatenate((advance, np.asarray(batch.start, dtype=np.int64))).tolist()

    assert list(compiled.start) == list(python.start)
    assert list(compiled.preempt) == list(python.preempt)
    assert members(compiled) == members(python)
    assert (compiled.prefill_chunks or {}) == (python.prefill_chunks or {})


@settings(max_examples=300, deadline=None)
@given(view=chunking_views(), chunk_size=st.integers(1, 64), reserve=st.booleans(),
       watermark=st.sampled_from([0.0, 0.1]), seqs=st.integers(1, 8))
def test_sarathi_decision_twin(view, chunk_size, reserve, watermark, seqs):
    policy = SarathiLike(EvictLIFO(), chunk_size=chunk_size, reserve_prompt=reserve,
                         watermark=watermark, max_num_seqs=seqs)
    same_batch(compiled_decision(policy, view), policy.decide(view), view)


@settings(max_examples=300, deadline=None)
@given(view=chunking_views(), tokens=st.integers(200, 600), watermark=st.sampled_from([0.0, 0.1]),
       seqs=st.integers(1, 8))
def test_vllm_decision_twin(view, tokens, watermark, seqs):
    policy = VLLMLike(EvictLIFO(), max_num_batched_tokens=tokens, watermark=watermark,
                      max_num_seqs=seqs)
    same_batch(compiled_decision(policy, view), policy.decide(view), view)


def test_vllm_decision_twin_preempts_the_latest_arrivals():
    # Blocks of 4, 6 blocks: three decodes holding 8 slots each need 3 blocks each next step
    # (9 > 6): the latest arrival (id 2) goes, then 6 fit.
    view = serving_view(4, 24, prompt=[4, 4, 4], prefilled=[4, 4, 4], generated=[4, 4, 4])
    policy = VLLMLike(EvictLIFO())
    batch = compiled_decision(policy, view)
    assert list(batch.preempt) == [2] and list(batch.advance) == [0, 1]
    same_batch(batch, policy.decide(view), view)


@pytest.mark.parametrize("make", [FCFSLookahead, MCSF])
@settings(max_examples=300, deadline=None)
@given(view=chunking_views(), estimates=st.lists(st.integers(1, 80), min_size=12,
                                                 max_size=12))
def test_lookahead_decision_twins(make, view, estimates):
    estimate = np.array(estimates[:view.prompt_len.size], dtype=np.int64)
    view = dataclasses.replace(view, predicted_output=estimate)
    policy = make(EvictLIFO())
    same_batch(compiled_decision(policy, view), policy.decide(view), view)


@pytest.mark.parametrize("policy", ["wait", "wait_max_wait", "nested_wait",
                                    "nested_wait_max_wait"])
@settings(max_examples=200, deadline=None)
@given(view=chunking_views(), types=st.lists(st.integers(0, 1), min_size=12, max_size=12),
       now=st.floats(0.0, 10.0), more=st.booleans())
def test_wait_decision_twins(policy, view, types, now, more):
    n = view.prompt_len.size
    view = dataclasses.replace(view, type_id=np.array(types[:n]), now=now,
                               arrival=np.linspace(0.0, 8.0, n),
                               next_arrival=now + 1.0 if more else float("inf"))
    policy = POLICIES[policy]()
    same_batch(compiled_decision(policy, view), policy.decide(view), view)


@settings(max_examples=200, deadline=None)
@given(view=chunking_views(), alpha=st.sampled_from([0.0, 0.1, 0.5]))
def test_protection_decision_twin(view, alpha):
    policy = AlphaProtection(alpha, ClearAll())
    same_batch(compiled_decision(policy, view), policy.decide(view), view)


@pytest.mark.parametrize("rule, kind", [(EvictLIFO(), dec.EVICT_LIFO), (ClearAll(), dec.CLEAR_ALL),
                                        (ClearEachWithProb(0.5), dec.CLEAR_WITH_PROB)])
def test_overflow_rule_twins(rule, kind):
    holders = np.array([7, 3, 5, 1, 9], dtype=np.int64)  # 3 running, then 2 starts
    held_after = np.array([10, 4, 6, 3, 3], dtype=np.int64)
    for capacity in (5, 12, 20, 26, 40):
        python_rng, compiled_rng = np.random.default_rng(1), np.random.default_rng(1)
        victims = np.zeros(5, dtype=np.int64)
        count = dec.overflow_evict(kind, getattr(rule, "beta", 0.0), compiled_rng, holders,
                                   held_after, 5, capacity, 3, victims)
        expected = rule.evict(holders, held_after, capacity, python_rng, 3)
        assert victims[:count].tolist() == list(expected)
        assert compiled_rng.random() == python_rng.random()  # the same draws were made


def test_token_gaps_fold_where_the_histogram_folds():
    from replay.engine.histogram import LogHistogram

    rng = np.random.default_rng(2)
    python, compiled = LogHistogram(buffer_size=16), LogHistogram(buffer_size=16)
    ints = np.zeros(kernels.N_INTS, dtype=np.int64)
    floats = np.array([compiled._log_lo, compiled._log_ratio, 0.0, 0.0])
    for _ in range(60):
        # runs of equal values (as a step's decodes share a gap), fresh values, none, and
        # more than the buffer holds
        size = int(rng.choice([0, 1, 3, 7, 20]))
        gaps = np.repeat(rng.random(3) + 0.01, [size // 2, size - size // 2 - size // 3,
                                                size // 3])
        python.add(gaps)
        kernels.add_gaps(gaps, gaps.size, compiled._buffer, compiled.counts, floats, ints)
        assert (ints[kernels.I_GAP_COUNT], floats[kernels.H_TOTAL], floats[kernels.H_MAX],
                ints[kernels.I_FILLED]) == (python.count, python.total, python.max,
                                            python._filled)
        assert np.array_equal(compiled.counts, python.counts)
    assert python.count > 16 * 20  # it folded many times


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0.0, 1e8) | st.sampled_from([1e-9, 1e-7, 1e7, 2e7]),
                       max_size=400),
       repeat=st.integers(1, 5))
def test_the_fold_rule_bins_as_the_histogram_defines(values, repeat):
    # The shared rule, against numpy's vectorized statement of the same bins (the two may
    # differ where numpy's log and the C library's differ in the last bit, at a bin's
    # edge, so the values here keep clear of the edges of the bins they fall in).
    from replay.engine.histogram import LogHistogram, fold_values

    h = LogHistogram()
    array = np.repeat(np.array(values, dtype=np.float64), repeat)
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf: the first bin
        position = (np.log(array) - h._log_lo) / h._log_ratio
        clear = np.abs(position - np.round(position)) > 1e-6
        array = array[clear | (array <= 1e-7) | (array >= 1e7)]
        expected = np.bincount(np.clip(np.floor((np.log(array) - h._log_lo) / h._log_ratio),
                                       0, h.counts.size - 1).astype(np.int64),
                               minlength=h.counts.size)
    total, largest = fold_values(array, array.size, h.counts, h._log_lo, h._log_ratio)
    assert np.array_equal(h.counts, expected)
    assert total == float(array.sum())  # numpy's pairwise sum, to the bit
    assert largest == (float(array.max()) if array.size else -np.inf)


# ------------------------------------------------------------------- what is not compiled
class _UsersPolicy:
    """A user's own Python policy: start everything waiting."""

    overflow = EvictLIFO()

    def decide(self, view):
        from replay.engine.policy import Batch

        return Batch(start=view.waiting)


class _TweakedVLLM(VLLMLike):
    """A subclass may decide otherwise: it has no compiled twin."""


def test_a_policy_without_a_compiled_decision_is_reported_unsupported():
    requests = Requests(np.array([3, 4]), np.array([2, 2]), arrival=np.zeros(2))
    for policy in (_UsersPolicy(), _TweakedVLLM(EvictLIFO())):
        engine = Engine(requests, policy, UnitTiming(), explicit(50))
        assert not supports_compiled(engine)
        assert type(policy).__name__ in unsupported_reason(engine)
        with pytest.raises(ValueError, match="no compiled path"):
            run_compiled(engine)
        assert engine.run().status == "completed"  # the Python path runs it unchanged
    supported = Engine(requests, VLLMLike(EvictLIFO()), UnitTiming(), explicit(50))
    assert supports_compiled(supported) and unsupported_reason(supported) is None


def test_the_disk_cache_is_keyed_by_every_module_with_compiled_functions():
    # numba keys a cached function by its own file only, so the package keys its cache
    # folder by these modules' sources; a new module of compiled functions must be listed.
    from replay.engine import numeric

    package = Path(numeric.__file__).resolve().parent.parent
    compiled = {str(path.relative_to(package)) for path in package.rglob("*.py")
                if "\n@njit(" in path.read_text() or "= jit(" in path.read_text()}
    assert compiled == set(numeric.JIT_SOURCES)


def test_every_step_loop_has_a_cache_index_of_its_own():
    # numba updates a cache index by read, add, write; loops sharing one index, compiled by
    # two processes at once, could lose each other's entries or swap their machine code
    # (seen: a Sarathi-like run on Vidur timing priced its first batch at 1.04 s instead of
    # 0.20 s after pytest -n 2 compiled the loops on a cold cache).
    indexes = {loop._cache._cache_file._index_path for loop in kernels.STEP_LOOPS.values()}
    assert len(indexes) == len(kernels.STEP_LOOPS)


def test_a_cache_folder_that_cannot_be_made_compiles_without_the_lock(monkeypatch, tmp_path):
    # numba then caches elsewhere or not at all; the run must not fail on the lock
    from replay.compiled import driver

    compiled = []

    class Loop:
        signatures = []

        def compile(self, signature):
            compiled.append(signature)

    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("")
    monkeypatch.setattr(driver, "_CACHE_DIR", in_the_way / "numba")
    monkeypatch.setattr(driver, "_step_loop_of", lambda engine: Loop())
    requests = Requests(np.array([2, 3]), np.array([2, 2]), arrival=np.zeros(2))
    driver._compile(Engine(requests, FCFSLookahead(EvictLIFO()), UnitTiming(), explicit(64)))
    assert len(compiled) == 1


def test_a_token_gap_that_is_not_a_number_is_refused():
    from replay.engine.histogram import LogHistogram

    for bad in (np.nan, -1.0):
        h = LogHistogram(buffer_size=4)
        with pytest.raises(ValueError):
            h.add(np.array([0.5, bad, 0.5, 0.5, 0.5]))  # more than the buffer: folds now


ONE_LOOP_EACH = [("vllm", "vidur"), ("sarathi", "vidur"), ("fcfs", "vidur"), ("mcsf", "vidur"),
                 ("protection", "unit"), ("wait", "linear"), ("nested_wait", "linear")]


@pytest.mark.slow
def test_a_cold_compile_compiles_each_function_once(tmp_path):
    # A second signature (such as a literal 0 for an int64) is a second compile of the
    # function for nothing. Decode stretches are specialized by backend, so the loops that
    # stretch share one backend here. In a fresh process with an empty cache: a loaded
    # loop would not compile its callees at all.
    script = f"""
import numpy as np
from numba.core.dispatcher import Dispatcher
from replay.compiled import compile_kernels, decisions, kernels, pricing, sorting
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.requests import Requests
from tests.test_compiled import POLICIES, TIMINGS

requests = Requests(np.array([2, 3]), np.array([2, 2]), arrival=np.zeros(2),
                    type_id=np.array([0, 1]))
for policy, timing in {ONE_LOOP_EACH!r}:
    assert compile_kernels(Engine(requests, POLICIES[policy](), TIMINGS[timing](),
                                  explicit(64))) > 0
for module in (decisions, kernels, pricing, sorting):
    for name, function in vars(module).items():
        if isinstance(function, Dispatcher) and len(function.signatures) > 1:
            print(name, *function.signatures, sep="\\n  ")
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parent.parent)
    assert done.stdout == ""


def test_an_engine_that_has_run_is_refused():
    requests = Requests(np.array([3, 4]), np.array([2, 2]), arrival=np.zeros(2))
    engine = Engine(requests, VLLMLike(EvictLIFO()), UnitTiming(), explicit(50))
    run_compiled(engine)
    with pytest.raises(ValueError, match="has run already"):
        run_compiled(engine)


@pytest.mark.parametrize("policy", ["wait", "nested_wait"])
def test_a_request_of_an_unknown_type_fails_as_on_the_python_path(policy):
    from replay.errors import ConfigError

    requests = Requests(np.array([3, 4, 2]), np.array([2, 2, 3]), arrival=np.zeros(3),
                        type_id=np.array([0, 5, 1]))
    outcomes = []
    for run in (lambda e: e.run(), run_compiled):
        engine = Engine(requests, POLICIES[policy](), UnitTiming(), explicit(50))
        try:
            outcomes.append(("ok", run(engine).requests))
        except ConfigError as exc:
            outcomes.append(("error", str(exc)))
    if outcomes[0][0] == "error":
        assert outcomes[1] == outcomes[0]
    else:  # Nested WAIT does not read types
        assert outcomes[1][0] == "ok" and outcomes[1][1].equals(outcomes[0][1])


# --------------------------------------------- the real Vidur tables (a cheap training)


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "sarathi_unreserved", "mcsf"])
def test_compiled_path_on_real_vidur_tables(timings, policy):  # noqa: F811
    """Crosscheck-like setups (blocks of 16, 1,030 blocks) on the trained 70B tables, with
    256 requests per batch allowed so that decode batches leave the profile (128)."""
    rng = np.random.default_rng(7)
    n = 300
    s, o = rng.integers(1, 3000, n), rng.integers(1, 1200, n)
    requests = Requests(s, o, arrival=np.cumsum(rng.exponential(1 / 30, n)))
    make = {"vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=256),
            "sarathi": lambda: SarathiLike(EvictLIFO(), max_num_seqs=256, reserve_prompt=True),
            "sarathi_unreserved": lambda: SarathiLike(EvictLIFO(), chunk_size=256),
            "mcsf": lambda: MCSF(EvictLIFO())}[policy]
    timing = timings["70b"]
    counted = dict(timing.out_of_range_batches)

    def engine():
        return Engine(requests, make(), timing, explicit(1030 * 16, 16),
                      preemption="recompute")

    python = engine().run()
    extrapolated = {k: v - counted[k] for k, v in timing.out_of_range_batches.items()}
    compiled = run_compiled(engine())
    assert_identical(python, compiled)
    assert {k: v - counted[k] - extrapolated[k]
            for k, v in timing.out_of_range_batches.items()} == extrapolated


@pytest.mark.parametrize("limit", [dict(max_steps=10), dict(livelock_window=7)])
@pytest.mark.parametrize("policy", ["fcfs", "vllm", "sarathi"])
def test_the_run_stops_where_the_python_path_stops(policy, limit):
    # One long decode: a stretch must stop at the step limit or the livelock window.
    requests = Requests(np.array([4, 3]), np.array([50, 40]), arrival=np.array([0.0, 2.0]))

    def engine():
        return Engine(requests, POLICIES[policy](), LinearTiming(0.01, 1e-4), explicit(100),
                      **limit)

    python, compiled = engine().run(), run_compiled(engine())
    assert_identical(python, compiled)
    assert compiled.status in ("step_limit", "livelock")


def test_a_run_records_which_step_loop_ran_and_why():
    from replay.config import compose_config
    from replay.run import build_and_run

    fast, _, _ = build_and_run(compose_config(["workload.n=60"]))
    assert fast.engine_path == {"path": "compiled"} and fast.compile_time_s >= 0
    reference, _, _ = build_and_run(compose_config(["workload.n=60", "engine.compiled=false"]))
    assert reference.engine_path == {"path": "python", "reason": "engine.compiled=false"}
    pd.testing.assert_frame_equal(fast.requests, reference.requests, check_exact=True)
    lp, _, _ = build_and_run(compose_config(["workload.n=20", "policy=sorted_f"]))
    assert lp.engine_path["path"] == "python" and "SortedF" in lp.engine_path["reason"]


def test_without_numba_a_run_falls_back_to_python_with_one_warning(monkeypatch, caplog):
    import logging

    from replay import run as run_module
    from replay.config import compose_config

    monkeypatch.setitem(sys.modules, "replay.compiled", None)  # import fails as without numba
    monkeypatch.setattr(run_module, "_NO_NUMBA_WARNED", False)
    with caplog.at_level(logging.WARNING, logger="replay.run"):
        for _ in range(2):
            result, _, _ = run_module.build_and_run(compose_config(["workload.n=30"]))
            assert result.status == "completed" and result.engine_path["path"] == "python"
            assert "numba unavailable" in result.engine_path["reason"]
    warnings = [r for r in caplog.records if "numba cannot be imported" in r.getMessage()]
    assert len(warnings) == 1
