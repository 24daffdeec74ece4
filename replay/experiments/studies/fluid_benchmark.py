"""docs/reproducing/wait.md B5: the fluid benchmark of every B scenario, and the segment design.

1. For each typed scenario (B0-B3 as their experiment configs define them, and B4
   as its trace clustered into 50-token types), the fluid equilibrium in both
   conventions (``harness``: the numbers as our configs use them, ``(s, o)``;
   ``paper``: the same numbers read as the paper's ``(l, l')``), next to the
   simulated throughput of each policy if the scenario's runs exist under
   ``simulated_root`` (the reproduction targets' folders).
2. The three memory terms of the segment design (docs/policies/wait.md) against the
   number of segments ``L`` for ``m`` output-length types weighted by a trace's
   output histogram, one panel per (rate, horizon, delta) setting. Thresholds are
   the smallest rate-proportional ones meeting (16)'s time condition for the
   model's linear coefficients, with margin ``epsilon`` so that (12) is strict.
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from replay.config import compose_config  # noqa: E402
from replay.experiments.plots.common import save_figure  # noqa: E402
from replay.experiments.plots.wait import wait_table  # noqa: E402
from replay.fluid.model import (
    TypeMix,
    equilibrium,
    linear_coefficients,
    nested_condition_thresholds,
    segment_memory_terms,
)
from replay.run import make_requests  # noqa: E402
from replay.storage.outputs import (
    atomic_write_text,  # noqa: E402
    summary_json,
)
from replay.workloads.typed import output_length_types  # noqa: E402


def scenario_types(experiment: str, data_dir: str, seed: int = 0) -> tuple[list[dict], dict]:
    """The effective typed rates of a B experiment, and its linear coefficients."""
    cfg = compose_config([f"experiment={experiment}", f"data_dir={data_dir}"])
    coefficients = {k: v for k, v in linear_coefficients(cfg).items() if k != "source"}
    if "types" in cfg.workload:
        return list(instantiate(cfg.workload).types), coefficients
    requests = make_requests(instantiate(cfg.workload), instantiate(cfg.arrivals), seed,
                             "seconds")
    bins = output_length_types(requests, 50, 500)
    rate = float(cfg.arrivals.rate)
    types = [{"prompt_len": max(1, round(row.mean_prompt_len)), "output_len": int(row.output_len),
              "rate": rate * float(row.share)} for row in bins.itertuples() if row.count > 0]
    return types, coefficients


def benchmark_table(scenarios: dict[str, str], data_dir: str, simulated_root: Path | None,
                    suffix: str = "") -> pd.DataFrame:
    rows = []
    for name, experiment in scenarios.items():
        types, c = scenario_types(experiment, data_dir)
        for convention in ("harness", "paper"):
            eq = equilibrium(TypeMix.from_types(types, convention), c["d0"], c["d1"], c["d2"],
                             c["d3"], c["d4"])
            rows.append({"scenario": name, "experiment": experiment, "convention": convention,
                         "total_rate": sum(t["rate"] for t in types), **c,
                         **{k: eq[k] for k in ("W", "load", "stable", "tau_star", "m_star",
                                               "throughput_star")}})
    table = pd.DataFrame(rows)
    if simulated_root is not None:
        simulated = []
        for name in scenarios:
            runs = simulated_root / f"{name}{suffix}" / "runs"
            if not runs.is_dir():
                continue
            sims = wait_table(runs / "paper" if (runs / "paper").is_dir() else runs)
            for (policy, rate), part in sims.groupby(["policy", "total_rate"]):
                simulated.append({"scenario": name, "policy": policy, "total_rate": rate,
                                  "simulated_throughput": part["throughput"].mean(),
                                  "runs": len(part)})
        if simulated:
            sims = pd.DataFrame(simulated).pivot_table(
                index=["scenario", "total_rate"], columns="policy",
                values="simulated_throughput").add_prefix("simulated: ").reset_index()
            # Only the simulations at the scenario's own rate sit next to its benchmark.
            table = table.merge(sims, on=["scenario", "total_rate"], how="left")
    return table


def segment_terms(cfg: DictConfig, histogram: pd.Series, settings: list[dict],
                  segment_counts: list[int], prompt_len: float, epsilon: float) -> pd.DataFrame:
    linear = linear_coefficients(cfg)
    lengths = histogram.index.to_numpy()
    weights = histogram.to_numpy(dtype=float) / histogram.sum()
    rows = []
    for setting in settings:
        rate = weights * float(setting["rate"])
        for segments in segment_counts:
            groups = np.array_split(np.arange(lengths.size), segments)
            edges = np.concatenate(([0], [lengths[g[-1]] for g in groups]))
            tails = np.array([rate[lengths > b].sum() for b in edges[:-1]])
            n = nested_condition_thresholds(tails, edges, prompt_len, linear["d0"],
                                            linear["d1"], epsilon, d2=linear["d2"],
                                            d3=linear["d3"], d4=linear["d4"])
            if n is None:
                rows.append({**setting, "segments": segments, "term1": np.nan,
                             "term2": np.nan, "term3": np.nan, "total": np.nan})
                continue
            terms = segment_memory_terms(lengths, rate, prompt_len, segments, n,
                                         setting["horizon"], setting["delta"])
            rows.append({**setting, "segments": segments, "thresholds": n.tolist(),
                         **{k: terms[k] for k in ("term1", "term2", "term3", "total")}})
    return pd.DataFrame(rows)


#: The WAIT paper's Section 7.2: the segment design's total memory is lowest near these
#: numbers of segments.
PAPER_BEST_SEGMENTS = (5, 10)


def plot_segment_terms(table: pd.DataFrame, out: Path) -> Path:
    """One panel per (rate, horizon, delta): the three terms and their total vs ``L``."""
    settings = table[["rate", "horizon", "delta"]].drop_duplicates().to_dict("records")
    columns = 3
    rows = -(-len(settings) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        part = table[(table["rate"] == setting["rate"]) & (table["horizon"] == setting["horizon"])
                     & (table["delta"] == setting["delta"])]
        ax.set_title(f"rate {setting['rate']:g}/s, T = {setting['horizon']:g} s, "
                     f"delta = {setting['delta']:g}", fontsize=9)
        if part["total"].isna().all():
            ax.text(0.5, 0.5, "no thresholds meet (16):\nthe fluid load is >= 1 here",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for term, style, label in (("term1", "o-", "Term 1 (batch)"),
                                   ("term2", "s-", "Term 2 (queues)"),
                                   ("term3", "^-", "Term 3 (safety)"),
                                   ("total", "kx-", "total")):
            ax.plot(part["segments"], part[term].replace(np.inf, np.nan), style, ms=3,
                    label=label)
        best = part.loc[part["total"].replace(np.inf, np.nan).idxmin()]
        ax.axvline(best["segments"], color="gray", ls=":",
                   label=f"minimum at L = {int(best['segments'])}")
        ax.axvspan(*PAPER_BEST_SEGMENTS, color="tab:red", alpha=0.1,
                   label=f"paper: lowest near L = {PAPER_BEST_SEGMENTS[0]}-"
                   f"{PAPER_BEST_SEGMENTS[1]} (7.2)")
        if part["total"].replace(np.inf, np.nan).notna().sum() < 2:
            ax.text(0.5, 0.9, "one segment count meets (16): no curve", ha="center",
                    transform=ax.transAxes, fontsize=7)
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 5, 10, 20, 50, 100], labels=["1", "2", "5", "10", "20", "50", "100"])
        ax.set_xlabel("segments L")
        ax.set_ylabel("memory (token slots)")
        ax.set_ylim(0, None)
        ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(settings):]:
        ax.set_visible(False)
    return save_figure(fig, out, table)


def run_study(cfg: DictConfig, out_dir: Path, scenarios: dict, settings: list,
              segment_counts: list, prompt_len: float, max_output: int, epsilon: float,
              simulated_root: str | None = None, simulated_suffix: str = "") -> dict:
    started = time.perf_counter()  # the study's whole time, as a replay records it
    out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(simulated_root) if simulated_root else None
    table = benchmark_table(dict(scenarios), str(cfg.data_dir), root, simulated_suffix)
    table.to_csv(out_dir / "fluid_benchmark.csv", index=False)
    requests = make_requests(instantiate(cfg.workload), instantiate(cfg.arrivals), cfg.seed,
                             "seconds")
    outputs = requests.output_len[requests.output_len <= max_output]
    histogram = pd.Series(np.bincount(outputs, minlength=max_output + 1)[1:],
                          index=np.arange(1, max_output + 1))
    terms = segment_terms(cfg, histogram, [dict(s) for s in settings], list(segment_counts),
                          prompt_len, epsilon)
    plot_segment_terms(terms, out_dir / "segment_terms.png")
    best = (terms.dropna(subset=["total"]).sort_values("total")
            .groupby(["rate", "horizon", "delta"], as_index=False).first())
    summary = {"study": "fluid_benchmark", "histogram_source": requests.source,
               "histogram_unit": requests.length_unit, "types": int((histogram > 0).sum()),
               "fluid_benchmark": table.to_dict(orient="records"),
               "best_segments": best[["rate", "horizon", "delta", "segments", "total"]]
               .to_dict(orient="records"),
               "config": OmegaConf.to_container(cfg, resolve=True)}
    summary["wall_time_s"] = time.perf_counter() - started
    atomic_write_text(out_dir / "summary.json", summary_json(summary) + "\n")
    return summary
