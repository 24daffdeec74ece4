"""The records the step loop works on: the engine's state, a rule's state, a timing backend's
tables.

Each is a numba *structref*: a mutable record that compiled functions read and write by
field name and that Python holds as one object. Its fields have fixed types (the arrays'
dtypes are fixed here, whatever the config), so the step loop is compiled once for every
config: only a new kind of field would compile it again.

:class:`EngineState` holds everything one replay changes: the per-request arrays indexed by
engine id (requests numbered in arrival order, ties by workload position), the waiting
queue and the running set, the clock and counters, the decision the policy writes, the
shape of the batch being priced, the iteration log and the token-gap histogram. Python
creates the per-request arrays and keeps references to them: they are the same memory the
compiled code writes, so the request table is read from them after the run.

:class:`RuleState` is what a policy's decision or an overflow rule keeps: parameters
(``ints``, ``floats``) and state across steps (``ids``, ``marks``, ``counts``), laid out by
the rule's own module. :class:`TimingState` is a timing backend's parameters and tables.
``bridge`` in the last two names the Python object behind a rule written in Python
(:mod:`replay.engine.rules`).

The rules reach the step loop as typed function pointers (:data:`DECIDE`, :data:`EVICT`,
:data:`PRICE`, :data:`PRICE_DECODES`): one compiled loop serves every policy, overflow rule
and timing backend, each of which is compiled on its own.
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.experimental import structref

from replay.engine.jit import jit

I8, F8, B1, I1 = np.int64, np.float64, np.bool_, np.int8
#: Field kinds: a Python scalar (``int``, ``float``), or a numpy dtype (1-D array), or
#: ``(dtype, 2)`` (a 2-D array).
_RNG = "rng"  # a numpy random Generator (the overflow rules' stream)
_NUMBA = {_RNG: types.NumPyRandomGeneratorType("NumPyRandomGeneratorType"),
          int: types.int64, float: types.float64, I8: types.int64[::1],
          F8: types.float64[::1], B1: types.boolean[::1], I1: types.int8[::1],
          (F8, 2): types.float64[:, ::1], (I8, 2): types.int64[:, ::1]}

#: Request status, in ``EngineState.status``: not arrived, waiting, running, completed, or
#: dropped by its policy (it never completes).
FUTURE, WAITING, RUNNING, DONE, DROPPED = 0, 1, 2, 3, 4

ENGINE_FIELDS: tuple[tuple[str, object], ...] = (
    # -- the run's constants
    ("n", int), ("capacity", int), ("block", int), ("livelock_window", int),
    ("max_steps", int),  # -1: none
    ("max_running", int), ("max_starts", int),  # -1: none
    ("recompute", int), ("requeue_back", int), ("fast_forward", int),
    ("yield_steps", int),  # steps per call of the loop before it hands back to Python
    # -- per request (engine id), fixed once it arrives
    ("arrival", F8), ("prompt_len", I8), ("output_len", I8),
    ("estimate", I8),  # the output length policies plan with (predicted_output)
    ("predicted_lo", I8), ("predicted_hi", I8), ("type_id", I8),
    # -- per request, changed by the run
    ("status", I1), ("prefill_len", I8), ("prefilled", I8), ("generated", I8), ("held", I8),
    ("start_iteration", I8), ("evictions", I8), ("queue_key", I8),
    ("start_time", F8), ("first_token_time", F8), ("completion_time", F8),
    ("last_token_time", F8), ("max_token_gap", F8),
    # -- the clock and counters
    ("now", float), ("next_arrival", float), ("released", int), ("iteration", int),
    ("steps", int), ("idle_steps", int), ("completed", int), ("dropped", int), ("kv_held", int),
    ("blocks_held", int), ("next_key", int), ("decisions", int), ("outcome", int),
    # -- the waiting queue (queue[qhead:qtail], in queue-key order) and the running set
    # (running[:n_run], in start order); versions count their changes
    ("queue", I8), ("qhead", int), ("qtail", int), ("queue_version", int),
    ("running", I8), ("n_run", int), ("running_version", int),
    # -- what changed since the last decision: who joined the queue, who started
    ("joined", I8), ("n_joined", int), ("started", I8), ("n_started", int),
    # -- the decision (policy.Batch as arrays): start[:n_start], advance[:n_advance] (-1:
    # every running request), preempt[:n_preempt], drop[:n_drop], prompt chunks chunk_of[id]
    # (0: all that remains) for ids chunk_ids[:n_chunks], the steady-steps promise, an error
    ("start", I8), ("n_start", int), ("advance", I8), ("n_advance", int),
    ("preempt", I8), ("n_preempt", int), ("drop", I8), ("n_drop", int),
    ("chunk_of", I8), ("chunk_ids", I8),
    ("n_chunks", int), ("steady", int), ("error_code", int), ("error_arg", int),
    # -- the batch being priced: members[:m] with their chunk, KV gain, shape
    ("members", I8), ("m", int), ("chunk", I8), ("gain", I8), ("new_tokens", I8),
    ("context", I8), ("is_prefill", B1),
    # -- the iteration log: start_time, duration | the integer columns | failed
    ("log_times", (F8, 2)), ("log_ints", (I8, 2)), ("log_failed", B1), ("n_log", int),
    # -- the token-gap histogram (replay.engine.histogram.LogHistogram's arrays and scalars)
    ("gap_buffer", F8), ("gap_counts", I8), ("gap_filled", int), ("gap_count", int),
    ("gap_log_lo", float), ("gap_log_ratio", float), ("gap_total", float), ("gap_max", float),
    # -- scratch space for the phases and the decisions
    ("scratch", I8), ("scratch2", I8), ("scratch3", I8), ("float_scratch", F8),
    # -- the overflow rules' random stream
    ("overflow_rng", _RNG),
    # -- sessions (dynamic = 1): a later turn arrives a think time after its predecessor
    # completes, so engine ids (arrival order) are given as requests arrive. The requests in
    # workload order (w_*), each one's next turn and think time, the engine id's workload
    # row, the first turns in arrival order (released from next_first on) and the later
    # turns whose arrival is known, in a heap of (time, workload row)
    ("dynamic", int), ("w_arrival", F8), ("w_prompt", I8), ("w_output", I8),
    ("w_estimate", I8), ("w_lo", I8), ("w_hi", I8), ("w_type", I8), ("w_hash_start", I8),
    ("w_hash_count", I8), ("successor", I8), ("think", F8), ("workload_of", I8),
    ("first_turns", I8), ("next_first", int), ("heap_time", F8), ("heap_id", I8),
    ("heap_size", int),
    # -- the prefix cache (replay.engine.prefix_cache; off: cache_on = 0, arrays empty):
    # per request its full blocks' chain hashes (hashes[hash_start:+hash_count]), how many
    # leading blocks it references, the hits found for this step's admissions and the
    # tokens its last admission took from the cache; the hash table of entries, each
    # entry's hash, references, free-list links and insertion number; the free entry ids;
    # beside each hash, the entry a request's reference to that block holds (valid below
    # its n_ref: a referenced entry is never reclaimed, so the id stays right)
    ("cache_on", int), ("cache_rule", int), ("hashes", I8), ("ref_entry", I8),
    ("hash_start", I8),
    ("hash_count", I8), ("n_ref", I8), ("hit_blocks", I8), ("cached_tokens", I8),
    ("cache_table", I8), ("entry_hash", I8), ("entry_ref", I8), ("entry_prev", I8),
    ("entry_next", I8), ("entry_seq", I8), ("entry_stack", I8), ("n_entry_stack", int),
    ("cache_entries", int), ("cache_free", int), ("shared_refs", int), ("free_head", int),
    ("free_tail", int), ("entry_counter", int), ("step_hit_tokens", int),
    # the step each entry was last pinned in (an admission of that step found it: no reclaim
    # may take it), this step's stamp and how many free entries it pinned
    ("entry_pin", I8), ("pin_stamp", int), ("pinned_free", int),
    # what each request's last lookup found (rows of lookup_memo, see prefix_cache): its
    # chain of cached leading blocks (their entries in ref_entry), entries removed when it
    # looked (against the running count, whose latest removals removal_log keeps: hash and
    # block position), and whether the chain is complete while no entry has been added
    # since; each entry's block position; one id for a lookup of one request
    ("lookup_memo", (I8, 2)), ("cache_removals", int), ("removal_log", (I8, 2)),
    ("entry_depth", I8), ("lookup_one", I8),
    # -- the prefix cache's totals: reclaimed entries, blocks found and looked up at
    # admissions, tokens taken from the cache and prompt tokens admitted; and its log
    # columns (tokens taken from the cache by the iteration's admissions, entries after it)
    ("cache_reclaimed", int), ("cache_hit_blocks", int), ("cache_lookup_blocks", int),
    ("cache_hit_tokens", int), ("cache_prompt_tokens", int), ("log_cache", (I8, 2)),
)

#: Rows of the 2-D log arrays (the iteration log's time and integer columns) are at most this.
LOG_ROWS = 8

RULE_FIELDS = (("ints", I8), ("floats", F8), ("ids", I8), ("marks", B1), ("counts", I8),
               ("bridge", int))
TIMING_FIELDS = (("ints", I8), ("floats", F8), ("table", F8), ("table2", F8), ("table3", F8),
                 ("grid", (F8, 2)), ("grid2", (F8, 2)), ("grid3", (F8, 2)), ("counters", I8),
                 ("bridge", int))


def _register(name: str, fields):
    @structref.register
    class RecordType(types.StructRef):
        def preprocess_fields(self, fields):
            return tuple((field, types.unliteral(typ)) for field, typ in fields)

    RecordType.__name__ = RecordType.__qualname__ = f"{name}Type"
    record_type = RecordType([(field, _NUMBA[kind]) for field, kind in fields])
    return RecordType, record_type


class EngineState(structref.StructRefProxy):
    """The engine's state record (see the module docstring); made by :func:`new_engine_state`."""


