"""E2: the prefix cache, measured on the Mooncake traces and on a shared-prefix workload.

Two parts, each written to its own CSV and figure:

* **Trace hit ratios** (``e2_trace_hit_ratios``). Each Mooncake FAST'25 trace in
  ``traces`` is replayed in arrival order through the block cache of
  :mod:`replay.workloads.prefix_stats` (no scheduler: every request is served the moment
  it arrives), with an unbounded cache and with each capacity of ``capacities_tokens``;
  the hit ratios by blocks and by tokens are those of ``python -m traces.stats prefix``
  (docs/workloads.md defines both). ``block_size`` defaults to the traces' 512 tokens.
* **Policies with and without the cache** (``e2_policies``). The experiment's own config
  (a shared-prefix workload, explicit KV small enough that memory binds) is replayed for
  each policy of ``policies`` at each rate of ``rates``, with ``kv.prefix_cache=none`` and
  ``block_hash``: mean latency and TTFT, preemptions, the cache's hit ratio, and the
  share of iterations whose KV peak reached the capacity (free cache entries included).

``study.quick=true`` runs ``quick_settings`` instead. Every number comes from these replays;
the Mooncake paper's own hit ratios are not compared here (see docs/reproducing/engine.md).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from replay.config import compose_config  # noqa: E402
from replay.experiments.plots.common import save_figure  # noqa: E402
from replay.run import build_engine  # noqa: E402
from replay.workloads.mooncake import MooncakeTrace  # noqa: E402
from replay.workloads.prefix_stats import prefix_cache_replay  # noqa: E402


def trace_hit_ratios(data_dir: Path, traces: list[str], capacities: list[int],
                     block_size: int) -> pd.DataFrame:
    """One row per trace and capacity (``None``: unbounded) with the replay's counts."""
    rows = []
    for name in traces:
        path = data_dir / "traces" / "mooncake" / f"{name}_trace.jsonl"
        requests = MooncakeTrace(str(path)).pool()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        for capacity in [None, *capacities]:
            stats, _ = prefix_cache_replay(requests, block_size, capacity)
            rows.append({"trace": name, **stats.as_dict(), "sha256": digest})
    return pd.DataFrame(rows)


def plot_trace_hit_ratios(table: pd.DataFrame, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for index, (name, rows) in enumerate(table.groupby("trace", sort=False)):
        color = f"C{index}"
        bounded = rows.dropna(subset=["capacity_tokens"]).sort_values("capacity_tokens")
        ax.plot(bounded["capacity_tokens"], bounded["hit_ratio_tokens"], marker="o", ms=3,
                color=color, label=f"{name}, LRU cache of that size")
        unbounded = rows[rows["capacity_tokens"].isna()]["hit_ratio_tokens"]
        if len(unbounded):
            ax.axhline(float(unbounded.iloc[0]), color=color, ls="--", lw=1,
                       label=f"{name}, unbounded")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("hit ratio (prompt tokens found cached)")
    ax.set_ylim(0, 1)
    ax.set_title(f"E2: Mooncake FAST'25 traces through a prefix cache "
                 f"({int(table['block_size'].iloc[0])}-token blocks, arrival order, "
                 f"no scheduler)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, out_dir / "e2_trace_hit_ratios.png", table)


def policy_runs(cfg: DictConfig, policies: list[str], rates: list[float],
                overrides: list[str]) -> pd.DataFrame:
    """One row per policy, rate and cache setting: the replay's headline numbers."""
    rows = []
    for policy in policies:
        for rate in rates:
            for cache in ("none", "block_hash"):
                run_cfg = compose_config([f"policy={policy}", f"data_dir={cfg.data_dir}",
                                          f"seed={cfg.seed}", *overrides,
                                          f"arrivals.rate={rate}", f"kv.prefix_cache={cache}"])
                engine = build_engine(run_cfg)[0]
                result = engine.run()
                it, req = result.iterations, result.requests
                done = req[req["completion"].notna()]
                totals = result.prefix_cache or {}
                hit_tokens, prompt_tokens = totals.get("hit_tokens"), totals.get("prompt_tokens")
                rows.append({
                    "policy": policy, "label": type(engine.policy).__name__, "rate": rate,
                    "cache": cache, "status": result.status, "n_requests": len(req),
                    "n_completed": len(done),
                    "mean_latency_s": float((done["completion"] - done["arrival"]).mean()),
                    "mean_ttft_s": float((done["first_token"] - done["arrival"]).mean()),
                    "preemptions": int(req["evictions"].sum()),
                    "kv_peak_at_capacity_share": float((it["kv_peak"] >= engine.kv.tokens).mean()),
                    "hit_ratio_tokens": (hit_tokens / prompt_tokens
                                         if prompt_tokens else None),
                    "reclaimed_blocks": totals.get("reclaimed_blocks"),
                    "kv_tokens": engine.kv.tokens})
    return pd.DataFrame(rows)


def plot_policy_runs(table: pd.DataFrame, out_dir: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for index, (policy, rows) in enumerate(table.groupby("policy", sort=False)):
        for cache, style in (("none", "--"), ("block_hash", "-")):
            line = rows[rows["cache"] == cache].sort_values("rate")
            label = f"{policy}, cache {'on' if cache == 'block_hash' else 'off'}"
            left.plot(line["rate"], line["mean_latency_s"], ls=style, marker="o", ms=3,
                      color=f"C{index}", label=label)
            right.plot(line["rate"], line["preemptions"], ls=style, marker="o", ms=3,
                       color=f"C{index}", label=label)
    left.set_ylabel("mean end-to-end latency (s)")
    right.set_ylabel("preemptions per run")
    for ax in (left, right):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.legend(fontsize=7)
    kv = int(table["kv_tokens"].iloc[0])
    left.set_title(f"E2: shared-prefix workload, {int(table['n_requests'].iloc[0])} requests, "
                   f"KV {kv:,} tokens", fontsize=9)
    return save_figure(fig, out_dir / "e2_policies.png", table)


def run_study(cfg: DictConfig, out_dir: Path, traces: list[str], capacities_tokens: list[int],
              block_size: int, policies: list[str], rates: list[float], overrides: list[str],
              quick: bool = False, quick_settings: DictConfig | None = None) -> dict:
    if quick and quick_settings is not None:
        settings = OmegaConf.to_container(quick_settings, resolve=True)
        traces = settings.get("traces", traces)
        capacities_tokens = settings.get("capacities_tokens", capacities_tokens)
        rates = settings.get("rates", rates)
        overrides = [*overrides, *settings.get("overrides", [])]
    started = time.perf_counter()
    data_dir = Path(cfg.data_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    traces_table = trace_hit_ratios(data_dir, list(traces), [int(c) for c in capacities_tokens],
                                    int(block_size))
    figures = [plot_trace_hit_ratios(traces_table, out_dir)]
    runs = policy_runs(cfg, list(policies), [float(r) for r in rates], list(overrides))
    figures.append(plot_policy_runs(runs, out_dir))
    return {"status": "completed", "figures": [f.name for f in figures],
            "trace_hit_ratios": traces_table.drop(columns="sha256").to_dict("records"),
            "policies": runs.to_dict("records"),
            "study_time_s": time.perf_counter() - started}
