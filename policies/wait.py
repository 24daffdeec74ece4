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

from policies.common.staging import first_per_group
from replay.engine.policy import Batch, OverflowRule, PolicyView
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, condition_11, wait_thresholds
from replay.params import RequestType, check


@dataclass
class Wait:
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

    def decide(self, view: PolicyView) -> Batch:
        waiting, running = view.waiting, view.running
        types = self.per_stage.size
        wait_type, run_type = view.type_id[waiting], view.type_id[running]
        if (wait_type.size and (wait_type.min() < 0 or wait_type.max() >= types)) or (
                run_type.size and (run_type.min() < 0 or run_type.max() >= types)):
            raise ConfigError(f"policy=wait needs requests typed 0..{types - 1} (workload=typed "
                              f"with the same types as policy.types)")
        at_stage_zero = np.bincount(wait_type, minlength=types)
        ready = at_stage_zero >= self.per_stage
        if not view.more_arrivals:
            ready[:] = True
        elif self.max_wait is not None:
            cutoff = view.now - self.max_wait
            ready[np.unique(wait_type[view.arrival[waiting] < cutoff])] = True
            ready[np.unique(run_type[view.arrival[running] < cutoff])] = True
        if not ready.any():
            return Batch(advance=running[:0])
        start = waiting[ready[wait_type]]  # queue order: oldest first
        start = start[first_per_group(view.type_id[start], self.per_stage[view.type_id[start]])]
        active = np.sort(running[ready[run_type]])  # ids are arrival order: oldest first
        active_type = view.type_id[active]
        stage_key = active_type * int(self.output_len.max() + 1) + view.generated[active]
        keep = first_per_group(stage_key, self.per_stage[active_type])
        return Batch(start=start, advance=active[keep])
