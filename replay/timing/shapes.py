"""Predicted iteration times of standard batch shapes, for both models.

``python -m replay.timing.shapes [--out FILE.csv] [hydra overrides]`` prints and
saves (columns ``model, hardware, shape, milliseconds, extrapolated``) the
``timing=vidur`` prediction for:

* prefill of one request with 128 ... 4096 prompt tokens;
* prefill of 2, 4, 8 requests x 512 tokens in one iteration;
* decode iterations of 1 ... 128 requests at context 576;
* decode of one request at contexts 192, 1088 and 4160 (4160 exceeds Llama-2's
  4096-token context, so it shows the out-of-range behaviour).

Overrides apply to both models (e.g. ``timing.predictor=linear_regression``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from replay.cli import run_or_exit
from replay.config import compose_config
from replay.timing.base import BatchShape

MODEL_HARDWARE = (("llama2_70b", "a100x2"), ("llama2_7b", "a100x1"))


def compose_timing(model: str, hardware: str, overrides=(), timing: str = "vidur"):
    """The timing backend the replay would build for ``model`` on ``hardware``."""
    cfg = compose_config([f"model={model}", f"hardware={hardware}", f"timing={timing}",
                          *overrides])
    return instantiate(cfg.timing)


def batch(new_tokens, context) -> BatchShape:
    new_tokens = np.asarray(new_tokens, dtype=np.int64)
    return BatchShape(new_tokens=new_tokens,
                      context=np.broadcast_to(np.asarray(context, dtype=np.int64),
                                              new_tokens.shape).copy(),
                      is_prefill=new_tokens > 1)


def standard_shapes() -> dict[str, BatchShape]:
    shapes = {f"prefill 1x{n}": batch([n], 0) for n in (128, 256, 512, 1024, 2048, 4096)}
    shapes.update({f"prefill {k}x512": batch([512] * k, 0) for k in (2, 4, 8)})
    shapes.update({f"decode {b}@576": batch([1] * b, 576)
                   for b in (1, 2, 4, 8, 16, 32, 64, 128)})
    shapes.update({f"decode 1@{c}": batch([1], c) for c in (192, 1088, 4160)})
    return shapes


def shape_table(timing, model: str, hardware: str) -> pd.DataFrame:
    rows = []
    for name, shape in standard_shapes().items():
        before = sum(timing.out_of_range_batches.values())
        seconds = timing.duration(shape)
        rows.append({"model": model, "hardware": hardware, "shape": name,
                     "milliseconds": round(seconds * 1e3, 4),
                     "extrapolated": sum(timing.out_of_range_batches.values()) > before})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/timing_shapes.csv"))
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both models")
    args = parser.parse_args(argv)
    tables = []
    for model, hardware in MODEL_HARDWARE:
        timing = compose_timing(model, hardware, args.overrides)
        tables.append(shape_table(timing, model, hardware))
        attention = timing.describe()["attention"]
        print(f"# {model} on {hardware}: attention table: "
              f"{attention.get('what', attention.get('source'))}")
    table = pd.concat(tables, ignore_index=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    wide = table.pivot(index="shape", columns="model", values="milliseconds")
    print(wide.loc[table["shape"].unique()].to_string())
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
