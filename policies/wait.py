"""WAIT: threshold batching for known types (docs/policies/wait.md; the WAIT paper's Algorithm 1).

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

Thresholds (``thresholds=``): ``fluid`` (default; the fluid equilibrium's per-stage
count for a batch of about ``batch_limit`` requests), ``paper_printed`` (the formula in
the paper's experiments section, which starves long types), ``condition_11`` (the
smallest rate-proportional thresholds meeting the paper's condition (11) for the linear
coefficients ``d0 .. d4``; see :func:`replay.fluid.model.wait_thresholds`) or ``authors``
(the WAIT authors' own, :func:`authors_limits`). ``n`` gives them directly instead.
Overflow (a batch over ``M``) is handled by the engine's rule, ``evict_lifo`` by
default; evicted requests restart at stage 0.

**The authors' variant.** The WAIT authors' scheduler (``modified_booking_limit`` in
their Vidur fork, Luoxiaogan/vidur_or at commit 1fe368d) differs from the paper's rule
in three ways, each an option here (all three and ``thresholds: authors`` make their
variant, ``paper_policy=wait_authors``):

* ``in_flight_limit: per_type``: type ``j`` owns ``L_j = B lambda_j (o_j + 1) /
  sum_k lambda_k (o_k + 1)`` of the batch limit. Its admissions are capped at
  ``min(n_j, room_j)``, ``room_j = trunc(L_j - in flight_j)`` (none when that is <= 0),
  and its requests in flight have no per-stage cap: they all run.
* ``readiness: any_type``: a batch forms once *some* type is ready, and then every type
  admits (with ``per_type``, type ``j`` is ready when ``min(n_j, room_j)`` of its requests
  wait, so no room counts as ready). With ``own_type`` (the paper's) only the ready types
  take part.
* ``force_clear``: no drain rule. After the last arrival batches form by the same rule,
  and once no type is ready every unfinished request, waiting or in flight, is dropped
  (it frees its KV and never completes) and the run ends. Their code clears whether or
  not its own ``force_clear`` flag is set; here the option decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.staging import drop_unfinished, first_per_group, running_by_id
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, PolicyView, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.fluid.model import THRESHOLD_RULES, TypeMix, condition_11, wait_thresholds
from replay.params import RequestType, check

#: The rule's record: ``ints`` = [stage-key multiplier, whether every request of the run has
#: one of the policy's types, length of the kept running set, in_flight_limit is per_type,
#: readiness is any_type, force_clear, then the per-type thresholds]; ``floats`` =
#: [whether there is a max_wait, max_wait, then the per-type in-flight limits ``L_j``];
#: ``ids``: the running set in id order; ``counts``: waiting requests per type (kept when
#: every request is typed); ``marks``: scratch.
MULTIPLIER, ALL_TYPED, BY_ID, PER_TYPE, ANY_TYPE, FORCE_CLEAR, THRESHOLDS = range(7)
LIMITS = 2
#: Error code: a request whose type is not one of the policy's (``error_arg``: its id).
UNTYPED = 1


def authors_limits(mix: TypeMix, batch_limit: float) -> tuple[np.ndarray, np.ndarray]:
    """The WAIT authors' per-type in-flight limits ``L_j`` and thresholds ``n_j``
    (``calculate_booking_limits`` and the per-stage limit of their scheduler):
    ``L_j = B w_j / sum_k w_k`` with ``w_j = lambda_j (o_j + 1)``, and ``n_j = trunc(max(L_j
    / (o_j + 1), 1))``. Computed with their operations in their order (Python floats,
    summed left to right), so that a truncation lands where theirs does."""
    weights = [float(rate) * (float(o) + 1) for rate, o in zip(mix.rate, mix.output_len,
                                                                strict=True)]
    total = sum(weights)
    limits = [(w / total) * float(batch_limit) for w in weights]
    thresholds = [int(max(limit / (float(o) + 1), 1))
                  for limit, o in zip(limits, mix.output_len, strict=True)]
    return np.array(limits, dtype=np.float64), np.array(thresholds, dtype=np.int64)


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
    multiplier = rule.ints[MULTIPLIER]
    for k in range(n_active):
        rid = active[k]
        keys[k] = type_id[rid] * multiplier + generated[rid]
        limits[k] = per_stage[type_id[rid]]
    keep = rule.marks
    first_per_group(keys, limits, n_active, keep)
    n_advance = 0
    advance = s.advance
    for k in range(n_active):
        if keep[k]:
            advance[n_advance] = active[k]
            n_advance += 1
    return n_advance


@jit
def _admission_caps(s, rule, running, n_run):
    """Per type, how many waiting requests make it ready and how many it may admit: ``n_j``
    for both, or with per-type in-flight limits ``min(n_j, room_j)`` and that at least 0."""
    params, type_id = rule.ints, s.type_id
    per_stage = params[THRESHOLDS:]
    need = per_stage.copy()
    take = per_stage.copy()
    if params[PER_TYPE]:
        in_flight = np.zeros(per_stage.size, dtype=np.int64)
        for k in range(n_run):
            in_flight[type_id[running[k]]] += 1
        limits = rule.floats[LIMITS:]
        for t in range(per_stage.size):
            need[t] = min(per_stage[t], int(limits[t] - in_flight[t]))  # truncated, as theirs
            take[t] = max(need[t], 0)
    return need, take


@jit
def wait_decide(s, rule):
    """A batch forms only when some type ``j`` has at least ``n_j`` requests waiting (stage 0);
    for every such type it starts the ``min(n_j, count)`` oldest waiting and advances the
    ``n_j`` oldest at every stage; everything else pauses (see the module docstring for the
    drain rule and the authors' options)."""
    params, type_id, queue, head, tail = rule.ints, s.type_id, s.queue, s.qhead, s.qtail
    per_stage = params[THRESHOLDS:]
    types = per_stage.size
    running = rule.ids
    n_run = running_by_id(s, running, params[BY_ID])
    params[BY_ID] = n_run
    count = rule.counts
    if params[ALL_TYPED]:  # the waiting requests per type, kept as they join and start
        joined, started = s.joined, s.started
        for i in range(s.n_joined):
            count[type_id[joined[i]]] += 1
        for i in range(s.n_started):
            count[type_id[started[i]]] -= 1
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
    need, take = _admission_caps(s, rule, running, n_run)
    ready = count >= need
    if s.next_arrival == np.inf:  # no arrival is left
        if not params[FORCE_CLEAR]:  # drain rule: every type qualifies
            ready[:] = True
        elif not ready.any():  # the authors' force_clear: drop what is left, the run ends
            drop_unfinished(s, running, n_run)
            rule.counts[:] = 0
            return 0
    elif rule.floats[0] != 0.0:
        cutoff = s.now - rule.floats[1]
        arrival = s.arrival
        for q in range(head, tail):
            if arrival[queue[q]] < cutoff:
                ready[type_id[queue[q]]] = True
        for k in range(n_run):
            if arrival[running[k]] < cutoff:
                ready[type_id[running[k]]] = True
    if params[ANY_TYPE] and ready.any():
        ready[:] = True
    s.n_advance = 0
    if not ready.any():
        return 0
    wanted = 0  # what the scan below finds: it stops there instead of at the queue's end
    for t in range(types):
        if ready[t]:
            wanted += min(take[t], count[t])
    taken = np.zeros(types, dtype=np.int64)
    n_start = 0
    start, advance = s.start, s.advance
    for q in range(head, tail):
        if n_start == wanted:
            break
        rid = queue[q]
        t = type_id[rid]
        if ready[t] and taken[t] < take[t]:
            taken[t] += 1
            start[n_start] = rid
            n_start += 1
    s.n_start = n_start
    if params[PER_TYPE]:  # no per-stage cap: every request in flight of a ready type runs
        if ready.all():
            s.n_advance = -1
            return 0
        n_advance = 0
        for k in range(n_run):
            if ready[type_id[running[k]]]:
                advance[n_advance] = running[k]
                n_advance += 1
        s.n_advance = n_advance
        return 0
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
            advance[n_advance] = rid
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
    in_flight_limit: Literal["per_stage", "per_type"] = "per_stage"
    readiness: Literal["own_type", "any_type"] = "own_type"
    force_clear: bool = False
    per_stage: np.ndarray = field(init=False, repr=False)
    in_flight_limits: np.ndarray | None = field(init=False, repr=False, default=None)

    decision = wait_decide

    def __post_init__(self) -> None:
        if not self.types:
            raise ConfigError("policy=wait needs the request types: use a typed workload "
                              "(workload=typed arrivals=trace, or a B experiment)")
        rules = (*THRESHOLD_RULES, "authors")
        if self.thresholds not in rules:
            raise ConfigError(f"policy.thresholds must be one of {rules}, got "
                              f"{self.thresholds!r}")
        mix = TypeMix.from_types(list(self.types))
        uses_limits = self.in_flight_limit == "per_type" or (
            self.thresholds == "authors" and self.n is None)
        if uses_limits and self.batch_limit is None:
            raise ConfigError("policy.batch_limit (B) is needed for in_flight_limit=per_type "
                              "and thresholds=authors")
        limits, authors_n = authors_limits(mix, self.batch_limit) if uses_limits else (None,
                                                                                       None)
        if self.n is not None:
            n = np.asarray(list(self.n), dtype=np.int64)
            if n.size != mix.rate.size or np.any(n < 1):
                raise ConfigError(f"policy.n must give one threshold >= 1 per type "
                                  f"({mix.rate.size}), got {list(self.n)}")
        elif self.thresholds == "authors":
            n = authors_n
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
        self.in_flight_limits = limits if self.in_flight_limit == "per_type" else None
        self.mix, self.output_len = mix, mix.output_len

    def describe(self) -> dict:
        info = {"thresholds": self.per_stage.tolist(), "rule": "given" if self.n is not None
                else self.thresholds, "batch_limit": self.batch_limit,
                "in_flight_limit": self.in_flight_limit, "readiness": self.readiness,
                "force_clear": self.force_clear}
        if self.in_flight_limits is not None:
            info["in_flight_limits"] = self.in_flight_limits.tolist()
        return {**info, **condition_11(self.mix, self.per_stage, self.d0 or 0.0,
                                       self.d1 or 0.0, self.d2, d3=self.d3, d4=self.d4)}

    def rule_state(self, setup: RunSetup):
        types = self.per_stage.size
        type_id = setup.type_id
        all_typed = bool(np.all((type_id >= 0) & (type_id < types)))
        flags = [int(self.in_flight_limit == "per_type"), int(self.readiness == "any_type"),
                 int(self.force_clear)]
        limits = self.in_flight_limits if self.in_flight_limits is not None else []
        return new_rule_state(
            ints=np.concatenate(([int(self.output_len.max() + 1), int(all_typed), 0, *flags],
                                 self.per_stage)),
            floats=np.concatenate(([1.0, self.max_wait] if self.max_wait is not None
                                   else [0.0, 0.0], limits)),
            ids=np.zeros(setup.n, dtype=np.int64), marks=np.zeros(setup.n, dtype=np.bool_),
            counts=np.zeros(types, dtype=np.int64))

    def decision_error(self, code: int, arg: int, view: PolicyView) -> Exception:
        return ConfigError(f"policy=wait needs requests typed 0..{self.per_stage.size - 1} "
                           f"(workload=typed with the same types as policy.types)")
