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

from policies.common.staging import first_per_group
from replay.engine.policy import Batch, OverflowRule, PolicyView
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, condition_12, scale_thresholds, segment_edges, segment_tails
from replay.params import RequestType, check


@dataclass
class NestedWait:
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

    def decide(self, view: PolicyView) -> Batch:
        waiting, running = view.waiting, view.running
        stage = view.generated[running]
        inner = self.edges[1:-1]
        entry = np.empty(self.per_stage.size, dtype=np.int64)
        entry[0] = waiting.size
        position = np.searchsorted(inner, stage)
        at_entry = inner[np.minimum(position, inner.size - 1)] == stage if inner.size else stage < 0
        entry[1:] = np.bincount(position[at_entry], minlength=inner.size)
        meets = entry >= self.per_stage
        open_segments = int(np.argmin(meets)) if not meets.all() else meets.size
        if not view.more_arrivals or (
                self.max_wait is not None and (
                    (waiting.size and view.arrival[waiting[0]] < view.now - self.max_wait)
                    or (running.size and view.arrival[running].min() < view.now
                        - self.max_wait))):
            open_segments = meets.size
        if open_segments == 0:
            return Batch(advance=running[:0])
        segment = position + at_entry  # b_{i-1} <= stage < b_i
        active = running[segment < open_segments]
        by_age = np.argsort(active)  # ids are arrival order: oldest first
        active, active_segment = active[by_age], segment[segment < open_segments][by_age]
        keep = first_per_group(view.generated[active], self.per_stage[active_segment])
        return Batch(start=waiting[: self.per_stage[0]], advance=active[keep])
