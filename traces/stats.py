"""``python -m traces.stats [--markdown] [--output-types WIDTH:MAX] workload=NAME [overrides]``.

Composes the same Hydra config as ``python -m replay`` (so any override works, e.g.
``workload=lmsys workload.n=null`` for the whole file, ``seed=3``) and draws the workload's
requests exactly as a replay with that config would. Prints count, mean, median, p90, p99 and
max of the prompt and output lengths, the length unit, and the rows dropped and why.
``--output-types 50:500`` also clusters the outputs into types by length bin (EXPERIMENTS.md
B3: each bin's output length, count, share of the rate and mean prompt).
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from replay.cli import compose_or_exit, fail, run_or_exit
from replay.engine.requests import Requests
from replay.run import make_requests
from replay.workloads.typed import output_length_types

STATISTICS = ("count", "mean", "median", "p90", "p99", "max")


def workload_requests(cfg: DictConfig) -> Requests:
    """The requests a replay of ``cfg`` would serve (same seed streams)."""
    return make_requests(instantiate(cfg.workload), instantiate(cfg.arrivals), cfg.seed,
                         time_unit="seconds", workload_seed=cfg.get("workload_seed"))


def length_stats(requests: Requests) -> pd.DataFrame:
    """One row per length (``prompt_len``, ``output_len``), one column per statistic."""
    rows = {}
    for name in ("prompt_len", "output_len"):
        values = np.asarray(getattr(requests, name), dtype=float)
        p90, p99 = np.percentile(values, [90, 99]) if values.size else (np.nan, np.nan)
        rows[name] = [values.size, values.mean() if values.size else np.nan,
                      np.median(values) if values.size else np.nan, p90, p99,
                      values.max() if values.size else np.nan]
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(STATISTICS))


def markdown(frame: pd.DataFrame) -> str:
    header = "| length | " + " | ".join(frame.columns) + " |"
    lines = [header, "|---" * (len(frame.columns) + 1) + "|"]
    for name, row in frame.iterrows():
        cells = [f"{int(row['count'])}"] + [f"{row[c]:.2f}".rstrip("0").rstrip(".")
                                            for c in frame.columns[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    as_markdown = "--markdown" in args
    types = None
    if "--output-types" in args:
        at = args.index("--output-types")
        try:
            width, top = (int(x) for x in args[at + 1].split(":"))
        except (IndexError, ValueError):
            fail("--output-types needs WIDTH:MAX, e.g. 50:500")
        types = (width, top)
        del args[at:at + 2]
    overrides = [a for a in args if a != "--markdown"]
    cfg = compose_or_exit(overrides)
    from replay.validate import validate_config

    run_or_exit(validate_config, cfg)
    requests = run_or_exit(workload_requests, cfg)
    frame = length_stats(requests)
    print(f"workload: {cfg.workload.get('name', '?')}  source: {requests.source}")
    print(f"length unit: {requests.length_unit}  dropped rows: {requests.dropped or 'none'}")
    print(markdown(frame) if as_markdown else frame.to_string(float_format=lambda x: f"{x:.2f}"))
    if types is not None:
        table = output_length_types(requests, *types)
        print(f"\noutput types (bins of {types[0]} up to {types[1]}; "
              f"{table.attrs['beyond']} outputs beyond):")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
