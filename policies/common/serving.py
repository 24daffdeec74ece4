"""What the serving-style policies (vLLM-like, Sarathi-like) share: vLLM's preemption order
and the checks of their limits.
"""

from __future__ import annotations

import numpy as np

from replay.errors import ConfigError


def preempt_latest_until_fit(ids: np.ndarray, blocks_after: np.ndarray,
                             capacity_blocks: int) -> np.ndarray | None:
    """Which of ``ids`` to keep so that their ``blocks_after`` fit ``capacity_blocks``.

    vLLM's FCFS priority: the request that arrived last (largest engine id) is
    preempted first. Returns a boolean mask over ``ids`` (True = kept), or ``None``
    when they all fit (most steps: the callers then skip every masking).
    """
    excess = int(blocks_after.sum()) - capacity_blocks
    if excess <= 0:
        return None
    keep = np.ones(ids.size, dtype=bool)
    latest_first = np.argsort(ids, kind="stable")[::-1]
    freed = np.cumsum(blocks_after[latest_first])
    keep[latest_first[: int(np.searchsorted(freed, excess, side="left")) + 1]] = False
    return keep


def check_serving_limits(**limits) -> None:
    """Reject a serving policy's limits: counts (``max_num_seqs``, token budgets) must be
    >= 1 and ``watermark`` a fraction in [0, 1); each named by its ``policy.`` key."""
    for key, value in limits.items():
        ok = 0.0 <= value < 1.0 if key == "watermark" else value >= 1
        if not ok:
            allowed = "in [0, 1)" if key == "watermark" else ">= 1"
            raise ConfigError(f"policy.{key} must be {allowed}, got {value}")
