"""Capacity under service-level objectives: the highest arrival rate at which at least a
``target`` share of requests (90 % by default) meets the experiment's ``metrics.slo``.

The experiment's config is replayed at arrival rates chosen by bisection between
``rate_low`` and ``rate_high`` (``arrivals.rate``), each rate once per seed of ``seeds``
(the workload's lengths and the arrival times are drawn again per seed); a rate's
attainment is the share of all its requests, over the seeds, that meet both objectives
(:class:`replay.engine.metrics.SLO`). The search first checks the two ends, then halves
the interval between the highest rate that met the target and the lowest that did not,
until it is narrower than ``tolerance`` (relative to its lower end) or ``max_runs`` rates
have been replayed. The capacity is the highest rate that met the target; the interval to
the next rate tested that did not says how sharp that is.

Bisection assumes attainment falls as the rate grows. A replay's attainment is a sample
(one draw of lengths and arrivals per seed), so near the capacity it need not be
monotone: ``slo_capacity.csv`` keeps every rate tested, and ``monotone`` in the summary
says whether a higher rate ever met the target after a lower one missed it.

Writes ``slo_capacity.csv`` (one row per rate and seed: attainment of each objective and
both, goodput, status), ``slo_capacity.png`` (attainment against rate, the target and the
capacity) and ``summary.json``. ``study.quick=true`` runs ``quick_settings`` instead.
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from replay.engine.metrics import SLO, slo_summary  # noqa: E402
from replay.errors import ConfigError  # noqa: E402
from replay.experiments.plots.common import save_figure  # noqa: E402
from replay.run import build_and_run  # noqa: E402

#: The most rates one search may replay (each rate runs once per seed).
MAX_RUNS = 64


def replay_rate(cfg: DictConfig, rate: float, seed: int, slo: SLO) -> dict:
    """One replay of ``cfg`` at ``rate`` with ``seed``: its SLO record and status."""
    run_cfg = cfg.copy()
    OmegaConf.update(run_cfg, "arrivals.rate", float(rate))
    OmegaConf.update(run_cfg, "seed", int(seed))
    result, _, _ = build_and_run(run_cfg)
    it = result.iterations
    makespan = float((it["start_time"] + it["duration"]).max()) if len(it) else 0.0
    record = slo_summary(result.requests, makespan, slo)
    return {"rate": float(rate), "seed": int(seed), "status": result.status,
            "n_requests": len(result.requests), "n_slo_met": record["n_slo_met"],
            "slo_attainment": record["slo_attainment"],
            "slo_ttft_attainment": record["slo_ttft_attainment"],
            "slo_tpot_attainment": record["slo_tpot_attainment"],
            "goodput_requests_per_s": record["goodput_requests_per_s"]}


def search(attainment_at, rate_low: float, rate_high: float, target: float, tolerance: float,
           max_runs: int) -> dict:
    """Bisection for the highest rate whose attainment (``attainment_at(rate)``) is at least
    ``target``: ``capacity`` (None if even ``rate_low`` misses), ``next_rate`` (the lowest
    rate tested above it that missed; None if ``rate_high`` met it) and the rates tested."""
    tested = {}

    def meets(rate: float) -> bool:
        tested[rate] = attainment_at(rate)
        return tested[rate] >= target

    if not meets(rate_low):
        return {"capacity": None, "next_rate": rate_low, "tested": tested}
    if meets(rate_high):
        return {"capacity": rate_high, "next_rate": None, "tested": tested}
    low, high = rate_low, rate_high
    while len(tested) < max_runs and high - low > tolerance * low:
        middle = (low + high) / 2
        if meets(middle):
            low = middle
        else:
            high = middle
    return {"capacity": low, "next_rate": high, "tested": tested}


def plot(table: pd.DataFrame, target: float, capacity: float | None, title: str,
         out: Path) -> Path:
    per_rate = table.groupby("rate", as_index=False)[["n_slo_met", "n_requests"]].sum()
    per_rate["attainment"] = per_rate["n_slo_met"] / per_rate["n_requests"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(per_rate["rate"], per_rate["attainment"], "o-", label="requests meeting the SLO")
    ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.0%}")
    if capacity is not None:
        ax.axvline(capacity, color="C2", ls=":", label=f"capacity {capacity:.3g} requests/s")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out, per_rate)


def run_study(cfg: DictConfig, out_dir: Path, rate_low: float, rate_high: float,
              target: float = 0.9, tolerance: float = 0.05, max_runs: int = 12,
              seeds: list | None = None, quick: bool = False,
              quick_settings: dict | None = None) -> dict:
    started = time.perf_counter()
    settings = {"rate_low": rate_low, "rate_high": rate_high, "target": target,
                "tolerance": tolerance, "max_runs": max_runs,
                "seeds": list(seeds) if seeds is not None else [0]}
    if quick:
        extra = quick_settings or {}
        settings.update(OmegaConf.to_container(extra, resolve=True)
                        if isinstance(extra, DictConfig | ListConfig) else extra)
    slo = SLO.of((cfg.get("metrics") or {}).get("slo"))
    if slo is None:
        raise ConfigError("study slo_capacity needs an objective: set metrics.slo.ttft_ms "
                          "and/or metrics.slo.tpot_ms")
    low, high = float(settings["rate_low"]), float(settings["rate_high"])
    if not 0 < low < high:
        raise ConfigError(f"study.rate_low={low} and study.rate_high={high}: need "
                          f"0 < rate_low < rate_high (requests/s)")
    if not 0 < float(settings["target"]) <= 1:
        raise ConfigError(f"study.target={settings['target']}: a share of requests in (0, 1]")
    if not 0 < float(settings["tolerance"]) < 1:
        raise ConfigError(f"study.tolerance={settings['tolerance']}: a fraction in (0, 1)")
    if not 2 <= int(settings["max_runs"]) <= MAX_RUNS:
        raise ConfigError(f"study.max_runs={settings['max_runs']}: between 2 and {MAX_RUNS}")
    rows = []

    def attainment_at(rate: float) -> float:
        found = [replay_rate(cfg, rate, seed, slo) for seed in settings["seeds"]]
        rows.extend(found)
        return sum(r["n_slo_met"] for r in found) / sum(r["n_requests"] for r in found)

    result = search(attainment_at, low, high, float(settings["target"]),
                    float(settings["tolerance"]), int(settings["max_runs"]))
    table = pd.DataFrame(rows).sort_values(["rate", "seed"]).reset_index(drop=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "slo_capacity.csv", index=False)
    ordered = sorted(result["tested"].items())
    met = [a >= float(settings["target"]) for _, a in ordered]
    monotone = all(not (later and not earlier)
                   for earlier, later in zip(met, met[1:], strict=False))
    title = (f"{cfg.policy._target_.rsplit('.', 1)[-1]}, {cfg.model.name} on {cfg.hardware.name},"
             f" {cfg.timing._target_.rsplit('.', 1)[-1]}; SLO: TTFT <= {slo.ttft_ms} ms, "
             f"TPOT <= {slo.tpot_ms} ms")
    plot(table, float(settings["target"]), result["capacity"], title,
         out_dir / "slo_capacity.png")
    return {"study": "slo_capacity", "quick": bool(quick), "settings": settings,
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "capacity_requests_per_s": result["capacity"], "next_rate": result["next_rate"],
            "attainment_by_rate": {str(r): a for r, a in ordered}, "monotone": monotone,
            "n_runs": len(rows), "wall_time_s": time.perf_counter() - started}
