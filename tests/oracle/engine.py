"""The test oracle: a plain, step-by-step implementation of the replay model in numpy.

This is the Python engine kvsched ran before its step loop was compiled (see
docs/architecture.md). It stays as an independent statement of the same model, read and
written for clarity, not speed: every step asks the policy (no steady stretches), and the
built-in policies it runs are the plain versions in :mod:`tests.oracle.policies`. The
production engine (:mod:`replay.engine.loop`) is held equal to it, table for table, on
random instances (tests/test_oracle.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from replay.engine.histogram import LogHistogram
from replay.engine.kv import KVCapacity
from replay.engine.policy import Batch, Policy, PolicyView
from replay.engine.requests import Requests
from replay.engine.results import ITERATION_COLUMNS, ITERATION_DTYPES, RunResult
from replay.engine.timing import BatchShape, TimingBackend
from tests.oracle.policies import blocks
from tests.oracle.prefix_cache import OraclePrefixCache
from tests.oracle.waiting import WaitingQueue

FUTURE, WAITING, RUNNING, DONE, DROPPED = 0, 1, 2, 3, 4
#: A long replay logs where it is at most this often (wall seconds), checked every 4,096 steps.
HEARTBEAT_S = 30.0
log = logging.getLogger(__name__)
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class OracleView(PolicyView):
    """The policy's view, with the oracle's prefix cache for the oracle policies (None with
    it off)."""

    cache: OraclePrefixCache | None = None


class DecisionError(RuntimeError):
    """A policy returned a decision the engine cannot carry out (a policy bug)."""


@dataclass(slots=True)
class _Step:
    """One step as the phases hand it on: the policy's decision, validated and capped
    (:meth:`Engine._decide`), then its shape, price and KV peak (:meth:`Engine._price`)."""

    batch: Batch
    members: np.ndarray  # advancing requests, then admissions
    start: np.ndarray  # admissions after the engine's caps
    started_all: bool  # no admission was cut
    chunks: Mapping[int, int] | None  # the policy's prefill chunks, less cut admissions'
    n_evicted: int  # preempted by the policy (and, on overflow, evicted by its rule)
    chunk: np.ndarray | None = None  # prompt tokens each member processes
    prefill_total: int = 0
    emits: np.ndarray | None = None  # None: decode only, every member emits
    gain: np.ndarray | int = 1  # slots each member gains
    gain_total: int = 0
    n_decode: int = 0
    duration: float = 0.0
    kv_peak: int = 0
    new_blocks: int = 0  # with paging
    finished: int = 0  # completions, once executed
    emitters: int = 0  # members that emitted a token, once executed


def _whole(value) -> bool:
    """A request id or token count: an integer, not a bool or a float that would be
    truncated."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _frozen(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _sealed(a: np.ndarray) -> np.ndarray:
    """``a`` itself, made read-only: for arrays the engine replaces and never writes to."""
    a.flags.writeable = False
    return a


def default_livelock_window(requests: Requests) -> int:
    """Steps without a completion after which a run is declared livelocked.

    A policy that keeps advancing what it started completes some request within
    ``max(s_i + o_i)`` iterations (even at one prompt token per chunk), so four
    times that, plus slack for arrivals and failed attempts, only trips on
    cycles.
    """
    return 4 * int((requests.prompt_len + requests.output_len).max(initial=1)) + 100


