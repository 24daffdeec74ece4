"""The WAIT authors' setup (issues 30 and 42): Llama-3-8B on one A100, their exact trace,
and their own result files read batch by batch beside ours."""

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


@pytest.mark.slow  # trains Vidur's predictor for Llama-3-8B (half a minute)
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



# ------------------------------------------------------------------- their exact trace
def test_their_generator_gives_their_trace():
    from replay.workloads.python_stream import PythonRandomStream

    stream = PythonRandomStream(types=[{"prompt_len": 20, "output_len": 100, "rate": 6000},
                                       {"prompt_len": 20, "output_len": 200, "rate": 4000},
                                       {"prompt_len": 20, "output_len": 300, "rate": 2000}],
                                n=10_000, seed=42)
    requests = stream.sample(np.random.default_rng(0))
    # Their first requests: type 2, then 1, 2, 3, 1 (Python's random seeded 42, a type by
    # rate weight, then an exponential gap at 12,000/s).
    assert requests.type_id[:5].tolist() == [1, 0, 1, 2, 0]
    assert requests.arrival[0] == 2.1107365868949076e-06
    assert requests.arrival[3] == pytest.approx(0.00012483670317650094, rel=0, abs=1e-18)
    assert np.bincount(requests.type_id).tolist() == [4966, 3372, 1662]
    # 1,669,600 output tokens: the final count of every one of their vLLM runs.
    assert int(requests.output_len.sum()) == 1_669_600
    assert set(requests.prompt_len.tolist()) == {20}
    assert requests.arrival[-1] == pytest.approx(0.8315314258897064, rel=1e-15)
    assert np.all(np.diff(requests.arrival) > 0)
    # Its own seed, not the run's numpy stream: the same trace whatever the generator.
    again = stream.sample(np.random.default_rng(7))
    assert np.array_equal(again.arrival, requests.arrival)


def test_their_generator_refuses_a_count_from_the_arrivals():
    from replay.engine.requests import RequestError
    from replay.workloads.python_stream import PythonRandomStream

    stream = PythonRandomStream(types=[{"prompt_len": 1, "output_len": 2, "rate": 4}], n=3)
    assert stream.expected_requests() == (3.0, "workload.n")
    with pytest.raises(RequestError, match="workload.n"):
        stream.sample(np.random.default_rng(0), n=5)


def test_b1_authors_composes_with_their_trace():
    from hydra.utils import instantiate

    from replay.config import compose_config

    cfg = compose_config([f"data_dir={DATA_DIR}", "experiment=b1_authors"])
    assert cfg.workload.n == 10_000 and cfg.workload.seed == 42
    assert cfg.timing.beyond_profile in ("flat", "linear", "measured")
    workload = instantiate(cfg.workload)
    assert int(workload.sample(np.random.default_rng(0)).output_len.sum()) == 1_669_600


# ------------------------------------------------------------- their files, batch by batch
def _their_file(folder, name: str, ends, counts):
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"Time (sec)": [0.0, *ends], "throughput": [0, *counts]}).to_csv(
        folder / name, index=False)


def test_their_metric_by_hand():
    from replay.experiments.authors import at_last_batch_end, notebook_mean

    batches = pd.DataFrame({"end": [100.0, 150.0, 200.0, 250.0],
                            "members": [1000, 500, 500, 500]})
    # All 2,500 batch members over the last batch end.
    assert at_last_batch_end(batches) == pytest.approx(2500 / 250)
    # The notebook: mean of count / T over the batch ends at T >= 150 s.
    assert notebook_mean(batches) == pytest.approx((1500 / 150 + 2000 / 200 + 2500 / 250) / 3)
    assert math.isnan(notebook_mean(batches.iloc[:1]))  # ended before 150 s


def _our_run(folder, policy: str, cap: int, members, durations, force_clear=None,
             mode: str = "linear"):
    import json

    folder.mkdir(parents=True)
    start = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    pd.DataFrame({"start_time": start, "duration": durations, "batch_size": members,
                  "failed": False}).to_parquet(folder / "iterations.parquet")
    config = {"policy": {"_target_": policy}, "batch_limit": cap}
    if force_clear is not None:
        config["policy"]["force_clear"] = force_clear
    (folder / "summary.json").write_text(json.dumps({
        "status": "completed", "config": config,
        "timing": {"beyond_profile": {"mode": mode}}}))


