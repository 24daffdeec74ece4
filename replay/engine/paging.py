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
    """Blocks needed to hold ``tokens`` >= 0 slots (elementwise; a Python int for a Python
    int)."""
    if not isinstance(tokens, int):
        tokens = np.asarray(tokens)
    return (tokens + (block_size - 1)) // block_size


class BlockGrowth:
    """Blocks that requests holding ``held`` slots gain in total once each holds ``j`` slots
    more: ``sum(blocks(held + j) - blocks(held))``, for an array of ``j`` at once.

    A request gains ``j // block_size`` blocks, plus one if its last block has fewer than
    ``j % block_size`` slots free; so a count of requests by free slots answers any ``j``.
    """

    def __init__(self, held: np.ndarray, block_size: int) -> None:
        self.requests, self.block_size = held.size, block_size
        if held.size == 1:  # a lone request (a common stretch): its own blocks directly
            self.lone = int(held[0])
            return
        self.lone = None
        used = np.bincount((held - 1) % block_size, minlength=block_size)  # slots used - 1
        # fuller[m]: requests with fewer than m free slots in their last block.
        self.fuller = np.concatenate(([0], np.cumsum(used[::-1])[:-1]))

    def __call__(self, j: np.ndarray) -> np.ndarray:
        if self.lone is not None:
            return blocks(self.lone + j, self.block_size) - blocks(self.lone, self.block_size)
        return self.requests * (j // self.block_size) + self.fuller[j % self.block_size]


