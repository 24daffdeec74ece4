"""Nested WAIT: segment thresholds for unknown output lengths (docs/policies/wait.md, Algorithm 2).

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

**The authors' variant** (``general_nested_booking_limit`` in the WAIT authors' Vidur fork,
Luoxiaogan/vidur_or at commit 1fe368d; ``paper_policy=nested_authors``):

* ``thresholds: authors``: the segments come from the types' distinct output lengths
  ``d_1 < ... < d_K``: the first holds stages ``0..d_1`` (``1 + d_1`` stages, the prefill
  counted), segment ``i > 1`` the ``d_i - d_{i-1}`` stages after it. With ``S_i`` the total
  rate of the types whose output exceeds ``d_{i-1}`` (all of them for the first) and
  ``w_i = (stages of i) S_i``, ``n_i = trunc(max(B w_i / sum_k w_k / (stages of i), 1))``
  (:func:`authors_segments`). ``boundaries``, if given, must be these.
* ``force_clear``: no drain rule. After the last arrival each segment opens on its own when
  its entry queue reaches its threshold (before it, segments still open in order); once none
  does, every unfinished request is dropped and the run ends, as in WAIT's ``force_clear``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.staging import drop_unfinished, running_by_id
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.sorting import search_left
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, condition_12, scale_thresholds, segment_edges, segment_tails
from replay.params import RequestType, check

#: The rule's record: ``ints`` = [length of the kept running set, segments ``K``,
#: force_clear, the ``K`` thresholds, the ``K - 1`` inner stage boundaries]; ``floats`` =
#: [whether there is a max_wait, max_wait]; ``ids``: the running set in id order.
BY_ID, SEGMENTS, FORCE_CLEAR, THRESHOLDS = range(4)


def authors_segments(mix: TypeMix, batch_limit: float) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
    """The WAIT authors' Nested WAIT segments (``calculate_nested_booking_limits``): the
    segment edges ``[0, 1 + d_1, 1 + d_2, ..., 1 + d_K]`` from the distinct output lengths
    ``d_i``, the per-stage thresholds ``n_i`` and the segment weights ``w_i`` (see the module
    docstring), with their operations in their order (Python floats, left to right)."""
    distinct = sorted({int(o) for o in mix.output_len})
    rates = [float(r) for r in mix.rate]
    outputs = [int(o) for o in mix.output_len]
    stages = [1 + distinct[0]] + [b - a for a, b in zip(distinct, distinct[1:], strict=False)]
    tails = [sum(rates)] + [sum(r for r, o in zip(rates, outputs, strict=True) if o > d)
                            for d in distinct[:-1]]
    weights = [count * tail for count, tail in zip(stages, tails, strict=True)]
    total = sum(weights)
    n = [int(max(float(batch_limit) * (w / total) / count, 1))
         for w, count in zip(weights, stages, strict=True)]
    edges = np.concatenate(([0], np.cumsum(stages)))
    return edges.astype(np.int64), np.array(n, dtype=np.int64), np.array(weights)


@jit
def nested_wait_decide(s, rule):
    """Form the batch from segments ``1..k`` for the largest ``k`` whose entry queues all reach
    their thresholds, taking the ``n_i`` oldest at every stage of segment ``i`` (see the
    module docstring for the drain rule and ``force_clear``)."""
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
    is_open = np.zeros(segments, dtype=np.bool_)
    if s.next_arrival == np.inf and params[FORCE_CLEAR]:
        # the authors' rule after the last arrival: each segment on its own; none: clear
        for i in range(segments):
            is_open[i] = entry[i] >= per_stage[i]
        if not is_open.any():
            drop_unfinished(s, running, n_run)
            return 0
    elif s.next_arrival == np.inf:  # drain rule: no arrival is left, every segment opens
        is_open[:] = True
    else:
        late = False
        if rule.floats[0] != 0.0:
            cutoff = s.now - rule.floats[1]
            arrival = s.arrival
            late = tail > head and arrival[queue[head]] < cutoff
            for k in range(n_run):
                if arrival[running[k]] < cutoff:
                    late = True
        for i in range(segments):  # segments open in order
            if not (late or entry[i] >= per_stage[i]):
                break
            is_open[i] = True
    s.n_advance = 0
    if not is_open.any():
        return 0
    # The first per_stage[segment] at each stage of the open segments, oldest first: a count
    # per stage, in one pass over the running set in id order.
    counted = np.zeros(top + 1, dtype=np.int64)
    n_advance = 0
    advance = s.advance
    for k in range(n_run):
        if not is_open[segment[k]]:
            continue
        rid = running[k]
        stage = generated[rid]
        if counted[stage] < per_stage[segment[k]]:
            advance[n_advance] = rid
            n_advance += 1
        counted[stage] += 1
    s.n_advance = n_advance
    n_start = min(per_stage[0], tail - head) if is_open[0] else 0
    start = s.start
    for k in range(n_start):
        start[k] = queue[head + k]
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
    thresholds: Literal["scaled", "authors"] = "scaled"
    force_clear: bool = False

    decision = nested_wait_decide

    def __post_init__(self) -> None:
        mix = TypeMix.from_types(list(self.types)) if self.types else None
        self.weights = None
        if self.thresholds == "authors":
            edges, authors_n = self._authors_segments(mix)
        else:
            edges, authors_n = self._given_segments(mix), None
        self.edges = edges
        self.tails = None if mix is None else segment_tails(mix, self.edges)
        if self.n is not None:
            n = np.asarray(list(self.n), dtype=np.int64)
        elif authors_n is not None:
            n = authors_n
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

    def _given_segments(self, mix: TypeMix | None) -> np.ndarray:
        """The segment edges from ``boundaries`` (or ``segment_width`` and ``segments``) and
        the open segment's end (``max_stage``, or the longest output)."""
        if self.boundaries is None:
            if not self.segment_width or not self.segments:
                raise ConfigError("policy: give boundaries, or segment_width and segments")
            self.boundaries = [self.segment_width * i for i in range(1, self.segments)]
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
        return segment_edges(inner, last)

    def _authors_segments(self, mix: TypeMix | None) -> tuple[np.ndarray, np.ndarray]:
        """The authors' segments and thresholds from the types (:func:`authors_segments`); the
        keys that would set them otherwise must agree or be unset."""
        if mix is None:
            raise ConfigError("policy.thresholds=authors needs the request types (a typed "
                              "workload): the segments come from their output lengths")
        for key in ("ratios", "max_stage"):
            if getattr(self, key) is not None:
                raise ConfigError(f"policy.{key} must be null with thresholds=authors (the "
                                  f"segments and thresholds come from the types)")
        if self.epsilon:
            raise ConfigError(f"policy.epsilon={self.epsilon} must be 0 with "
                              f"thresholds=authors (their thresholds have no margin)")
        edges, n, self.weights = authors_segments(mix, self.batch_limit)
        inner = edges[1:-1].tolist()
        if self.boundaries is not None and list(self.boundaries) != inner:
            raise ConfigError(f"policy.boundaries={list(self.boundaries)} differ from the "
                              f"authors' segments for these types, which start at stages "
                              f"{inner} (thresholds=authors); set them to null or to those")
        self.boundaries = inner
        return edges, n

    def describe(self) -> dict:
        info = {"thresholds": self.per_stage.tolist(), "edges": self.edges.tolist(),
                "rule": "given" if self.n is not None else self.thresholds,
                "force_clear": self.force_clear}
        if self.weights is not None:
            info["segment_weights"] = self.weights.tolist()
        if self.tails is not None:
            info["segment_tails"] = self.tails.tolist()
            info["condition_12"] = condition_12(self.per_stage, self.tails)
        return info

    def rule_state(self, setup: RunSetup):
        inner = np.asarray(self.edges[1:-1], dtype=np.int64)
        return new_rule_state(
            ints=np.concatenate(([0, self.per_stage.size, int(self.force_clear)],
                                 self.per_stage, inner)),
            floats=[1.0, self.max_wait] if self.max_wait is not None else [0.0, 0.0],
            ids=np.zeros(setup.n, dtype=np.int64))
