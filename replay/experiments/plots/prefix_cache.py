"""The prefix cache of runs over time: its hit ratio so far and the memory its blocks hold
(``python -m replay.plots cache``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from replay.experiments.plots.common import plt, save_figure


def cache_timeline(iterations: pd.DataFrame, block_size: int) -> pd.DataFrame:
    """Per executed iteration: its end time, the cumulative hit ratio by tokens (prompt
    tokens taken from the cache over those taken plus those computed, recomputations
    included) and the cache's blocks in token slots (referenced and free)."""
    done = iterations[~iterations["failed"]]
    cached = done["cached_tokens"].cumsum()
    computed = done["prefill_tokens"].cumsum()
    total = cached + computed
    return pd.DataFrame({
        "time": (done["start_time"] + done["duration"]).to_numpy(),
        "hit_ratio_tokens": (cached / total.where(total > 0)).to_numpy(),
        "cache_slots": (done["cache_blocks"] * block_size).to_numpy(),
        "kv_after": done["kv_after"].to_numpy()})


def plot_cache_timelines(runs: Sequence[tuple[str, pd.DataFrame, int, int]], out: Path) -> Path:
    """``(label, iterations, block size, M)`` of runs with the cache on: the hit ratio so far
    (left) and the cache's occupancy with the capacity marked (right); ``out`` (.png) and
    its CSV."""
    fig, (ratio_ax, slots_ax) = plt.subplots(1, 2, figsize=(11, 4))
    frames = []
    for label, iterations, block_size, capacity in runs:
        timeline = cache_timeline(iterations, block_size)
        ratio_ax.plot(timeline["time"], timeline["hit_ratio_tokens"], lw=0.9, label=label)
        slots_ax.plot(timeline["time"], timeline["cache_slots"], lw=0.8, label=label)
        frames.append(timeline.assign(run=label, block_size=block_size, kv_capacity=capacity))
    for capacity in sorted({run[3] for run in runs}):
        slots_ax.axhline(capacity, color="k", ls="--", lw=1, label=f"M = {capacity:,}")
    ratio_ax.set_ylim(0, 1)
    ratio_ax.set_ylabel("hit ratio so far (prompt tokens from the cache)")
    slots_ax.set_ylabel("cached blocks (token slots, referenced and free)")
    for ax in (ratio_ax, slots_ax):
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7, loc="best")
    ratio_ax.set_title("Prefix cache over time", fontsize=9)
    return save_figure(fig, out, pd.concat(frames))
