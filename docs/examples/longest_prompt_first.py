"""Longest prompt first: an example policy for the kvsched documentation.

It admits waiting requests in descending prompt length (ties: queue order) for as
long as the shared lookahead memory check passes, and stops at the first request
that does not fit, exactly like MC-SF but with another order. Running requests
always continue. Use it as a template: copy this file to ``policies/`` and the
yaml beside it to ``configs/policy/``, then run
``python -m replay policy=longest_prompt_first``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.common.lookahead import admissible_prefix
from replay.engine.policy import Batch, OverflowRule, PolicyView


@dataclass
class LongestPromptFirst:
    """Start the longest waiting prompts first, within the lookahead memory check."""

    overflow: OverflowRule

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting  # engine ids in queue order (read-only)
        # A stable sort on the negated prompt lengths keeps queue order among ties.
        order = waiting[np.argsort(-view.prompt_len[waiting], kind="stable")]
        # The longest prefix of `order` that can start now without ever exceeding M,
        # judged with the predicted output lengths (the truth under prediction=exact).
        return Batch(start=order[: admissible_prefix(view, order)])
