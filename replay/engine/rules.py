"""How a rule reaches the step loop: as a compiled function, or from Python through a bridge.

The step loop (:func:`replay.engine.loop.run_steps`) calls three kinds of rule through typed
function pointers: the policy's decision (:data:`~replay.engine.state.DECIDE`), the
overflow rule (:data:`~replay.engine.state.EVICT`) and the timing backend's price
(:data:`~replay.engine.state.PRICE`, :data:`~replay.engine.state.PRICE_DECODES`).

* A **compiled rule** is an object that says which compiled function decides (or evicts,
  or prices) and what record it reads: a built-in policy derives from
  :class:`CompiledPolicy`, an overflow rule from :class:`CompiledOverflow`, a timing
  backend from :class:`CompiledTiming`. Its rule is written once, in its own module, and
  every path runs it: the step loop calls it, and so does the object's Python method
  (``decide(view)``, ``evict(...)``, ``duration(shape)``).
* A **Python rule** is any other object with the Python method (a user's policy, the
  LP-based policies, a subclass that overrides ``decide``). The loop then calls a compiled
  bridge function that calls back into Python (numba's object mode) at that point of the
  step, with a read-only :class:`~replay.engine.policy.PolicyView`, and writes the answer
  into the engine state after checking it (a policy bug gets a :class:`DecisionError` that
  names the policy).

The :class:`~replay.engine.loop.Engine` turns the run's policy, overflow rule and timing
backend into the loop's arguments (``Engine._rule_functions``, ``Engine._rules``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numba import objmode

from replay.engine.jit import jit
from replay.engine.policy import Batch, PolicyView, RunSetup
from replay.engine.prefix_cache import lookup_hits_of
from replay.engine.state import (
    DONE,
    DROPPED,
    FUTURE,
    RUNNING,
    WAITING,
    RuleState,
    TimingState,
    blank_engine_fields,
    new_engine_state,
    new_rule_state,
    new_timing_state,
)
from replay.engine.timing import BatchShape


class DecisionError(RuntimeError):
    """A policy returned a decision the engine cannot carry out (a policy bug)."""


# ------------------------------------------------------------------ compiled rules
class CompiledPolicy:
    """A policy whose decision is a compiled function (see the module docstring).

    A subclass sets ``decision`` to its ``@jit`` function ``(engine state, rule state) ->
    error code`` (read from the class, never bound; the :data:`~replay.engine.state.DECIDE`
    contract: it reads the state and writes the batch into ``start``, ``advance``,
    ``preempt``, ``chunk_of`` / ``chunk_ids`` and ``steady``), and overrides
    :meth:`rule_state` if its decision reads parameters or keeps state across steps, and
    :meth:`decision_error` if it reports errors.
    """

    decision = None

    def rule_state(self, setup: RunSetup) -> RuleState:
        """The record the decision reads: its parameters and its state across steps."""
        return new_rule_state()

    def decision_error(self, code: int, arg: int, view: PolicyView) -> Exception:
        """The exception for the decision's error ``code`` (``arg``: a request id or value)
        at the state ``view`` shows."""
        return DecisionError(f"{type(self).__name__}: decision failed with code {code}")

    def decide(self, view: PolicyView) -> Batch:
        """The decision for ``view``, computed by the compiled decision (as the step loop would
        at that state; state kept across steps starts afresh)."""
        return decide_on_view(self, view)


class CompiledOverflow:
    """An overflow rule whose choice is a compiled function ``evict_victims`` (the
    :data:`~replay.engine.state.EVICT` contract) reading :meth:`rule_state`."""

    evict_victims = None

    def rule_state(self) -> RuleState:
        return new_rule_state()

    def evict(self, holders, held_after, kv_capacity, rng, n_running) -> np.ndarray:
        """The victims among ``holders``, chosen by the compiled function."""
        return evict_with(self, holders, held_after, kv_capacity, rng, n_running)


class CompiledTiming:
    """A timing backend whose price is the compiled functions ``price_batch`` and
    ``price_decodes`` (the :data:`~replay.engine.state.PRICE` and
    :data:`~replay.engine.state.PRICE_DECODES` contracts) reading :meth:`timing_state`.
    :meth:`duration` prices one shape with the same function."""

    price_batch = None
    price_decodes = None

    def timing_state(self) -> TimingState:
        return new_timing_state()

    def finish(self, record: TimingState) -> None:
        """What the backend keeps of a run's (or a shape's) pricing, from its record."""

    def price_error(self, batch: BatchShape, record: TimingState) -> Exception:
        """The exception for a batch the price refused (NaN)."""
        return ValueError(f"timing backend {type(self).__name__} refused a batch of "
                          f"{batch.size} requests")

    def duration(self, batch: BatchShape) -> float:
        record = self.timing_state()
        duration = price_shape(self, batch, record)
        self.finish(record)
        if math.isnan(duration):
            raise self.price_error(batch, record)
        return duration


@jit
def _counters(record):
    return record.counters


def counters_of(record: TimingState) -> np.ndarray:
    """A timing record's ``counters`` (the same memory)."""
    return _counters(record)


