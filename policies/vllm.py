"""vLLM-like: prefill-prioritising, non-clairvoyant (docs/policies/serving.md).

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
admitted now holds ``prefill_len + 1`` slots after its prefill (docs/model.md: the
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

from policies.common.serving import check_serving_limits, prefill_first
from replay.engine.jit import jit
from replay.engine.policy import OverflowRule, PolicyView, RunSetup
from replay.engine.rules import CompiledPolicy
from replay.engine.state import new_rule_state
from replay.errors import ConfigError
from replay.params import check


@jit
def vllm_decide(s, rule):
    """Admit a prefix of the queue (prefill only) if any fits the three limits, else decode
    every running request, preempting the latest arrivals until their blocks fit."""
    return prefill_first(s, rule, s.queue[s.qhead:s.qtail], s.qtail - s.qhead)


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
