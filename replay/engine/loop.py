"""The iteration-level replay engine (see docs/model.md): one compiled step loop for every
policy, overflow rule and timing backend.

The engine owns the clock, the arrival stream, KV accounting, evictions, completions and
metrics. At every step it releases arrivals, asks the policy for a batch, prices the
iteration with the timing backend, checks the KV the batch would hold after the iteration
against ``M`` (applying the policy's overflow rule and charging the failed attempt if it
does not fit), and advances every request in the batch. The phases are written once, in
:mod:`replay.engine.phases`; :func:`run_steps` runs them in order, calling the policy's
decision, the overflow rule and the timing backend's price through function pointers
(:mod:`replay.engine.rules`: compiled rules directly, Python ones through a bridge).

Two semantics are options, both recorded in every summary:

* ``preemption``: what an evicted or preempted request keeps. ``restart`` (the papers'
  model): nothing; it prefills its prompt again. ``recompute`` (vLLM's): the tokens it
  emitted; readmitted, it prefills ``s + generated`` tokens in one attempt (chunkable), the
  last prefill iteration emits its next token, and it continues. Its first-token time and
  token gaps carry over.
* ``requeue``: where it re-enters the waiting queue. ``front``: at its original arrival
  position; ``back``: behind everything waiting, as if newly arrived. The queue order is a
  per-request key assigned when a request enters the queue (arrival, or ``back`` requeue);
  the view's ``waiting`` is in key order.

``max_running`` (optional) caps the running set for every policy: admissions beyond it are
cut, keeping the first ones of the policy's list (a prefix keeps a lookahead-feasible set
feasible). ``max_starts_per_round`` (optional, a diagnostic) cuts each step's admissions to
that many the same way. A cut admission's prefill chunk is dropped with it.

State is a record of arrays indexed by *engine id* (arrival order, ties by workload
position; :mod:`replay.engine.state`), so a step costs work in the batch and the queue
head, never in the whole trace.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from numba.core import types
from tqdm.auto import tqdm

from replay.engine import jit as compiling
from replay.engine.histogram import LogHistogram
from replay.engine.jit import jit, reference_counts
from replay.engine.kv import CACHE_EVICTIONS, KVCapacity
from replay.engine.phases import (
    COMPLETED,
    LIVELOCK,
    STALLED,
    STEP_LIMIT,
    apply_decision,
    clear_chunks,
    execute,
    fail_attempt,
    make_room,
    price,
    release_arrivals,
    run_stretch,
    stop_reason,
)
from replay.engine.policy import Policy, RunSetup
from replay.engine.prefix_cache import LOOKUP_REMOVALS, REMOVAL_LOG
from replay.engine.requests import Requests
from replay.engine.results import RunResult, iteration_frame
from replay.engine.rules import (
    CompiledOverflow,
    CompiledTiming,
    DecisionError,
    EngineArrays,
    PythonOverflow,
    PythonPolicy,
    PythonTiming,
    decide_in_python,
    evict_in_python,
    is_compiled,
    is_compiled_policy,
    new_rule_state,
    new_timing_state,
    no_decode_price,
    price_in_python,
    register,
    release,
)
from replay.engine.state import (
    DECIDE,
    DONE,
    ENGINE_STATE,
    EVICT,
    PRICE,
    PRICE_DECODES,
    RECORD_MAKERS,
    RULE_STATE,
    TIMING_STATE,
    new_engine_state,
    state_array_names,
)
from replay.engine.timing import BatchShape, TimingBackend
from replay.params import check, check_params

__all__ = ["DecisionError", "Engine", "EngineOptions", "RunResult", "default_livelock_window"]

#: A long replay logs where it is at most this often (wall seconds).
HEARTBEAT_S = 30.0
#: The step loop hands back to Python after this many steps (progress, heartbeat, Ctrl-C).
YIELD_STEPS = 1 << 16
EXIT_DONE, EXIT_YIELD, EXIT_POLICY_ERROR, EXIT_PRICE_ERROR = range(4)
_STATUS = {COMPLETED: "completed", LIVELOCK: "livelock", STALLED: "stalled",
           STEP_LIMIT: "step_limit"}
_INITIAL_LOG_ROWS = 1 << 12
#: The per-request and buffer arrays the engine makes and hands to its state record.
STATE_ARRAYS = state_array_names()
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    """The engine's options (``engine.*`` in the config), with their types and ranges."""

    livelock_window: int | None = field(default=None, metadata=check(ge=1))
    max_steps: int | None = field(default=None, metadata=check(ge=1))
    validate_decisions: bool = True
    preemption: Literal["restart", "recompute"] = "restart"
    requeue: Literal["front", "back"] = "front"
    max_running: int | None = field(default=None, metadata=check(ge=1))
    max_starts_per_round: int | None = field(default=None, metadata=check(ge=1))
    fast_forward: bool = True


