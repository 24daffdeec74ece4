"""``python -m traces.stats [--markdown] workload=NAME [overrides]``: length statistics.

Composes the same Hydra config as ``python -m replay`` (so any override works, e.g.
``workload=lmsys workload.n=null`` for the whole file, ``seed=3``) and draws the workload's
requests exactly as a replay with that config would. Prints count, mean, median, p90, p99 and
max of the prompt and output lengths, the length unit, and the rows dropped and why.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from replay.requests import Requests
from replay.run import compose_config, make_requests

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
    as_markdown = "--markdown" in args
    overrides = [a for a in args if a != "--markdown"]
    cfg = compose_config(overrides)
    requests = workload_requests(cfg)
    frame = length_stats(requests)
    print(f"workload: {cfg.workload.get('name', '?')}  source: {requests.source}")
    print(f"length unit: {requests.length_unit}  dropped rows: {requests.dropped or 'none'}")
    print(markdown(frame) if as_markdown else frame.to_string(float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
