"""Block (paged-attention) accounting: KV counted in whole blocks of ``kv.block_size`` slots.

The engine counts KV in whole blocks when ``kv.block_size > 1``: a request holding ``h``
slots occupies ``ceil(h / block_size)`` blocks, and an iteration runs only if the blocks held
after it fit in ``M / block_size``. The serving policies plan with the same function, so
their batches never trip the engine's overflow check.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from replay.engine.jit import jit


@intrinsic
def _trailing_zeros(typingctx, value):
    """The number of trailing zero bits of an int64 (one instruction)."""

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.int64(types.int64), codegen


@jit(inline="always")
def blocks(tokens, block):
    """Blocks needed to hold ``tokens >= 0`` slots: ``ceil(tokens / block)``. A block of a power
    of two slots (16, the usual one) divides by a shift: the step loop counts blocks for every
    batch member at every step, and an integer division by a value known only at run time
    was a sixth of an LMSYS crosscheck case's loop time."""
    if block & (block - 1) == 0:  # floor division by 2^k is an arithmetic right shift
        return (tokens + (block - 1)) >> _trailing_zeros(block)
    return (tokens + (block - 1)) // block
