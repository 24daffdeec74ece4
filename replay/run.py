"""Build a replay from a resolved config, run it, and write its outputs.

A run is a pure function of its config: the seed is split into independent
streams for the workload, the arrival process and the engine, and everything
a result depends on (resolved config, input files with hashes, package
versions) is written next to it.
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from replay.config import register_resolvers
from replay.engine.loop import Engine, RunResult
from replay.engine.metrics import SLO, summarize
from replay.engine.requests import RequestError, Requests
from replay.errors import ConfigError, LimitError
from replay.fluid.model import TypeMix, equilibrium, linear_coefficients, stability_boundary
from replay.storage.outputs import (
    TABLES,
    atomic_write,
    read_summary,
    stale_reason,
    write_summary,
)
from replay.workloads.prediction import error_summary, predict

log = logging.getLogger(__name__)


RECORDED_PACKAGES = ("kvsched", "numpy", "pandas", "pyarrow", "hydra-core", "omegaconf",
                     "scipy", "highspy", "ortools", "scikit-learn", "vidur")


def package_versions() -> dict[str, str]:
    """The versions of the packages a run's results depend on (a copy: the summary's own)."""
    return dict(_loaded_package_versions())


@functools.cache
def _loaded_package_versions() -> dict[str, str]:
    # Read once per process: the code that runs is what was imported at its start (a sweep
    # worker runs hundreds of jobs; reading the metadata costs tens of milliseconds).
    versions = {"python": platform.python_version()}
    for name in RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


#: The most requests one replay may draw (each costs a few hundred bytes through the run and
#: its tables); ``+limits.max_requests=N`` raises it.
MAX_REQUESTS = 20_000_000


def expected_requests(workload, arrivals) -> tuple[float, str] | None:
    """How many requests a run will draw, estimated from the config alone, and the keys
    that set it (``None``: the count is a file's rows, already in memory)."""
    if getattr(arrivals, "sets_count", False) and hasattr(arrivals, "expected_requests"):
        return arrivals.expected_requests()
    if hasattr(workload, "expected_requests"):
        return workload.expected_requests()
    n = getattr(workload, "n", None)
    return (float(n), "workload.n") if isinstance(n, int | float) else None


def guard_requests(workload, arrivals, limit: float = MAX_REQUESTS) -> None:
    """Refuse a run whose estimated request count is beyond ``limit``, before drawing it."""
    estimate = expected_requests(workload, arrivals)
    if estimate is None:
        return
    count, keys = estimate
    if not count <= limit:  # also NaN
        raise LimitError(f"this run would draw ~{count:.3g} requests (limit {limit:.3g}); it "
                         f"follows from {keys}: lower it (or raise +limits.max_requests=N)")


def make_requests(workload, arrivals, seed: int, time_unit: str,
                  workload_seed: int | None = None,
                  max_requests: float = MAX_REQUESTS) -> Requests:
    """Draw the request lengths and their arrival times from independent seeded streams.

    The lengths come from ``workload_seed`` when given (``None``: ``seed``), so that a
    study can keep one request set and re-draw only the arrivals (A4: see
    docs/reproducing/mcsf.md#a4-spread-over-seeds).
    The expected number of requests is checked against ``max_requests`` first
    (:func:`guard_requests`), so an absurd rate or ``n`` is an error, not an allocation.
    """
    if getattr(workload, "defines_arrivals", False) and not getattr(
            arrivals, "replays_workload_times", False):
        raise ConfigError(f"workload {workload.name} generates its own arrival times (Poisson "
                          f"per type); run it with arrivals=trace")
    guard_requests(workload, arrivals, max_requests)
    length_stream, arrival_stream = np.random.SeedSequence([seed, 0xA7]).spawn(2)
    if workload_seed is not None:
        length_stream = np.random.SeedSequence([workload_seed, 0xA7]).spawn(2)[0]
    workload_rng = np.random.default_rng(length_stream)
    arrival_rng = np.random.default_rng(arrival_stream)
    if arrivals.sets_count:
        times = arrivals.sample(arrival_rng, None)
        requests = workload.sample(workload_rng, n=len(times))
    else:
        requests = workload.sample(workload_rng)
        times = arrivals.sample(arrival_rng, len(requests), requests.arrival)
    if time_unit == "rounds" and not np.all(np.mod(times, 1) == 0):
        raise RequestError(f"arrivals: {type(arrivals).__name__} gives times between whole "
                           f"rounds, and a unit-time replay (timing=unit) counts in rounds; use "
                           f"arrivals=all_at_once or arrivals=poisson_rounds")
    return requests.with_arrivals(times)


def with_predictions(requests: Requests, predictor, kv_tokens: int, seed: int) -> Requests:
    """Fill the predicted intervals (:mod:`replay.workloads.prediction`) from the predictor's own
    seeded stream, so that the lengths and arrivals do not depend on the predictor."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB2]))
    lo, hi = predict(predictor, requests.prompt_len, requests.output_len, kv_tokens, rng)
    return replace(requests, predicted_lo=lo, predicted_hi=hi, predictor=predictor)


def fluid_benchmark(types, cfg: DictConfig) -> dict:
    """The fluid equilibrium of a typed workload's (effective) rates, recorded with its run,
    under the linear coefficients the config implies
    (:func:`replay.fluid.model.linear_coefficients`): they define the stability boundary
    the B figures mark."""
    mix = TypeMix.from_types(list(types))
    c = linear_coefficients(cfg)
    d = {k: c[k] for k in ("d0", "d1", "d2", "d3", "d4")}
    return {"coefficients": c, "total_rate": float(mix.rate.sum()), "rates": mix.rate.tolist(),
            "rate_scale_at_boundary": stability_boundary(mix, d["d1"], d["d2"], d["d3"], d["d4"]),
            **equilibrium(mix, **d)}


def known_types(cfg: DictConfig, workload) -> dict:
    """A policy that reads the workload's types (``types: ${workload.types}``) gets its
    effective ones: a typed workload rescales its rates by ``total_rate`` or ``load``."""
    if (cfg.policy.get("types") is not None and getattr(workload, "types", None) is not None
            and cfg.policy.types == cfg.workload.get("types")):
        return {"types": [dict(t) for t in workload.types]}
    return {}


def build_engine(cfg: DictConfig) -> tuple[Engine, object, object, Requests]:
    """The engine ``cfg`` implies, constructed and not yet run, with its workload and
    timing backend and the requests it replays."""
    register_resolvers()  # a sweep or study worker resolves the config's interpolations too
    kv = instantiate(cfg.kv)
    timing = instantiate(cfg.timing)
    workload = instantiate(cfg.workload)
    limits = cfg.get("limits") or {}
    requests = make_requests(workload, instantiate(cfg.arrivals), cfg.seed, timing.time_unit,
                             cfg.get("workload_seed"),
                             limits.get("max_requests", MAX_REQUESTS))
    requests = with_predictions(requests, instantiate(cfg.prediction), kv.tokens, cfg.seed)
    policy = instantiate(cfg.policy, **known_types(cfg, workload))
    engine = Engine(requests, policy, timing, kv, seed=cfg.seed, progress=cfg.output.progress,
                    **OmegaConf.to_container(cfg.engine, resolve=True))
    return engine, workload, timing, requests


def build_and_run(cfg: DictConfig) -> tuple[RunResult, Requests, dict]:
    """Instantiate every component of ``cfg`` and replay it."""
    engine, workload, timing, requests = build_engine(cfg)
    policy = engine.policy
    result = engine.run()
    if hasattr(policy, "describe"):
        result.policy_info = policy.describe()
    if getattr(workload, "types", None) is not None:
        result.fluid = fluid_benchmark(workload.types, cfg)
    return result, requests, timing.describe()


def run(cfg: DictConfig, out_dir: Path, resolved: dict | None = None) -> dict:
    """Run ``cfg`` and write ``requests.parquet``, ``iterations.parquet`` and ``summary.json``.

    With ``output.skip_existing`` a finished run of the same resolved config is
    reused, unless an input file changed since or a table is missing
    (:func:`replay.storage.outputs.stale_reason`); then it is recomputed and the log
    says why. A folder holding another config's run is refused unless
    ``output.overwrite``. Files are written atomically, the summary last; tables
    this run does not write are removed, so none is left from an older run. ``resolved``
    is ``cfg`` resolved already (:func:`replay.config.validate.validate_config` returns it;
    resolving costs a sweep job tens of milliseconds).
    """
    if resolved is None:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    tables = [name for name, wanted in zip(TABLES, (cfg.output.request_table,
                                                    cfg.output.iteration_table), strict=True)
              if wanted]
    try:
        reason = stale_reason(out_dir, resolved, tables)
    except ValueError as exc:
        if not cfg.output.get("overwrite", False):
            raise ConfigError(f"{exc}; choose another folder (hydra.run.dir=...) or set "
                              f"output.overwrite=true to replace it") from None
        reason = "output.overwrite=true replaces a run of another config"
    if reason is None and cfg.output.skip_existing:
        log.info("skipping %s: finished run with the same config and inputs", out_dir)
        return read_summary(out_dir / "summary.json")
    if reason != "no finished run here":
        log.info("recomputing %s: %s", out_dir, reason)
    slo = SLO.of((cfg.get("metrics") or {}).get("slo"))
    started = time.perf_counter()
    result, requests, timing_info = build_and_run(cfg)
    wall = time.perf_counter() - started
    summary = summarize(result, slo, cfg.output.get("percentiles"))
    summary.update({
        "wall_time_s": wall,
        "loop_time_s": result.loop_time_s,   # the engine's step loop only (no setup, no output)
        "time_unit": "rounds" if timing_info["backend"] == "unit" else "seconds",
        "length_unit": requests.length_unit,
        "timing": timing_info,
        "workload_source": requests.source,
        "dropped_rows": requests.dropped,
        "prediction": error_summary(requests.predictor, requests.predicted_lo,
                                    requests.predicted_hi, requests.output_len),
        "policy_info": result.policy_info,
        "fluid": result.fluid,
        "input_files": list(requests.files) + list(timing_info.get("files", [])),
        "packages": package_versions(),
        "config": resolved,
    })
    (out_dir / "summary.json").unlink(missing_ok=True)
    frames = {"requests.parquet": result.requests, "iterations.parquet": result.iterations}
    written = {}
    for name in TABLES:
        if name in tables:
            record = atomic_write(out_dir / name, lambda tmp, frame=frames[name]:
                                  frame.to_parquet(tmp, index=False))
            written[name] = {"bytes": record["bytes"], "sha256": record["sha256"]}
        else:
            (out_dir / name).unlink(missing_ok=True)
    # The summary, written last, is the manifest: a resume reuses this run only while every
    # table still has the size and SHA-256 recorded here (replay.storage.outputs.stale_reason).
    summary["output_files"] = written
    write_summary(out_dir / "summary.json", summary)
    if result.status != "completed":
        log.warning("run ended with status %s: %s", result.status, result.message)
    return summary