def test_side_by_side_and_the_pricing_measurement_on_constructed_runs(tmp_path):
    from replay.experiments.authors import (
        THEIR_FOLDER,
        pricing_summary,
        pricing_table,
        side_by_side,
    )

    root = tmp_path / "data"
    theirs = root / THEIR_FOLDER
    # Their vLLM at cap 200: a prefill batch of 100 (0.2 s), then decodes of 200 (0.02 s).
    _their_file(theirs / "vllm", "throughput_vllm_batch_size_200.csv",
                [0.2, 0.22, 0.24], [100, 300, 500])
    _their_file(theirs / "modified_booking_limit",
                "throughput_modified_booking_limit_limit_200_batch_size_150.csv",
                [0.1, 0.2], [150, 300])
    runs = tmp_path / "runs"
    _our_run(runs / "vllm" / "a", "policies.vllm.VLLMLike", 200, [100, 200, 200],
             [0.2, 0.018, 0.018])
    _our_run(runs / "wait" / "a", "policies.wait.Wait", 200, [150, 150], [0.1, 0.1])
    for mode, decode in (("flat", 0.014), ("linear", 0.019), ("measured", 0.024)):
        _our_run(runs / f"pricing_{mode}_vllm" / "a", "policies.vllm.VLLMLike", 200,
                 [100, 200, 200], [0.2, decode, decode], mode=mode)
    table = side_by_side(runs, root).set_index("policy")
    vllm = table.loc["vLLM-like"]
    assert bool(vllm["same_batches"]) and vllm["theirs_max_batch"] == 200
    assert vllm["theirs_at_end"] == pytest.approx(500 / 0.24)
    assert vllm["ours_at_end"] == pytest.approx(500 / 0.236)
    # The same batches: the two decode batches (past the profile) took 0.018 s against 0.02 s
    # and moved our last batch end 0.004 s earlier; the prefill batch took the same time.
    assert vllm["median_ratio_past_profile"] == pytest.approx(0.9)
    assert vllm["end_shift_past_profile_s"] == pytest.approx(-0.004)
    assert vllm["end_shift_within_profile_s"] == pytest.approx(0.0)
    assert not bool(table.loc["WAIT", "their_variant"])
    pricing = pricing_table(runs, root)
    linear = pricing[pricing["mode"] == "linear"].iloc[0]
    # Batch by batch: the two decode batches past 128 members took 0.019 s against 0.02 s.
    assert linear["batches_past_profile"] == 2
    assert linear["median_ratio_past_profile"] == pytest.approx(0.95)
    assert linear["median_ratio_within_profile"] == pytest.approx(1.0)
    summary = pricing_summary(pricing)
    assert summary["mode"].tolist()[0] == "linear"  # 0.95 is closer to 1 than 0.7 and 1.2


def test_a_wait_that_is_not_their_variant_is_shown_but_not_judged(tmp_path, monkeypatch):
    from replay.experiments.authors import PARTS, THEIR_FOLDER

    root = tmp_path / "data"
    _their_file(root / THEIR_FOLDER / "modified_booking_limit",
                "throughput_modified_booking_limit_limit_200_batch_size_150.csv",
                [0.1, 0.2], [150, 300])
    out = tmp_path / "b1_authors"
    _our_run(out / "runs" / "wait" / "200", "policies.wait.Wait", 200, [150, 150], [0.1, 0.1])
    (wait_part,) = [p for p in PARTS if p.quantity.startswith("WAIT: the metric at")]
    monkeypatch.setenv("KVSCHED_DATA_DIR", str(root))
    result = wait_part.result(out)
    assert result.verdict == "not measured" and "not their variant" in result.sentence


def test_their_84_files_are_the_caps_the_target_runs(data_dir):
    from replay.experiments.authors import their_batches, their_runs
    from replay.experiments.targets import AUTHORS_CAPS

    runs = their_runs(data_dir)
    assert runs.groupby("policy").size().to_dict() == {
        "Nested WAIT": 21, "Sarathi-like": 13, "WAIT": 29, "vLLM-like": 21}
    ours = {"vLLM-like": "vllm", "Sarathi-like": "sarathi", "WAIT": "wait_authors",
            "Nested WAIT": "nested_authors"}
    for label, name in ours.items():
        assert sorted(runs[runs["policy"] == label]["cap"]) == sorted(AUTHORS_CAPS[name])
    # Every vLLM run of theirs ends on the trace's 1,669,600 output tokens.
    for path in runs[runs["policy"] == "vLLM-like"]["path"]:
        assert int(their_batches(path)["members"].sum()) == 1_669_600
