"""Issue 30 item 4: the WAIT authors' setup (Llama-3-8B on one A100, their B1-high mix)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from replay.timing import attention_7b

from .conftest import DATA_DIR

PROFILES = DATA_DIR / "vidur" / "profiling"
ATTENTION_70B = PROFILES / "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv"
MLP_8B = PROFILES / "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
CHEAP = ["timing.random_forest_grid={num_estimators:[8],max_depth:[8],min_samples_split:[2]}",
         "timing.k_fold_cv_splits=2"]
LLAMA3_8B = attention_7b.TARGET_SHAPES["meta-llama/Meta-Llama-3-8B"]


def _toy_70b_profile(bandwidth_bytes_per_ms: float) -> pd.DataFrame:
    """Decode rows exactly ``t = 0.01 + 0.001 B + B kv 2048 / BW`` and two prefill rows."""
    shape = {"n_embd": 8192, "n_q_head": 64, "n_kv_head": 8, "num_tensor_parallel_workers": 2}
    rows = []
    for batch in (1, 2, 4, 8):
        for kv in (0, 500, 1000, 2000):
            t = 0.01 + 0.001 * batch + batch * kv * 2048 / bandwidth_bytes_per_ms
            rows.append({**shape, "is_prefill": False, "batch_size": batch, "kv_cache_size": kv,
                         "prefill_chunk_size": 0,
                         **{c: t for c in attention_7b.DECODE_STATS},
                         **{c: 0.0 for c in attention_7b.PREFILL_STATS}})
    for chunk in (64, 1024):
        rows.append({**shape, "is_prefill": True, "batch_size": 1, "kv_cache_size": 0,
                     "prefill_chunk_size": chunk,
                     **{c: 0.0 for c in attention_7b.DECODE_STATS},
                     **{c: chunk / 1000 for c in attention_7b.PREFILL_STATS}})
    return pd.DataFrame(rows)


def test_llama3_8b_kv_bytes_are_a_quarter_of_7b():
    # 2 (K, V) x 8 KV heads x 128 x 2 bytes, against 32 KV heads for Llama-2-7B.
    assert attention_7b.kv_bytes_per_token(LLAMA3_8B) == 4096
    assert attention_7b.kv_bytes_per_token(attention_7b.TARGET_SHAPE) == 16384


def test_8b_derivation_by_hand_on_a_toy_profile():
    bandwidth = 1e9                       # bytes per ms = 1000 GB/s
    source = _toy_70b_profile(bandwidth)
    ratio = (np.array([16, 4096]), np.array([1.5, 1.5]))   # a flat 8/4 KV-head prefill ratio
    derived, constants = attention_7b.derive(source, ratio, LLAMA3_8B)
    assert len(derived) == len(source)
    assert set(derived["n_kv_head"]) == {8} and set(derived["n_q_head"]) == {32}
    assert set(derived["n_embd"]) == {4096} and set(derived["num_tensor_parallel_workers"]) == {1}
    assert constants["decode_bandwidth_GBps"] == pytest.approx(1000.0, rel=1e-6)
    assert constants["kv_bytes_per_token_target"] == 4096
    # B = 4, kv = 1000: 0.01 + 0.004 + 4*1000*2048/1e9 = 0.022192 ms measured at 70B;
    # 8B adds 4*1000*(4096-2048)/1e9 = 0.008192 ms: 0.030384 ms.
    row = derived[(~derived["is_prefill"]) & (derived["batch_size"] == 4)
                  & (derived["kv_cache_size"] == 1000)]
    assert row["time_stats.attn_decode.median"].item() == pytest.approx(0.030384, rel=1e-9)
    # Prefill: 70B time x the ratio (1.024 ms x 1.5 for the 1024-token chunk).
    row = derived[derived["is_prefill"] & (derived["prefill_chunk_size"] == 1024)]
    assert row["time_stats.attn_prefill.median"].item() == pytest.approx(1.536, rel=1e-9)
    # The 7B target on the same data adds 7x as much per cached token.
    derived_7b, _ = attention_7b.derive(source, ratio)
    row_7b = derived_7b[(~derived_7b["is_prefill"]) & (derived_7b["batch_size"] == 4)
                        & (derived_7b["kv_cache_size"] == 1000)]
    assert row_7b["time_stats.attn_decode.median"].item() == pytest.approx(
        0.022192 + 7 * 0.008192, rel=1e-9)


@pytest.mark.skipif(not (ATTENTION_70B.is_file() and MLP_8B.is_file()),
                    reason=f"Vidur profiles not in {PROFILES}")
def test_llama3_8b_vidur_prices_a_batch(tmp_path):
    from replay.timing.shapes import batch, compose_timing

    timing = compose_timing("llama3_8b", "a100x1",
                            [*CHEAP, f"timing.cache_dir={tmp_path}",
                             "timing.beyond_profile=flat"])
    info = timing.describe()
    assert info["model"] == "meta-llama/Meta-Llama-3-8B"
    attention = info["attention"]
    assert "Meta-Llama-3-8B TP1" in attention["what"]
    assert attention["constants"]["kv_bytes_per_token_target"] == 4096
    table = pd.read_csv(attention["table_file"]["path"])
    source = pd.read_csv(ATTENTION_70B)
    assert len(table) == len(source)
    assert set(table["n_kv_head"]) == {8} and set(table["num_tensor_parallel_workers"]) == {1}
    # Hand check on a real row: decode of 64 requests at 1024 cached tokens gains
    # 64 * 1024 * 2048 bytes at the fitted bandwidth.
    decode = ~source["is_prefill"].astype(bool)
    pick = decode & (source["batch_size"] == 64) & (source["kv_cache_size"] == 1024)
    bandwidth = attention["constants"]["decode_bandwidth_GBps"] * 1e6   # bytes per ms
    column = "time_stats.attn_decode.median"
    assert table.loc[pick, column].to_numpy() == pytest.approx(
        source.loc[pick, column].to_numpy() + 64 * 1024 * 2048 / bandwidth, rel=1e-6)
    # One B1-high-like iteration: 4 prompts of 20 tokens and 60 decodes at context 150.
    seconds = timing.duration(batch([20] * 4 + [1] * 60, [0] * 4 + [150] * 60))
    assert math.isfinite(seconds) and 0 < seconds < 1
    # Flat past the profile: 1000 decodes cost what 128 do at the same context.
    assert timing.parts(batch([1] * 1000, 150))["decode_attention"] == pytest.approx(
        timing.parts(batch([1] * 128, 150))["decode_attention"], rel=1e-12)


def test_authors_throughput_on_a_hand_made_iteration_table():
    from replay.experiments.authors import authors_throughput

    iterations = pd.DataFrame({
        "start_time": [0.0, 1.0, 2.0, 3.0, 3.5],
        "duration":   [1.0, 1.0, 1.0, 0.5, 1.5],
        "batch_size": [3, 5, 4, 7, 2],
        "failed":     [False, False, False, True, False],
    })
    # Batch ends 1, 2, 3, (3.5 failed: ran nothing), 5: over the span to 5 s, (3+5+4+2)/5.
    assert authors_throughput(iterations) == pytest.approx(14 / 5)
    # By T = 2.5 s only the batches ending at 1 and 2 count: (3 + 5) / 2.5.
    assert authors_throughput(iterations, 2.5) == pytest.approx(8 / 2.5)
    # A batch counts at its end, not its start: at T = 2.99 the third is still running.
    assert authors_throughput(iterations, 2.99) == pytest.approx(8 / 2.99)
    # Past the end the count stays and T keeps growing (their curve decays as 1/T).
    assert authors_throughput(iterations, 10.0) == pytest.approx(14 / 10)
    assert authors_throughput(iterations.iloc[:0]) == 0.0
    with pytest.raises(ValueError, match="horizon"):
        authors_throughput(iterations, 0.0)


def test_cap_table_reads_a_run_folder(tmp_path):
    import json

    from replay.experiments.authors import cap_table

    run = tmp_path / "paper_policy=wait,batch_limit=100"
    run.mkdir()
    pd.DataFrame({"start_time": [0.0, 1.0], "duration": [1.0, 1.0], "batch_size": [2, 1],
                  "failed": [False, False]}).to_parquet(run / "iterations.parquet")
    (run / "summary.json").write_text(json.dumps({
        "status": "completed", "n_requests": 2, "n_completed": 2, "makespan": 2.0,
        "throughput_tokens_per_s": 1.5, "throughput_requests_per_s": 1.0,
        "config": {"policy": {"_target_": "policies.wait.Wait"}, "batch_limit": 100,
                   "seed": 42}}))
    table = cap_table(tmp_path, horizons=(1.0,))
    row = table.iloc[0]
    assert (row["policy"], row["cap"], row["max_batch"]) == ("WAIT", 100, 2)
    assert row["authors_at_end"] == pytest.approx(1.5)
    assert row["authors_at_1s"] == pytest.approx(2.0)
    assert row["ours_tokens_per_s"] == 1.5
    from replay.experiments.authors import table_figure

    written = table_figure(tmp_path, tmp_path / "figures")
    assert [p.name for p in written] == ["b1_authors.png"]
    assert (tmp_path / "figures" / "b1_authors.csv").is_file()  # the table behind it
    assert pd.read_csv(written[0].with_suffix(".csv"))["policy"].tolist() == ["WAIT"]
    assert table_figure(tmp_path / "figures", tmp_path / "none") == []
