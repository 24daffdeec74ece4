"""The engine is held equal to the test oracle: a plain numpy statement of the same model
(:mod:`tests.oracle.engine`) running plain statements of the built-in policies
(:mod:`tests.oracle.policies`), step by step with no steady stretches.

Equal means byte for byte: the request table, the iteration table, the token-gap histogram
(count, total, maximum and every bin), the status and message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.fcfs import FCFSLookahead
from policies.lpm import LongestPrefixMatch
from policies.mcsf import MCSF
from policies.nested_wait import NestedWait
from policies.paper_fcfs import PaperFCFS
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from policies.vllm_v1 import VLLMV1
from policies.wait import Wait
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.engine.requests import Requests
from replay.timing.simple import LinearTiming, UnitTiming
from replay.timing.vidur import VidurTiming
from replay.timing.vidur_tables import VidurTables
from tests.oracle import engine as oracle
from tests.oracle.policies import oracle_of
from tests.test_timing_vidur import cache_dir, timings  # noqa: F401 (fixtures, shared)

TYPES = [{"prompt_len": 4, "output_len": 8, "rate": 1.0},
         {"prompt_len": 10, "output_len": 3, "rate": 0.5}]
POLICIES = {
    "vllm": lambda: VLLMLike(EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200),
    "sarathi": lambda: SarathiLike(EvictLIFO(), chunk_size=16, max_num_seqs=8),
    "vllm_v1": lambda: VLLMV1(EvictLIFO(), max_num_seqs=4, max_num_batched_tokens=16),
    "vllm_v1_threshold": lambda: VLLMV1(EvictLIFO(), max_num_batched_tokens=24,
                                        long_prefill_token_threshold=5,
                                        reserve_full_isl=False, reserved_blocks=0),
    "sarathi_reserve": lambda: SarathiLike(EvictLIFO(), chunk_size=16, reserve_prompt=True),
    "sarathi_watermark": lambda: SarathiLike(EvictLIFO(), chunk_size=16, watermark=0.2),
    "fcfs": lambda: FCFSLookahead(EvictLIFO()),
    "mcsf": lambda: MCSF(EvictLIFO()),
    "paper_fcfs": lambda: PaperFCFS(EvictLIFO()),
    "protection": lambda: AlphaProtection(0.3, ClearAll()),
    "clearing": lambda: AlphaProtection(0.2, ClearEachWithProb(0.5)),
    "protection_lifo": lambda: AlphaProtection(0.1, EvictLIFO()),
    "wait": lambda: Wait(EvictLIFO(), TYPES, n=[2, 1]),
    "wait_max_wait": lambda: Wait(EvictLIFO(), TYPES, n=[3, 2], max_wait=4.0),
    "nested_wait": lambda: NestedWait(EvictLIFO(), boundaries=[2, 5], max_stage=20,
                                      n=[2, 2, 1]),
    "nested_wait_max_wait": lambda: NestedWait(EvictLIFO(), boundaries=[3], max_stage=20,
                                               n=[3, 2], max_wait=3.0),
    # the WAIT authors' variants (paper_policy=wait_authors, nested_authors), and their
    # options one by one
    "wait_authors": lambda: Wait(EvictLIFO(), TYPES, thresholds="authors", batch_limit=6,
                                 in_flight_limit="per_type", readiness="any_type",
                                 force_clear=True),
    "wait_per_type": lambda: Wait(EvictLIFO(), TYPES, n=[2, 1], batch_limit=6,
                                  in_flight_limit="per_type"),
    "wait_any_type_force_clear": lambda: Wait(EvictLIFO(), TYPES, n=[3, 2],
                                              readiness="any_type", force_clear=True),
    "nested_authors": lambda: NestedWait(EvictLIFO(), types=TYPES, thresholds="authors",
                                         batch_limit=20, force_clear=True),
    "nested_wait_force_clear": lambda: NestedWait(EvictLIFO(), boundaries=[2, 5],
                                                  max_stage=20, n=[2, 2, 1], force_clear=True),
}


def fake_vidur(out_of_range: str = "extrapolate", seed: int = 0,
               beyond_profile: str = "linear") -> VidurTiming:
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
    timing.out_of_range, timing.beyond_profile = out_of_range, beyond_profile
    timing.out_of_range_batches = {"tokens": 0, "decode_batch": 0, "context": 0}
    timing._bind_tables(tables)
    return timing


TIMINGS = {"unit": UnitTiming, "linear": lambda: LinearTiming(0.01, 1e-4, 5e-4),
           "vidur": fake_vidur}


def assert_identical(result, reference) -> None:
    """Two runs' outputs are the same, byte for byte (the oracle's messages name its own
    policy class, ``Oracle<Name>``)."""
    message = reference.message
    if message.startswith("Oracle"):
        message = message.split(" ", 1)[1]
        assert result.message.split(" ", 1)[1] == message
    else:
        assert result.message == message
    assert result.status == reference.status
    pd.testing.assert_frame_equal(result.requests, reference.requests, check_exact=True)
    pd.testing.assert_frame_equal(result.iterations, reference.iterations, check_exact=True)
    got, want = result.token_gaps, reference.token_gaps
    got._flush()
    want._flush()
    assert (got.count, got.total, got.max) == (want.count, want.total, want.max)
    assert np.array_equal(got.counts, want.counts)


def engine_and_oracle(requests, policy, timing, kv, seed: int = 0, **options):
    """The engine's run and the oracle's, of the same requests, policy and options (the
    oracle runs every step: fast-forward is an engine option only)."""
    fast_forward = options.pop("fast_forward", True)
    result = Engine(requests, policy(), timing(), kv, seed=seed, fast_forward=fast_forward,
                    **options).run()
    reference = oracle.Engine(requests, oracle_of(policy()), timing(), kv, seed=seed,
                              **options).run()
    return result, reference


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
                   max_starts_per_round=draw(st.sampled_from([None, 1])),
                   fast_forward=draw(st.booleans()))
    types = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    return Requests(s, o, arrival=arrival, predicted_lo=np.minimum(hi, o), predicted_hi=hi,
                    type_id=types), explicit(kv, block), options


def pairs(policies, timing_names, fast: set[tuple[str, str]]) -> list:
    """Every (policy, timing) pair; those not in ``fast`` are slow (CI runs them all: the
    default run keeps a lookahead, a serving and the WAIT paper's FCFS pair, and a
    few with the cache, within its CPU budget)."""
    return [pytest.param(policy, timing, marks=() if (policy, timing) in fast
                         else pytest.mark.slow) for policy in policies for timing in timing_names]


FAST_PAIRS = {("fcfs", "unit"), ("vllm", "unit"), ("paper_fcfs", "unit")}


@pytest.mark.parametrize(("policy", "timing"), pairs(POLICIES, TIMINGS, FAST_PAIRS))
@settings(max_examples=20, deadline=None)
@given(workload=workloads())
def test_the_engine_gives_the_oracles_results(policy, timing, workload):
    requests, kv, options = workload
    assert_identical(*engine_and_oracle(requests, POLICIES[policy], TIMINGS[timing], kv,
                                        livelock_window=500, **options))


def test_a_log_longer_than_its_first_room_grows_and_keeps_every_row():
    """The iteration log starts with room for 4,096 rows and doubles when full: three
    requests of 1,800 tokens each decode one at a time (one running), about 5,400 steps and
    so a doubling, with the cache's log beside it."""
    requests = Requests(np.array([4, 4, 4]), np.array([1800, 1800, 1800]), arrival=np.zeros(3),
                        type_id=np.zeros(3, np.int64), block_ids=np.array([7], np.int64),
                        block_offsets=np.array([0, 1, 1, 1], np.int64), block_unit=4)
    kv = replace(explicit(1804, 4), prefix_cache="block_hash", cache_eviction="lru")
    result, reference = engine_and_oracle(requests, POLICIES["fcfs"], TIMINGS["unit"], kv,
                                          fast_forward=False)
    assert len(result.iterations) > 4096
    assert_identical(result, reference)
    assert result.prefix_cache == reference.prefix_cache


