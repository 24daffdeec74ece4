"""Overflow rules the engine applies for a policy when a batch exceeds the KV capacity.

Each rule is configured in the policy's yaml (``overflow: {_target_: ...}``). After the
rule's evictions the engine charges the failed attempt the predicted time of the batch that
could not run and asks the policy again (docs/model.md, overflow). Each rule's choice is
one compiled function (:data:`~replay.engine.state.EVICT`): ``holders`` are the running
requests in start order, then the ones the batch starts; ``held after`` is what each would
hold after the iteration; only running requests can be evicted (the others hold nothing
yet). A rule written in Python instead has ``evict(holders, held_after, kv_capacity, rng,
n_running) -> ids`` and runs through the engine's bridge.
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.engine.jit import jit
from replay.engine.rules import CompiledOverflow
from replay.engine.state import new_rule_state
from replay.errors import ConfigError


@jit
def _clear_all(s, rule, n_holders, n_running):
    victims, holders = s.preempt, s.scratch
    for k in range(n_running):
        victims[k] = holders[k]
    return n_running


class ClearAll(CompiledOverflow):
    """Clear every running holder (alpha-protection greedy)."""

    evict_victims = _clear_all


@jit
def _clear_each_with_prob(s, rule, n_holders, n_running):
    # One draw per holder (admissions included, which cannot be evicted), so the random
    # stream does not depend on how many of the batch were running.
    beta, rng = rule.floats[0], s.overflow_rng
    victims, holders = s.preempt, s.scratch
    n = 0
    for k in range(n_holders):
        draw = rng.random()
        if k < n_running and draw < beta:
            victims[n] = holders[k]
            n += 1
    return n


@dataclass(frozen=True)
class ClearEachWithProb(CompiledOverflow):
    """Clear each running holder independently with probability ``beta`` (alpha/beta-clearing).

    The remaining set may still exceed the capacity; the next attempt then fails again and
    another pass is made (docs/policies/lookahead.md).
    """

    beta: float

    evict_victims = _clear_each_with_prob

    def __post_init__(self) -> None:
        if not 0.0 < self.beta <= 1.0:
            raise ConfigError(f"overflow.beta must be in (0, 1], got {self.beta}")

    def rule_state(self):
        return new_rule_state(floats=[self.beta])


@jit
def _evict_lifo(s, rule, n_holders, n_running):
    # The latest started running requests until the rest fits: the shortest such suffix.
    victims, holders, held_after = s.preempt, s.scratch, s.scratch3
    total = 0
    for k in range(n_holders):
        total += held_after[k]
    excess = total - s.capacity
    if excess <= 0 or n_running == 0:
        return 0
    freed = 0
    n = 0
    for k in range(n_running - 1, -1, -1):
        freed += held_after[k]
        victims[n] = holders[k]
        n += 1
        if freed >= excess:
            break
    return n


class EvictLIFO(CompiledOverflow):
    """Evict the most recently started running requests until the batch fits.

    Requests the batch itself would start hold no KV yet and are never victims (evicting them
    would free nothing and the same batch would be retried); if evicting every running
    request is not enough, all are evicted.
    """

    evict_victims = _evict_lifo