def default_livelock_window(requests: Requests) -> int:
    """Steps without a completion after which a run is declared livelocked.

    A policy that keeps advancing what it started completes some request within
    ``max(s_i + o_i)`` iterations (even at one prompt token per chunk), so four times that,
    plus slack for arrivals and failed attempts, only trips on cycles.
    """
    return 4 * int((requests.prompt_len + requests.output_len).max(initial=1)) + 100


# --------------------------------------------------------------------------- the loop
@jit
def run_steps(s, policy, decide, overflow, evict_victims, timing, price_batch, price_decodes):
    """Run steps until the run ends (:data:`EXIT_DONE`; ``s.outcome`` says how), until
    ``s.yield_steps`` more steps have run (:data:`EXIT_YIELD`), or until the policy reports
    an error (:data:`EXIT_POLICY_ERROR`) or the timing backend refuses a batch
    (:data:`EXIT_PRICE_ERROR`). Every call resumes at a step boundary."""
    steps_at_call = s.steps
    while s.completed + s.dropped < s.n:
        if s.steps - steps_at_call >= s.yield_steps:
            return EXIT_YIELD
        release_arrivals(s)
        if s.qtail == s.qhead and s.n_run == 0:
            s.now = s.next_arrival
            continue
        outcome = stop_reason(s)
        if outcome:
            s.outcome = outcome
            return EXIT_DONE
        s.n_start, s.n_advance, s.n_preempt, s.n_drop, s.steady = 0, -1, 0, 0, 0  # decide sets
        # its own
        error = decide(s, policy)
        if error:
            s.error_code = error
            return EXIT_POLICY_ERROR
        s.decisions += 1
        s.n_joined = 0
        s.n_started = 0
        n_evicted, started_all = apply_decision(s)
        if s.m == 0:
            clear_chunks(s)
            if s.completed + s.dropped == s.n:
                break
            if s.next_arrival < np.inf:
                s.now = s.next_arrival
                continue
            s.outcome = STALLED
            return EXIT_DONE
        duration, kv_peak, prefill_total, n_decode, decode_only, gain_total, new_blocks = price(
            s, timing, price_batch, price_decodes)
        if np.isnan(duration):
            return EXIT_PRICE_ERROR
        kv_peak = make_room(s, kv_peak)
        s.steps += 1
        if kv_peak > s.capacity:
            fail_attempt(s, overflow, evict_victims, duration, kv_peak, prefill_total, n_decode,
                         decode_only, n_evicted)
            clear_chunks(s)
            continue
        n_finished, emitters = execute(s, duration, kv_peak, prefill_total, n_decode,
                                       decode_only, gain_total, new_blocks, n_evicted)
        if (s.steady > 0 and s.fast_forward and started_all and n_evicted == 0
                and n_finished == 0 and emitters == n_decode):
            run_stretch(s, timing, price_batch, price_decodes, s.steady, decode_only)
        clear_chunks(s)
    s.outcome = COMPLETED
    return EXIT_DONE


#: The loop's one signature: every rule arrives as a typed function pointer.
RUN_STEPS_SIGNATURE = types.int64(ENGINE_STATE, RULE_STATE, DECIDE, RULE_STATE, EVICT,
                                  TIMING_STATE, PRICE, PRICE_DECODES)


@jit
def _outcome(s):
    return (s.outcome, s.now, s.completed, s.dropped, s.steps, s.idle_steps, s.iteration,
            s.decisions, s.kv_held, s.blocks_held, s.n_log, s.gap_filled, s.gap_count, s.gap_total,
            s.gap_max, s.error_code, s.error_arg, s.m, s.qhead, s.qtail, s.n_run, s.next_key,
            s.next_arrival)


@jit
def _log_arrays(s):
    return s.log_times, s.log_ints, s.log_failed


@jit
def _log_cache(s):
    return s.log_cache


_CACHE_TOTALS = ("hit_blocks", "lookup_blocks", "hit_tokens", "prompt_tokens",
                 "reclaimed_blocks", "entries_at_end")


@jit
def _cache_totals(s):
    return (s.cache_hit_blocks, s.cache_lookup_blocks, s.cache_hit_tokens,
            s.cache_prompt_tokens, s.cache_reclaimed, s.cache_entries)


