"""Outputs pinned by hash: engine changes must leave existing results identical.

The hashes were computed with the engine as it was before the preemption modes,
the requeue option and the TBT metrics existed (commit 934df86). Under the
defaults (``engine.preemption=restart``, ``engine.requeue=front``) every column
that existed then must be unchanged, bit for bit. New columns are not pinned.
If a deliberate change of semantics moves a pin, say so in the commit message.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from replay.config import compose_config
from replay.run import build_and_run

REQUEST_COLUMNS = ["request_id", "source_row", "arrival", "prompt_len", "output_len", "start",
                   "first_token", "completion", "evictions", "tokens_generated", "latency",
                   "ttft", "completed"]
ITERATION_COLUMNS = ["start_time", "duration", "batch_size", "n_started", "prefill_tokens",
                     "decode_requests", "kv_peak", "kv_after", "n_completed", "n_evicted",
                     "failed"]
#: The pins were taken with the 3-term linear model of Llama-2-70B on 2 x A100 that the
#: refit (d0..d4) replaced; they pin the engine, so they keep those coefficients (and show
#: that d3 = d4 = 0 prices exactly as the old model did).
OLD = [f"model.linear_timing.a100x2.{k}={v}" for k, v in
       (("d0", 0.05554), ("d1", 3.638e-07), ("d2", 0.0003193), ("d3", 0), ("d4", 0))]
SMALL = ["arrivals.rate=50", "workload.n=600", "kv.tokens=3000", *OLD]

PINNED = {
    "fcfs_linear_50": (["policy=fcfs", *SMALL], "completed",
                       "7b07c97bf23f4a67", "63869e5a001c9928"),
    "mcsf_linear_50": (["policy=mcsf", *SMALL], "completed",
                       "b210341e7ca71d6e", "d5d993ea250c0cd8"),
    "protection_linear_50": (["policy=protection", "policy.alpha=0.3", *SMALL], "livelock",
                             "2b2da43699fbc9b4", "33a20cdddfb390c9"),
    "clearing_linear_50": (["policy=clearing", *SMALL, "seed=3"], "completed",
                           "05809406310e4af1", "68af619c3f077da3"),
    "mcsf_unit_rounds": (["policy=mcsf", "timing=unit", "arrivals=poisson_rounds",
                          "arrivals.rate=3", "arrivals.horizon=60", "workload=synthetic",
                          "kv.tokens=100"], "completed", "b4317568e46363d3", "a89c59399d10333f"),
    "fcfs_paged": (["policy=fcfs", "arrivals.rate=50", "workload.n=400", "kv.tokens=4200",
                    "kv.block_size=16", *OLD], "completed", "757547876468d36c", "0745edd0e9974c4d"),
    # Pinned before MC-SF kept its order across steps (policies.common.ordering): evicted requests
    # rejoin the order (noisy predictions, 366 evictions), and a long overloaded queue.
    "mcsf_noisy_evictions": (["policy=mcsf", "prediction=noisy", "prediction.sigma=1", *SMALL],
                             "completed", "fd8d7f4acc72b9b5", "7e1ec4bbb7973797"),
    "mcsf_overloaded": (["policy=mcsf", "arrivals.rate=200", "workload.n=3000",
                         "kv.tokens=3000", *OLD], "completed",
                        "d55ca89b1cb1663b", "6b09b87efcf45d81"),
}


#: Pinned before the engine's faster core (preallocated waiting queue, decode-only fast
#: path): every column of both tables, and the token-gap histogram's count and mean.
#: They cover what the older pins do not: paged recompute preemption (vLLM-like), chunked
#: prefill (Sarathi-like), ``requeue=back`` with recompute, and Vidur timing on LMSYS.
PINNED_WHOLE = {
    "vllm_recompute": (["policy=vllm", "arrivals.rate=50", "workload.n=600", "kv.tokens=4000",
                        *OLD],
                       "f19a31cfa8b96393", "ef37398fcac4ed14", 44570, 0.07978448508678938),
    "sarathi_chunks": (["policy=sarathi", "arrivals.rate=50", "workload.n=600",
                        "kv.tokens=4000", *OLD],
                       "aec24b0476d7ff9c", "c5615ff414f0a8cd", 44570, 0.07750802184317254),
    "mcsf_requeue_back": (["policy=mcsf", "prediction=noisy", "prediction.sigma=1", *SMALL,
                           "engine.requeue=back", "engine.preemption=recompute"],
                          "225bf16e5a538b02", "b7223caad29d3c6b", 44570, 0.08412398025277089),
    "mcsf_vidur_lmsys": (["policy=mcsf", "timing=vidur", "workload=lmsys", "arrivals.rate=20",
                          "workload.n=500", "kv.tokens=5000"],
                         "59e33523c2195c97", "a5a923d68a222279", 46299, 0.06707864781871534),
}


def digest(frame: pd.DataFrame) -> str:
    rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return hashlib.sha256(rows.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("name", PINNED)
def test_default_semantics_reproduce_pinned_outputs(name):
    overrides, status, requests_hash, iterations_hash = PINNED[name]
    result, _, _ = build_and_run(compose_config(overrides))
    assert result.status == status
    assert digest(result.requests[REQUEST_COLUMNS]) == requests_hash
    assert digest(result.iterations[ITERATION_COLUMNS]) == iterations_hash


@pytest.mark.parametrize("name", PINNED_WHOLE)
def test_engine_core_reproduces_whole_tables(name):
    overrides, requests_hash, iterations_hash, gap_count, gap_mean = PINNED_WHOLE[name]
    result, _, _ = build_and_run(compose_config(overrides))
    assert result.status == "completed"
    assert digest(result.requests) == requests_hash
    assert digest(result.iterations) == iterations_hash
    gaps = result.token_gaps.summary()
    assert (gaps["count"], gaps["mean"]) == (gap_count, gap_mean)
