"""Fit the ``timing=linear`` coefficients to the Vidur backend, and say how well they fit:
``python -m replay.tools.fit_linear [--batches N] [--seed S] [--out DIR] [hydra overrides]``
(see :mod:`replay.timing.fit_linear` for the fitting mix, the method and the regions)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from replay.config.cli import CommandParser, run_or_exit, seed_int
from replay.timing.fit_linear import MAX_BATCHES, fit_and_report


def batch_count(text: str) -> int:
    """``--batches``: a whole number of batches in 1..MAX_BATCHES."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_BATCHES:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_BATCHES:,}, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m replay.tools.fit_linear", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=batch_count, default=4000,
                        help=f"batches in the fitting mix, 1..{MAX_BATCHES:,}")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="seed of the fitting mix, a whole number >= 0")
    parser.add_argument("--out", type=Path, default=Path("outputs/timing/fit_linear"))
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both models")
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    fit_and_report(args.batches, args.seed, args.overrides, args.out, raw)
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