#: What Python calls around the loop (making the records, reading the outcome, the logs and
#: the cache's totals), each with the one signature it is called with: compiled with the loop.
AROUND_THE_LOOP = RECORD_MAKERS + tuple((read, (ENGINE_STATE,)) for read in (
    _outcome, _log_arrays, _log_cache, _cache_totals))

_OUTCOME = ("outcome", "now", "completed", "dropped", "steps", "idle_steps", "iteration",
            "decisions", "kv_held", "blocks_held", "n_log", "gap_filled", "gap_count", "gap_total",
            "gap_max", "error_code", "error_arg", "m", "qhead", "qtail", "n_run", "next_key",
            "next_arrival")


def _outcome_of(state) -> dict:
    return dict(zip(_OUTCOME, _outcome(state), strict=True))


_ready: set = set()


#: The rules' function pointer types, by the attribute of the rule's class that holds the
#: function (a helper process, and ``python -m replay.compile``, rebuild a signature from it).
RULE_KINDS = {"decision": DECIDE, "evict_victims": EVICT, "price_batch": PRICE,
              "price_decodes": PRICE_DECODES}
#: What compiles with the loop: the loop, then what Python calls around it.
LOOP_AND_AROUND = ((run_steps, RUN_STEPS_SIGNATURE), *AROUND_THE_LOOP)
#: Phases the loop calls that a first run's helper process compiles into the disk cache while
#: the run compiles the loop, which then loads them (each with the types the loop calls it
#: with; a test holds them to the loop's own typing). The loop reaches them late, so the
#: helper has usually saved them by then; a phase it has not, the loop compiles as usual.
#: Only ``execute``: the loop reaches the steady stretch right after it, before a helper
#: could have saved both, and would compile the stretch a second time.
PHASES_FOR_A_HELPER = (
    (execute, (ENGINE_STATE, types.float64, types.int64, types.int64, types.int64,
               types.boolean, types.int64, types.int64, types.int64)),
)
#: What a helper process may compile besides the rules, by position (a key).
BESIDE_THE_LOOP = AROUND_THE_LOOP + PHASES_FOR_A_HELPER
#: The functions the first run's line calls "the step loop" (the phases are linked into it).
_LOOP_FUNCTIONS = frozenset(f for f, _ in LOOP_AND_AROUND)


def beside_the_loop_signature(key: str):
    """The signature of a function compiled beside the loop, by its key: the attribute of its
    rule's class (:data:`RULE_KINDS`), or a position in :data:`BESIDE_THE_LOOP`."""
    return RULE_KINDS[key].signature if key in RULE_KINDS else BESIDE_THE_LOOP[int(key)][1]


def ensure_compiled(rules) -> float:
    """Compile the step loop, what Python calls around it and ``rules`` (pairs of a rule's
    function and its function pointer type) for the loop's signature, or load them from the
    disk cache, where this process has not yet; returns the seconds that took. When the loop
    is not in the disk cache (the first run on a machine, or after an edit of the engine)
    and the machine has a second core, a helper process compiles the rules and the loop's
    :data:`PHASES_FOR_A_HELPER` meanwhile, and the loop loads those phases. When anything
    had to be compiled, one line says so."""
    kind_of = {id(kind): name for name, kind in RULE_KINDS.items()}
    wanted = [*LOOP_AND_AROUND, *((f, kind.signature) for f, kind in rules)]
    missing = [(f, signature) for f, signature in wanted if f not in _ready]
    if not missing:
        return 0.0
    started = time.perf_counter()
    with compiling.compile_lock():
        helper, by_helper, helpers_share = None, [], set()
        if missing[0][0] is run_steps and not compiling.in_disk_cache(run_steps,
                                                                        RUN_STEPS_SIGNATURE):
            # The helper takes a phase the loop reaches late, the rules and the maker of the
            # engine's record (Python needs it only once the loop is compiled); the run
            # compiles the loop and the rest meanwhile, then loads the helper's share.
            offered = [(f, str(len(AROUND_THE_LOOP) + k))
                       for k, (f, _) in enumerate(PHASES_FOR_A_HELPER)]
            offered += [(f, kind_of[id(kind)]) for f, kind in rules if f not in _ready]
            offered += [(RECORD_MAKERS[0][0], "0")]
            helper = compiling.compile_in_a_helper(
                [(f.py_func.__module__, f.py_func.__qualname__, key) for f, key in offered],
                f"{__name__}:{beside_the_loop_signature.__name__}")
            helpers_share = {f for f, _ in offered}
            missing.sort(key=lambda item: item[0] in helpers_share)  # the run's own first
        try:
            for function, signature in missing:
                if helper is not None and function in helpers_share:
                    # the rest is in the disk cache now, or compiles here
                    by_helper, helper = compiling.helper_compiled(helper), None
                function.compile(signature)
        finally:
            if helper is not None:  # interrupted while compiling the loop
                helper.kill()
                helper.wait()
    # The loop runs only as compiled for function pointers: called with a rule's dispatcher,
    # numba would otherwise compile a copy specialised to that rule.
    run_steps.disable_compile()
    seconds = time.perf_counter() - started
    functions = [f for f, _ in missing]
    here = compiling.compiled_from_scratch(functions)
    compiled = [f for f in functions if f in here or f.__name__ in by_helper]
    # The loop's own functions are one thing to a reader; the rules are named.
    said = ["the step loop"] if any(f in _LOOP_FUNCTIONS for f in compiled) else []
    said += [f.__name__ for f in compiled if f not in _LOOP_FUNCTIONS]
    if said:
        log.warning("kvsched: compiled %s in %.1f s%s, once: later runs load %s from the "
                    "disk cache (%s)", ", ".join(said), seconds,
                    " (two processes)" if by_helper else "",
                    "them" if len(said) > 1 else "it", compiling.CACHE_DIR)
    _ready.update(functions)
    return seconds


