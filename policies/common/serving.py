"""What the serving-style policies (vLLM-like, Sarathi-like) share: vLLM's preemption order
and the checks of their limits.
"""

from __future__ import annotations

from replay.engine.jit import jit
from replay.engine.sorting import stable_argsort
from replay.errors import ConfigError


@jit
def preempt_latest_until_fit(ids, blocks_after, n, capacity_blocks):
    """Which of ``ids[:n]`` to preempt so that the others' ``blocks_after`` fit
    ``capacity_blocks``, in vLLM's FCFS priority: the request that arrived last (largest
    engine id) goes first. Returns the smallest id preempted (every id at or above it goes),
    or -1 when they all fit (most steps)."""
    total = 0
    for k in range(n):
        total += blocks_after[k]
    excess = total - capacity_blocks
    if excess <= 0:
        return -1
    order = stable_argsort(ids, n)
    freed = 0
    for k in range(n - 1, -1, -1):
        freed += blocks_after[order[k]]
        if freed >= excess:
            return ids[order[k]]
    return ids[order[0]]


def check_serving_limits(**limits) -> None:
    """Reject a serving policy's limits: counts (``max_num_seqs``, token budgets) must be
    >= 1 and ``watermark`` a fraction in [0, 1); each named by its ``policy.`` key."""
    for key, value in limits.items():
        ok = 0.0 <= value < 1.0 if key == "watermark" else value >= 1
        if not ok:
            allowed = "in [0, 1)" if key == "watermark" else ">= 1"
            raise ConfigError(f"policy.{key} must be {allowed}, got {value}")
