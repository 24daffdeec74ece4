"""The capacity check of the B scenarios: the fluid model's stability boundary next to the
rate at which each policy saturates in simulation.

For every scenario (a B experiment), the fluid model of the refitted linear timing
(``model.linear_timing``, :func:`replay.fluid.model.linear_coefficients`) gives the load
at the scenario's own rate and the **boundary rate**, the total rate at which the load
reaches 1 (:func:`replay.fluid.model.stability_boundary`). Each policy is then replayed
under the experiment's own timing (``timing=vidur`` for the B setups) at rates that are
fractions of that boundary, each at two horizons (``horizons``: seconds of arrivals).
A run is **stable in simulation** when it completes and its mean queueing delay
(arrival to first iteration) at the long horizon is at most ``growth_limit`` times the
short one's (with a floor of ``delay_floor`` seconds, below which any growth is noise):
past saturation the backlog, and so the delay, grows with the horizon.

Every point runs once per entry of ``timings`` (name -> overrides): the scenario's own
timing (``vidur``) and the linear model the fluid analysis is built on (``linear``). Where
the two saturate apart, the gap between the fluid boundary and the measured saturation is
the linear model's error at the scenario's shapes; where they agree, the timing model is
not the cause. One factor varied alone.

Writes ``capacity.csv`` (one row per scenario, policy, timing, rate and horizon pair),
``capacity_summary.csv`` (per scenario, policy and timing: fluid boundary rate, the
measured saturation interval, and every rate the fluid model calls stable that was
unstable in simulation), ``capacity.png`` (delay growth against rate / boundary rate) and
``summary.json``. ``study.quick=true`` runs ``quick_settings`` instead (seconds).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from policies.labels import policy_label  # noqa: E402
from replay.config import compose_config  # noqa: E402
from replay.errors import ConfigError, InputError  # noqa: E402
from replay.experiments.plots.common import legend_beside, save_figure  # noqa: E402
from replay.experiments.studies.fluid_benchmark import scenario_types  # noqa: E402
from replay.fluid.model import (  # noqa: E402
    COEFFICIENTS,
    TypeMix,
    equilibrium,
    linear_coefficients,
    stability_boundary,
)
from replay.run import build_and_run  # noqa: E402
from replay.storage.outputs import atomic_write_text  # noqa: E402

log = logging.getLogger(__name__)


#: The largest rate tested, as a multiple of the fluid boundary rate (past saturation a
#: run's backlog, and so its memory, grows with the rate).
MAX_FRACTION = 10.0


def fluid_figures(experiment: str, data_dir: str) -> dict:
    """The fluid load at the scenario's own rate and its boundary rate."""
    types, _ = scenario_types(experiment, data_dir)
    cfg = compose_config([f"experiment={experiment}", f"data_dir={data_dir}"])
    c = linear_coefficients(cfg)
    d = {k: c[k] for k in COEFFICIENTS}
    mix = TypeMix.from_types(types)
    eq = equilibrium(mix, **d)
    total = float(mix.rate.sum())
    scale = stability_boundary(mix, d["d1"], d["d2"], d["d3"], d["d4"])
    return {"experiment": experiment, "own_rate": total, "fluid_load": eq["load"],
            "fluid_stable": bool(eq["stable"]), "boundary_rate": total * scale,
            "load_terms": eq["load_terms"], "coefficients": c,
            "typed": "types" in cfg.workload}


def run_point(experiment: str, policy: str, rate: float, horizon: float, typed: bool,
              data_dir: str, seed: int, overrides: list[str],
              vidur_cache: str | None = None) -> dict:
    """One replay of ``experiment`` with ``policy`` at total ``rate`` for ``horizon`` seconds;
    a Vidur timing reads its predictor from ``vidur_cache`` (the study's own) when given."""
    if typed:
        load = ["workload.load=null", f"workload.total_rate={rate}",
                f"workload.duration_s={horizon}"]
    else:  # a trace with Poisson arrivals (B4): as many requests as the horizon holds
        load = [f"arrivals.rate={rate}", f"workload.n={max(1, round(rate * horizon))}"]
    cfg = compose_config([f"experiment={experiment}", f"paper_policy={policy}",
                          f"data_dir={data_dir}", f"seed={seed}", *load, *overrides])
    if vidur_cache and "cache_dir" in cfg.timing:  # not every timing has one (linear)
        cfg.timing.cache_dir = vidur_cache
    try:
        result, _, _ = build_and_run(cfg)
    except (InputError, InstantiationException) as exc:  # e.g. no thresholds meet (11)
        return {"status": "refused", "message": str(exc).splitlines()[0]}
    done = result.requests
    delay = (done["start"] - done["arrival"]).to_numpy(float)
    end = float((result.iterations["start_time"] + result.iterations["duration"]).max()) \
        if len(result.iterations) else math.nan
    return {"status": result.status, "message": result.message,
            "requests": len(done), "mean_queueing_delay": float(np.nanmean(delay)),
            "max_queueing_delay": float(np.nanmax(delay)),
            "evictions": int(done["evictions"].sum()),
            "throughput": float(done["tokens_generated"].sum()) / end if end > 0 else math.nan}


