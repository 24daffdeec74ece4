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

from policies.common.serving import check_serving_limits, preempt_latest_until_fit
from replay.engine.jit import jit
from replay.engine.paging import blocks
from replay.engine.policy import OverflowRule, PolicyView, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.params import check

#: The rule's record: ``ints`` = [max_num_seqs, max_num_batched_tokens, watermark in blocks].
MAX_SEQS, MAX_TOKENS, WATERMARK = 0, 1, 2
#: Error code: the queue head's prefill exceeds max_num_batched_tokens (``error_arg``: its id).
PREFILL_OVER_BUDGET = 1


@jit
def vllm_decide(s, rule):
    """Admit a prefix of the queue (prefill only) if any fits the three limits, else decode
    every running request, preempting the latest arrivals until their blocks fit."""
    block, params = s.block, rule.ints
    capacity = s.capacity // block
    running, n_run, held = s.running, s.n_run, s.held
    used = 0
    for k in range(n_run):
        used += blocks(held[running[k]], block)
    free = capacity - used
    n_wait = min(max(0, params[MAX_SEQS] - n_run), s.qtail - s.qhead)
    if n_wait > 0:
        queue, head, prefill_len = s.queue, s.qhead, s.prefill_len
        first = queue[head]
        head_prefill = prefill_len[first]
        if head_prefill > params[MAX_TOKENS]:
            s.error_arg = first
            return PREFILL_OVER_BUDGET
        watermark = params[WATERMARK]
        s.n_advance = 0
        if free - blocks(head_prefill + 1, block) < watermark:
            # The head does not fit (most steps of an overloaded run), so no prefix does; the
            # watermark is waived for a lone request (see the module docstring).
            if n_run == 0:
                s.start[0] = first
                s.n_start = 1
                return 0
        else:
            prefill = 0
            needed = 0
            k = 0
            while k < n_wait:
                rid = queue[head + k]
                prefill += prefill_len[rid]
                needed += blocks(prefill_len[rid] + 1, block)
                if prefill > params[MAX_TOKENS] or free - needed < watermark:
                    break
                s.start[k] = rid
                k += 1
            s.n_start = k
            return 0
        s.n_advance = -1
    after = s.scratch
    for k in range(n_run):
        after[k] = blocks(held[running[k]] + 1, block)
    cut = preempt_latest_until_fit(running, after, n_run, capacity)
    if cut < 0:
        # Steady: without arrivals or completions the queue head stays too big for the free
        # blocks (they only shrink), so only the preemption test can change this.
        s.steady = 2 ** 62
        return 0
    n_advance = 0
    n_preempt = 0
    for k in range(n_run):
        rid = running[k]
        if rid >= cut:
            s.preempt[n_preempt] = rid
            n_preempt += 1
        else:
            s.advance[n_advance] = rid
            n_advance += 1
    s.n_advance, s.n_preempt = n_advance, n_preempt
    return 0


@dataclass
class VLLMLike(CompiledPolicy):
    overflow: OverflowRule
    max_num_seqs: int = field(default=256, metadata=check(ge=1))
    max_num_batched_tokens: int = field(default=4096, metadata=check(ge=1))
    watermark: float = field(default=0.01, metadata=check(ge=0, lt=1))
    block_size: int = field(default=16, metadata=check(ge=1))
    preemption: Literal["recompute", "restart"] = "recompute"

    decision = vllm_decide

    def __post_init__(self) -> None:
        check_serving_limits(max_num_seqs=self.max_num_seqs,
                             max_num_batched_tokens=self.max_num_batched_tokens,
                             watermark=self.watermark)

    def rule_state(self, setup: RunSetup):
        watermark = int(self.watermark * (setup.kv_capacity // setup.block_size))
        return new_rule_state(ints=[self.max_num_seqs, self.max_num_batched_tokens, watermark])

    def decision_error(self, code: int, arg: int, view: PolicyView) -> Exception:
        return ConfigError(
            f"policy.max_num_batched_tokens={self.max_num_batched_tokens} is below the "
            f"{int(view.prefill_len[arg])}-token prefill of request {arg}; vLLM requires "
            f"the budget to cover the longest prompt (plus, under recompute, its output)")
