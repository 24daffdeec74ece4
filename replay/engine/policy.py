"""The policy contract: a read-only view of the engine in, a batch decision out.

A policy is any object with

* ``decide(view: PolicyView) -> Batch``, called at every scheduling step, and
* ``overflow``: the :mod:`replay.engine.overflow` rule the engine applies on the
  policy's behalf when a batch would exceed the KV capacity.

Policies never modify engine state: every array in the view is read-only, and
the engine validates each decision before acting on it.

Request ids seen by policies are *engine ids*: requests are numbered in
arrival order with ties broken by their position in the workload, so sorting
ids ascending is "arrival order, ties by id" (FCFS order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
#: ``Batch.steady_steps`` of a decision that repeats until one of the engine's own stops (an
#: arrival, a completion, a prompt's last chunk, the KV limit).
UNTIL_CHANGE = 2 ** 62


@dataclass(frozen=True, slots=True)
class Batch:
    """One iteration's decision.

    ``start``: waiting requests to start this iteration.
    ``advance``: running requests that take part (``None``: all running; a
    policy may pause requests by leaving them out, their KV is kept).
    ``preempt``: running requests to evict *before* the iteration (recompute:
    they lose their progress and KV and return to the waiting queue).
    ``drop``: waiting or running requests that leave the run for good before the
    iteration (a running one frees its KV); they never complete and are counted in the
    summary's ``n_dropped``. (The WAIT authors' ``force_clear`` drops the queue.)
    ``prefill_chunks``: for requests that are prefilling this iteration, the
    prompt tokens each processes (default: all of its remaining prompt).
    ``steady_steps``: a promise about the following steps, read only when
    nothing is preempted and no prompt is finished by the decision (every
    member decodes or takes a prompt chunk that is not its last): that at each
    of the next ``steady_steps`` steps ``decide`` would return the same decision
    again (the same members in the same order, ``advance`` then ``start``, the
    requests started now among the running ones; the same chunks; the promise
    it comes with may differ), unless a request arrives or completes first, a
    chunk would be its prompt's last, or the batch's next step would exceed the
    KV capacity. A promise that comes with starts is read only if the engine
    started them all (no ``max_running`` or ``max_starts_per_round`` cut).
    :data:`UNTIL_CHANGE` promises it with no bound. The engine
    executes such a stretch without calling ``decide`` (see
    :func:`replay.engine.phases.run_stretch`), with results identical to calling it. Promise it
    only where the decision provably repeats and does not draw from ``rng``.
    """

    start: np.ndarray = field(default_factory=lambda: _EMPTY)
    advance: np.ndarray | None = None
    preempt: np.ndarray = field(default_factory=lambda: _EMPTY)
    drop: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_chunks: Mapping[int, int] | None = None
    steady_steps: int = 0


@dataclass(slots=True)
class PolicyView:
    """What a policy may see. Per-request arrays are indexed by engine id and read-only.

    ``predicted_output`` is the policy's point estimate of ``o_i`` (the truth
    when predictions are exact); ``predicted_lo``/``predicted_hi`` bound it.
    The true output lengths are deliberately not part of the view.
    ``held`` is the KV slots each request holds now (prompt tokens prefilled +
    tokens generated). ``prefill_len`` is what a request's current attempt must
    prefill: ``s``, or ``s + generated`` for a request preempted under the
    ``recompute`` mode (it keeps its tokens); ``prefilled`` counts towards it.
    ``waiting`` is in queue order (arrival order, unless requests were requeued
    at the back). ``start_iteration`` is the executed-iteration index at
    which a running request (last) started. ``kv_block_size`` is the paging
    granularity the engine counts KV in (1 = token-exact).
    """

    kv_capacity: int
    arrival: np.ndarray
    prompt_len: np.ndarray
    prefill_len: np.ndarray
    predicted_output: np.ndarray
    predicted_lo: np.ndarray
    predicted_hi: np.ndarray
    type_id: np.ndarray
    prefilled: np.ndarray
    generated: np.ndarray
    held: np.ndarray
    start_iteration: np.ndarray
    rng: np.random.Generator
    kv_block_size: int = 1
    now: float = 0.0
    iteration: int = 0
    kv_held: int = 0
    waiting: np.ndarray = field(default_factory=lambda: _EMPTY)
    running: np.ndarray = field(default_factory=lambda: _EMPTY)
    next_arrival: float = float("inf")
    #: With the prefix cache, how many prompt tokens of each waiting request are cached now.
    prefix_lookup: Callable[[np.ndarray], np.ndarray] | None = None

    @property
    def more_arrivals(self) -> bool:
        return self.next_arrival != float("inf")

    def cached_tokens(self, ids: np.ndarray) -> np.ndarray:
        """The prompt tokens of waiting requests ``ids`` found in the prefix cache now (what
        starting them would not compute and would share); zeros without the cache."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.prefix_lookup is None:
            return np.zeros(ids.size, dtype=np.int64)
        return self.prefix_lookup(ids)


@dataclass(frozen=True)
class RunSetup:
    """What a compiled rule may know of a run before it starts, to lay out its record:
    the number of requests, the KV capacity and block size, and per engine id the request
    types and the output estimates the policy plans with."""

    n: int
    kv_capacity: int
    block_size: int
    type_id: np.ndarray
    estimate: np.ndarray


class OverflowRule(Protocol):
    """Chooses which running requests to evict when a batch would exceed the KV capacity.

    ``holders`` are all requests that would hold KV after the iteration: the
    ``n_running`` running ones first, in start order, then the ones the batch
    starts; ``held_after`` is what each would hold. Returns the ids to evict;
    only running requests can be evicted (the others hold nothing yet).
    """

    def evict(self, holders: np.ndarray, held_after: np.ndarray, kv_capacity: int,
              rng: np.random.Generator, n_running: int) -> np.ndarray: ...


class Policy(Protocol):
    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch: ...