@st.composite
def prefix_workloads(draw, max_n: int = 12):
    """Requests whose prompts share prefixes: each belongs to one of three families and
    shares a random number of its family's leading content ids (one per block, or per two
    blocks); the rest of its prompt is its own."""
    block = draw(st.sampled_from([2, 4]))
    unit = block * draw(st.sampled_from([1, 2]))
    kv = block * draw(st.integers(12, 60))
    n = draw(st.integers(1, max_n))
    s = np.array(draw(st.lists(st.integers(block, kv // 2), min_size=n, max_size=n)))
    o = np.array([draw(st.integers(1, min(kv - si, 3 * block))) for si in s])
    arrival = np.array(draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)), dtype=float)
    ids, offsets = [], [0]
    for i in range(n):
        family = draw(st.integers(0, 2))
        shared = draw(st.integers(0, -(-int(s[i]) // unit)))
        ids += [1000 * family + k for k in range(shared)]
        offsets.append(len(ids))
    options = dict(preemption=draw(st.sampled_from(["restart", "recompute"])),
                   requeue=draw(st.sampled_from(["front", "back"])),
                   max_running=draw(st.sampled_from([None, 3])),
                   fast_forward=draw(st.booleans()))
    cache = replace(explicit(kv, block), prefix_cache="block_hash",
                    cache_eviction=draw(st.sampled_from(["lru", "fifo"])))
    types = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    return Requests(s, o, arrival=arrival, type_id=types, block_ids=np.array(ids, np.int64),
                    block_offsets=np.array(offsets, np.int64), block_unit=unit), cache, options


CACHE_POLICIES = {**POLICIES, "lpm": lambda: LongestPrefixMatch(
    EvictLIFO(), max_num_seqs=8, max_num_batched_tokens=200, window=3)}


FAST_CACHE_PAIRS = {("mcsf", "unit"), ("sarathi", "unit"), ("vllm_v1", "unit")}


# Found by a CI run: Sarathi-like promised to repeat a decode batch while its queue head's
# cached prefix lay on free entries; a decode's reclaim cut those hits, which freed room for
# a chunk, and the engine's stretch skipped the step that admitted it.
QUEUE_HEAD_ON_FREE_HITS = (
    Requests(np.array([2, 6, 27, 2, 2, 22, 2]), np.array([5, 1, 5, 1, 1, 1, 1]),
             arrival=np.array([1.0, 0, 0, 0, 0, 1, 0]), type_id=np.zeros(7, np.int64),
             block_ids=np.array([], np.int64), block_offsets=np.zeros(8, np.int64),
             block_unit=2),
    replace(explicit(56, 2), prefix_cache="block_hash", cache_eviction="fifo"),
    dict(preemption="restart", requeue="front", max_running=None, fast_forward=True))
# Found by a longer hypothesis run: request 3's answer filled the rest of the trace block its
# 4-token prompt began, and was hashed as that block's content, so it became a hit for
# request 9's prompt in the middle of a decode stretch. An answer is now its request's own.
ANSWER_UNDER_A_PROMPT_ID = (
    Requests(np.array([4, 4, 4, 4, 4, 4, 4, 4, 24, 32]), np.array([1, 1, 1, 5, 1, 1, 1, 1, 5, 1]),
             arrival=np.zeros(10), type_id=np.zeros(10, np.int64),
             block_ids=np.array([0, 0], np.int64),
             block_offsets=np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2], np.int64), block_unit=8),
    replace(explicit(64, 4), prefix_cache="block_hash", cache_eviction="lru"),
    dict(preemption="restart", requeue="front", max_running=None, fast_forward=True))


@pytest.mark.parametrize(("policy", "timing"),
                         pairs(CACHE_POLICIES, ["unit", "linear"], FAST_CACHE_PAIRS))
@settings(max_examples=15, deadline=None)
@given(workload=prefix_workloads())
@example(workload=QUEUE_HEAD_ON_FREE_HITS)
@example(workload=ANSWER_UNDER_A_PROMPT_ID)
def test_the_engine_gives_the_oracles_results_with_the_prefix_cache(policy, timing, workload):
    requests, kv, options = workload
    result, reference = engine_and_oracle(requests, CACHE_POLICIES[policy], TIMINGS[timing],
                                          kv, livelock_window=500, **options)
    assert_identical(result, reference)
    assert result.prefix_cache == reference.prefix_cache


# ------------------------------------------------------------------ whole configs
SMALL = ["arrivals.rate=50", "workload.n=600", "kv.tokens=3000"]
CONFIGS = {  # the regression pins' configs (tests/test_regression_pins.py) and a few more
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
    "wait_b1": ["experiment=b1_wait_low", "paper_policy=wait", "timing=linear",
                "workload.duration_s=0.2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_the_engine_gives_the_oracles_results_on_whole_configs(name):
    from replay.config import compose_config
    from replay.run import build_engine

    cfg = compose_config(CONFIGS[name])
    engine, _, _, requests = build_engine(cfg)
    result = engine.run()
    options = {k: v for k, v in vars(engine.options).items() if k != "fast_forward"}
    reference = oracle.Engine(requests, oracle_of(engine.policy), engine.timing, engine.kv,
                              seed=cfg.seed, **options).run()
    assert_identical(result, reference)
    assert result.decisions <= reference.decisions  # stretches ran without deciding


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["vllm", "sarathi", "sarathi_unreserved", "mcsf"])
def test_the_engine_gives_the_oracles_results_on_real_vidur_tables(timings, policy):  # noqa: F811
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
    assert_identical(*engine_and_oracle(requests, make, lambda: timing,
                                        explicit(1030 * 16, 16), preemption="recompute"))


@pytest.mark.parametrize("limit", [dict(max_steps=10), dict(livelock_window=7)])
@pytest.mark.parametrize("policy", ["fcfs", "vllm", "sarathi"])
def test_the_run_stops_where_the_oracle_stops(policy, limit):
    # One long decode: a stretch must stop at the step limit or the livelock window.
    requests = Requests(np.array([4, 3]), np.array([50, 40]), arrival=np.array([0.0, 2.0]))
    result, reference = engine_and_oracle(requests, POLICIES[policy],
                                          lambda: LinearTiming(0.01, 1e-4), explicit(100),
                                          **limit)
    assert_identical(result, reference)
    assert result.status in ("step_limit", "livelock")


# ---------------------------------------------------------------------- compiling
def test_compiling_depends_on_types_not_on_config_values(monkeypatch):
    """Runs of other sizes, capacities, block sizes and options reuse what the first run
    compiled: the loop, the rules and the functions that make and read the records."""
    from numba.core.dispatcher import Dispatcher

    rng = np.random.default_rng(1)
    compiled, compile_as_numba_does = [], Dispatcher.compile

    def counted(self, signature):
        compiled.append(self.py_func.__name__)
        return compile_as_numba_does(self, signature)

    for k, (n, kv, block, options) in enumerate([
            (5, 60, 1, {}), (40, 400, 16, dict(preemption="recompute")),
            (9, 33, 3, dict(requeue="back", max_running=2))]):
        if k == 1:  # after the first run, any compile (or load) is one too many
            monkeypatch.setattr(Dispatcher, "compile", counted)
        s, o = rng.integers(1, 10, n), rng.integers(1, 10, n)
        Engine(Requests(s, o, arrival=np.sort(rng.random(n))), MCSF(EvictLIFO()),
               LinearTiming(0.01, 1e-4), explicit(kv, block), **options).run()
    assert compiled == []


@pytest.mark.slow
def test_a_cold_compile_compiles_each_function_once(tmp_path):
    # A second signature (such as a literal 0 for an int64) is a second compile of the
    # function for nothing; a phase a helper compiles for other types than the loop's is
    # compiled twice. In a fresh process with an empty cache.
    script = """
import numpy as np
from numba.core.dispatcher import Dispatcher
import policies.common.lookahead, policies.common.serving, policies.common.staging
import replay.engine.phases, replay.engine.rules, replay.engine.sorting
import replay.timing.simple, replay.timing.vidur_pricing
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.requests import Requests
from tests.test_oracle import POLICIES, TIMINGS

requests = Requests(np.array([2, 3]), np.array([2, 2]), arrival=np.zeros(2),
                    type_id=np.array([0, 1]))
for policy in POLICIES:
    for timing in TIMINGS:
        Engine(requests, POLICIES[policy](), TIMINGS[timing](), explicit(64)).run()
modules = [m for name, m in sys.modules.items()
           if name.startswith(("replay.engine", "replay.timing", "policies"))]
for module in modules:
    for name, function in vars(module).items():
        if isinstance(function, Dispatcher) and len(function.signatures) > 1:
            print(module.__name__, name, *function.signatures, sep="\\n  ")
# the phases a helper compiles ahead of the loop, for the types the loop calls them with
from replay.engine.loop import PHASES_FOR_A_HELPER
for function, signature in PHASES_FOR_A_HELPER:
    if function.signatures != [tuple(signature)]:
        print("helper's signature of", function.__name__, "is not the loop's")
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import sys\n" + script], env=env,
                          capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parent.parent)
    assert done.stdout == ""
    # The first run's one line names the loop as one thing (not its record makers) and the
    # rules it compiled (test_architecture checks a later run that names a rule alone).
    first = done.stderr.splitlines()[0]
    assert first.startswith("kvsched: compiled the step loop, "), done.stderr
    assert "_make_engine_state" not in done.stderr
