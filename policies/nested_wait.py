"""Nested WAIT: segment thresholds for unknown output lengths (POLICIES.md §7, Algorithm 2).

Output lengths are not used: only a request's stage (iterations it has had) is
observed. Segment ``i`` holds stages ``b_{i-1} <= k < b_i`` (``b_0 = 0``; the last
segment is open-ended; boundary stages follow Algorithm 2, not the text's
``ceil(k / 50)``). Its entry queue is the requests at stage exactly ``b_{i-1}``
(segment 1: the waiting requests). The batch is formed from segments ``1..k``
for the largest ``k`` whose entry queues all reach their thresholds, taking the
``min(n_i, count)`` oldest requests at every stage of segment ``i``; later
segments pause with their KV kept. With ``k = 0`` the policy waits.

Thresholds: ``n`` directly, ``ratios`` scaled so that a full iteration holds about
``batch_limit`` requests (``n_i = ceil(c r_i (1 + epsilon)^(i-1))``,
``c = B / sum_i (b_i - b_{i-1}) r_i``), or ``ratios: null`` to generate them from
the typed workload's rates (``r_i = S_i``, the rate of the types reaching segment
``i``; the paper's ratios are exactly these tail sums). The last, open segment
counts ``max output - b_{K-1}`` stages (``max_stage``). :meth:`describe` reports
whether condition (12) holds strictly.

Same drain rule, ``max_wait`` and overflow rule (``evict_lifo``) as WAIT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.common.staging import running_by_id
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.sorting import search_left
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, condition_12, scale_thresholds, segment_edges, segment_tails
from replay.params import RequestType, check

#: The rule's record: ``ints`` = [length of the kept running set, segments ``K``, the ``K``
#: thresholds, the ``K - 1`` inner stage boundaries]; ``floats`` = [whether there is a
#: max_wait, max_wait]; ``ids``: the running set in id order.
BY_ID, SEGMENTS, THRESHOLDS = 0, 1, 2


@jit
def nested_wait_decide(s, rule):
    """Form the batch from segments ``1..k`` for the largest ``k`` whose entry queues all reach
    their thresholds, taking the ``n_i`` oldest at every stage of segment ``i`` (see the
    module docstring)."""
    params = rule.ints
    segments = params[SEGMENTS]
    per_stage = params[THRESHOLDS:THRESHOLDS + segments]
    inner = params[THRESHOLDS + segments:]
    running = rule.ids
    n_run = running_by_id(s, running, params[BY_ID])
    params[BY_ID] = n_run
    generated, queue, head, tail = s.generated, s.queue, s.qhead, s.qtail
    entry = np.zeros(segments, dtype=np.int64)
    entry[0] = tail - head
    segment = s.scratch
    top = 0
    for k in range(n_run):
        stage = generated[running[k]]
        top = max(top, stage)
        p = search_left(inner, stage)
        at_entry = inner.size > 0 and inner[min(p, inner.size - 1)] == stage
        if at_entry:
            entry[1 + p] += 1
        segment[k] = p + (1 if at_entry else 0)
    open_segments = segments
    for i in range(segments):
        if entry[i] < per_stage[i]:
            open_segments = i
            break
    if s.next_arrival == np.inf:  # drain rule: no arrival is left, every segment opens
        open_segments = segments
    elif rule.floats[0] != 0.0:
        cutoff = s.now - rule.floats[1]
        late = tail > head and s.arrival[queue[head]] < cutoff
        for k in range(n_run):
            if s.arrival[running[k]] < cutoff:
                late = True
        if late:
            open_segments = segments
    s.n_advance = 0
    if open_segments == 0:
        return 0
    # The first per_stage[segment] at each stage of the open segments, oldest first: a count
    # per stage, in one pass over the running set in id order.
    counted = np.zeros(top + 1, dtype=np.int64)
    n_advance = 0
    for k in range(n_run):
        if segment[k] >= open_segments:
            continue
        rid = running[k]
        stage = generated[rid]
        if counted[stage] < per_stage[segment[k]]:
            s.advance[n_advance] = rid
            n_advance += 1
        counted[stage] += 1
    s.n_advance = n_advance
    n_start = min(per_stage[0], tail - head)
    for k in range(n_start):
        s.start[k] = queue[head + k]
    s.n_start = n_start
    return 0


@dataclass
class NestedWait(CompiledPolicy):
    overflow: OverflowRule
    boundaries: Sequence[int] | None = field(default=None, metadata=check(ge=1))
    segment_width: int | None = field(default=None, metadata=check(ge=1))
    segments: int | None = field(default=None, metadata=check(ge=1))
    max_stage: int | None = field(default=None, metadata=check(ge=1))
    ratios: Sequence[float] | None = field(default=None, metadata=check(gt=0))
    types: Sequence[RequestType] | None = None
    batch_limit: float = field(default=512, metadata=check(gt=0))
    epsilon: float = field(default=0.0, metadata=check(ge=0))
    n: Sequence[int] | None = field(default=None, metadata=check(ge=1))
    max_wait: float | None = field(default=None, metadata=check(gt=0))

    decision = nested_wait_decide

    def __post_init__(self) -> None:
        if self.boundaries is None:
            if not self.segment_width or not self.segments:
                raise ConfigError("policy: give boundaries, or segment_width and segments")
            self.boundaries = [self.segment_width * i for i in range(1, self.segments)]
        mix = TypeMix.from_types(list(self.types)) if self.types else None
        last = self.max_stage or (int(mix.output_len.max()) if mix is not None else None)
        if last is None:
            raise ConfigError("policy.max_stage is needed (the open segment's length) when "
                              "the workload has no types")
        inner = list(self.boundaries)
        if any(b >= c for b, c in zip(inner, inner[1:], strict=False)):
            raise ConfigError(f"policy.boundaries={inner} must be strictly increasing")
        if self.max_stage is not None and inner and self.max_stage <= inner[-1]:
            raise ConfigError(f"policy.max_stage={self.max_stage} must exceed the last boundary "
                              f"{inner[-1]} (policy.boundaries); the open segment would be empty")
        self.edges = segment_edges(inner, last)
        self.tails = None if mix is None else segment_tails(mix, self.edges)
        if self.n is not None:
            n = np.asarray(list(self.n), dtype=np.int64)
        elif self.ratios is not None:
            n = scale_thresholds(list(self.ratios), self.edges, self.batch_limit, self.epsilon)
        elif self.tails is not None:
            if np.any(self.tails <= 0):
                raise ConfigError(f"policy: no type reaches some segment (tails "
                                  f"{self.tails.tolist()}); drop the empty segments")
            n = scale_thresholds(self.tails, self.edges, self.batch_limit, self.epsilon)
        else:
            raise ConfigError("policy: give n, ratios, or a typed workload to generate them")
        if n.size != self.edges.size - 1 or np.any(n < 1):
            raise ConfigError(f"policy: need one threshold >= 1 per segment "
                              f"({self.edges.size - 1}), got {n.tolist()}")
        if self.max_wait is not None and not self.max_wait > 0:
            raise ConfigError(f"policy.max_wait must be > 0 or null, got {self.max_wait}")
        self.per_stage = n

    def describe(self) -> dict:
        info = {"thresholds": self.per_stage.tolist(), "edges": self.edges.tolist()}
        if self.tails is not None:
            info["segment_tails"] = self.tails.tolist()
            info["condition_12"] = condition_12(self.per_stage, self.tails)
        return info

    def rule_state(self, setup: RunSetup):
        inner = np.asarray(self.edges[1:-1], dtype=np.int64)
        return new_rule_state(
            ints=np.concatenate(([0, self.per_stage.size], self.per_stage, inner)),
            floats=[1.0, self.max_wait] if self.max_wait is not None else [0.0, 0.0],
            ids=np.zeros(setup.n, dtype=np.int64))
