"""vLLM-like: prefill-prioritising, non-clairvoyant (POLICIES.md §4).

Modelled on vLLM's v0 scheduler (and Vidur's ``vllm`` replica scheduler):

* If requests wait, admit them in queue order while the running set stays
  within ``max_num_seqs``, the batch's prefill tokens within
  ``max_num_batched_tokens``, and the free KV after admission at least
  ``watermark * M``; stop at the first that does not fit. If any is admitted
  the iteration prefills only those (running decodes pause).
* Otherwise every running request decodes one token; if their blocks after
  the iteration exceed ``M``, the latest arrivals are preempted until they fit.

KV is counted in blocks of the engine's ``kv.block_size`` (``block_size`` here
is the value this policy's yaml asks the engine for: vLLM's 16). A request
admitted now holds ``prefill_len + 1`` slots after its prefill (MODEL.md: the
prefill emits token 1), so admission reserves those blocks; vLLM allocates the
prompt's blocks at admission and the first token's slot at the next step, a
difference of at most one block per request. Output lengths are not used.

Decisions where vLLM and the spec say nothing: with nothing running, the head
of the queue is admitted even if it would break the watermark (vLLM would
reject such a prompt as too long; here it fits ``M`` and must be served), and
a prefill longer than ``max_num_batched_tokens`` is a configuration error
(vLLM requires the budget to cover the longest prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.serving import check_serving_limits, preempt_latest_until_fit
from replay.engine.paging import blocks
from replay.engine.policy import UNTIL_CHANGE, Batch, OverflowRule, PolicyView
from replay.errors import ConfigError
from replay.params import check

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class VLLMLike:
    overflow: OverflowRule
    max_num_seqs: int = field(default=256, metadata=check(ge=1))
    max_num_batched_tokens: int = field(default=4096, metadata=check(ge=1))
    watermark: float = field(default=0.01, metadata=check(ge=0, lt=1))
    block_size: int = field(default=16, metadata=check(ge=1))
    preemption: Literal["recompute", "restart"] = "recompute"

    def __post_init__(self) -> None:
        check_serving_limits(max_num_seqs=self.max_num_seqs,
                             max_num_batched_tokens=self.max_num_batched_tokens,
                             watermark=self.watermark)

    def decide(self, view: PolicyView) -> Batch:
        block = view.kv_block_size
        capacity = view.kv_capacity // block
        running = view.running
        admitted = self.admit(view, capacity - int(blocks(view.held[running], block).sum()))
        if admitted.size:
            return Batch(start=admitted, advance=_EMPTY)
        keep = preempt_latest_until_fit(running, blocks(view.held[running] + 1, block), capacity)
        if keep is None:
            # Steady: without arrivals or completions the queue head stays too big for the
            # free blocks (they only shrink), so only the preemption test can change this.
            # advance=None (all running) spares the engine validating the ids.
            return Batch(steady_steps=UNTIL_CHANGE)
        return Batch(advance=running[keep], preempt=running[~keep])

    def admit(self, view: PolicyView, free_blocks: int) -> np.ndarray:
        """The prefix of the waiting queue that the three admission limits allow."""
        waiting = view.waiting[: max(0, self.max_num_seqs - view.running.size)]
        if waiting.size == 0:
            return _EMPTY
        head_prefill = int(view.prefill_len[waiting[0]])
        if head_prefill > self.max_num_batched_tokens:
            raise ConfigError(
                f"policy.max_num_batched_tokens={self.max_num_batched_tokens} is below the "
                f"{head_prefill}-token prefill of request {int(waiting[0])}; vLLM requires "
                f"the budget to cover the longest prompt (plus, under recompute, its output)")
        watermark = int(self.watermark * (view.kv_capacity // view.kv_block_size))
        if free_blocks - blocks(head_prefill + 1, view.kv_block_size) < watermark:
            # The head does not fit (most steps of an overloaded run), so no prefix does;
            # the watermark is waived for a lone request (see the module docstring).
            return waiting[:1] if view.running.size == 0 else _EMPTY
        prefill = view.prefill_len[waiting]
        needed = np.cumsum(blocks(prefill + 1, view.kv_block_size))
        fits = (np.cumsum(prefill) <= self.max_num_batched_tokens) & (
            free_blocks - needed >= watermark)
        return waiting[:int(np.argmin(fits)) if np.count_nonzero(~fits) else fits.size]
