"""``python -m traces.stats [--markdown] [--output-types WIDTH:MAX] workload=NAME [overrides]``
and ``python -m traces.stats prefix FILE|overrides [--capacity-tokens N] [--block-size B]``.

Composes the same Hydra config as ``python -m replay`` (so any override works, e.g.
``workload=lmsys workload.n=null`` for the whole file, ``seed=3``) and draws the workload's
requests exactly as a replay with that config would. Prints count, mean, median, p90, p99 and
max of the prompt and output lengths, the length unit, and the rows dropped and why.
``--output-types 50:500`` also clusters the outputs into types by length bin
(docs/reproducing/wait.md B3: each bin's output length, count, share of the rate and mean prompt).

``prefix`` replays a trace's requests in arrival order through an LRU prefix cache
(:mod:`replay.workloads.prefix_stats`: unbounded unless ``--capacity-tokens``; blocks of
``--block-size`` tokens, by default the trace's own block unit) and prints, as its last
line, one JSON object with ``hit_ratio_blocks``, ``hit_ratio_tokens`` and the counts behind
them. FILE is a Mooncake-format JSONL trace; instead of a file, ``workload=NAME
[overrides]`` draws any workload that carries prompt-content ids.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from replay.config.cli import CommandParser, compose_or_exit, fail, run_or_exit
from replay.engine.requests import Requests
from replay.run import make_requests
from replay.workloads.mooncake import MooncakeTrace
from replay.workloads.prefix_stats import prefix_cache_replay
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


def output_types_option(text: str) -> tuple[int, int]:
    """``WIDTH:MAX`` with ``1 <= WIDTH <= MAX`` (bad input is one error line)."""
    try:
        width, top = (int(x) for x in text.split(":"))
    except ValueError:
        fail(f"--output-types needs WIDTH:MAX, e.g. 50:500, got {text!r}")
    if not 1 <= width <= top:
        fail(f"--output-types {text}: need whole numbers 1 <= WIDTH <= MAX, e.g. 50:500")
    return width, top


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def prefix_requests(target: list[str]) -> Requests:
    """The requests of a Mooncake-format file, or of a workload composed from overrides."""
    if all("=" in t for t in target):
        cfg = compose_or_exit(target)
        return run_or_exit(workload_requests, cfg)
    if len(target) != 1:
        fail(f"prefix takes one trace FILE or workload overrides (KEY=VALUE), got {target}")
    return run_or_exit(MooncakeTrace(target[0]).pool)


def prefix_main(argv: list[str]) -> None:
    parser = CommandParser(
        prog="python -m traces.stats prefix",
        description="Prefix-cache hit ratios of a trace replayed through an LRU block cache "
                    "(replay.workloads.prefix_stats defines them).")
    parser.add_argument("target", nargs="+", metavar="FILE|KEY=VALUE",
                        help="a Mooncake-format JSONL trace, or workload overrides")
    parser.add_argument("--capacity-tokens", type=_count(0), default=None,
                        help="cache capacity in tokens (default: unbounded)")
    parser.add_argument("--block-size", type=_count(1), default=None,
                        help="tokens per cached block (default: the trace's block unit)")
    args = parser.parse_args(argv)
    requests = prefix_requests(args.target)
    block_size = args.block_size or requests.block_unit
    if block_size is None:
        fail(f"{requests.source}: the requests carry no prompt-content ids, so no two prompts "
             f"can share a block; use a workload with ids (mooncake, shared_prefix, sessions)")
    stats, _ = run_or_exit(prefix_cache_replay, requests, block_size, args.capacity_tokens)
    record = {**stats.as_dict(), "block_unit": requests.block_unit, "source": requests.source,
              "input_files": list(requests.files)}
    capacity = ("unbounded" if args.capacity_tokens is None
                else f"{args.capacity_tokens:,} tokens ({stats.capacity_blocks:,} blocks)")
    print(f"prefix cache: {requests.source}, {stats.requests:,} requests, blocks of "
          f"{block_size} tokens, capacity {capacity}")
    print(json.dumps(record))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "prefix":
        prefix_main(args[1:])
        return
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    as_markdown = "--markdown" in args
    types = None
    if "--output-types" in args:
        at = args.index("--output-types")
        if at + 1 >= len(args):
            fail("--output-types needs WIDTH:MAX, e.g. 50:500")
        types = output_types_option(args[at + 1])
        del args[at:at + 2]
    overrides = [a for a in args if a != "--markdown"]
    cfg = compose_or_exit(overrides)
    from replay.config.validate import validate_config

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
    run_or_exit(main)