class Engine:
    """Replays ``requests`` under ``policy``; construct once per run, then :meth:`run`."""

    def __init__(self, requests: Requests, policy: Policy, timing: TimingBackend,
                 kv: KVCapacity, seed: int = 0, livelock_window: int | None = None,
                 max_steps: int | None = None, progress: bool = False,
                 validate_decisions: bool = True, preemption: str = "restart",
                 requeue: str = "front", max_running: int | None = None,
                 max_starts_per_round: int | None = None) -> None:
        if requests.arrival is None:
            raise ValueError("Engine: requests have no arrival times; assign arrivals first")
        self.preemption, self.requeue, self.max_running = preemption, requeue, max_running
        self.max_starts_per_round = max_starts_per_round
        requests.validate(kv.tokens)
        self.requests = requests
        self.policy = policy
        self.timing = timing
        self.kv = kv
        self.livelock_window = livelock_window or default_livelock_window(requests)
        self.max_steps = max_steps
        self.progress = progress
        self.validate_decisions = validate_decisions
        policy_seed, overflow_seed = np.random.SeedSequence([seed, 0xE5]).spawn(2)
        self.policy_rng = np.random.default_rng(policy_seed)
        self.overflow_rng = np.random.default_rng(overflow_seed)

        # Engine id = rank in (arrival, workload position) order.
        self.order = np.lexsort((np.arange(len(requests)), requests.arrival))
        self.arrival = requests.arrival[self.order].astype(np.float64)
        self.prompt_len = requests.prompt_len[self.order].astype(np.int64)
        self.output_len = requests.output_len[self.order].astype(np.int64)
        n = len(requests)
        lo = requests.predicted_lo if requests.predicted_lo is not None else requests.output_len
        hi = requests.predicted_hi if requests.predicted_hi is not None else requests.output_len
        self.predicted_lo = lo[self.order].astype(np.int64)
        self.predicted_hi = hi[self.order].astype(np.int64)
        # The point estimate policies plan with: the interval's upper end, which is
        # the truth when predictions are exact (a policy may refine its own copy).
        self.predicted_output = self.predicted_hi
        types = requests.type_id if requests.type_id is not None else np.full(n, -1)
        self.type_id = np.asarray(types)[self.order].astype(np.int64)

        self.status = np.zeros(n, dtype=np.int8)
        # Tokens the current attempt must prefill: s, or s + kept tokens after a recompute.
        self.prefill_len = self.prompt_len.copy()
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.held = np.zeros(n, dtype=np.int64)
        self.start_iteration = np.full(n, -1, dtype=np.int64)
        self.start_time = np.full(n, np.nan)
        self.first_token_time = np.full(n, np.nan)
        self.completion_time = np.full(n, np.nan)
        self.evictions = np.zeros(n, dtype=np.int64)
        self.last_token_time = np.full(n, np.nan)
        self.max_token_gap = np.full(n, np.nan)
        self.token_gaps = LogHistogram()
        # Queue position: requests wait in ascending key; a key is given on entering the queue.
        self.queue_key = np.arange(n, dtype=np.int64)
        self._next_queue_key = n
        self._gain_scratch = np.zeros(n, dtype=np.int64)
        self._id_scratch = np.zeros(n, dtype=np.int64)
        self._positions = _sealed(np.arange(1, n + 1, dtype=np.int64))  # 1-based marks
        # Decode-only shapes are slices of these (a batch never exceeds the trace).
        self._ones = _sealed(np.ones(n, dtype=np.int64))
        self._no_prefill = _sealed(np.zeros(n, dtype=bool))
        self.cache = None
        self.cached_tokens = np.zeros(n, dtype=np.int64)  # taken by the last admission
        if kv.prefix_cache != "none":
            if requests.predecessor is not None:
                raise ValueError("the oracle has no sessions")
            hashes, offsets = requests.block_hashes(kv.block_size, with_output=True)
            self.cache = OraclePrefixCache(
                [hashes[offsets[w]:offsets[w + 1]] for w in self.order.tolist()],
                kv.block_size, kv.cache_eviction)
        self.hits: dict[int, int] = {}  # this step's admissions' cached blocks

    # ------------------------------------------------------------------ helpers
    def _check_ids(self, ids, expected: int, what: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if not self.validate_decisions or ids.size == 0:
            return ids
        # Boolean checks count with count_nonzero: on short arrays a quarter of any()'s cost.
        if ids.size == 1:  # the common case, in plain integers
            rid = int(ids[0])
            if not 0 <= rid < self.status.size:
                raise self._unknown_ids(what)
            if self.status[rid] == expected:
                return ids
        elif expected == WAITING:  # admissions in queue order (most policies): a queue prefix
            queue = self.queue.ids
            if ids.size <= queue.size and not np.count_nonzero(queue[:ids.size] != ids):
                return ids
        if np.count_nonzero(ids < 0):
            raise self._unknown_ids(what)
        # Mark each id with its position: a repeated id keeps only its last mark.
        seen, positions = self._id_scratch, self._positions[:ids.size]
        try:
            seen[ids] = positions
        except IndexError:  # an id past the trace
            raise self._unknown_ids(what) from None
        bad = (self.status[ids] != expected) | (seen[ids] != positions)
        seen[ids] = 0
        if np.count_nonzero(bad):
            wrong = ids[self.status[ids] != expected]
            if not wrong.size:
                raise DecisionError(f"{type(self.policy).__name__}: {what} repeats a request id")
            state = {FUTURE: "not arrived", WAITING: "waiting", RUNNING: "running",
                     DONE: "completed"}
            raise DecisionError(
                f"{type(self.policy).__name__}: {what} names request {int(wrong[0])} which is "
                f"{state[int(self.status[wrong[0]])]}")
        return ids

    def _unknown_ids(self, what: str) -> DecisionError:
        return DecisionError(f"{type(self.policy).__name__}: {what} has unknown request ids")

    def _evict(self, victims: np.ndarray) -> int:
        """Free the KV of running ``victims`` and return them to the waiting queue.

        Under ``restart`` they lose every token; under ``recompute`` they keep the
        tokens emitted so far and must prefill ``s + generated`` when readmitted.
        """
        victims = victims[self.status[victims] == RUNNING]
        if victims.size == 0:
            return 0
        # One victim (most preemptions) indexes the state with a plain int: the same
        # updates at a fraction of the cost of one-element arrays.
        index = int(victims[0]) if victims.size == 1 else victims
        freed = int(self.held[index].sum())
        if self.cache is not None:
            for rid in victims.tolist():
                self.cache.release(rid)
        self.status[index] = WAITING
        self.prefilled[index] = 0
        if self.preemption == "restart":
            self.generated[index] = 0
            self.first_token_time[index] = np.nan
            self.last_token_time[index] = np.nan
            self.max_token_gap[index] = np.nan
        self.prefill_len[index] = self.prompt_len[index] + self.generated[index]
        if self.kv.block_size > 1:
            self.blocks_held -= int(blocks(self.held[index], self.kv.block_size).sum())
        self.held[index] = 0
        self.start_iteration[index] = -1
        self.evictions[index] += 1
        self.kv_held -= freed
        self.running = _sealed(self.running[self.status[self.running] == RUNNING])
        if victims.size > 1:
            victims = victims[np.argsort(self.queue_key[victims], kind="stable")]
        if self.requeue == "back":
            keys = np.arange(self._next_queue_key, self._next_queue_key + victims.size)
            self.queue_key[victims] = keys
            self._next_queue_key += victims.size
            self.queue.append(victims)
        else:
            # The queue is in key order and keys are unique: insert the victims by key
            # (until a `back` requeue every key is its id, so the ids are the keys).
            queue = self.queue.ids
            if self._next_queue_key == self.status.size:
                at = np.searchsorted(queue, victims)
            else:
                at = np.searchsorted(self.queue_key[queue], self.queue_key[victims])
            self.queue.insert(at, victims)
        return int(victims.size)

    def _complete(self, finished: np.ndarray, end: float) -> None:
        """Record ``finished`` as completed at ``end`` and free their KV."""
        if finished.size == 1:
            # One completion (most steps that have any), in plain integers: a quarter of
            # the array path's cost.
            rid = int(finished[0])
            self.completion_time[rid] = end
            self.status[rid] = DONE
            if self.cache is not None:
                self.cache.release(rid)
            held = int(self.held[rid])
            self.kv_held -= held
            if self.kv.block_size > 1:
                self.blocks_held -= blocks(held, self.kv.block_size)
            self.held[rid] = 0
            self.running = _sealed(self.running[self.running != rid])
            return
        self.completion_time[finished] = end
        self.status[finished] = DONE
        if self.cache is not None:
            for rid in finished.tolist():
                self.cache.release(rid)
        held = self.held[finished]
        self.kv_held -= int(held.sum())
        if self.kv.block_size > 1:
            self.blocks_held -= int(blocks(held, self.kv.block_size).sum())
        self.held[finished] = 0
        self.running = _sealed(self.running[self.status[self.running] == RUNNING])

    def _prefill_chunks(self, chunks: Mapping[int, int] | None, members: np.ndarray,
                        remaining_prompt: np.ndarray) -> np.ndarray:
        """Prompt tokens each member processes (0 for a decode); the default is all that remain."""
        if not chunks:
            return remaining_prompt
        chunk = remaining_prompt.copy()
        if len(chunks) == 1:  # the common case: one prompt only part-done
            ((rid, tokens),) = chunks.items()
            at = np.flatnonzero(members == rid)  # members are distinct (checked)
            if (at.size and _whole(rid) and _whole(tokens)
                    and 1 <= tokens <= remaining_prompt[at[0]]):
                chunk[at[0]] = tokens
                return chunk
        position = self._id_scratch  # zero between uses; 1-based positions while in use
        position[members] = self._positions[:members.size]
        count = len(chunks)
        rids = np.fromiter(chunks.keys(), dtype=np.int64, count=count)
        tokens = np.fromiter(chunks.values(), dtype=np.int64, count=count)
        k = position.take(rids, mode="clip") - 1  # unknown ids are caught just below
        position[members] = 0
        bad = ((rids.view(np.uint64) >= position.size) | (k < 0) | (tokens < 1)
               | (tokens > remaining_prompt[k]))
        # fromiter truncates floats: an id or a chunk must be a whole number as given.
        bad |= [not (_whole(rid) and _whole(t)) for rid, t in chunks.items()]
        if np.count_nonzero(bad):
            i = int(np.flatnonzero(bad)[0])
            raise DecisionError(
                f"{type(self.policy).__name__}: prefill chunk "
                f"{list(chunks.values())[i]!r} for request "
                f"{int(rids[i])} is not in 1..remaining prompt of a prefilling batch member")
        chunk[k] = tokens
        return chunk

    # --------------------------------------------------------------------- run
    def run(self) -> RunResult:
        """Replay until every request completed or a stop condition holds.

        Each step runs the phases in order: release arrivals, ask the policy
        (:meth:`_decide`), price the batch and its KV peak (:meth:`_price`), then either
        fail the attempt on overflow (:meth:`_overflow`) or execute it (:meth:`_execute`,
        which advances, completes and records).
        """
        loop_started = time.perf_counter()
        n = self.status.size
        self._start_run()
        status, message = "completed", ""
        self._bar = tqdm(total=n, disable=not self.progress, unit="req", desc="replay",
                         leave=False)
        while self.completed + self.dropped < n:
            self._release_arrivals()
            if self.queue.size == 0 and self.running.size == 0:
                self.now = float(self.next_arrival)
                continue
            stop = self._stop_reason()
            if stop is not None:
                status, message = stop
                break
            step = self._decide()
            if step.members.size == 0:
                if self.completed + self.dropped == n:
                    break
                if self.released < n:
                    self.now = float(self.next_arrival)
                    continue
                status = "stalled"
                message = (f"{type(self.policy).__name__} scheduled nothing with "
                           f"{n - self.completed - self.dropped} requests unfinished and no "
                           f"arrivals left")
                break
            self._price(step)
            self.steps += 1
            if not self.steps & 4095:
                self._heartbeat()
            if step.kv_peak > self.kv.tokens:
                self._overflow(step)
                continue
            self._execute(step)
        loop_time = time.perf_counter() - loop_started
        self._bar.close()
        iterations = _frame(self._log, self.cache is not None)
        return RunResult(status, message, self._request_table(), iterations, self.kv,
                         self.livelock_window, self.decision_time, self.preemption,
                         self.requeue, self.token_gaps, timing_time_s=self.timing_time,
                         loop_time_s=loop_time, decisions=self.decisions, dropped=self.dropped,
                         prefix_cache=self.cache.summary() if self.cache is not None else None)

    def _heartbeat(self) -> None:
        """Say where a long replay is (the progress bar is off by default)."""
        wall = time.perf_counter()
        if wall - self._last_heartbeat >= HEARTBEAT_S:
            self._last_heartbeat = wall
            log.info("replay: %d of %d requests completed, %d steps, simulated time %.6g %s",
                     self.completed, self.status.size, self.steps, self.now,
                     getattr(self.timing, "time_unit", "seconds"))

    def _start_run(self) -> None:
        """The run's clock, counters, queue, running set and the policy's read-only view."""
        block = self.kv.block_size
        self.queue, self.running, self.kv_held = WaitingQueue(), _sealed(_EMPTY.copy()), 0
        self.blocks_held = 0  # with paging (block > 1): KV blocks the running requests occupy
        self.view = OracleView(
            kv_capacity=self.kv.tokens, arrival=_frozen(self.arrival),
            prompt_len=_frozen(self.prompt_len),
            predicted_output=_frozen(self.predicted_output),
            predicted_lo=_frozen(self.predicted_lo), predicted_hi=_frozen(self.predicted_hi),
            type_id=_frozen(self.type_id), prefilled=_frozen(self.prefilled),
            generated=_frozen(self.generated), held=_frozen(self.held),
            start_iteration=_frozen(self.start_iteration), rng=self.policy_rng,
            kv_block_size=block, prefill_len=_frozen(self.prefill_len), cache=self.cache)
        if self.cache is not None:
            self.view.prefix_lookup = lambda ids: np.array(
                [self.cache.hits(r, int(self.prefill_len[r])) * block for r in ids.tolist()],
                dtype=np.int64)
        self._log = []
        self.now, self.released, self.next_arrival = 0.0, 0, np.inf
        self.iteration = self.steps = self.idle_steps = self.completed = self.decisions = 0
        self.dropped = 0
        self.decision_time = self.timing_time = 0.0
        self._last_heartbeat = time.perf_counter()

    # -- phase 1: arrivals
    def _release_arrivals(self) -> None:
        """Move every request that has arrived by ``now`` into the waiting queue."""
        n, arrival = self.status.size, self.arrival
        released = self.released
        if released < n and arrival[released] <= self.now:
            upto = int(np.searchsorted(arrival, self.now, side="right"))
            self.status[released:upto] = WAITING
            arrived = np.arange(released, upto)
            if self._next_queue_key > n:  # a `back` requeue happened: queue behind it
                self.queue_key[arrived] = np.arange(self._next_queue_key,
                                                    self._next_queue_key + arrived.size)
                self._next_queue_key += arrived.size
            self.queue.append(arrived)
            self.released = released = upto
        self.next_arrival = arrival[released] if released < n else np.inf

    def _stop_reason(self) -> tuple[str, str] | None:
        """``(status, message)`` when the run must stop before this step, else None."""
        if self.idle_steps > self.livelock_window:
            return "livelock", (
                f"no request completed in {self.idle_steps} steps with "
                f"{self.status.size - self.completed - self.dropped} unfinished "
                f"(livelock_window={self.livelock_window})")
        if self.max_steps is not None and self.steps >= self.max_steps:
            return "step_limit", f"stopped after max_steps={self.max_steps}"
        return None

    # -- phase 2: the policy's decision, validated and capped
    def _decide(self) -> _Step:
        view = self.view
        view.now, view.iteration, view.kv_held = self.now, self.iteration, self.kv_held
        view.waiting, view.running = self.queue.ids, self.running
        view.next_arrival = float(self.next_arrival)
        decide_started = time.perf_counter()
        batch = self.policy.decide(view)
        self.decision_time += time.perf_counter() - decide_started
        self.decisions += 1

        if len(batch.drop):
            self._drop(np.asarray(batch.drop, dtype=np.int64))
        n_evicted = 0
        if batch.preempt is not None and len(batch.preempt):
            n_evicted = self._evict(self._check_ids(batch.preempt, RUNNING, "preempt"))
        requested = (self._check_ids(batch.start, WAITING, "start") if len(batch.start)
                     else _EMPTY)
        start = requested
        if self.max_running is not None and self.running.size + start.size > self.max_running:
            # A cap on running requests for every policy (a serving engine's batch limit):
            # the policy's admissions are cut to the first ones in its order.
            start = start[: max(0, self.max_running - self.running.size)]
        if self.max_starts_per_round is not None:
            start = start[: self.max_starts_per_round]
        started_all = start.size == requested.size
        chunks = batch.prefill_chunks
        if chunks and not started_all:  # no chunk for an admission the caps cut
            cut = set(requested[start.size:].tolist())
            chunks = {rid: tokens for rid, tokens in chunks.items() if rid not in cut}
        advance = (self.running if batch.advance is None
                   else self._check_ids(batch.advance, RUNNING, "advance"))
        if self.cache is not None:  # what the admissions find cached, kept from reclaims
            self.cache.unpin()
            self.hits = {rid: self.cache.hits(rid, int(self.prefill_len[rid]))
                         for rid in start.tolist()}
            for rid, hits in self.hits.items():
                self.cache.pin(rid, hits)
        members = np.concatenate((advance, start)) if start.size else advance
        return _Step(batch, members, start, started_all, chunks, n_evicted)

    # -- phase 3: the iteration's shape, price and KV peak
    def _price(self, step: _Step) -> None:
        members, block = step.members, self.kv.block_size
        held_before = self.held[members]
        remaining_prompt = self.prefill_len[members] - self.prefilled[members]
        if self.cache is not None and step.start.size:
            # an admission's cached blocks are context, not computed
            skip = np.array([self.hits[rid] * block for rid in step.start.tolist()])
            held_before = held_before.copy()
            held_before[members.size - skip.size:] += skip
            remaining_prompt[members.size - skip.size:] -= skip
        chunk = self._prefill_chunks(step.chunks, members, remaining_prompt)
        prefill_total = int(chunk.sum())
        if prefill_total == 0:
            # Decode only (most steps): every member emits one token and holds one more slot.
            emits, gain, gain_total, n_decode = None, 1, members.size, members.size
            is_prefill, new_tokens = self._no_prefill[:members.size], self._ones[:members.size]
        else:
            is_prefill = remaining_prompt > 0
            emits = chunk == remaining_prompt  # a decode, or the prompt's last chunk
            gain = chunk + emits
            gain_total = int(gain.sum())
            n_decode = members.size - int(np.count_nonzero(is_prefill))
            new_tokens = np.maximum(chunk, 1)
        timing_started = time.perf_counter()
        duration = float(self.timing.duration(BatchShape(
            new_tokens=new_tokens, context=held_before, is_prefill=is_prefill)))
        self.timing_time += time.perf_counter() - timing_started
        kv_peak = self.kv_held + gain_total
        new_blocks = 0
        if block > 1:
            # Only members change what they hold; their block counts grow at boundaries
            # (by one token: exactly where the last block is full, or there is none).
            if emits is None:
                new_blocks = np.count_nonzero(held_before % block == 0)
            else:
                new_blocks = int((blocks(held_before + gain, block)
                                  - blocks(held_before, block)).sum())
            kv_peak = (self.blocks_held + new_blocks) * block
        if self.cache is not None:
            kv_peak = (self._physical_blocks() + new_blocks) * block
            if kv_peak > self.kv.tokens:  # free entries make room, if enough of them
                needed = -(-(kv_peak - self.kv.tokens) // block)
                if needed <= self.cache.reclaimable():
                    self.cache.reclaim(needed)
                    kv_peak -= needed * block
        step.chunk, step.prefill_total, step.emits, step.gain = chunk, prefill_total, emits, gain
        step.gain_total, step.n_decode, step.duration = gain_total, n_decode, duration
        step.kv_peak, step.new_blocks = kv_peak, new_blocks

    # -- phase 4a: overflow: the attempt fails, its time is charged, the overflow rule evicts
    def _overflow(self, step: _Step) -> None:
        start, members = step.start, step.members
        holders = np.concatenate((self.running, start)) if start.size else self.running
        scratch = self._gain_scratch
        scratch[members] = step.gain
        held_after = self.held[holders] + scratch[holders]
        scratch[members] = 0
        victims = np.asarray(
            self.policy.overflow.evict(holders, held_after, self.kv.tokens, self.overflow_rng,
                                       self.running.size),
            dtype=np.int64)
        if victims.size and not np.isin(victims, holders).all():
            raise DecisionError(f"{type(self.policy).__name__}: overflow rule evicted "
                                f"a request that holds no KV in this batch")
        step.n_evicted += self._evict(victims)
        self._log.append((self.now, step.duration, members.size, start.size, step.prefill_total,
                          step.n_decode, int(step.kv_peak), self._kv_after(), 0, step.n_evicted,
                          True, *self._cache_columns(0)))
        self.now += step.duration
        self.idle_steps += 1

    # -- phase 4b: execution: admissions, progress, token times, completions, the log row
    def _execute(self, step: _Step) -> None:
        start, members, emits, now = step.start, step.members, step.emits, self.now
        hit_tokens = 0
        if self.cache is not None:
            for rid in start.tolist():  # admissions take their cached blocks
                hits, prefill_len = self.hits[rid], int(self.prefill_len[rid])
                self.cache.admit(rid, hits, prefill_len)
                tokens = hits * self.kv.block_size
                self.prefilled[rid] += tokens
                self.held[rid] += tokens
                self.kv_held += tokens
                self.blocks_held += hits
                self.cached_tokens[rid] = tokens
                hit_tokens += tokens
        if start.size:
            self.status[start] = RUNNING
            self.start_iteration[start] = self.iteration
            self.start_time[start] = now
            self.running = _sealed(np.concatenate((self.running, start)))
            self.queue.drop_left(self.status, WAITING, start.size)
        end = now + step.duration
        if emits is None:
            self.generated[members] += 1
            self.held[members] += 1
            emitters = members
        else:
            self.prefilled[members] += step.chunk
            self.generated[members] += emits
            self.held[members] += step.gain
            emitters = members[emits]
        self.kv_held += step.gain_total
        if self.kv.block_size > 1:
            self.blocks_held += step.new_blocks
        if self.cache is not None:
            for rid in members.tolist():
                self.cache.insert_full(rid, int(self.held[rid]))
        tokens = self.generated[emitters]
        if emits is None:
            later = emitters  # decoding means the prompt's last chunk emitted token 1 before
        else:
            first = tokens == 1
            self.first_token_time[emitters[first]] = end
            later = emitters[~first]
        if later.size:
            gaps = end - self.last_token_time[later]
            self.token_gaps.add(gaps)
            self.max_token_gap[later] = np.fmax(self.max_token_gap[later], gaps)
        self.last_token_time[emitters] = end
        finished = emitters[tokens == self.output_len[emitters]]
        if finished.size:
            self._complete(finished, end)
            self._count_completed(int(finished.size))
        else:
            self.idle_steps += 1
        self._log.append((now, step.duration, members.size, start.size, step.prefill_total,
                          step.n_decode, int(step.kv_peak), self._kv_after(), finished.size,
                          step.n_evicted, False, *self._cache_columns(hit_tokens)))
        self.now = end
        self.iteration += 1
        step.finished, step.emitters = int(finished.size), int(emitters.size)

    def _physical_blocks(self) -> int:
        return self.cache.physical(self.held[self.running], self.running)

    def _kv_after(self) -> int:
        """The log's KV after a step: slots held, or with the prefix cache the blocks in
        use (entries included), in slots."""
        if self.cache is None:
            return self.kv_held
        return self._physical_blocks() * self.kv.block_size

    def _cache_columns(self, hit_tokens: int) -> tuple:
        if self.cache is None:
            return ()
        return hit_tokens, len(self.cache.entries)

    def _drop(self, ids: np.ndarray) -> None:
        """The policy drops ``ids`` (waiting or running): they never complete."""
        ids = ids[np.isin(self.status[ids], (WAITING, RUNNING))]
        running = ids[self.status[ids] == RUNNING]
        if self.cache is not None:
            for rid in running.tolist():
                self.cache.release(rid)
        self.kv_held -= int(self.held[running].sum())
        if self.kv.block_size > 1:
            self.blocks_held -= int(blocks(self.held[running], self.kv.block_size).sum())
        self.held[running] = 0
        self.status[ids] = DROPPED
        self.dropped += ids.size
        self.running = _sealed(self.running[self.status[self.running] == RUNNING])
        queue = self.queue.ids
        self.queue.replace(queue[self.status[queue] == WAITING])
        if ids.size:
            self.idle_steps = 0

    def _count_completed(self, count: int) -> None:
        self.completed += count
        self.idle_steps = 0
        self._bar.update(count)

    def _request_table(self) -> pd.DataFrame:
        """Per-request results in workload order (``request_id`` = position in the workload)."""
        back = np.empty_like(self.order)
        back[self.order] = np.arange(self.order.size)
        r = self.requests
        table = pd.DataFrame({
            "request_id": np.arange(len(r)),
            "source_row": r.source_row if r.source_row is not None else np.arange(len(r)),
            "arrival": r.arrival,
            "prompt_len": r.prompt_len,
            "output_len": r.output_len,
            "start": self.start_time[back],
            "first_token": self.first_token_time[back],
            "completion": self.completion_time[back],
            "evictions": self.evictions[back],
            "tokens_generated": self.generated[back],
        })
        table["latency"] = table["completion"] - table["arrival"]
        table["ttft"] = table["first_token"] - table["arrival"]
        table["completed"] = self.status[back] == DONE
        # Mean gap telescopes: (last token - first token) / (tokens - 1).
        with np.errstate(invalid="ignore", divide="ignore"):
            table["tbt_mean"] = np.where(
                table["completed"] & (table["output_len"] > 1),
                (table["completion"] - table["first_token"]) / (table["output_len"] - 1), np.nan)
        table["tbt_max"] = self.max_token_gap[back]
        if self.cache is not None:
            table["cached_tokens"] = self.cached_tokens[back]
        return table


def _frame(rows: list[tuple], cache: bool) -> pd.DataFrame:
    """The iteration table from its rows (with the prefix cache's two columns last)."""
    names = ITERATION_COLUMNS + (["cached_tokens", "cache_blocks"] if cache else [])
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return pd.DataFrame({name: np.array(values, dtype=ITERATION_DTYPES.get(name, np.int64))
                         for name, values in zip(names, columns, strict=True)})
