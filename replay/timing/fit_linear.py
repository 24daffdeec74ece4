"""Fit the ``timing=linear`` coefficients to the Vidur backend.

``python -m replay.timing.fit_linear [--batches N] [--seed S] [hydra overrides]``
prints, for each model/hardware pair, ``d0, d1, d2`` of
``LinearTiming`` (``d0 + d1 * sum(context + new_tokens) + d2 * prefill tokens``,
seconds) fitted to ``timing=vidur`` on a seeded mix of batches, as YAML lines for
``configs/model/<model>.yaml`` under ``linear_timing:``, with the fit error.

The mix (all inside the profiled range, so nothing is extrapolated):

* 80 % decode-only iterations: 1..128 requests, each context drawn
  log-uniformly in [16, 4000] tokens (short chat turns to long documents);
* 20 % iterations with 1..4 prefills (prompt log-uniform in [16, 2048], total at
  most 4096 tokens) next to 0..64 decodes drawn as above.

Coefficients are non-negative least squares on relative error (each batch's row
divided by its Vidur time), so short decode steps weigh as much as long prefills.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.optimize import nnls

from replay.cli import run_or_exit
from replay.timing.base import BatchShape
from replay.timing.shapes import MODEL_HARDWARE, compose_timing
from replay.timing.simple import LinearTiming

DECODE_SHARE = 0.8


def _log_uniform(rng: np.random.Generator, low: int, high: int, size: int) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), size)).astype(np.int64)


def batch_mix(rng: np.random.Generator, n: int) -> list[BatchShape]:
    batches = []
    for _ in range(n):
        if rng.random() < DECODE_SHARE:
            decodes, prompts = int(rng.integers(1, 129)), np.zeros(0, np.int64)
        else:
            decodes = int(rng.integers(0, 65))
            prompts = _log_uniform(rng, 16, 2048, int(rng.integers(1, 5)))
            prompts = prompts[np.cumsum(prompts) <= 4096 - decodes] if prompts.size else prompts
            if prompts.size == 0:
                prompts = np.array([min(16, 4096 - decodes)], np.int64)
        new_tokens = np.concatenate([prompts, np.ones(decodes, np.int64)])
        context = np.concatenate([np.zeros(prompts.size, np.int64),
                                  _log_uniform(rng, 16, 4000, decodes)])
        batches.append(BatchShape(new_tokens=new_tokens, context=context,
                                  is_prefill=new_tokens > 1))
    return batches


def fit(timing, batches: list[BatchShape]) -> dict:
    design = np.array([(1.0, *LinearTiming.terms(b)) for b in batches], dtype=float)
    target = np.array([timing.duration(b) for b in batches])
    coef, _ = nnls(design / target[:, None], np.ones_like(target))
    relative = np.abs(design @ coef - target) / target
    return {"d0": float(coef[0]), "d1": float(coef[1]), "d2": float(coef[2]),
            "mape": float(relative.mean()), "max_relative_error": float(relative.max()),
            "n_batches": len(batches)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both models")
    args = parser.parse_args(argv)
    for model, hardware in MODEL_HARDWARE:
        timing = compose_timing(model, hardware, args.overrides)
        batches = batch_mix(np.random.default_rng(args.seed), args.batches)
        result = fit(timing, batches)
        print(f"# {model}: fitted to timing=vidur ({timing.spec.predictor}) on "
              f"{result['n_batches']} batches, seed {args.seed}: MAPE "
              f"{result['mape']:.1%}, max relative error {result['max_relative_error']:.1%}")
        print(f"  {hardware}: {{d0: {result['d0']:.4g}, d1: {result['d1']:.4g}, "
              f"d2: {result['d2']:.4g}}}")
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
