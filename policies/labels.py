"""What a person reads for a policy: its name as the papers write it, with its parameters.

Tables, figures and printouts show ``MC-SF`` or ``alpha-protection (0.25)``, never a class
path; this is the one place that maps a resolved ``policy`` config to that label.
"""

from __future__ import annotations

from collections.abc import Mapping

NAMES = {"MCSF": "MC-SF", "FCFSLookahead": "FCFS (MC-Benchmark)", "SortedLP": "Sorted-LP",
         "LPSwap": "LP-Swap", "Wait": "WAIT", "NestedWait": "Nested WAIT",
         "VLLMLike": "vLLM-like", "SarathiLike": "Sarathi-like",
         "PaperFCFS": "FCFS (WAIT paper)", "VLLMV1": "vLLM v1"}


def policy_label(policy_cfg: Mapping) -> str:
    """The label of a resolved ``policy`` config, e.g. ``alpha/beta-clearing (0.2, 0.1)``;
    an unknown policy (a user's own) shows as its class name."""
    name = str(policy_cfg["_target_"]).rsplit(".", 1)[-1]
    overflow = str((policy_cfg.get("overflow") or {}).get("_target_", ""))
    if name == "AlphaProtection":
        if overflow.endswith("ClearEachWithProb"):
            return f"alpha/beta-clearing ({policy_cfg['alpha']}, {policy_cfg['overflow']['beta']})"
        return f"alpha-protection ({policy_cfg['alpha']})"
    if name == "SortedF":
        return f"Sorted-F ({policy_cfg['solver']})"
    if name == "AMin":
        return {"a_min": "Sorted-F + A_min", "a_max": "Sorted-F + A_max",
                "optimistic": "Sorted-F, optimistic"}[policy_cfg["variant"]]
    return NAMES.get(name, name)