# --------------------------------------------------------------------------- the engine
def prefix_cache_arrays(requests: Requests, order: np.ndarray | None,
                        kv: KVCapacity) -> dict:
    """The prefix cache's arrays (:mod:`replay.engine.prefix_cache`): the chain hashes of
    every request's full blocks, its answer's included (a request preempted and admitted
    again finds what it held still cached, as in vLLM), in one flat array in workload
    order with each row's start and count (and the same per engine id when ``order`` gives
    the ids before the run); and the empty table and entries (at most one entry per block
    of ``M``). A session turn's answer blocks carry the hashes of the next turn's prompt at
    those positions: the next prompt starts with that answer. Empty arrays with the cache
    off."""
    names = ("hashes", "ref_entry", "hash_start", "hash_count", "w_hash_start",
             "w_hash_count", "n_ref", "hit_blocks", "cached_tokens", "cache_table",
             "entry_hash", "entry_ref", "entry_prev", "entry_next", "entry_seq", "entry_stack",
             "entry_pin", "entry_depth", "lookup_one")
    if kv.prefix_cache == "none":
        return {**{name: np.zeros(0, dtype=np.int64) for name in names},
                "lookup_memo": np.zeros((3, 0), dtype=np.int64),
                "removal_log": np.zeros((2, 0), dtype=np.int64)}
    block, n = kv.block_size, len(requests)
    hashes, offsets = requests.block_hashes(block, with_output=True)
    lists = [hashes[offsets[w]:offsets[w + 1]] for w in range(n)]
    if requests.predecessor is not None:
        prompt_blocks = requests.prompt_len // block
        for w, before in enumerate(requests.predecessor.tolist()):
            if before >= 0:  # the previous turn's answer is the start of this turn's prompt
                asked, answered = int(prompt_blocks[before]), lists[before].size
                lists[before] = np.concatenate(
                    (lists[before][:asked], lists[w][asked:answered]))
    counts = np.array([part.size for part in lists], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    entries = kv.tokens // block + 1
    table = 1 << int(2 * entries).bit_length()
    arrays = {name: np.zeros(n, dtype=np.int64) for name in ("n_ref", "hit_blocks",
                                                               "cached_tokens")}
    arrays.update(
        hashes=np.concatenate(lists) if n else np.zeros(0, np.int64),
        ref_entry=np.full(int(counts.sum()), -1, dtype=np.int64),
        w_hash_start=starts, w_hash_count=counts,
        hash_start=starts[order] if order is not None else np.zeros(n, np.int64),
        hash_count=counts[order] if order is not None else np.zeros(n, np.int64),
        cache_table=np.full(table, -1, dtype=np.int64),
        entry_hash=np.zeros(entries, dtype=np.int64), entry_ref=np.zeros(entries, np.int64),
        entry_prev=np.full(entries, -1, dtype=np.int64),
        entry_next=np.full(entries, -1, dtype=np.int64),
        entry_seq=np.zeros(entries, dtype=np.int64), entry_pin=np.zeros(entries, np.int64),
        entry_stack=np.arange(entries - 1, -1, -1, dtype=np.int64),
        entry_depth=np.zeros(entries, dtype=np.int64),
        lookup_one=np.zeros(1, dtype=np.int64))
    memo = np.zeros((3, n), dtype=np.int64)
    memo[LOOKUP_REMOVALS:] = -1  # never looked up
    return {**{name: np.ascontiguousarray(arrays[name], dtype=np.int64) for name in names},
            "lookup_memo": memo, "removal_log": np.zeros((2, REMOVAL_LOG), dtype=np.int64)}


def session_arrays(requests: Requests, lo: np.ndarray, hi: np.ndarray,
                   types: np.ndarray) -> dict:
    """The sessions' arrays (:mod:`replay.engine.sessions`): the requests in workload order,
    each one's next turn and think time, the first turns in arrival order and an empty heap.
    Empty arrays for a workload without sessions."""
    names = ("w_arrival", "w_prompt", "w_output", "w_estimate", "w_lo", "w_hi", "w_type",
             "successor", "think", "workload_of", "first_turns", "heap_time", "heap_id")
    n = len(requests)
    before = requests.predecessor
    if before is None or not np.any(before >= 0):
        return {name: np.zeros(0, dtype=np.float64 if name in ("w_arrival", "think",
                                                                  "heap_time") else np.int64)
                for name in names}
    successor = np.full(n, -1, dtype=np.int64)
    later = np.flatnonzero(before >= 0)
    successor[before[later]] = later
    first = np.flatnonzero(before < 0)
    first = first[np.lexsort((first, requests.arrival[first]))]
    return {"w_arrival": np.asarray(requests.arrival, dtype=np.float64),
            "w_prompt": requests.prompt_len.astype(np.int64),
            "w_output": requests.output_len.astype(np.int64),
            "w_estimate": hi.astype(np.int64), "w_lo": lo.astype(np.int64),
            "w_hi": hi.astype(np.int64), "w_type": types.astype(np.int64),
            "successor": successor, "think": np.asarray(requests.think_time, dtype=np.float64),
            "workload_of": np.full(n, -1, dtype=np.int64), "first_turns": first,
            "heap_time": np.zeros(n), "heap_id": np.zeros(n, dtype=np.int64)}


class Engine:
    """Replays ``requests`` under ``policy``; construct once per run, then :meth:`run`."""

    def __init__(self, requests: Requests, policy: Policy, timing: TimingBackend,
                 kv: KVCapacity, seed: int = 0, progress: bool = False, **options) -> None:
        if requests.arrival is None:
            raise ValueError("Engine: requests have no arrival times; assign arrivals first")
        check_params(EngineOptions, options, "engine")
        self.options = EngineOptions(**options)
        requests.validate(kv.tokens)
        self.requests, self.policy, self.timing, self.kv = requests, policy, timing, kv
        self.preemption, self.requeue = self.options.preemption, self.options.requeue
        self.livelock_window = self.options.livelock_window or default_livelock_window(requests)
        self.progress = progress
        policy_seed, overflow_seed = np.random.SeedSequence([seed, 0xE5]).spawn(2)
        self.policy_rng = np.random.default_rng(policy_seed)
        self.overflow_rng = np.random.default_rng(overflow_seed)
        n = len(requests)
        lo = requests.predicted_lo if requests.predicted_lo is not None else requests.output_len
        hi = requests.predicted_hi if requests.predicted_hi is not None else requests.output_len
        types_ = np.asarray(requests.type_id if requests.type_id is not None
                            else np.full(n, -1), dtype=np.int64)
        sessions = session_arrays(requests, lo, hi, types_)
        self.dynamic = sessions["successor"].size > 0
        # Engine id = rank in (arrival, workload position) order: given now, or, with
        # sessions, as requests arrive (replay.engine.sessions).
        self.order = (None if self.dynamic
                      else np.lexsort((np.arange(n), requests.arrival)))
        order = np.arange(n) if self.dynamic else self.order
        prompt_len = requests.prompt_len[order].astype(np.int64)
        arrival = requests.arrival[order].astype(np.float64)
        # The point estimate policies plan with is the interval's upper end, which is the
        # truth when predictions are exact.
        self.arrays = {
            "arrival": np.full(n, np.nan) if self.dynamic else arrival,
            "prompt_len": prompt_len,
            "output_len": requests.output_len[order].astype(np.int64),
            "estimate": hi[order].astype(np.int64),
            "predicted_lo": lo[order].astype(np.int64),
            "predicted_hi": hi[order].astype(np.int64),
            "type_id": types_[order],
            "status": np.zeros(n, dtype=np.int8),
            "prefill_len": prompt_len.copy(),
            "start_time": np.full(n, np.nan), "first_token_time": np.full(n, np.nan),
            "completion_time": np.full(n, np.nan), "last_token_time": np.full(n, np.nan),
            "max_token_gap": np.full(n, np.nan),
            "queue_key": np.arange(n, dtype=np.int64),
            "start_iteration": np.full(n, -1, dtype=np.int64),
            "queue": np.zeros(n + 1, dtype=np.int64),
            "joined": np.zeros(2 * n + 16, dtype=np.int64),
            "scratch": np.zeros(n + 1, dtype=np.int64),
            "scratch2": np.zeros(n + 1, dtype=np.int64),
            "scratch3": np.zeros(n + 1, dtype=np.int64),
            "float_scratch": np.zeros(max(n, 1), dtype=np.float64),
            "is_prefill": np.zeros(n, dtype=np.bool_),
        }
        if self.dynamic:  # every per-request field is filled as its request arrives
            for name in ("prompt_len", "output_len", "estimate", "predicted_lo",
                         "predicted_hi", "type_id", "prefill_len"):
                self.arrays[name][:] = 0
        for name in ("prefilled", "generated", "held", "evictions", "running", "started",
                     "start", "advance", "preempt", "drop", "chunk_of", "chunk_ids", "members",
                     "chunk", "gain", "new_tokens", "context"):
            self.arrays[name] = np.zeros(n, dtype=np.int64)
        self.arrays.update(sessions)
        self.arrays.update(prefix_cache_arrays(requests, self.order, kv))
        self.token_gaps = LogHistogram()
        self._ran = False

    # The arrays by the names the rest of the project reads.
    def __getattr__(self, name: str):
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @property
    def predicted_output(self) -> np.ndarray:
        return self.arrays["estimate"]

    def setup(self) -> RunSetup:
        a = self.arrays
        return RunSetup(n=a["status"].size, kv_capacity=self.kv.tokens,
                        block_size=self.kv.block_size, type_id=a["type_id"],
                        estimate=a["estimate"])

    # ------------------------------------------------------------------ the rules
    def _rule_functions(self) -> tuple:
        """The loop's four rule functions: a compiled rule's own, else the bridge into
        Python."""
        policy, timing, overflow = self.policy, self.timing, self.policy.overflow
        decide = type(policy).decision if is_compiled_policy(policy) else decide_in_python
        evict_victims = (type(overflow).evict_victims
                         if is_compiled(overflow, CompiledOverflow, "evict") else evict_in_python)
        price_batch, price_decodes = ((type(timing).price_batch, type(timing).price_decodes)
                                      if is_compiled(timing, CompiledTiming, "duration")
                                      else (price_in_python, no_decode_price))
        return decide, evict_victims, price_batch, price_decodes

    def _rules(self, state, arrays: EngineArrays, functions: tuple):
        """The loop's rule arguments (``functions`` from :meth:`_rule_functions`), and how
        each rule runs (compiled or through Python)."""
        policy, timing, overflow = self.policy, self.timing, self.policy.overflow
        decide, evict_victims, price_batch, price_decodes = functions
        bridges = []
        if decide is not decide_in_python:
            policy_state, policy_path = policy.rule_state(self.setup()), "compiled"
        else:
            adapter = PythonPolicy(policy, state, arrays, self.kv.tokens, self.kv.block_size,
                                   self.policy_rng, self.options.validate_decisions)
            bridges.append(adapter)
            policy_state, policy_path = None, "python"
        if evict_victims is not evict_in_python:
            overflow_state, overflow_path = overflow.rule_state(), "compiled"
        else:
            adapter = PythonOverflow(overflow, type(policy).__name__, arrays, self.kv.tokens,
                                     self.overflow_rng)
            bridges.append(adapter)
            overflow_state, overflow_path = None, "python"
        if price_batch is not price_in_python:
            timing_state, timing_path = timing.timing_state(), "compiled"
        else:
            bridges.append(PythonTiming(timing, arrays))
            timing_state, timing_path = None, "python"
        tokens = [register(b) for b in bridges]
        tokens_left = iter(tokens)
        if policy_state is None:
            policy_state = new_rule_state(bridge=next(tokens_left))
        if overflow_state is None:
            overflow_state = new_rule_state(bridge=next(tokens_left))
        if timing_state is None:
            timing_state = new_timing_state(bridge=next(tokens_left))
        rules = (policy_state, decide, overflow_state, evict_victims, timing_state, price_batch,
                 price_decodes)
        path = {"policy": policy_path, "overflow": overflow_path, "timing": timing_path,
                "reference_counts": reference_counts()}
        return rules, bridges, tokens, path

    # ------------------------------------------------------------------ the run
    def run(self) -> RunResult:
        """Replay until every request completed or a stop condition holds."""
        if self._ran:
            raise ValueError("Engine.run: this engine has run already; construct a new one "
                             "(an Engine replays once)")
        self._ran = True
        a, n, kv, o = self.arrays, self.arrays["status"].size, self.kv, self.options
        gaps = self.token_gaps
        functions = self._rule_functions()
        compile_time = ensure_compiled(tuple(zip(functions, (DECIDE, EVICT, PRICE,
                                                             PRICE_DECODES), strict=True)))
        state = new_engine_state(
            **{name: a[name] for name in STATE_ARRAYS}, n=n, capacity=kv.tokens,
            block=kv.block_size,
            livelock_window=self.livelock_window,
            max_steps=-1 if o.max_steps is None else o.max_steps,
            max_running=-1 if o.max_running is None else o.max_running,
            max_starts=-1 if o.max_starts_per_round is None else o.max_starts_per_round,
            recompute=o.preemption == "recompute", requeue_back=o.requeue == "back",
            fast_forward=o.fast_forward, yield_steps=YIELD_STEPS,
            now=0.0, next_arrival=np.inf, released=0, iteration=0, steps=0, idle_steps=0,
            completed=0, kv_held=0, blocks_held=0, next_key=n, decisions=0, outcome=0,
            qhead=0, qtail=0, queue_version=0, n_run=0, running_version=0, n_joined=0,
            n_started=0, n_start=0, n_advance=0, n_preempt=0, n_drop=0, n_chunks=0, steady=0,
            dropped=0,
            error_code=0, error_arg=0, m=0,
            log_times=np.zeros((2, _INITIAL_LOG_ROWS)),
            log_ints=np.zeros((8, _INITIAL_LOG_ROWS), dtype=np.int64),
            log_failed=np.zeros(_INITIAL_LOG_ROWS, dtype=np.bool_), n_log=0,
            gap_buffer=gaps._buffer, gap_counts=gaps.counts, gap_filled=0, gap_count=0,
            gap_log_lo=gaps._log_lo, gap_log_ratio=gaps._log_ratio, gap_total=0.0,
            gap_max=0.0, overflow_rng=self.overflow_rng,
            cache_on=kv.prefix_cache != "none", cache_rule=CACHE_EVICTIONS.index(
                kv.cache_eviction), n_entry_stack=a["entry_stack"].size, cache_entries=0,
            cache_free=0, shared_refs=0, free_head=-1, free_tail=-1, entry_counter=0,
            pin_stamp=0, pinned_free=0, cache_removals=0,
            step_hit_tokens=0, cache_reclaimed=0, cache_hit_blocks=0, cache_lookup_blocks=0,
            cache_hit_tokens=0, cache_prompt_tokens=0, dynamic=self.dynamic, next_first=0,
            heap_size=0,
            log_cache=np.zeros((2, _INITIAL_LOG_ROWS if kv.prefix_cache != "none" else 0),
                               dtype=np.int64))
        rules, bridges, tokens, path = self._rules(state, EngineArrays(a), functions)
        started = time.perf_counter()
        # (no bar object at all without progress: making one costs a run 0.05 ms)
        bar = (tqdm(total=n, unit="req", desc="replay", leave=False) if self.progress
               else None)
        last_heartbeat = started
        try:
            while True:
                code = run_steps(state, *rules)
                if code != EXIT_YIELD:
                    break
                outcome = _outcome_of(state)
                if bar is not None:
                    bar.update(outcome["completed"] - bar.n)
                if time.perf_counter() - last_heartbeat >= HEARTBEAT_S:
                    last_heartbeat = time.perf_counter()
                    log.info("replay: %d of %d requests completed, %d steps, simulated time "
                             "%.6g %s", outcome["completed"], n, outcome["steps"],
                             outcome["now"], getattr(self.timing, "time_unit", "seconds"))
            outcome = _outcome_of(state)
            if bar is not None:
                bar.update(outcome["completed"] - bar.n)
            if code == EXIT_POLICY_ERROR:
                view = PythonPolicy(self.policy, state, EngineArrays(a), kv.tokens, kv.block_size,
                                    self.policy_rng, False).view_at(
                    outcome["now"], outcome["iteration"], outcome["kv_held"], outcome["qhead"],
                    outcome["qtail"], outcome["n_run"], outcome["next_arrival"])
                raise self.policy.decision_error(outcome["error_code"], outcome["error_arg"],
                                                 view)
            if code == EXIT_PRICE_ERROR:
                m = outcome["m"]
                raise self.timing.price_error(BatchShape(
                    a["new_tokens"][:m].copy(), a["context"][:m].copy(),
                    a["is_prefill"][:m].copy()), rules[4])
        finally:
            if bar is not None:
                bar.close()
            release(tokens)
        loop_time = time.perf_counter() - started
        gaps._filled, gaps.count = outcome["gap_filled"], outcome["gap_count"]
        gaps.total, gaps.max = outcome["gap_total"], outcome["gap_max"]
        self._final = outcome
        status, message = self._status_message(outcome)
        decision_time = sum(getattr(b, "decision_time", 0.0) for b in bridges)
        timing_time = sum(getattr(b, "time_spent", 0.0) for b in bridges)
        if path["timing"] == "compiled":
            self.timing.finish(rules[4])
        requests_table = self._request_table()
        iterations = iteration_frame(*_log_arrays(state), outcome["n_log"])
        cache = None
        if kv.prefix_cache != "none":
            cache = dict(zip(_CACHE_TOTALS, _cache_totals(state), strict=True))
            log_cache = _log_cache(state)[:, :outcome["n_log"]]
            iterations["cached_tokens"], iterations["cache_blocks"] = log_cache
        return RunResult(status, message, requests_table, iterations, kv,
                         self.livelock_window, decision_time, self.preemption, self.requeue,
                         gaps, timing_time_s=timing_time, loop_time_s=loop_time,
                         decisions=outcome["decisions"], compile_time_s=compile_time,
                         engine_path=path, dropped=outcome["dropped"], prefix_cache=cache)

    def _status_message(self, outcome: dict) -> tuple[str, str]:
        status = _STATUS[outcome["outcome"]]
        unfinished = self.arrays["status"].size - outcome["completed"] - outcome["dropped"]
        if status == "livelock":
            return status, (f"no request completed in {outcome['idle_steps']} steps with "
                            f"{unfinished} unfinished (livelock_window={self.livelock_window})")
        if status == "step_limit":
            return status, f"stopped after max_steps={self.options.max_steps}"
        if status == "stalled":
            return status, (f"{type(self.policy).__name__} scheduled nothing with "
                            f"{unfinished} requests unfinished and no arrivals left")
        return status, ""

    def engine_ids(self) -> np.ndarray:
        """Each workload row's engine id (-1: a later turn of a session that never arrived)."""
        n = self.arrays["status"].size
        back = np.full(n, -1, dtype=np.int64)
        if self.dynamic:
            released = self.arrays["workload_of"]
            arrived = np.flatnonzero(released >= 0)
            back[released[arrived]] = arrived
        else:
            back[self.order] = np.arange(n)
        return back

    def _request_table(self) -> pd.DataFrame:
        """Per-request results in workload order (``request_id`` = position in the workload)."""
        a = self.arrays
        back = self.engine_ids()
        arrived = back >= 0
        index = np.where(arrived, back, 0)

        def column(name, missing):
            return np.where(arrived, a[name][index], missing)

        r = self.requests
        # Every column as an array first and one frame of them: a frame built column by
        # column costs a 10,000-request run some milliseconds of pandas' bookkeeping.
        arrival = r.arrival if not self.dynamic else column("arrival", np.nan)
        first_token, completion = column("first_token_time", np.nan), column(
            "completion_time", np.nan)
        completed = column("status", 0) == DONE
        # Mean gap telescopes: (last token - first token) / (tokens - 1).
        with np.errstate(invalid="ignore", divide="ignore"):
            tbt_mean = np.where(completed & (r.output_len > 1),
                                (completion - first_token) / (r.output_len - 1), np.nan)
        columns = {
            "request_id": np.arange(len(r)),
            "source_row": r.source_row if r.source_row is not None else np.arange(len(r)),
            "arrival": arrival,
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            "start": column("start_time", np.nan),
            "first_token": first_token,
            "completion": completion,
            "evictions": column("evictions", 0),
            "tokens_generated": column("generated", 0),
            "latency": completion - arrival,
            "ttft": first_token - arrival,
            "completed": completed,
            "tbt_mean": tbt_mean,
            "tbt_max": column("max_token_gap", np.nan),
        }
        if self.kv.prefix_cache != "none":
            columns["cached_tokens"] = column("cached_tokens", 0)
        return pd.DataFrame(columns)
