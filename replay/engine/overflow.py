"""Overflow rules the engine applies for a policy when a batch exceeds the KV capacity.

Each rule is configured in the policy's yaml (``overflow: {_target_: ...}``).
After the rule's evictions the engine charges the failed attempt the predicted
time of the batch that could not run and asks the policy again (MODEL.md §3.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.errors import ConfigError


class ClearAll:
    """Clear every holder (alpha-protection greedy)."""

    def evict(self, holders, held_after, kv_capacity, rng, n_running) -> np.ndarray:
        return holders[:n_running]


@dataclass(frozen=True)
class ClearEachWithProb:
    """Clear each holder independently with probability ``beta`` (alpha/beta-clearing).

    The remaining set may still exceed the capacity; the next attempt then
    fails again and another pass is made, as POLICIES.md §3 prescribes.
    """

    beta: float

    def __post_init__(self) -> None:
        if not 0.0 < self.beta <= 1.0:
            raise ConfigError(f"overflow.beta must be in (0, 1], got {self.beta}")

    def evict(self, holders, held_after, kv_capacity, rng, n_running) -> np.ndarray:
        # One draw per holder (starts included, which the engine cannot evict), so the
        # random stream does not depend on how many of the batch were running.
        return holders[:n_running][rng.random(holders.size)[:n_running] < self.beta]


def _evict_in_order(order: np.ndarray, holders, held_after, kv_capacity) -> np.ndarray:
    """Evict holders in ``order`` until the rest fits: the shortest such prefix."""
    excess = int(held_after.sum()) - kv_capacity
    if excess <= 0 or order.size == 0:
        return holders[:0]
    freed = np.cumsum(held_after[order])
    count = int(np.searchsorted(freed, excess, side="left")) + 1
    return holders[order[:count]]


class EvictLIFO:
    """Evict the most recently started running requests until the batch fits.

    Requests the batch itself would start hold no KV yet and are never victims
    (evicting them would free nothing and the same batch would be retried); if
    evicting every running request is not enough, all are evicted.
    """

    def evict(self, holders, held_after, kv_capacity, rng, n_running) -> np.ndarray:
        return _evict_in_order(np.arange(n_running)[::-1], holders, held_after, kv_capacity)