def sweep(scenarios: dict, fractions: list[float], horizons: list[float], data_dir: str,
          seed: int, overrides: list[str], growth_limit: float,
          delay_floor: float, timings: dict[str, list[str]],
          vidur_cache: str | None = None) -> tuple[pd.DataFrame, dict]:
    short, long = sorted(horizons)
    rows, fluid = [], {}
    for experiment, spec in scenarios.items():
        fig = fluid_figures(experiment, data_dir)
        fluid[experiment] = fig
        log.info("capacity: %s: fluid load %.3g at %.4g req/s, boundary %.4g req/s", experiment,
                 fig["fluid_load"], fig["own_rate"], fig["boundary_rate"])
        for policy, (timing, timing_overrides), fraction in itertools.product(
                spec["policies"], timings.items(), fractions):
            rate = fraction * fig["boundary_rate"]
            runs = {h: run_point(experiment, policy, rate, h, fig["typed"], data_dir, seed,
                                 [*overrides, *timing_overrides], vidur_cache)
                    for h in (short, long)}
            growth = (max(runs[long].get("mean_queueing_delay", math.inf), delay_floor)
                      / max(runs[short].get("mean_queueing_delay", math.inf), delay_floor))
            completed = all(r["status"] == "completed" for r in runs.values())
            stable = completed and growth <= growth_limit
            rows.append({"scenario": experiment, "policy": policy, "timing": timing,
                         "fraction": fraction,
                         "rate": rate, "fluid_load_at_rate": fraction,
                         "fluid_stable": fraction < 1, "short_horizon": short,
                         "long_horizon": long, "delay_growth": growth,
                         "stable_in_simulation": stable,
                         **{f"{k}_short": v for k, v in runs[short].items()},
                         **{f"{k}_long": v for k, v in runs[long].items()}})
            log.info("capacity: %s %s, %s timing, at %.3g x boundary (%.4g req/s): delay "
                     "growth %.3g, %s", experiment, policy, timing, fraction, rate, growth,
                     "stable" if stable else "unstable")
    return pd.DataFrame(rows), fluid


def summarize(table: pd.DataFrame, fluid: dict) -> pd.DataFrame:
    rows = []
    for (experiment, policy, timing), part in table.groupby(["scenario", "policy", "timing"],
                                                            sort=False):
        part = part.sort_values("rate")
        unstable = part[~part["stable_in_simulation"]]
        first_unstable = float(unstable["rate"].iloc[0]) if len(unstable) else math.inf
        below = part[part["rate"] < first_unstable]
        f = fluid[experiment]
        lies = part[part["fluid_stable"] & ~part["stable_in_simulation"]]
        rows.append({"scenario": experiment, "policy": policy,
                     "label": _policy_label(experiment, str(policy)), "timing": timing,
                     "own_rate": f["own_rate"],
                     "fluid_load_at_own_rate": f["fluid_load"],
                     "fluid_label_at_own_rate": "stable" if f["fluid_stable"] else "unstable",
                     "fluid_boundary_rate": f["boundary_rate"],
                     "saturation_above": float(below["rate"].max()) if len(below) else 0.0,
                     "saturation_below": first_unstable,
                     "saturation_above_over_boundary": (float(below["fraction"].max())
                                                        if len(below) else 0.0),
                     "fluid_stable_but_unstable_in_simulation": lies["fraction"].tolist()})
    return pd.DataFrame(rows)


def _policy_label(experiment: str, policy: str) -> str:
    """The legend label of a ``paper_policy`` option as ``experiment`` composes it."""
    try:
        return policy_label(compose_config([f"experiment={experiment}",
                                            f"paper_policy={policy}"]).policy)
    except Exception:  # noqa: BLE001 - a label is not worth failing the figure
        return policy


