"""Block (paged-attention) accounting shared by the serving-style policies.

The engine counts KV in whole blocks when ``kv.block_size > 1``: a request
holding ``h`` slots occupies ``ceil(h / block_size)`` blocks, and an iteration
runs only if the blocks held after it fit in ``M / block_size``. The vLLM-like
and Sarathi-like policies plan with the same arithmetic, so their batches never
trip the engine's overflow check.
"""

from __future__ import annotations

import numpy as np


def blocks(tokens, block_size: int):
    """Blocks needed to hold ``tokens`` slots (elementwise)."""
    return -(-np.asarray(tokens) // block_size)


def preempt_latest_until_fit(ids: np.ndarray, blocks_after: np.ndarray,
                             capacity_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Preempt the latest arrivals among ``ids`` until the rest's ``blocks_after`` fit.

    vLLM's FCFS priority: the request that arrived last (largest engine id) is
    preempted first. Returns ``(kept, preempted)``, each in ascending id.
    """
    excess = int(blocks_after.sum()) - capacity_blocks
    order = np.argsort(ids, kind="stable")
    if excess <= 0:
        return ids[order], ids[:0]
    latest_first = order[::-1]
    freed = np.cumsum(blocks_after[latest_first])
    count = int(np.searchsorted(freed, excess, side="left")) + 1
    victims = latest_first[:count]
    return np.sort(ids[latest_first[count:]]), np.sort(ids[victims])