class RuleState(structref.StructRefProxy):
    """A policy's or an overflow rule's record; made by :func:`new_rule_state`."""


class TimingState(structref.StructRefProxy):
    """A timing backend's record; made by :func:`new_timing_state`."""


EngineStateType, ENGINE_STATE = _register("EngineState", ENGINE_FIELDS)
RuleStateType, RULE_STATE = _register("RuleState", RULE_FIELDS)
TimingStateType, TIMING_STATE = _register("TimingState", TIMING_FIELDS)
for _proxy, _typeclass, _fields in ((EngineState, EngineStateType, ENGINE_FIELDS),
                                   (RuleState, RuleStateType, RULE_FIELDS),
                                   (TimingState, TimingStateType, TIMING_FIELDS)):
    structref.define_proxy(_proxy, _typeclass, [field for field, _ in _fields])


@jit
def _make_engine_state(*values):
    return EngineState(*values)


@jit
def _make_rule_state(*values):
    return RuleState(*values)


@jit
def _make_timing_state(*values):
    return TimingState(*values)


#: The functions that make the records from Python, each with the one signature it is
#: called with (a tuple of its fields' types, numba's form of ``*values``): the loop compiles
#: them with itself (:func:`replay.engine.loop.ensure_compiled`), so the first run's line
#: counts them.
RECORD_MAKERS = tuple((make, (types.Tuple(tuple(_NUMBA[kind] for _, kind in fields)),))
                      for make, fields in (
    (_make_engine_state, ENGINE_FIELDS), (_make_rule_state, RULE_FIELDS),
    (_make_timing_state, TIMING_FIELDS)))


