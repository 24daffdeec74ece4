"""E2's parts on hand-checkable inputs: the trace hit ratios and the cache timeline."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from replay.experiments.plots.prefix_cache import cache_timeline
from replay.experiments.studies.prefix_cache import trace_hit_ratios


def test_trace_hit_ratios_unbounded_and_bounded(tmp_path):
    folder = tmp_path / "traces" / "mooncake"
    folder.mkdir(parents=True)
    lines = [{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
             {"timestamp": 10, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
             {"timestamp": 20, "input_length": 512, "output_length": 5, "hash_ids": [9]}]
    (folder / "tiny_trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = trace_hit_ratios(tmp_path, ["tiny"], [512], 512).set_index("capacity_tokens",
                                                                        drop=False)
    unbounded = table[table["capacity_tokens"].isna()].iloc[0]
    # the second request finds the first's two blocks; its third block is partial
    assert unbounded["hit_blocks"] == 2 and unbounded["full_blocks"] == 5
    assert unbounded["hit_ratio_tokens"] == pytest.approx(1024 / (1024 + 1100 + 512))
    one_block = table[table["capacity_tokens"] == 512].iloc[0]
    # a one-block cache keeps the first request's first block (its tail goes first)
    assert one_block["hit_blocks"] == 1
    assert len(unbounded["sha256"]) == 64


def test_the_cache_timeline_counts_cached_over_all_prompt_tokens():
    iterations = pd.DataFrame({
        "start_time": [0.0, 1.0, 2.0], "duration": [1.0, 1.0, 1.0],
        "failed": [False, True, False], "cached_tokens": [0, 64, 48],
        "prefill_tokens": [100, 10, 16], "cache_blocks": [6, 6, 9], "kv_after": [96, 96, 160]})
    timeline = cache_timeline(iterations, block_size=16)
    assert timeline["time"].tolist() == [1.0, 3.0]  # the failed attempt is not a step
    assert np.allclose(timeline["hit_ratio_tokens"], [0.0, 48 / 164])
    assert timeline["cache_slots"].tolist() == [96, 144]
