"""Compare the Llama-2-7B attention sources on the shapes they share.

``python -m replay.tools.attention_sources [--out DIR] [hydra overrides]`` writes
``decode.csv`` and ``prefill.csv`` (milliseconds per layer) and prints their
medians. Each row is one shape of NVIDIA's A100-SXM4-80GB kernel tables
(:mod:`replay.timing.aiconfigurator`) that Vidur's measured Llama-2-70B TP 2
profile also has:

* ``vidur_70b``: Vidur's measurement at the 70B per-GPU shape (32 query / 4 KV heads);
* ``derived_7b``: this project's 7B TP 1 table (32 / 32, :mod:`replay.timing.attention_7b`);
* ``kernel_kv4`` and ``kernel_kv32``: the collection's measurement of the same
  kernel with 4 and with 32 KV heads (missing where the collection has none).

Decode shapes are ``batch_size`` sequences holding ``tokens`` cached tokens;
prefill shapes are one sequence of ``tokens`` prompt tokens with nothing cached.
``kernel_kv4 / vidur_70b`` says how well a collection reproduces Vidur's own
measurement; ``derived_7b / kernel_kv32`` how far the derivation is from a
measured 7B-shaped kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from replay.config.cli import CommandParser, compose, run_or_exit
from replay.storage.data import require_file
from replay.storage.outputs import ensure_writable_dir
from replay.timing import aiconfigurator, attention_7b
from replay.timing.profiles_fetch import fetch_hint, profile_paths

MODEL_70B = attention_7b.SOURCE_SHAPE["model"]
STAT = {"decode": "time_stats.attn_decode.median", "prefill": "time_stats.attn_prefill.median"}


def vidur_rows(profile: pd.DataFrame, phase: str) -> pd.DataFrame:
    """Median time per (batch_size, tokens) of one phase of a Vidur attention table."""
    if phase == "decode":
        rows = profile[~profile["is_prefill"].astype(bool)]
        tokens = rows["kv_cache_size"]
    else:
        rows = profile[profile["is_prefill"].astype(bool) & (profile["kv_cache_size"] == 0)]
        tokens = rows["prefill_chunk_size"]
    return (rows.assign(tokens=tokens).groupby(["batch_size", "tokens"])[STAT[phase]].median())


def compare(profile_70b: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{"decode": ..., "prefill": ...}``: every shared shape, one row per collection."""
    derived, _ = attention_7b.derive(profile_70b, aiconfigurator.prefill_kv_head_ratio())
    out = {}
    for phase in ("decode", "prefill"):
        kernels = aiconfigurator.load(phase).reset_index()
        if phase == "prefill":
            kernels = kernels[kernels["batch_size"] == 1]
        table = kernels.join(vidur_rows(profile_70b, phase).rename("vidur_70b"),
                             on=["batch_size", "tokens"], how="inner")
        table = table.join(vidur_rows(derived, phase).rename("derived_7b"),
                           on=["batch_size", "tokens"], how="inner")
        table = table.rename(columns={"kv4": "kernel_kv4", "kv32": "kernel_kv32"})
        table["kv4_over_vidur"] = table["kernel_kv4"] / table["vidur_70b"]
        table["derived_over_kv32"] = table["derived_7b"] / table["kernel_kv32"]
        out[phase] = table[["collection", "batch_size", "tokens", "vidur_70b", "derived_7b",
                            "kernel_kv4", "kernel_kv32", "kv4_over_vidur",
                            "derived_over_kv32"]].reset_index(drop=True)
    return out


def summary(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Median and range of both ratios per phase and collection."""
    rows = []
    for phase, table in tables.items():
        for collection, group in table.groupby("collection", sort=False):
            row = {"phase": phase, "collection": collection, "shapes": len(group)}
            for ratio in ("kv4_over_vidur", "derived_over_kv32"):
                values = group[ratio].dropna()
                row[f"{ratio} median"] = values.median()
                row[f"{ratio} p10-p90"] = (f"{values.quantile(0.1):.2f}-"
                                           f"{values.quantile(0.9):.2f}") if len(values) else ""
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m replay.tools.attention_sources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/attention_sources"))
    parser.add_argument("overrides", nargs="*", help="hydra overrides (e.g. data_dir=...)")
    args = parser.parse_args(argv)
    ensure_writable_dir(args.out)  # before the work, not after it
    cfg = compose(["model=llama2_7b", "hardware=a100x1", "timing=vidur", *args.overrides])
    source = require_file(
        profile_paths(Path(cfg.timing.profile_dir), MODEL_70B, "a100")["attention"],
        fetch_hint("attention", MODEL_70B, "a100"))
    tables = compare(pd.read_csv(source))
    for phase, table in tables.items():
        table.to_csv(args.out / f"{phase}.csv", index=False)
    print(f"# ms per layer; Vidur 70B TP2 profile {source}; kernel tables "
          f"{aiconfigurator.PACKAGE} {aiconfigurator.provenance()['version']}")
    print(summary(tables).round(3).to_string(index=False))
    print(f"saved {args.out}/decode.csv and prefill.csv")
    return 0


if __name__ == "__main__":
    sys.exit(run_or_exit(main))