def is_compiled_policy(policy) -> bool:
    """Whether ``policy`` decides with its compiled function: a :class:`CompiledPolicy` whose
    ``decide`` is not overridden (a subclass that decides otherwise runs in Python)."""
    return is_compiled(policy, CompiledPolicy, "decide") and type(policy).decision is not None


def is_compiled(rule, base, method: str) -> bool:
    """Whether ``rule`` runs its compiled function: a ``base`` whose Python ``method`` is not
    overridden (a subclass that overrides it runs in Python)."""
    return isinstance(rule, base) and getattr(type(rule), method) is getattr(base, method)


# ------------------------------------------------------------------- Python rules
#: The Python side of each bridged rule, by the ``bridge`` number in its record.
_BRIDGED: dict[int, object] = {}
_tokens = itertools.count()


def register(adapter) -> int:
    """Keep ``adapter`` (the Python side of a bridged rule) for the run; its number."""
    token = next(_tokens)
    _BRIDGED[token] = adapter
    return token


def release(records) -> None:
    """Forget the Python side of ``records`` (at the end of a run)."""
    for record in records:
        _BRIDGED.pop(record.bridge if hasattr(record, "bridge") else record, None)


def _python_decision(token, now, iteration, kv_held, qhead, qtail, n_run, next_arrival,
                     queue_version, running_version):
    return _BRIDGED[token].decide(now, iteration, kv_held, qhead, qtail, n_run, next_arrival,
                                  queue_version, running_version)


def _python_victims(token, n_holders, n_running):
    return _BRIDGED[token].evict(n_holders, n_running)


def _python_price(token, m):
    return _BRIDGED[token].price(m)


@jit
def decide_in_python(s, rule):
    """The :data:`~replay.engine.state.DECIDE` bridge to a policy written in Python."""
    token, now, iteration, kv_held = rule.bridge, s.now, s.iteration, s.kv_held
    qhead, qtail, n_run, next_arrival = s.qhead, s.qtail, s.n_run, s.next_arrival
    queue_version, running_version = s.queue_version, s.running_version
    with objmode(out="UniTuple(int64, 6)"):
        out = _python_decision(token, now, iteration, kv_held, qhead, qtail, n_run,
                               next_arrival, queue_version, running_version)
    s.n_start, s.n_advance, s.n_preempt, s.n_drop, s.n_chunks, s.steady = out
    return 0


@jit
def evict_in_python(s, rule, n_holders, n_running):
    """The :data:`~replay.engine.state.EVICT` bridge to an overflow rule written in Python."""
    token = rule.bridge
    with objmode(out="int64"):
        out = _python_victims(token, n_holders, n_running)
    return out