def _normalised(fields, values: dict) -> list:
    missing = [name for name, _ in fields if name not in values]
    unknown = set(values) - {name for name, _ in fields}
    if missing or unknown:
        raise TypeError(f"record fields missing {missing}, unknown {sorted(unknown)}")
    out = []
    for name, kind in fields:
        value = values[name]
        if kind is _RNG:
            out.append(value)
        elif kind is int:
            out.append(int(value))
        elif kind is float:
            out.append(float(value))
        else:
            dtype, dims = kind if isinstance(kind, tuple) else (kind, 1)
            array = np.asarray(value)
            if (array.dtype != dtype or array.ndim != dims or not array.flags.c_contiguous
                    or not array.flags.writeable):
                # The record's type is fixed: an array of another dtype or layout, or a
                # read-only one, would be a new type and compile everything again.
                array = np.array(array, dtype=dtype, order="C", ndmin=dims)
            out.append(array)
    return out


def new_engine_state(**values) -> EngineState:
    """An :class:`EngineState` from every field of :data:`ENGINE_FIELDS` by name. Arrays of
    the right dtype and layout are used as they are (the caller keeps them and sees what the
    step loop writes); others are converted to copies."""
    return _make_engine_state(*_normalised(ENGINE_FIELDS, values))


def state_array_names() -> tuple[str, ...]:
    """The array fields of :data:`ENGINE_FIELDS` other than the log and the histogram's: the
    per-request arrays and buffers the engine makes for a run."""
    return tuple(name for name, kind in ENGINE_FIELDS
                 if (kind in (I8, F8, B1, I1) or isinstance(kind, tuple))
                 and not name.startswith(("log_", "gap_")))