def plot(table: pd.DataFrame, growth_limit: float, out: Path) -> Path:
    """Per scenario: how much the mean queueing delay grows from the short to the long
    horizon vs the rate as a fraction of the fluid boundary, one line per policy and timing
    (a color per policy, a line style per timing). Points
    without a finite growth (a refused or unfinished run) are counted in the legend; a
    panel without any finite point is replaced by a note."""
    scenarios = list(dict.fromkeys(table["scenario"]))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.6 * len(scenarios), 3.9),
                             squeeze=False)
    for ax, experiment in zip(axes.flat, scenarios, strict=True):
        part = table[table["scenario"] == experiment]
        ax.set_title(experiment, fontsize=9)
        growth_all = part["delay_growth"].replace([np.inf, -np.inf], np.nan)
        if not (growth_all > 0).any():
            ax.text(0.5, 0.5, "no rate gave a finite, positive\ndelay growth (see the CSV)",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        colors = {}
        for (policy, timing), rows in part.groupby(["policy", "timing"], sort=False):
            rows = rows.sort_values("fraction")
            growth = rows["delay_growth"].replace([np.inf, -np.inf], np.nan)
            label = f"{_policy_label(experiment, str(policy))}, {timing} timing"
            missing = int(growth.isna().sum())
            if missing:
                label += f" ({missing} of {len(rows)} rates without a finite growth)"
            # One color per policy, one line style per timing.
            style = "o-" if timing == part["timing"].iloc[0] else "s--"
            line = ax.plot(rows["fraction"], growth, style, ms=3, label=label,
                           color=colors.get(policy))
            colors.setdefault(policy, line[0].get_color())
        ax.axvline(1.0, color="gray", ls=":", label="fluid boundary (load 1)")
        ax.axhline(growth_limit, color="red", ls="--", lw=0.8,
                   label=f"growth limit ({growth_limit:g}x): above it, unstable")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2, 5 x 10^k, no others
            axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("arrival rate / fluid boundary rate (load)")
        ax.set_ylabel("mean queueing delay, long / short horizon (x)")
        legend_beside(ax, fontsize=6)
    return save_figure(fig, out, table)


def run_study(cfg: DictConfig, out_dir: Path, scenarios: dict, fractions: list,
              horizons: list, growth_limit: float, delay_floor: float, timings: dict,
              seed: int = 0, overrides: list | None = None, quick: bool = False,
              quick_settings: dict | None = None) -> dict:
    started = time.perf_counter()  # the study's whole time, as a replay records it
    def plain(value):
        return OmegaConf.to_container(value, resolve=True) if isinstance(
            value, DictConfig | ListConfig) else value

    settings = {"scenarios": plain(scenarios), "fractions": plain(fractions),
                "horizons": plain(horizons), "overrides": list(plain(overrides) or []),
                "timings": {name: [str(o) for o in (extra or [])]
                            for name, extra in plain(timings).items()}}
    if quick:
        q = dict(plain(quick_settings) or {})
        settings.update(q)
    if not settings["timings"]:
        raise ConfigError("study.timings: name at least one timing (e.g. vidur: [])")
    # The rates imply how many requests each run holds: bound them before any run (each
    # run's own guards bound the requests a horizon implies).
    bad = [f for f in settings["fractions"] if not 0 < float(f) <= MAX_FRACTION]
    if bad:
        raise ConfigError(f"study.fractions: {bad[0]} is not allowed: each fraction of the "
                          f"fluid boundary rate must be > 0 and <= {MAX_FRACTION:g}")
    if len(settings["horizons"]) != 2 or not all(float(h) > 0 for h in settings["horizons"]):
        raise ConfigError(f"study.horizons: need two horizons > 0 (seconds), got "
                          f"{settings['horizons']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    table, fluid = sweep(settings["scenarios"], [float(f) for f in settings["fractions"]],
                         [float(h) for h in settings["horizons"]], str(cfg.data_dir), int(seed),
                         [str(o) for o in settings["overrides"]], float(growth_limit),
                         float(delay_floor), settings["timings"],
                         # the study's own Vidur cache serves every run
                         cfg.timing.get("cache_dir"))
    table.to_csv(out_dir / "capacity.csv", index=False)
    summary_table = summarize(table, fluid)
    summary_table.to_csv(out_dir / "capacity_summary.csv", index=False)
    plot(table, float(growth_limit), out_dir / "capacity.png")
    summary = {"study": "capacity", "quick": bool(quick), "settings": settings,
               "growth_limit": growth_limit, "delay_floor": delay_floor, "fluid": fluid,
               "summary": summary_table.to_dict(orient="records"),
               "config": OmegaConf.to_container(cfg, resolve=True)}
    summary["wall_time_s"] = time.perf_counter() - started
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary
