"""Predicted iteration times of standard batch shapes, for both models.

``python -m replay.tools.shapes [--out FILE.csv] [hydra overrides]`` prints and
saves (columns ``model, hardware, shape, milliseconds, extrapolated``) the
``timing=vidur`` prediction for:

* prefill of one request with 128 ... 4096 prompt tokens;
* prefill of 2, 4, 8 requests x 512 tokens in one iteration;
* decode iterations of 1 ... 128 requests at context 576;
* decode of one request at contexts 192, 1088 and 4160 (4160 exceeds Llama-2's
  4096-token context, so it shows the out-of-range behaviour).

Overrides apply to both models (e.g. ``timing.predictor=linear_regression``).

``python -m replay.tools.shapes --explain [--experiment NAME] [hydra overrides]`` instead
prices the **typical iteration** of a typed B experiment (default ``b1_wait_low``): WAIT's
full iteration at its fluid thresholds for the experiment's batch limit (every stage of
every type filled: the stage-0 requests prefill, the rest decode). It prints, for both
models, ``timing=vidur``'s price split into what it sums: the token-wise operations per
Vidur operation (MLP, attention projections, norms/rope/residual, all-reduces with tensor
parallelism; from Vidur's own predictor, reloaded from the backend's cache), decode
attention and prefill attention; and the same iteration under ``timing=linear``
(``model.linear_timing``) term by term. ``--out`` saves both as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from replay.config.cli import CommandParser, run_or_exit
from replay.storage.outputs import atomic_write, atomic_write_text, ensure_writable_dir
from replay.timing.shapes import (
    MODEL_HARDWARE,
    compose_timing,
    linear_decomposition,
    shape_table,
    typical_iteration,
    vidur_decomposition,
)


def explain(experiment: str, overrides, out: Path | None) -> dict:
    shape, info = typical_iteration(experiment)
    print(f"# The typical iteration of {experiment}: WAIT's fluid thresholds "
          f"{info['thresholds']} at B = {info['batch_limit']}: {info['prompts']} prompts and "
          f"{info['decodes']} decodes (mean context {info['mean_decode_context']:.1f}), "
          f"{info['new_tokens']} new tokens")
    result = {"iteration": info, "models": {}}
    for model, hardware in MODEL_HARDWARE:
        timing = compose_timing(model, hardware, overrides)
        total = timing.duration(shape)
        parts = vidur_decomposition(timing, shape)
        linear = linear_decomposition(model, hardware, shape, overrides)
        result["models"][model] = {"hardware": hardware, "vidur_s": total, "vidur_parts_s": parts,
                                   "linear_s": sum(linear.values()), "linear_parts_s": linear,
                                   "beyond_profile": timing.describe()["beyond_profile"]["mode"]}
        print(f"\n## {model} on {hardware}: timing=vidur {total * 1e3:.2f} ms")
        for name, seconds in parts.items():
            print(f"  {name:52s} {seconds * 1e3:9.2f} ms {seconds / total:7.1%}")
        linear_total = sum(linear.values())
        print(f"## timing=linear {linear_total * 1e3:.2f} ms ({linear_total / total - 1:+.1%} "
              f"against vidur)")
        for name, seconds in linear.items():
            print(f"  {name:52s} {seconds * 1e3:9.2f} ms {seconds / linear_total:7.1%}")
    if out is not None:
        ensure_writable_dir(out.parent)
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")
        print(f"saved {out}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m replay.tools.shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="CSV of the shapes (default outputs/timing_shapes.csv), or JSON "
                             "of --explain (default: not saved)")
    parser.add_argument("--explain", action="store_true",
                        help="decompose the typical iteration of --experiment into its parts")
    parser.add_argument("--experiment", default="b1_wait_low")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both models")
    args = parser.parse_args(argv)
    if args.explain:
        explain(args.experiment, args.overrides, args.out)
        return 0
    args.out = args.out or Path("outputs/timing_shapes.csv")
    tables = []
    for model, hardware in MODEL_HARDWARE:
        timing = compose_timing(model, hardware, args.overrides)
        tables.append(shape_table(timing, model, hardware))
        attention = timing.describe()["attention"]
        print(f"# {model} on {hardware}: attention table: "
              f"{attention.get('what', attention.get('source'))}")
    table = pd.concat(tables, ignore_index=True)
    ensure_writable_dir(args.out.parent)
    atomic_write(args.out, lambda tmp: table.to_csv(tmp, index=False))
    wide = table.pivot(index="shape", columns="model", values="milliseconds")
    print(wide.loc[table["shape"].unique()].to_string())
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
