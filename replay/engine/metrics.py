"""Summary statistics of a run, computed from its per-request and per-iteration tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replay.engine.loop import RunResult
from replay.errors import ConfigError


@dataclass(frozen=True)
class SLO:
    """Service-level objectives per request (``metrics.slo`` in the config), in milliseconds
    of the run's clock: a request meets them when it completed, its TTFT is at most
    ``ttft_ms`` and its TPOT (mean time per output token after the first) at most
    ``tpot_ms``. ``None`` leaves that objective out (a request with one output token has
    no TPOT and meets a TPOT objective)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for key in ("ttft_ms", "tpot_ms"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, int | float) or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"metrics.slo.{key}={value!r} is not allowed: it must be a "
                                  f"number of milliseconds > 0, or null (no objective)")

    @classmethod
    def of(cls, node: Mapping | None) -> SLO | None:
        """The objectives of a ``metrics.slo`` node; ``None`` when it sets none."""
        node = dict(node or {})
        unknown = sorted(set(node) - {"ttft_ms", "tpot_ms"})
        if unknown:
            raise ConfigError(f"metrics.slo.{unknown[0]} is not an objective (there are "
                              f"metrics.slo.ttft_ms and metrics.slo.tpot_ms)")
        slo = cls(node.get("ttft_ms"), node.get("tpot_ms"))
        return None if slo.ttft_ms is None and slo.tpot_ms is None else slo

    def met(self, requests: pd.DataFrame) -> pd.DataFrame:
        """Per request (rows of a request table): whether it meets each objective and both."""
        done = requests["completed"].to_numpy(bool)
        ttft = requests["ttft"].to_numpy(float) * 1e3
        tpot = requests["tbt_mean"].to_numpy(float) * 1e3
        ttft_ok = done & (ttft <= self.ttft_ms if self.ttft_ms is not None else True)
        # A request with one output token has no TPOT (NaN): it meets a TPOT objective.
        tpot_ok = done & (~(tpot > self.tpot_ms) if self.tpot_ms is not None else True)
        return pd.DataFrame({"meets_ttft": ttft_ok, "meets_tpot": tpot_ok,
                             "meets_slo": ttft_ok & tpot_ok}, index=requests.index)


def slo_summary(requests: pd.DataFrame, makespan: float, slo: SLO) -> dict:
    """SLO attainment (the share of all requests meeting the objectives: an unfinished or
    dropped request misses them) and goodput (requests meeting both per unit of time)."""
    met = slo.met(requests)
    n = len(requests)

    def share(column: str) -> float | None:
        return float(met[column].sum()) / n if n else None

    good = int(met["meets_slo"].sum())
    return {"slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "slo_attainment": share("meets_slo"), "slo_ttft_attainment": share("meets_ttft"),
            "slo_tpot_attainment": share("meets_tpot"), "n_slo_met": good,
            "goodput_requests_per_s": good / makespan if makespan > 0 else None}


#: The percentiles a summary reports by default (``output.percentiles``), as vLLM's benchmark
#: reports median and P99 and people compare P90 too.
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
#: Percentiles every summary holds whatever is chosen, so that its keys stay comparable.
ALWAYS_PERCENTILES = (50.0, 99.0)
#: The distributions a summary reports a mean and percentiles of: end-to-end latency, time to
#: first token, time per output token and the gap between consecutive tokens (vLLM's E2EL,
#: TTFT, TPOT and ITL).
DISTRIBUTIONS = ("latency", "ttft", "tpot", "tbt")


def percentile_key(q: float) -> str:
    """The summary key prefix of percentile ``q``: ``p50``, ``p99``, ``p99.9``."""
    return f"p{q:g}"


def summarize(result: RunResult, slo: SLO | None = None,
              percentiles: Iterable[float] | None = None) -> dict:
    """The headline numbers of a run (docs/model.md#metrics-in-one-paragraph; every field is
    listed in docs/metrics.md), latencies over completed requests.

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

    Each distribution of :data:`DISTRIBUTIONS` has its mean and, for every percentile of
    ``percentiles`` (``None``: :data:`DEFAULT_PERCENTILES`) and of
    :data:`ALWAYS_PERCENTILES`, a key ``p<q>_<name>`` (``p90_ttft``; the median is
    ``p50_``). ``total_input_tokens`` and ``total_output_tokens`` are the prompt
    and output tokens of completed requests (vLLM's totals over successful requests), and
    ``throughput_total_tokens_per_s`` their sum per unit of time.

    With ``slo`` (:class:`SLO`) the summary adds its attainment and goodput
    (:func:`slo_summary`).
    """
    req, it = result.requests, result.iterations
    done = req[req["completed"]]
    latency = done["latency"].to_numpy()
    executed = it[~it["failed"]] if len(it) else it
    makespan = float((it["start_time"] + it["duration"]).max()) if len(it) else 0.0
    tokens = float(done["output_len"].sum())
    input_tokens = int(done["prompt_len"].sum())
    chosen = DEFAULT_PERCENTILES if percentiles is None else percentiles
    quantiles = tuple(sorted({*ALWAYS_PERCENTILES, *map(float, chosen)}))

    gaps = result.token_gaps.summary(quantiles=tuple(q / 100 for q in quantiles))
    # Time per output token of each completed request after its first (vLLM's TPOT).
    tpot = done["tbt_mean"].dropna().to_numpy()
    samples = {"latency": latency, "ttft": done["ttft"].to_numpy(float), "tpot": tpot}

    def spread(name: str) -> dict:
        """The mean and percentiles of one distribution (the token gaps from their histogram,
        the rest over completed requests)."""
        if name == "tbt":
            return {"mean_tbt": gaps["mean"],
                    **{f"{percentile_key(q)}_tbt": gaps[q / 100] for q in quantiles}}
        values = samples[name]
        return {f"mean_{name}": float(values.mean()) if values.size else None,
                **{f"{percentile_key(q)}_{name}": float(np.percentile(values, q))
                   if values.size else None for q in quantiles}}

    summary = {
        "status": result.status,
        "message": result.message,
        # Metrics of an unfinished run cover only the requests completed before it ended.
        "partial": result.status != "completed",
        "n_requests": int(len(req)),
        "n_completed": int(len(done)),
        "n_dropped": result.dropped,
        "tel": float(latency.sum()),
        **{key: value for name in DISTRIBUTIONS for key, value in spread(name).items()},
        "max_tbt": gaps["max"],
        "n_token_gaps": gaps["count"],
        "throughput_tokens_per_s": tokens / makespan if makespan > 0 else None,
        "throughput_requests_per_s": len(done) / makespan if makespan > 0 else None,
        "total_input_tokens": input_tokens,
        "total_output_tokens": int(tokens),
        "throughput_total_tokens_per_s": (input_tokens + tokens) / makespan
        if makespan > 0 else None,
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
    if slo is not None:
        summary.update(slo_summary(req, makespan, slo))
    return summary


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