def blank_engine_fields(n: int) -> dict:
    """Every :data:`ENGINE_FIELDS` value for ``n`` requests, zero (arrays of ``2 n + 16``):
    for a single decision or price outside a run, where the caller sets what matters."""
    fields = {}
    for name, kind in ENGINE_FIELDS:
        if kind is _RNG:
            fields[name] = np.random.default_rng(0)
        elif kind in (int, float):
            fields[name] = kind(0)
        elif isinstance(kind, tuple):
            fields[name] = np.zeros((LOG_ROWS, 1), dtype=kind[0])
        else:
            fields[name] = np.zeros(2 * n + 16, dtype=kind)
    return fields


def new_rule_state(ints=(), floats=(), ids=(), marks=(), counts=(), bridge=-1) -> RuleState:
    """A :class:`RuleState` (empty arrays where a rule keeps nothing)."""
    return _make_rule_state(*_normalised(RULE_FIELDS, dict(
        ints=np.asarray(ints, dtype=I8), floats=np.asarray(floats, dtype=F8),
        ids=np.asarray(ids, dtype=I8), marks=np.asarray(marks, dtype=B1),
        counts=np.asarray(counts, dtype=I8), bridge=bridge)))


def new_timing_state(ints=(), floats=(), table=(), table2=(), table3=(), grid=None,
                     grid2=None, grid3=None, counters=(), bridge=-1) -> TimingState:
    """A :class:`TimingState` (empty arrays where a backend has no table)."""
    empty = np.zeros((0, 0), dtype=F8)
    return _make_timing_state(*_normalised(TIMING_FIELDS, dict(
        ints=np.asarray(ints, dtype=I8), floats=np.asarray(floats, dtype=F8),
        table=np.asarray(table, dtype=F8), table2=np.asarray(table2, dtype=F8),
        table3=np.asarray(table3, dtype=F8), grid=empty if grid is None else grid,
        grid2=empty if grid2 is None else grid2, grid3=empty if grid3 is None else grid3,
        counters=np.asarray(counters, dtype=I8), bridge=bridge)))


@jit(inline="always")
def give_chunk(s, rid, tokens):
    """Part of a decision: ``rid`` prefills ``tokens`` of what remains of its prompt this
    step (a request given no chunk prefills all that remains)."""
    s.chunk_of[rid] = tokens
    s.chunk_ids[s.n_chunks] = rid
    s.n_chunks += 1


#: A policy's decision: writes the batch into the engine state's decision fields; returns 0,
#: or an error code of the policy's own (``EngineState.error_arg`` says more).
DECIDE = types.FunctionType(types.int64(ENGINE_STATE, RULE_STATE))
#: An overflow rule: ``holders`` are ``scratch[:n_holders]`` (the ``n_running`` running
#: requests in start order, then the admissions) and what each would hold after the
#: iteration is ``scratch3[:n_holders]``; writes its victims to ``preempt``, returns how many.
EVICT = types.FunctionType(types.int64(ENGINE_STATE, RULE_STATE, types.int64, types.int64))
#: A timing backend's price of the batch ``new_tokens``, ``context``, ``is_prefill`` ``[:m]``
#: in seconds (or rounds); NaN where it refuses the batch (the engine asks its Python side
#: to say why).
PRICE = types.FunctionType(types.float64(ENGINE_STATE, TIMING_STATE))
#: The same price for ``m`` decodes from their context sum and maximum, in O(1); NaN where it
#: has no answer (the engine then prices the batch member by member).
PRICE_DECODES = types.FunctionType(types.float64(TIMING_STATE, types.int64, types.int64,
                                                 types.int64))
