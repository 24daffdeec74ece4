"""``python -m replay.fluid [hydra overrides]``: the fluid model's figures for the configured
typed workload (equilibrium, stability, WAIT thresholds and their conditions) as one JSON
line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from replay.errors import ConfigError
from replay.fluid.model import (
    COEFFICIENTS,
    CONVENTIONS,
    THRESHOLD_RULES,
    TypeMix,
    condition_11,
    equilibrium,
    linear_coefficients,
    stability_boundary,
    wait_thresholds,
)


# ------------------------------------------------------------------------------- CLI
def describe(cfg) -> dict:
    """Everything the fluid model says about the configured typed workload."""
    from hydra.utils import instantiate

    if "types" not in cfg.workload:
        raise ConfigError("replay.fluid needs a typed workload (workload=typed or an "
                          "experiment that sets workload.types)")
    convention = cfg.get("fluid_convention", "harness")
    if convention not in CONVENTIONS:  # the model's own check names no key
        raise ConfigError(f"fluid_convention={convention!r} is not allowed: it must be one of "
                          f"{', '.join(CONVENTIONS)}")
    # The workload's effective rates (after total_rate / load rescaling).
    mix = TypeMix.from_types(list(instantiate(cfg.workload).types), convention)
    coefficients = linear_coefficients(cfg)
    d = {k: coefficients[k] for k in COEFFICIENTS}
    slopes = {k: d[k] for k in ("d1", "d2", "d3", "d4")}
    out = {"convention": convention, **d,
           "coefficients_source": coefficients["source"],
           "rate_scale_at_boundary": stability_boundary(mix, **slopes),
           **equilibrium(mix, **d)}
    batch_limit = cfg.policy.get("batch_limit", cfg.get("batch_limit"))
    kv_tokens = int(cfg.kv.tokens) if cfg.kv.get("tokens") is not None else None
    thresholds = {}
    for rule in THRESHOLD_RULES:
        if rule != "condition_11" and batch_limit is None:
            continue
        n = wait_thresholds(mix, rule, batch_limit, **d)
        thresholds[rule] = None if n is None else {
            "n": n.tolist(), **condition_11(mix, n, **d, kv_capacity=kv_tokens)}
    out.update(batch_limit=batch_limit, kv_capacity=kv_tokens, thresholds=thresholds)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from replay.config.cli import compose_or_exit, run_or_exit

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m replay.fluid [hydra overrides...] [fluid_convention=paper]\n"
              "Prints the fluid equilibrium, stability and WAIT thresholds of the configured "
              "typed workload (e.g. experiment=b1_wait_low) as one JSON line.")
        return
    convention = "harness"
    for a in list(args):
        if a.startswith("fluid_convention="):
            convention = a.split("=", 1)[1]
            args.remove(a)
    cfg = compose_or_exit(args)
    with __import__("omegaconf").open_dict(cfg):
        cfg.fluid_convention = convention
    print(json.dumps(run_or_exit(describe, cfg), default=str))


if __name__ == "__main__":
    from replay.config.cli import run_or_exit

    run_or_exit(main)
