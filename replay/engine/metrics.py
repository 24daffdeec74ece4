"""Summary statistics of a run, computed from its per-request and per-iteration tables."""

from __future__ import annotations

import numpy as np

from replay.engine.loop import RunResult


def summarize(result: RunResult) -> dict:
    """The headline numbers of MODEL.md §1 (latencies over completed requests).

    ``makespan`` is the end of the last executed iteration (the clock starts at
    0); throughput is generated tokens of completed requests per unit of time
    (per second, or per round under unit time). For an unfinished run every
    statistic covers the requests completed before it ended.

    ``mean_tpot``/``p99_tpot`` (time per output token) are over completed requests with
    more than one token, each request's mean gap after its first token. Time between
    tokens (TBT) statistics cover every gap between two consecutive
    tokens of one request that the engine executed: gaps of an attempt later
    discarded by a ``restart`` preemption included, and under ``recompute`` the
    stall across a preemption included (the user waits for it). ``p99_tbt`` is
    exact to the histogram's 0.1 % bin width; mean and max are exact.
    """
    req, it = result.requests, result.iterations
    done = req[req["completed"]]
    latency = done["latency"].to_numpy()
    executed = it[~it["failed"]] if len(it) else it
    makespan = float((it["start_time"] + it["duration"]).max()) if len(it) else 0.0
    tokens = float(done["output_len"].sum())

    def pct(q: float) -> float | None:
        return float(np.percentile(latency, q)) if latency.size else None

    gaps = result.token_gaps.summary(quantiles=(0.99,))
    # Time per output token of each completed request after its first (vLLM's TPOT).
    tpot = done["tbt_mean"].dropna().to_numpy()

    return {
        "status": result.status,
        "message": result.message,
        # Metrics of an unfinished run cover only the requests completed before it ended.
        "partial": result.status != "completed",
        "n_requests": int(len(req)),
        "n_completed": int(len(done)),
        "n_dropped": result.dropped,
        "tel": float(latency.sum()),
        "mean_latency": float(latency.mean()) if latency.size else None,
        "p50_latency": pct(50),
        "p99_latency": pct(99),
        "mean_ttft": float(done["ttft"].mean()) if len(done) else None,
        "p99_ttft": float(np.percentile(done["ttft"], 99)) if len(done) else None,
        "mean_tpot": float(tpot.mean()) if tpot.size else None,
        "p99_tpot": float(np.percentile(tpot, 99)) if tpot.size else None,
        "mean_tbt": gaps["mean"],
        "p99_tbt": gaps[0.99],
        "max_tbt": gaps["max"],
        "n_token_gaps": gaps["count"],
        "throughput_tokens_per_s": tokens / makespan if makespan > 0 else None,
        "throughput_requests_per_s": len(done) / makespan if makespan > 0 else None,
        "evictions": int(req["evictions"].sum()),
        "requests_evicted": int((req["evictions"] > 0).sum()),
        "makespan": makespan,
        "n_iterations": int(len(executed)),
        "n_failed_attempts": int(it["failed"].sum()) if len(it) else 0,
        "max_kv_peak": int(executed["kv_peak"].max()) if len(executed) else 0,
        "kv_capacity": result.kv.tokens,
        "kv_mode": result.kv.mode,
        "kv": result.kv.describe(),
        "livelock_window": result.livelock_window,
        "decision_time_s": result.decision_time_s,
        "n_decisions": result.decisions,
        "engine_path": result.engine_path,
        # Compiling the step loop and its rules (or loading them from the disk cache), once
        # per process; not in loop_time_s. A compiled decision is not timed apart (0 there).
        "compile_time_s": result.compile_time_s,
        "prefix_cache": prefix_cache_summary(result.prefix_cache),
        "preemption": result.preemption,
        "requeue": result.requeue,
    }


def prefix_cache_summary(totals: dict | None) -> dict | None:
    """Hit ratios of the prefix cache (None with the cache off): by blocks, the blocks
    found cached over the full prompt blocks looked up at every admission; by tokens, the
    prompt tokens taken from the cache over the prompt tokens admitted (re-admissions after
    a preemption count again). ``prefill_tokens_saved`` is the prompt tokens not computed."""
    if totals is None:
        return None
    return {"hit_ratio_blocks": totals["hit_blocks"] / totals["lookup_blocks"]
            if totals["lookup_blocks"] else None,
            "hit_ratio_tokens": totals["hit_tokens"] / totals["prompt_tokens"]
            if totals["prompt_tokens"] else None,
            "prefill_tokens_saved": totals["hit_tokens"], **totals}