@jit
def price_in_python(s, timing):
    """The :data:`~replay.engine.state.PRICE` bridge to a timing backend written in Python."""
    token, m = timing.bridge, s.m
    with objmode(out="float64"):
        out = _python_price(token, m)
    return out


@jit
def no_decode_price(timing, m, context_sum, context_max):
    """A backend without an O(1) price of decodes: every batch is priced member by member."""
    return np.nan


def _sealed(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _frozen(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _whole(value) -> bool:
    """A request id or token count: an integer, not a bool or a float that would be
    truncated."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass
class EngineArrays:
    """The engine state's arrays as Python holds them (the same memory the loop writes)."""

    arrays: Mapping[str, np.ndarray]

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            raise AttributeError(name) from None


class PythonPolicy:
    """The Python side of the decision bridge: keeps the policy's read-only view up to date,
    asks the policy, checks its batch and writes it into the engine state."""

    def __init__(self, policy, state, a: EngineArrays, kv_capacity: int, block: int, rng,
                 validate: bool) -> None:
        self.policy, self.state, self.a, self.validate = policy, state, a, validate
        self.name = type(policy).__name__
        self.view = PolicyView(
            kv_capacity=kv_capacity, arrival=_frozen(a.arrival), prompt_len=_frozen(a.prompt_len),
            predicted_output=_frozen(a.estimate), predicted_lo=_frozen(a.predicted_lo),
            predicted_hi=_frozen(a.predicted_hi), type_id=_frozen(a.type_id),
            prefilled=_frozen(a.prefilled), generated=_frozen(a.generated), held=_frozen(a.held),
            start_iteration=_frozen(a.start_iteration), rng=rng, kv_block_size=block,
            prefill_len=_frozen(a.prefill_len))
        if a.cache_table.size:
            self.view.prefix_lookup = self._cached_tokens
        self.versions = (-1, -1)
        self.decision_time = 0.0
        self.decisions = 0
        self._seen = np.zeros(a.status.size, dtype=np.int64)
        self._positions = _sealed(np.arange(1, a.status.size + 1, dtype=np.int64))

    def _cached_tokens(self, ids: np.ndarray) -> np.ndarray:
        ids = np.array(ids, dtype=np.int64)  # a copy: the lookup writes its answers there
        lookup_hits_of(self.state, ids, 0, ids.size, ids)
        return ids * self.view.kv_block_size

    def view_at(self, now, iteration, kv_held, qhead, qtail, n_run, next_arrival,
                queue_version=-2, running_version=-2) -> PolicyView:
        """The view at the engine's state now (the state's scalars as given)."""
        view, a = self.view, self.a
        view.now, view.iteration, view.kv_held = now, iteration, kv_held
        view.next_arrival = next_arrival
        # A new array only when the queue or the running set changed: a policy may keep the
        # one it saw (it never changes), and tell by identity that nothing did.
        if queue_version != self.versions[0] or queue_version == -2:
            view.waiting = _sealed(a.queue[qhead:qtail].copy())
        if running_version != self.versions[1] or running_version == -2:
            view.running = _sealed(a.running[:n_run].copy())
        self.versions = (queue_version, running_version)
        return view

    def decide(self, now, iteration, kv_held, qhead, qtail, n_run, next_arrival,
               queue_version, running_version):
        view = self.view_at(now, iteration, kv_held, qhead, qtail, n_run, next_arrival,
                            queue_version, running_version)
        started = time.perf_counter()
        batch = self.policy.decide(view)
        self.decision_time += time.perf_counter() - started
        self.decisions += 1
        return self._write(batch)

    def _write(self, batch) -> tuple[int, int, int, int, int, int]:
        if not isinstance(batch, Batch):
            raise DecisionError(f"{self.name}.decide returned {type(batch).__name__} "
                                f"{batch!r:.60}, not a replay.engine.policy.Batch")
        a = self.a
        dropped = self._ids(batch.drop, (WAITING, RUNNING), "drop")
        preempt = self._ids(batch.preempt, RUNNING, "preempt")
        start = self._ids(batch.start, WAITING, "start")
        a.drop[:dropped.size] = dropped
        a.preempt[:preempt.size] = preempt
        a.start[:start.size] = start
        if batch.advance is None:
            n_advance = -1
        else:
            advance = self._ids(batch.advance, RUNNING, "advance")
            a.advance[:advance.size] = advance
            n_advance = advance.size
        n_chunks = self._chunks(batch.prefill_chunks, start, None if n_advance < 0
                                else a.advance[:n_advance], preempt)
        steady = batch.steady_steps
        if steady and self.validate and (isinstance(steady, bool) or not isinstance(
                steady, int | np.integer) or steady < 0):
            raise DecisionError(f"{self.name}: steady_steps must be a whole number of steps "
                                f">= 0 (UNTIL_CHANGE for no bound), got {steady!r}")
        return (start.size, n_advance, preempt.size, dropped.size, n_chunks,
                int(steady) if steady else 0)

    def _ids(self, ids, expected: int | tuple, what: str) -> np.ndarray:
        """``ids`` as an int64 array, checked: known, each once, each of status ``expected``
        (one status or a tuple of them)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1) if len(ids) else _EMPTY
        if not self.validate or ids.size == 0:
            return ids
        status = self.a.status
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if ids.size == 1:  # the common case, in plain integers
            rid = int(ids[0])
            if not 0 <= rid < status.size:
                raise self._unknown_ids(what)
            if status[rid] in allowed:
                return ids
        elif expected == WAITING:  # admissions in queue order (most policies): a queue prefix
            queue = self.view.waiting
            if ids.size <= queue.size and not np.count_nonzero(queue[:ids.size] != ids):
                return ids
        if np.count_nonzero(ids < 0):
            raise self._unknown_ids(what)
        # Mark each id with its position: a repeated id keeps only its last mark.
        seen, positions = self._seen, self._positions[:ids.size]
        try:
            seen[ids] = positions
        except IndexError:  # an id past the trace
            raise self._unknown_ids(what) from None
        # One comparison per allowed status: np.isin sorts (18-20 us a call on five ids, by
        # timeit, against 1.2-2.5 us for this).
        statuses = status[ids]
        wrong_status = statuses != allowed[0]
        for other in allowed[1:]:
            wrong_status &= statuses != other
        bad = wrong_status | (seen[ids] != positions)
        seen[ids] = 0
        if np.count_nonzero(bad):
            wrong = ids[wrong_status]
            if not wrong.size:
                raise DecisionError(f"{self.name}: {what} repeats a request id")
            state = {FUTURE: "not arrived", WAITING: "waiting", RUNNING: "running",
                     DONE: "completed", DROPPED: "dropped"}
            raise DecisionError(
                f"{self.name}: {what} names request {int(wrong[0])} which is "
                f"{state[int(status[wrong[0]])]}")
        return ids

    def _unknown_ids(self, what: str) -> DecisionError:
        return DecisionError(f"{self.name}: {what} has unknown request ids")

    def _chunks(self, chunks, start, advance, preempt) -> int:
        """Write the named prompt chunks into ``chunk_of``/``chunk_ids``; each must be a whole
        number in 1..(the prompt that remains) of a prefilling batch member."""
        if not chunks:
            return 0
        a = self.a
        members = np.concatenate((self.view.running if advance is None else advance, start))
        if advance is None and preempt.size:
            members = members[~np.isin(members, preempt)]
        count = len(chunks)
        rids = np.fromiter(chunks.keys(), dtype=np.int64, count=count)
        tokens = np.fromiter(chunks.values(), dtype=np.int64, count=count)
        position = self._seen  # zero between uses; 1-based positions while in use
        position[members] = self._positions[:members.size]
        k = position.take(rids, mode="clip") - 1  # unknown ids are caught just below
        position[members] = 0
        valid = (rids.view(np.uint64) < position.size) & (k >= 0)
        remaining = np.where(valid, a.prefill_len[np.where(valid, rids, 0)]
                             - a.prefilled[np.where(valid, rids, 0)], 0)
        bad = ~valid | (tokens < 1) | (tokens > remaining)
        # fromiter truncates floats: an id or a chunk must be a whole number as given.
        bad |= [not (_whole(rid) and _whole(t)) for rid, t in chunks.items()]
        if np.count_nonzero(bad):
            i = int(np.flatnonzero(bad)[0])
            raise DecisionError(
                f"{self.name}: prefill chunk {list(chunks.values())[i]!r} for request "
                f"{int(rids[i])} is not in 1..remaining prompt of a prefilling batch member")
        a.chunk_of[rids] = tokens
        a.chunk_ids[:count] = rids
        return count


_EMPTY = np.zeros(0, dtype=np.int64)


class PythonOverflow:
    """The Python side of the overflow bridge."""

    def __init__(self, rule, policy_name: str, a: EngineArrays, kv_capacity: int, rng) -> None:
        self.rule, self.policy_name, self.a = rule, policy_name, a
        self.kv_capacity, self.rng = kv_capacity, rng

    def evict(self, n_holders: int, n_running: int) -> int:
        a = self.a
        holders = a.scratch[:n_holders].copy()
        victims = np.asarray(self.rule.evict(holders, a.scratch3[:n_holders].copy(),
                                             self.kv_capacity, self.rng, n_running),
                             dtype=np.int64).reshape(-1)
        if victims.size and not np.isin(victims, holders).all():
            raise DecisionError(f"{self.policy_name}: overflow rule evicted a request that "
                                f"holds no KV in this batch")
        a.preempt[:victims.size] = victims
        return victims.size


class PythonTiming:
    """The Python side of the timing bridge."""

    def __init__(self, timing, a: EngineArrays) -> None:
        self.timing, self.a = timing, a
        self.time_spent = 0.0

    def price(self, m: int) -> float:
        a = self.a
        started = time.perf_counter()
        duration = float(self.timing.duration(BatchShape(
            a.new_tokens[:m].copy(), a.context[:m].copy(), a.is_prefill[:m].copy())))
        self.time_spent += time.perf_counter() - started
        if not (math.isfinite(duration) and duration >= 0):
            raise DecisionError(f"timing backend {type(self.timing).__name__} priced a batch "
                                f"of {m} requests at {duration!r} (must be a finite time >= 0)")
        return duration


# ------------------------------------------------- one decision, eviction or price from Python
def evict_with(rule: CompiledOverflow, holders, held_after, kv_capacity: int, rng,
               n_running: int) -> np.ndarray:
    """``rule``'s compiled choice of victims among ``holders`` (see
    :mod:`replay.engine.overflow`), drawing from ``rng`` if it draws."""
    holders = np.asarray(holders, dtype=np.int64)
    k = holders.size
    state = new_engine_state(**{**blank_engine_fields(k), **dict(
        capacity=kv_capacity, scratch=_padded(holders, k), scratch3=_padded(held_after, k),
        overflow_rng=rng)})
    count = type(rule).evict_victims(state, rule.rule_state(), k, n_running)
    return state_array(state, "preempt")[:count].copy()



def decide_on_view(policy: CompiledPolicy, view: PolicyView) -> Batch:
    """``policy``'s compiled decision at the state ``view`` shows (see
    :meth:`CompiledPolicy.decide`)."""
    n = view.prompt_len.size
    waiting = np.asarray(view.waiting, dtype=np.int64)
    running = np.asarray(view.running, dtype=np.int64)
    status = np.full(n, FUTURE, dtype=np.int8)
    status[waiting] = WAITING
    status[running] = RUNNING
    queue = np.zeros(n + 1, dtype=np.int64)
    queue[:waiting.size] = waiting
    run = np.zeros(n, dtype=np.int64)
    run[:running.size] = running
    joined = np.zeros(2 * n + 16, dtype=np.int64)
    joined[:waiting.size] = waiting
    started = np.zeros(n, dtype=np.int64)
    started[:running.size] = running
    block = view.kv_block_size
    setup = RunSetup(n=n, kv_capacity=view.kv_capacity, block_size=block,
                     type_id=np.asarray(view.type_id, dtype=np.int64),
                     estimate=np.asarray(view.predicted_output, dtype=np.int64))
    zeros = np.zeros(n, dtype=np.int64)
    state = new_engine_state(**{**blank_engine_fields(n), **dict(
        n=n, capacity=view.kv_capacity, block=block, arrival=view.arrival,
        prompt_len=view.prompt_len, output_len=np.full(n, np.iinfo(np.int64).max),
        estimate=view.predicted_output, type_id=view.type_id, status=status,
        prefill_len=view.prefill_len, prefilled=view.prefilled, generated=view.generated,
        held=view.held, start_iteration=view.start_iteration, queue=queue, qtail=waiting.size,
        running=run, n_run=running.size, joined=joined, n_joined=waiting.size,
        started=started, n_started=running.size, now=view.now,
        next_arrival=view.next_arrival, iteration=view.iteration, kv_held=view.kv_held,
        chunk_of=zeros, n_advance=-1)})
    rule = policy.rule_state(setup)
    error = type(policy).decision(state, rule)
    if error:
        raise policy.decision_error(error, int(state_scalars(state)["error_arg"]), view)
    scalars = state_scalars(state)
    n_start, n_advance = scalars["n_start"], scalars["n_advance"]
    start = state_array(state, "start")[:n_start].copy()
    advance = None if n_advance < 0 else state_array(state, "advance")[:n_advance].copy()
    preempt = state_array(state, "preempt")[:scalars["n_preempt"]].copy()
    dropped = state_array(state, "drop")[:scalars["n_drop"]].copy()
    chunk_of = state_array(state, "chunk_of")
    prefill_len, prefilled = view.prefill_len, view.prefilled
    members = np.concatenate((running if advance is None else advance, start))
    chunks = {int(r): int(chunk_of[r]) for r in members
              if 0 < chunk_of[r] < prefill_len[r] - prefilled[r]}
    return Batch(start=start, advance=advance, preempt=preempt, drop=dropped,
                 prefill_chunks=chunks or None, steady_steps=scalars["steady"])


def price_shape(timing: CompiledTiming, shape: BatchShape, record: TimingState) -> float:
    """``timing``'s compiled price of one batch ``shape``."""
    m = shape.size
    state = new_engine_state(**{**blank_engine_fields(m), **dict(
        m=m, new_tokens=_padded(shape.new_tokens, m), context=_padded(shape.context, m),
        is_prefill=_padded(shape.is_prefill, m, np.bool_))})
    return float(type(timing).price_batch(state, record))


def _padded(values, m: int, dtype=np.int64) -> np.ndarray:
    out = np.zeros(max(m, 1), dtype=dtype)
    out[:m] = values
    return out


@jit
def state_scalars_tuple(s):
    return (s.n_start, s.n_advance, s.n_preempt, s.n_drop, s.n_chunks, s.steady,
            s.error_code, s.error_arg)


def state_scalars(state) -> dict:
    names = ("n_start", "n_advance", "n_preempt", "n_drop", "n_chunks", "steady", "error_code",
             "error_arg")
    return dict(zip(names, state_scalars_tuple(state), strict=True))


@jit
def _decision_arrays(s):
    return s.start, s.advance, s.preempt, s.drop, s.chunk_of


def state_array(state, name: str) -> np.ndarray:
    return dict(zip(("start", "advance", "preempt", "drop", "chunk_of"), _decision_arrays(state),
                    strict=True))[name]
