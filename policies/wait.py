"""WAIT: threshold batching for known types (POLICIES.md §6; the WAIT paper's Algorithm 1).

A request's stage is the number of iterations it has had (0 = waiting to start).
A batch forms only when some type ``j`` has at least ``n_j`` requests at stage 0;
for every such type it takes the ``min(n_j, count)`` oldest requests at every
stage ``0..o_j - 1``. Everything else pauses with its KV kept. With no type at
its threshold the policy waits (the engine moves the clock to the next arrival).

Deviations, as the spec allows and documents:

* drain rule: once no arrival is left every type qualifies (per-stage caps stay
  ``n_j``), so the backlog finishes; the paper's loop never ends;
* ``max_wait`` (seconds or rounds, optional): a type also qualifies when its
  oldest unfinished request arrived more than ``max_wait`` ago. Checked at
  decision times (arrivals and iteration ends).

Thresholds (``thresholds=``): ``fluid`` (default; the authors' code and the fluid
equilibrium's per-stage count for a batch of about ``batch_limit`` requests),
``paper_printed`` (the formula in the paper's experiments section, which starves
long types) or ``condition_11`` (the smallest rate-proportional thresholds meeting
the paper's condition (11) for the linear coefficients ``d0 .. d4``); see
:func:`replay.fluid.model.wait_thresholds`. ``n`` gives them directly instead.
Overflow (a batch over ``M``) is handled by the engine's rule, ``evict_lifo`` by
default; evicted requests restart at stage 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.common.staging import first_per_group, running_by_id
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, PolicyView, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, condition_11, wait_thresholds
from replay.params import RequestType, check

#: The rule's record: ``ints`` = [stage-key multiplier, whether every request of the run has
#: one of the policy's types, length of the kept running set, then the per-type
#: thresholds]; ``floats`` = [whether there is a max_wait, max_wait]; ``ids``: the running
#: set in id order; ``counts``: waiting requests per type (kept when every request is
#: typed); ``marks``: scratch.
MULTIPLIER, ALL_TYPED, BY_ID, THRESHOLDS = 0, 1, 2, 3
#: Error code: a request whose type is not one of the policy's (``error_arg``: its id).
UNTYPED = 1


@jit
def _ranked_advance(s, rule, ready, running, n_run):
    """The first ``n_type`` at each stage key (type, generated) of the ready types, ranked by
    a stable sort: for stage keys beyond the per-key table of :func:`wait_decide`."""
    type_id, generated, per_stage = s.type_id, s.generated, rule.ints[THRESHOLDS:]
    active, keys = s.scratch, s.scratch2
    n_active = np.int64(0)
    for k in range(n_run):
        if ready[type_id[running[k]]]:
            active[n_active] = running[k]
            n_active += 1
    limits = np.empty(n_active, dtype=np.int64)
    for k in range(n_active):
        rid = active[k]
        keys[k] = type_id[rid] * rule.ints[MULTIPLIER] + generated[rid]
        limits[k] = per_stage[type_id[rid]]
    keep = rule.marks
    first_per_group(keys, limits, n_active, keep)
    n_advance = 0
    for k in range(n_active):
        if keep[k]:
            s.advance[n_advance] = active[k]
            n_advance += 1
    return n_advance


@jit
def wait_decide(s, rule):
    """A batch forms only when some type ``j`` has at least ``n_j`` requests waiting (stage 0);
    for every such type it starts the ``min(n_j, count)`` oldest waiting and advances the
    ``n_j`` oldest at every stage; everything else pauses (see the module docstring)."""
    params, type_id, queue, head, tail = rule.ints, s.type_id, s.queue, s.qhead, s.qtail
    per_stage = params[THRESHOLDS:]
    types = per_stage.size
    running = rule.ids
    n_run = running_by_id(s, running, params[BY_ID])
    params[BY_ID] = n_run
    count = rule.counts
    if params[ALL_TYPED]:  # the waiting requests per type, kept as they join and start
        for i in range(s.n_joined):
            count[type_id[s.joined[i]]] += 1
        for i in range(s.n_started):
            count[type_id[s.started[i]]] -= 1
    else:
        for q in range(head, tail):
            if type_id[queue[q]] < 0 or type_id[queue[q]] >= types:
                s.error_arg = queue[q]
                return UNTYPED
        for k in range(n_run):
            if type_id[running[k]] < 0 or type_id[running[k]] >= types:
                s.error_arg = running[k]
                return UNTYPED
        count = np.zeros(types, dtype=np.int64)  # requests at stage 0 per type
        for q in range(head, tail):
            count[type_id[queue[q]]] += 1
    ready = count >= per_stage
    if s.next_arrival == np.inf:  # drain rule: no arrival is left, every type qualifies
        ready[:] = True
    elif rule.floats[0] != 0.0:
        cutoff = s.now - rule.floats[1]
        arrival = s.arrival
        for q in range(head, tail):
            if arrival[queue[q]] < cutoff:
                ready[type_id[queue[q]]] = True
        for k in range(n_run):
            if arrival[running[k]] < cutoff:
                ready[type_id[running[k]]] = True
    s.n_advance = 0
    if not ready.any():
        return 0
    wanted = 0  # what the scan below finds: it stops there instead of at the queue's end
    for t in range(types):
        if ready[t]:
            wanted += min(per_stage[t], count[t])
    taken = np.zeros(types, dtype=np.int64)
    n_start = 0
    for q in range(head, tail):
        if n_start == wanted:
            break
        rid = queue[q]
        t = type_id[rid]
        if ready[t] and taken[t] < per_stage[t]:
            taken[t] += 1
            s.start[n_start] = rid
            n_start += 1
    s.n_start = n_start
    # The first per_stage[type] of each stage key (type, generated), oldest first, of the
    # ready types: counted per key in one pass while the keys stay in the table, else ranked
    # by a stable sort.
    generated = s.generated
    size = types * params[MULTIPLIER]
    counted = np.zeros(size, dtype=np.int64)
    n_advance = 0
    for k in range(n_run):
        rid = running[k]
        t = type_id[rid]
        if not ready[t]:
            continue
        key = t * params[MULTIPLIER] + generated[rid]
        if key >= size:  # a request beyond its type's output length (no type of the run has it)
            s.n_advance = _ranked_advance(s, rule, ready, running, n_run)
            return 0
        if counted[key] < per_stage[t]:
            s.advance[n_advance] = rid
            n_advance += 1
        counted[key] += 1
    s.n_advance = n_advance
    return 0


@dataclass
class Wait(CompiledPolicy):
    overflow: OverflowRule
    types: Sequence[RequestType] | None
    thresholds: str = "fluid"
    batch_limit: float | None = field(default=512, metadata=check(gt=0))
    n: Sequence[int] | None = field(default=None, metadata=check(ge=1))
    max_wait: float | None = field(default=None, metadata=check(gt=0))
    d0: float | None = field(default=None, metadata=check(ge=0))
    d1: float | None = field(default=None, metadata=check(ge=0))
    d2: float = field(default=0.0, metadata=check(ge=0))
    d3: float = field(default=0.0, metadata=check(ge=0))
    d4: float = field(default=0.0, metadata=check(ge=0))
    per_stage: np.ndarray = field(init=False, repr=False)

    decision = wait_decide

    def __post_init__(self) -> None:
        if not self.types:
            raise ConfigError("policy=wait needs the request types: use a typed workload "
                              "(workload=typed arrivals=trace, or a B experiment)")
        mix = TypeMix.from_types(list(self.types))
        if self.n is not None:
            n = np.asarray(list(self.n), dtype=np.int64)
            if n.size != mix.rate.size or np.any(n < 1):
                raise ConfigError(f"policy.n must give one threshold >= 1 per type "
                                  f"({mix.rate.size}), got {list(self.n)}")
        else:
            n = wait_thresholds(mix, self.thresholds, self.batch_limit, self.d0, self.d1,
                                self.d2, d3=self.d3, d4=self.d4)
            if n is None:
                raise ConfigError(f"policy.thresholds={self.thresholds}: no thresholds meet "
                                  f"condition (11): the load d1 W + d2 P + d3 D + d4 R is >= 1 "
                                  f"(unstable)")
        if self.max_wait is not None and not self.max_wait > 0:
            raise ConfigError(f"policy.max_wait must be > 0 or null, got {self.max_wait}")
        self.per_stage = n
        self.mix, self.output_len = mix, mix.output_len

    def describe(self) -> dict:
        return {"thresholds": self.per_stage.tolist(), "rule": "given" if self.n is not None
                else self.thresholds, "batch_limit": self.batch_limit,
                **condition_11(self.mix, self.per_stage, self.d0 or 0.0, self.d1 or 0.0,
                               self.d2, d3=self.d3, d4=self.d4)}

    def rule_state(self, setup: RunSetup):
        types = self.per_stage.size
        type_id = setup.type_id
        all_typed = bool(np.all((type_id >= 0) & (type_id < types)))
        return new_rule_state(
            ints=np.concatenate(([int(self.output_len.max() + 1), int(all_typed), 0],
                                 self.per_stage)),
            floats=[1.0, self.max_wait] if self.max_wait is not None else [0.0, 0.0],
            ids=np.zeros(setup.n, dtype=np.int64), marks=np.zeros(setup.n, dtype=np.bool_),
            counts=np.zeros(types, dtype=np.int64))

    def decision_error(self, code: int, arg: int, view: PolicyView) -> Exception:
        return ConfigError(f"policy=wait needs requests typed 0..{self.per_stage.size - 1} "
                           f"(workload=typed with the same types as policy.types)")
