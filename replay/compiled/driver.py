"""``run_compiled(engine)``: replay an already-constructed :class:`~replay.engine.loop.Engine` with
the compiled step loop, on the engine's own state arrays, returning the
:class:`~replay.engine.loop.RunResult` that ``engine.run()`` returns (same request table,
iteration table, token-gap histogram, status and message; tested byte for byte).

Only built-in policies whose decision has a compiled twin, with a built-in overflow
rule and timing backend, have this path (:func:`supports_compiled`); everything else,
a user's own policy above all, runs on ``Engine.run``.

What differs from ``Engine.run``: ``decisions`` counts every step's decision (the
compiled loop does not fast-forward: it is cheap enough step by step, and the engine
defines fast-forwarding to change nothing but speed); ``decision_time_s`` and
``timing_time_s`` are 0 (both happen inside the compiled loop, whose whole wall time
is ``loop_time_s``); and :class:`CompiledRunResult` adds ``compile_time_s``, the time
this process spent compiling (or loading from numba's on-disk cache) the loop before
the replay, which ``loop_time_s`` excludes (it includes waiting for another process
that compiles into the same cache: one compiles at a time).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import fasteners
import numba
import numpy as np
import pandas as pd

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from policies.nested_wait import NestedWait
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from policies.wait import Wait
from replay.compiled import decisions as dec
from replay.compiled import kernels as k
from replay.compiled import pricing
from replay.engine.iteration_log import ITERATION_COLUMNS, ITERATION_DTYPES
from replay.engine.loop import Engine, RunResult
from replay.engine.numeric import numba_cache_dir
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.engine.policy import Batch, PolicyView
from replay.engine.waiting import WaitingQueue
from replay.timing.base import BatchShape
from replay.timing.simple import LinearTiming, UnitTiming
from replay.timing.vidur import VidurTiming

log = logging.getLogger(__name__)

#: Policy classes with a compiled decision (exact classes: a subclass may decide otherwise).
POLICIES = {VLLMLike: dec.VLLM, SarathiLike: dec.SARATHI, FCFSLookahead: dec.FCFS,
            MCSF: dec.MCSF, AlphaProtection: dec.PROTECTION, Wait: dec.WAIT,
            NestedWait: dec.NESTED_WAIT}
OVERFLOW_RULES = {EvictLIFO: dec.EVICT_LIFO, ClearAll: dec.CLEAR_ALL,
                  ClearEachWithProb: dec.CLEAR_WITH_PROB}
TIMINGS = {UnitTiming: pricing.UNIT, LinearTiming: pricing.LINEAR, VidurTiming: pricing.VIDUR}
_STATUS = {k.STATUS_COMPLETED: "completed", k.STATUS_LIVELOCK: "livelock",
           k.STATUS_STALLED: "stalled", k.STATUS_STEP_LIMIT: "step_limit"}
_INITIAL_LOG_ROWS = 1 << 14
#: The disk cache folder of the compiled functions, as it was when numba decorated them
#: (the sources it is keyed by may change on disk while a process runs).
_CACHE_DIR = Path(numba_cache_dir())


@dataclass
class CompiledRunResult(RunResult):
    """A :class:`RunResult` of the compiled path, with the compile (or cache-load) time."""

    compile_time_s: float = 0.0


def unsupported_reason(engine: Engine) -> str | None:
    """Why ``engine`` has no compiled path, or ``None`` if it has one."""
    policy = engine.policy
    if type(policy) not in POLICIES:
        return f"policy {type(policy).__name__} has no compiled decision"
    if type(policy.overflow) not in OVERFLOW_RULES:
        return f"overflow rule {type(policy.overflow).__name__} has no compiled twin"
    if type(engine.timing) not in TIMINGS:
        return f"timing backend {type(engine.timing).__name__} has no compiled pricing"
    if isinstance(engine.timing, VidurTiming) and engine.timing.beyond_profile != "linear":
        return (f"timing.beyond_profile={engine.timing.beyond_profile} has no compiled pricing "
                f"(only linear)")
    if isinstance(policy, MCSF | FCFSLookahead) and not _combinable(engine):
        return "predicted outputs too large to order by (estimate, id) in int64"
    return None


def supports_compiled(engine: Engine) -> bool:
    """Whether ``engine`` (its policy, overflow rule and timing backend) has a compiled path."""
    return unsupported_reason(engine) is None


def _combinable(engine: Engine) -> bool:
    n = max(engine.status.size, 1)
    return int(engine.predicted_output.max(initial=0)) < 2 ** 62 // n


def _policy_params(policy, kv_tokens: int, block: int, type_id: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The policy's parameters as the compiled decisions read them (``type_id``: every
    request's type, if known in advance; WAIT then skips its per-step type check)."""

    def all_typed(types: int) -> bool:
        return type_id is not None and bool(np.all((type_id >= 0) & (type_id < types)))

    ints = np.zeros(4, dtype=np.int64)
    floats = np.zeros(1, dtype=np.float64)
    if isinstance(policy, VLLMLike):
        ints[dec.V_MAX_SEQS] = policy.max_num_seqs
        ints[dec.V_MAX_TOKENS] = policy.max_num_batched_tokens
        ints[dec.V_WATERMARK] = int(policy.watermark * (kv_tokens // block))
    elif isinstance(policy, SarathiLike):
        ints[dec.S_CHUNK] = policy.chunk_size
        ints[dec.S_MAX_SEQS] = policy.max_num_seqs
        ints[dec.S_WATERMARK] = int(policy.watermark * (kv_tokens // block))
        ints[dec.S_RESERVE] = bool(policy.reserve_prompt)
    elif isinstance(policy, AlphaProtection):
        floats[0] = policy.alpha
    elif isinstance(policy, Wait | NestedWait):
        if policy.max_wait is not None:
            floats = np.array([1.0, policy.max_wait], dtype=np.float64)
        else:
            floats = np.zeros(2, dtype=np.float64)
        thresholds = np.asarray(policy.per_stage, dtype=np.int64)
        if isinstance(policy, Wait):
            ints = np.concatenate(([int(policy.output_len.max() + 1),
                                    int(all_typed(thresholds.size))], thresholds))
        else:
            inner = np.asarray(policy.edges[1:-1], dtype=np.int64)
            ints = np.concatenate(([thresholds.size], thresholds, inner))
    return np.ascontiguousarray(ints, dtype=np.int64), floats


def _type_waiting(policy, params: np.ndarray, type_id: np.ndarray,
                  waiting: np.ndarray) -> np.ndarray:
    """WAIT's count of waiting requests per type, which the step loop then keeps up to date
    (WAIT's decision reads it instead of counting the queue at every step); a placeholder
    for the other policies, or where a request's type is out of range (WAIT then counts)."""
    if not isinstance(policy, Wait) or not params[1]:
        return np.zeros(1, dtype=np.int64)
    return np.bincount(type_id[waiting], minlength=params.size - 2).astype(np.int64)


def _timing_params(timing):
    """The backend's parameters as the step loops read them: ``linear`` holds LinearTiming's
    ``d0, d1, d2``, Vidur's ``ms_to_s`` (index 3), then ``d3, d4`` (indices 4, 5)."""
    linear = np.zeros(6, dtype=np.float64)
    vidur_ints = np.zeros(6, dtype=np.int64)
    token_ms = np.zeros(1, dtype=np.float64)
    decode_ms = prefill_ms = np.zeros((1, 1), dtype=np.float64)
    if isinstance(timing, LinearTiming):
        linear[:3] = timing.d0, timing.d1, timing.d2
        linear[4:] = timing.d3, timing.d4
    elif isinstance(timing, VidurTiming):
        linear[3] = timing._ms_to_s
        token_ms = np.ascontiguousarray(timing._token_ms, dtype=np.float64)
        decode_ms = np.ascontiguousarray(timing._decode_ms, dtype=np.float64)
        prefill_ms = np.ascontiguousarray(timing._prefill_ms, dtype=np.float64)
        vidur_ints[pricing.V_GRANULARITY] = timing._granularity
        vidur_ints[pricing.V_MAX_TOKENS] = timing._max_tokens
        vidur_ints[pricing.V_MAX_BATCH] = timing._max_batch
        vidur_ints[pricing.V_MAX_CHUNK] = timing._max_chunk
        vidur_ints[pricing.V_CHECK_CHUNK] = timing._check_chunk
        vidur_ints[pricing.V_ERROR] = timing.out_of_range == "error"
    return linear, token_ms, decode_ms, prefill_ms, vidur_ints


class _Run:
    """The compiled loop's arguments for one engine, and what the driver does between calls."""

    def __init__(self, engine: Engine) -> None:
        e, n = engine, engine.status.size
        policy = e.policy
        self.engine = e
        none = -1
        config = np.zeros(k.N_CONFIG, dtype=np.int64)
        config[k.C_N] = n
        config[k.C_CAPACITY] = e.kv.tokens
        config[k.C_BLOCK] = e.kv.block_size
        config[k.C_LIVELOCK] = e.livelock_window
        config[k.C_MAX_STEPS] = none if e.max_steps is None else e.max_steps
        config[k.C_MAX_RUNNING] = none if e.max_running is None else e.max_running
        config[k.C_MAX_STARTS] = (none if e.max_starts_per_round is None
                                  else e.max_starts_per_round)
        config[k.C_RECOMPUTE] = e.preemption == "recompute"
        config[k.C_REQUEUE_BACK] = e.requeue == "back"
        config[k.C_OVERFLOW] = OVERFLOW_RULES[type(policy.overflow)]
        config[k.C_FAST_FORWARD] = bool(e.fast_forward)
        self.config = config
        self.step_loop = _step_loop_of(e)
        policy_ints, policy_floats = _policy_params(policy, e.kv.tokens, e.kv.block_size,
                                                    e.type_id)
        beta = float(getattr(policy.overflow, "beta", 0.0))
        linear, token_ms, decode_ms, prefill_ms, vidur_ints = _timing_params(e.timing)
        self.out_of_range = np.zeros(3, dtype=np.int64)
        self.ints = np.zeros(k.N_INTS, dtype=np.int64)
        self.ints[k.I_NEXT_KEY] = e._next_queue_key
        self.ints[k.I_HINT] = -1
        self.now = np.zeros(1, dtype=np.float64)
        self.queue = np.zeros(n + 1, dtype=np.int64)
        self.running = np.zeros(n, dtype=np.int64)
        self.log_times = np.zeros((2, _INITIAL_LOG_ROWS), dtype=np.float64)
        self.log_ints = np.zeros((8, _INITIAL_LOG_ROWS), dtype=np.int64)
        self.log_failed = np.zeros(_INITIAL_LOG_ROWS, dtype=np.bool_)
        gaps = e.token_gaps
        gaps._flush()  # a fresh engine's histogram is empty; fold anything there first
        self.ints[k.I_GAP_COUNT] = gaps.count
        # the loop folds into the histogram's own buffer and counts
        self.hist_floats = np.zeros(4, dtype=np.float64)
        self.hist_floats[[k.H_LOG_LO, k.H_LOG_RATIO, k.H_TOTAL, k.H_MAX]] = (
            gaps._log_lo, gaps._log_ratio, gaps.total, gaps.max)
        s = e
        self.args_head = (config, policy_ints, policy_floats, beta, e.overflow_rng, linear,
                          token_ms, decode_ms, prefill_ms, vidur_ints, self.out_of_range,
                          s.arrival, s.prompt_len, s.output_len,
                          np.ascontiguousarray(s.predicted_output, dtype=np.int64),
                          np.ascontiguousarray(s.type_id, dtype=np.int64),
                          s.status, s.prefill_len, s.prefilled, s.generated, s.held,
                          s.start_iteration, s.evictions, s.queue_key, s.start_time,
                          s.first_token_time, s.completion_time, s.last_token_time,
                          s.max_token_gap, self.ints, self.now, self.queue, self.running)
        i64 = np.int64
        # the last batch's shape, read back where pricing stops (EXIT_PRICE_ERROR)
        self.new_tokens, self.context = np.zeros(n, dtype=i64), np.zeros(n, dtype=i64)
        self.is_prefill = np.zeros(n, dtype=np.bool_)
        self.args_tail = (gaps._buffer, gaps.counts, self.hist_floats,
                          np.zeros(n, dtype=i64), np.zeros(n, dtype=np.bool_),
                          np.zeros(n, dtype=i64),  # running_by_id
                          np.zeros(2 * n + 16, dtype=i64), np.zeros(n, dtype=i64),
                          *(np.zeros(n, dtype=i64) for _ in range(4)),  # start..chunk_ids
                          *(np.zeros(n, dtype=i64) for _ in range(3)),  # members, chunk, gain
                          self.new_tokens, self.context, self.is_prefill,
                          *(np.zeros(n, dtype=i64) for _ in range(3)),
                          np.zeros(max(n, 1), dtype=np.float64),
                          _type_waiting(policy, policy_ints, e.type_id, self.queue[:0]))

    def args(self) -> tuple:
        return (*self.args_head, self.log_times, self.log_ints, self.log_failed,
                *self.args_tail)

    def call(self) -> int:
        return self.step_loop(*self.args())

    def finish_token_gaps(self) -> None:
        """The histogram's scalars as the loop left them (its buffer and counts are the
        histogram's own arrays)."""
        gaps, ints, floats = self.engine.token_gaps, self.ints, self.hist_floats
        gaps._filled, gaps.count = int(ints[k.I_FILLED]), int(ints[k.I_GAP_COUNT])
        gaps.total, gaps.max = float(floats[k.H_TOTAL]), float(floats[k.H_MAX])

    def grow_log(self) -> None:
        rows = self.log_failed.size
        self.log_times = np.concatenate((self.log_times, np.zeros_like(self.log_times)), axis=1)
        self.log_ints = np.concatenate((self.log_ints, np.zeros_like(self.log_ints)), axis=1)
        self.log_failed = np.concatenate((self.log_failed, np.zeros(rows, dtype=np.bool_)))

    def iteration_frame(self) -> pd.DataFrame:
        rows = int(self.ints[k.I_LOG])
        values = {"start_time": self.log_times[0, :rows], "duration": self.log_times[1, :rows],
                  "batch_size": self.log_ints[k.L_BATCH, :rows],
                  "n_started": self.log_ints[k.L_STARTED, :rows],
                  "prefill_tokens": self.log_ints[k.L_PREFILL, :rows],
                  "decode_requests": self.log_ints[k.L_DECODE, :rows],
                  "kv_peak": self.log_ints[k.L_PEAK, :rows],
                  "kv_after": self.log_ints[k.L_AFTER, :rows],
                  "n_completed": self.log_ints[k.L_COMPLETED, :rows],
                  "n_evicted": self.log_ints[k.L_EVICTED, :rows],
                  "failed": self.log_failed[:rows]}
        return pd.DataFrame({name: np.array(values[name], dtype=ITERATION_DTYPES[name])
                             for name in ITERATION_COLUMNS})

    def view(self) -> PolicyView:
        """The engine's view at the current step, as Engine.run would hand it to the policy."""
        e, ints = self.engine, self.ints
        released, n = int(ints[k.I_RELEASED]), e.status.size
        return PolicyView(
            kv_capacity=e.kv.tokens, arrival=e.arrival, prompt_len=e.prompt_len,
            predicted_output=e.predicted_output, predicted_lo=e.predicted_lo,
            predicted_hi=e.predicted_hi, type_id=e.type_id, prefilled=e.prefilled,
            generated=e.generated, held=e.held, start_iteration=e.start_iteration,
            rng=e.policy_rng, kv_block_size=e.kv.block_size, prefill_len=e.prefill_len,
            now=float(self.now[0]), iteration=int(ints[k.I_ITERATION]),
            kv_held=int(ints[k.I_KV_HELD]),
            waiting=self.queue[ints[k.I_QHEAD]:ints[k.I_QTAIL]].copy(),
            running=self.running[:ints[k.I_NRUN]].copy(),
            next_arrival=float(e.arrival[released]) if released < n else float("inf"))

    def finish_engine_state(self) -> None:
        """Leave the engine as Engine.run leaves it (queue, running set, KV counters)."""
        e, ints = self.engine, self.ints
        e.queue = WaitingQueue()
        e.queue.append(self.queue[ints[k.I_QHEAD]:ints[k.I_QTAIL]].copy())
        running = self.running[:ints[k.I_NRUN]].copy()
        running.flags.writeable = False
        e.running = running
        e.kv_held, e.blocks_held = int(ints[k.I_KV_HELD]), int(ints[k.I_BLOCKS_HELD])
        e._next_queue_key = int(ints[k.I_NEXT_KEY])

    def status_message(self) -> tuple[str, str]:
        e, ints = self.engine, self.ints
        status = _STATUS[int(ints[k.I_STATUS])]
        unfinished = e.status.size - int(ints[k.I_COMPLETED])
        if status == "livelock":
            return status, (f"no request completed in {int(ints[k.I_IDLE])} steps with "
                            f"{unfinished} unfinished (livelock_window={e.livelock_window})")
        if status == "step_limit":
            return status, f"stopped after max_steps={e.max_steps}"
        if status == "stalled":
            return status, (f"{type(e.policy).__name__} scheduled nothing with "
                            f"{unfinished} requests unfinished and no arrivals left")
        return status, ""


def _step_loop_of(engine: Engine):
    return k.STEP_LOOPS[POLICIES[type(engine.policy)], TIMINGS[type(engine.timing)]]


def compile_kernels(engine: Engine) -> float:
    """Compile (or load from numba's disk cache) the step loop for ``engine``'s policy and
    timing backend if this process has not yet, without running the engine; returns the
    seconds that took (0 when it was ready)."""
    _refuse_unsupported(engine)
    return _compile(engine)


def _compile(engine: Engine) -> float:
    step_loop = _step_loop_of(engine)
    if step_loop.signatures:  # the arguments' types are the same for every run
        return 0.0
    started = time.perf_counter()
    # A run's arguments give the signature. Building them here, timed with the compile, also
    # takes part of the first replay's extra cost out of its loop time: the process's first
    # large arrays get fresh pages from the C allocator, later ones reuse freed memory.
    signature = tuple(numba.typeof(arg) for arg in _Run(engine).args())
    # One process at a time compiles into (or loads from) the disk cache: numba updates a
    # function's cache index by read, add, write, so two processes saving different
    # signatures of one callee at once could lose an entry or map it to the other's code.
    # Where numba cannot write that folder it caches elsewhere or not at all; the lock is
    # then skipped.
    try:
        _CACHE_DIR.mkdir(parents=True, exist_ok=True)
        lock = fasteners.InterProcessLock(str(_CACHE_DIR / ".compile.lock"))
        lock.acquire()
    except OSError:
        lock = None
    try:
        step_loop.compile(signature)
    finally:
        if lock is not None:
            lock.release()
    return time.perf_counter() - started


def _refuse_unsupported(engine: Engine) -> None:
    reason = unsupported_reason(engine)
    if reason is not None:
        raise ValueError(f"no compiled path: {reason}; use Engine.run()")


def run_compiled(engine: Engine) -> CompiledRunResult:
    """Replay ``engine`` (constructed, not yet run) on the compiled path; the result is the one
    ``engine.run()`` would return (see the module docstring for the timing fields)."""
    _refuse_unsupported(engine)
    if hasattr(engine, "queue") or np.count_nonzero(engine.status):
        raise ValueError("run_compiled: the engine has run already; construct a new one "
                         "(an Engine replays once)")
    compile_time = _compile(engine)
    started = time.perf_counter()
    run = _Run(engine)
    while True:
        code = run.call()
        if code == k.EXIT_DONE:
            break
        if code == k.EXIT_LOG_FULL:
            run.grow_log()
        elif code == k.EXIT_ASK_POLICY:
            run.finish_token_gaps()
            engine.policy.decide(run.view())  # raises what the Python path raises
            raise RuntimeError("compiled decision deferred to the policy, which did not raise")
        elif code == k.EXIT_PRICE_ERROR:
            run.finish_token_gaps()
            m = int(run.ints[k.I_M])
            engine.timing.duration(BatchShape(run.new_tokens[:m].copy(), run.context[:m].copy(),
                                              run.is_prefill[:m].copy()))
            raise RuntimeError("compiled pricing stopped on a batch the backend priced")
    run.finish_token_gaps()
    run.finish_engine_state()
    if isinstance(engine.timing, VidurTiming):
        for kind, count in zip(pricing.OUT_OF_RANGE_KINDS, run.out_of_range.tolist(),
                               strict=True):
            if count and engine.timing.out_of_range_batches[kind] == 0:
                log.warning("timing.vidur: extrapolating beyond the profile (%s) in %d batches",
                            kind, count)
            engine.timing.out_of_range_batches[kind] += count
    loop_time = time.perf_counter() - started
    status, message = run.status_message()
    iterations = run.iteration_frame()
    return CompiledRunResult(status, message, engine._request_table(), iterations, engine.kv,
                             engine.livelock_window, 0.0, engine.preemption, engine.requeue,
                             engine.token_gaps, timing_time_s=0.0, loop_time_s=loop_time,
                             decisions=int(run.ints[k.I_DECISIONS]),
                             compile_time_s=compile_time)


def compiled_decision(policy, view: PolicyView) -> Batch:
    """The compiled twin's decision for ``view``, as a :class:`~replay.engine.policy.Batch` (no
    steady-steps promise; ``prefill_chunks`` names the chunks short of the remaining prompt,
    as the Python decisions do). For testing the twins against ``policy.decide(view)``."""
    kind = POLICIES[type(policy)]
    n = view.prompt_len.size
    block, capacity = view.kv_block_size, view.kv_capacity
    waiting = np.ascontiguousarray(view.waiting, dtype=np.int64)
    running = np.ascontiguousarray(view.running, dtype=np.int64)
    start, advance, preempt, chunk_ids = (np.zeros(n, dtype=np.int64) for _ in range(4))
    chunk_of = np.zeros(n, dtype=np.int64)
    scratch = [np.zeros(n + 1, dtype=np.int64) for _ in range(3)]
    prefill_len, prefilled, held = (np.ascontiguousarray(a, dtype=np.int64) for a in
                                    (view.prefill_len, view.prefilled, view.held))
    n_adv, n_pre = -1, 0
    if kind in (dec.VLLM, dec.SARATHI):
        params, _ = _policy_params(policy, capacity, block)
        if kind == dec.VLLM:
            n_start, n_adv, n_pre, _, error = dec.vllm_decide(
                params, capacity, block, prefill_len, held, waiting, 0, waiting.size, running,
                running.size, start, advance, preempt, scratch[0])
        else:
            n_start, n_adv, n_pre, _, error = dec.sarathi_decide(
                params, capacity, block, prefill_len, prefilled, held, waiting, 0,
                waiting.size, running, running.size, start, advance, preempt, chunk_of,
                chunk_ids, scratch[0], scratch[1])
        if error:
            policy.decide(view)  # raises
    elif kind in (dec.WAIT, dec.NESTED_WAIT):
        type_id = np.ascontiguousarray(view.type_id, dtype=np.int64)
        params, floats = _policy_params(policy, capacity, block, type_id)
        args = (params, floats, view.now, view.more_arrivals)
        # the running set in id order, as the step loop keeps it for these decisions
        shared = (np.ascontiguousarray(view.arrival, dtype=np.float64),
                  np.ascontiguousarray(view.generated, dtype=np.int64), waiting, 0,
                  waiting.size, np.sort(running), running.size, start, advance, scratch[0])
        if kind == dec.WAIT:
            n_start, n_adv, n_pre, _, error = dec.wait_decide(
                *args, type_id, *shared, scratch[1], np.zeros(n, dtype=np.bool_),
                _type_waiting(policy, params, type_id, waiting))
        else:
            n_start, n_adv, n_pre, _, error = dec.nested_wait_decide(*args, *shared)
        if error:
            policy.decide(view)  # raises
    elif kind == dec.PROTECTION:
        n_start = dec.protection_decide(policy.alpha, capacity, view.kv_held,
                                        np.ascontiguousarray(view.prompt_len, dtype=np.int64),
                                        waiting, 0, waiting.size, start)
    else:
        estimate = np.ascontiguousarray(view.predicted_output, dtype=np.int64)
        candidates = (waiting if kind == dec.FCFS
                      else waiting[np.lexsort((waiting, estimate[waiting]))])
        n_start = dec.lookahead_decide(candidates, candidates.size, capacity, block,
                                       view.kv_held, np.ascontiguousarray(view.prompt_len,
                                                                          dtype=np.int64),
                                       prefill_len, np.ascontiguousarray(view.generated,
                                                                         dtype=np.int64),
                                       estimate, running, running.size, start, *scratch,
                                       np.full(1, -1, dtype=np.int64), view.iteration)
    members = np.concatenate((running if n_adv < 0 else advance[:n_adv], start[:n_start]))
    chunks = {int(r): int(chunk_of[r]) for r in members
              if 0 < chunk_of[r] < prefill_len[r] - prefilled[r]}
    return Batch(start=start[:n_start].copy(),
                 advance=None if n_adv < 0 else advance[:n_adv].copy(),
                 preempt=preempt[:n_pre].copy(), prefill_chunks=chunks or None)

