"""The reproduction targets: what each paper figure runs (an experiment config, its sweeps
and quick variant) and which figures it draws. ``python -m replay.reproduce`` runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from replay.experiments import authors
from replay.experiments.plots.common import (
    plot_c3,
    plot_kv_of_sweep,
    plot_latency_vs_n,
    plot_latency_vs_n_runs,
    plot_seed_statistics,
    plot_sensitivity,
    plot_timescale_variants,
)
from replay.experiments.plots.d1 import plot_d1
from replay.experiments.plots.membound import plot_membound
from replay.experiments.plots.sorted_f import plot_c2, plot_d2
from replay.experiments.plots.wait import plot_policy_bars, plot_wait_sweep

#: What a target wrote, in its folder (size and SHA-256 of each output, the runs and config it
#: was drawn from, commit and date): written by :mod:`replay.reproduce`, read by the report.
MANIFEST = "outputs.json"


def study_figures(run_dir: Path, out_dir: Path) -> list[Path]:
    """A study draws its own figures into its run directory; these are its outputs."""
    return sorted(run_dir.glob("*.png"))


@dataclass(frozen=True)
class Target:
    """One reproduction target.

    ``sweeps`` (optional) names several multiruns of the same experiment, each with
    its own extra overrides, run into ``runs/<name>/``; ``quick_sweeps`` replaces
    their overrides under ``--quick``. In overrides, ``{outputs}`` stands for the
    folder holding every target's outputs and ``{suffix}`` for ``-quick`` or ``""``.
    """

    description: str
    overrides: tuple[str, ...]
    quick: tuple[str, ...] = ()
    multirun: bool = True
    figures: tuple[Callable[[Path, Path], list[Path]], ...] = ()
    needs_data: bool = False  # reads traces or Vidur profiles from the data directory
    sweeps: dict[str, tuple[str, ...]] | None = None
    quick_sweeps: dict[str, tuple[str, ...]] | None = None


class TargetFailed(RuntimeError):
    """A target's replay command failed (the others still run)."""


def in_sweep(sweep: str, figure: Callable[..., list[Path]], **options
             ) -> Callable[[Path, Path], list[Path]]:
    """A figure drawn from one named sweep of a target (``runs/<sweep>/``); none if that
    sweep did not run (``--quick`` skips some)."""
    def draw(runs_dir: Path, out_dir: Path) -> list[Path]:
        if not (runs_dir / sweep).is_dir():
            return []
        return figure(runs_dir / sweep, out_dir, **options)
    return draw


#: Quick runs on the Vidur backend: a predictor grid that trains in seconds.
VIDUR_QUICK = ("timing.random_forest_grid={num_estimators:[8],max_depth:[8],min_samples_split:[2]}",
               "timing.k_fold_cv_splits=2")


A3_QUICK = ("kv.tokens=1500", *VIDUR_QUICK)


#: The B experiments' sweeps: the paper's point, the rate as a fraction of the stability
#: boundary (fluid load), and the batch limit B.
LOADS = "workload.load=0.2,0.4,0.6,0.8,1.0,1.2,1.5"


#: ``rate_linear`` repeats the rate sweep on the linear timing model the fluid analysis
#: assumes: with Vidur, batches beyond its profiled 128 decodes are extrapolated linearly
#: in batch size, which caps throughput regardless of policy (see the README).
B_SWEEPS = {"paper": (), "rate": (LOADS,), "rate_linear": (LOADS, "timing=linear"),
            "batch": ("batch_limit=100,250,500,1000,2000",)}


#: Quick: no linear-timing sweep (the quick Vidur grid overrides do not apply to it).
B_QUICK_SWEEPS = {"paper": (), "rate": ("workload.load=0.5,1.2",),
                  "batch": ("batch_limit=100,500",)}


def wait_target(label: str, experiment: str, quick: tuple[str, ...], sweeps=B_SWEEPS,
                quick_sweeps=B_QUICK_SWEEPS, group: str = "total_rate",
                needs_data: bool = True) -> Target:
    figures = [in_sweep("paper", plot_policy_bars, name=label, group=group)]
    if "rate" in sweeps:
        figures.append(in_sweep("rate", plot_wait_sweep, x="total_rate", name=label))
    if "rate_linear" in sweeps:
        figures.append(in_sweep("rate_linear", plot_wait_sweep, x="total_rate",
                                name=f"{label}, linear timing", tag="linear"))
    if "batch" in sweeps:
        figures.append(in_sweep("batch", plot_wait_sweep, x="batch_limit", name=label))
    return Target(f"{label}: throughput (with Throughput*), latency and evictions per policy, "
                  f"3 seeds", (f"experiment={experiment}",), quick=(*VIDUR_QUICK, "seed=0", *quick),
                  figures=tuple(figures), needs_data=needs_data, sweeps=sweeps,
                  quick_sweeps={k: v for k, v in quick_sweeps.items() if k in sweeps})


#: D1's panels: Poisson and trace arrivals per model, and the offline panel where the LP
#: bound is computable (every policy there, the LP ones included).
D1_MODELS = {"70b": ("model=llama2_70b", "hardware=a100x2"),
             "7b": ("model=llama2_7b", "hardware=a100x1")}


D1_TRACE = ("workload=splitwise_code,splitwise_conv", "arrivals=trace", "~arrivals.rate",
            "workload.n=null", "++workload.first_rows=500")


D1_OFFLINE = ("arrivals=all_at_once", "~arrivals.rate", "timing=unit", "workload.n=200",
              "workload=lmsys,arxiv,mixed,sharegpt,splitwise_code,splitwise_conv",
              "paper_policy=fcfs,mcsf,protection_0.25,clearing_0.20_0.20,vllm,sarathi,"
              "nested_lmsys,sorted_f_swap,sorted_f_quantile,sorted_lp,lp_swap")


D1_SWEEPS = {**{f"online_{m}": hw for m, hw in D1_MODELS.items()},
             **{f"trace_{m}": (*hw, *D1_TRACE) for m, hw in D1_MODELS.items()},
             "offline": D1_OFFLINE}


D1_QUICK_SWEEPS = {
    "online_70b": (*D1_MODELS["70b"], "workload=lmsys,arxiv", "kv=explicit", "workload.n=30",
                   *VIDUR_QUICK),
    "trace_70b": (*D1_MODELS["70b"], *D1_TRACE, "workload=splitwise_conv", "kv=explicit",
                  "++workload.first_rows=30", *VIDUR_QUICK),
    "offline": (*D1_OFFLINE, "workload=lmsys,arxiv", "kv=explicit", "workload.n=30",
                "+lp_max_columns=5000")}


A3_FIGURES = (plot_latency_vs_n_runs, plot_latency_vs_n, plot_kv_of_sweep)


#: The WAIT scenarios where memory binds (issue 30): each memory-bound variant with its
#: saturation rate S under timing=vidur (the capacity study) and its quick overrides.
MEMBOUND = {
    "b1_wait_low_membound": ("B1 low demand, memory-bound", 300.0,
                             ("kv.tokens=1024", "workload.total_rate=150,285",
                              "workload.duration_s=0.5")),
    "b1_wait_high_membound": ("B1 high demand, memory-bound", 41.9,
                              ("kv.tokens=4096", "workload.total_rate=21,39.8",
                               "workload.duration_s=3")),
    "b2_nested_membound": ("B2 Nested WAIT, memory-bound", 51.6,
                           ("kv.tokens=2048", "workload.total_rate=25.8,49",
                            "workload.duration_s=2")),
}
#: B1 low only: WAIT with thresholds fitted to M (its own batch_limit, whose m_pi fits M).
WAIT_FITTED = {f"wait_fitted_{m}": ("paper_policy=wait", f"kv.tokens={m}",
                                    f"policy.batch_limit={b}")
               for m, b in ((1024, 40), (2048, 90), (4096, 200))}


def membound_target(name: str, label: str, saturation: float, quick: tuple[str, ...]) -> Target:
    fitted = name == "b1_wait_low_membound"
    return Target(
        f"{label}: throughput, mean and p99 latency, evictions and recomputed tokens per "
        f"policy vs the total rate (0.5-0.95 of the saturation rate S = {saturation:g}/s "
        f"measured under timing=vidur) and the KV budget M, 5 seeds, 95 % intervals",
        (f"experiment={name}",), quick=(*VIDUR_QUICK, "seed=0", *quick),
        figures=(partial(plot_membound, name=label, saturation_rate=saturation),),
        needs_data=True, sweeps={"grid": (), **(WAIT_FITTED if fitted else {})},
        quick_sweeps={"grid": (), **({"wait_fitted_1024": WAIT_FITTED["wait_fitted_1024"]}
                                     if fitted else {})})


def _caps(caps) -> str:
    return "batch_limit=" + ",".join(str(c) for c in sorted(caps))


#: The caps of the WAIT authors' result files (``$KVSCHED_DATA_DIR/wait_authors/``), per
#: policy setting: b1_authors runs each policy at exactly these.
AUTHORS_CAPS = {
    "vllm": (*range(100, 2001, 100), 448),
    "sarathi": (*range(100, 1201, 100), 448),
    "wait_authors": (*range(100, 2101, 100), 420, 440, 460, 480, 520, 540, 560, 580),
    "nested_authors": tuple(range(100, 2101, 100)),
}
#: The decode pricings past the profile that b1_authors measures on the baselines.
PRICING_MODES = ("flat", "linear", "measured")
AUTHORS_SWEEPS = {
    **{policy: (f"paper_policy={policy}", _caps(caps)) for policy, caps in AUTHORS_CAPS.items()},
    **{f"pricing_{mode}_{policy}": (f"paper_policy={policy}", _caps(AUTHORS_CAPS[policy]),
                                    f"timing.beyond_profile={mode}")
       for mode in PRICING_MODES for policy in ("vllm", "sarathi")}}
#: Quick: the same full trace (its batches are compared one by one), a few caps.
AUTHORS_QUICK_SWEEPS = {
    "vllm": ("paper_policy=vllm", "batch_limit=100,1000"),
    "sarathi": ("paper_policy=sarathi", "batch_limit=500"),
    "wait_authors": ("paper_policy=wait_authors", "batch_limit=500"),
    "nested_authors": ("paper_policy=nested_authors", "batch_limit=500"),
    **{f"pricing_{mode}_vllm": ("paper_policy=vllm", "batch_limit=1000",
                                f"timing.beyond_profile={mode}") for mode in PRICING_MODES}}


TARGETS: dict[str, Target] = {
    "c3": Target(
        "C3 worked example: TEL of FCFS (both tie orders), MC-SF, Sorted-F (dp, swap, "
        "quantile), Sorted-LP and LP-Swap, unit time, M = 64",
        ("experiment=c3_example",
         "paper_policy=fcfs,mcsf,sorted_f_dp,sorted_f_swap,sorted_f_quantile,sorted_lp,lp_swap",
         "workload.groups=[{count:1,prompt_len:63,output_len:1},"
         "{count:21,prompt_len:1,output_len:2}],[{count:21,prompt_len:1,output_len:2},"
         "{count:1,prompt_len:63,output_len:1}]"),
        figures=(plot_c3,)),
    "c1": Target(
        "C1: mean TEL ± s.e. of seven policies and the LP bound on five synthetic distributions "
        "(100 trials each, unit time, M = 100), next to the paper's Table 4",
        ("experiment=c1_synthetic",), quick=("study.quick=true",), multirun=False,
        figures=(study_figures,)),
    "c2": Target(
        "C2: average latency and decision time vs n = 200..2000 of FCFS, MC-SF, Sorted-LP, "
        "LP-Swap, Sorted-F (swap, quantile); mixed LMSYS + arXiv, Llama-2-70B TP2, Vidur "
        "linear regression, 5 shuffles",
        ("experiment=c2_mixed",), quick=("workload.n=60,120", "seed=0,1"),
        figures=(plot_c2,), needs_data=True),
    "d2": Target(
        "D2: Sorted-F + A_min, A_max, optimistic vs prediction interval ratio alpha, and MC-SF "
        "vs point-prediction noise sigma; C2 setup at n = 400, 30 seeds",
        ("experiment=d2_prediction_error",), quick=("workload.n=60", "seed=0,1"),
        sweeps={"interval": ("policy.variant=a_min,a_max,optimistic",
                             "prediction.alpha=1,0.8,0.5,0.2"),
                "point": ("policy=mcsf", "prediction=noisy", "prediction.sigma=0,0.25,0.5,1")},
        quick_sweeps={"interval": ("policy.variant=a_min,a_max,optimistic",
                                   "prediction.alpha=1,0.5"),
                      "point": ("policy=mcsf", "prediction=noisy", "prediction.sigma=0,0.5")},
        figures=(in_sweep("interval", plot_d2, x="alpha",
                          label="interval ratio alpha (l/u; 1 = exact)"),
                 in_sweep("point", plot_d2, x="sigma",
                          label="log-normal noise sigma of the point estimate (0 = exact)")),
        needs_data=True),
    "d1": Target(
        "D1: every policy on every workload (LMSYS, arXiv, mixed, ShareGPT at Poisson rates; "
        "Splitwise at its timestamps), Llama-2-70B TP2 and 7B TP1, explicit and GQA memory, "
        "Vidur timing; plus the offline panel (unit time, all at time 0) with the LP gap",
        ("experiment=d1_all",), sweeps=D1_SWEEPS,
        quick_sweeps=D1_QUICK_SWEEPS, figures=(plot_d1,), needs_data=True),
    "d4": Target(
        "D4: the linear timing model refitted to Vidur (Llama-2-7B on one A100, 70B on two): "
        "coefficients and relative error per region of a shape grid, against the target "
        "(median <= 5 %, max <= 20 % over decodes 1..512 x contexts 16..4,096)",
        ("experiment=d4_linear_fit",), quick=("study.quick=true",), multirun=False,
        needs_data=True, figures=(study_figures,)),
    "a3_small": Target(
        "A3 (scaled down) + A5: separate runs of n = 40..400, the first-n curve of the largest "
        "runs, KV of MC-SF", ("experiment=a3_small",),
        quick=("workload.n=60,120", "kv.tokens=1500"), figures=A3_FIGURES),
    **{name: Target(
        f"A3 + A5 on {source}: separate runs of n = 1,000..10,000 at 50/s and 10/s, "
        f"Llama-2-70B on 2 x A100 with Vidur timing, M = 16,492, eight policy settings; the "
        f"first-n curve of the 10,000-request runs; KV of MC-SF",
        ("experiment=a3", f"workload={source}"), quick=(*A3_QUICK, "workload.n=60,120"),
        figures=A3_FIGURES, needs_data=True)
       for name, source in (("a3", "lmsys"), ("a3_lmsys_synthetic", "lmsys_synthetic"),
                            ("a3_lmsys_words_synthetic", "lmsys_words_synthetic"))},
    "a4": Target(
        "A4: n = 1,000 at 50/s on the A3 setup, one fixed request set, 50 arrival seeds per "
        "policy setting and requeue position: mean, std, max, min, ratio to MC-SF, Table 1",
        ("experiment=a4",), quick=(*A3_QUICK, "workload.n=100", "seed=0,1,2"),
        figures=(plot_seed_statistics,), needs_data=True),
    "a4_timescale": Target(
        "A-series time scale: A4's latencies (10 seeds) under a 128-request running cap, "
        "Vidur's linear regression and other length sources, next to the paper's Table 1",
        ("experiment=a4_timescale",), quick=(*A3_QUICK, "workload.n=100", "seed=0,1"),
        figures=(plot_timescale_variants,), needs_data=True,
        sweeps={"baseline": (), "max_running_128": ("engine.max_running=128",),
                "linear_regression": ("timing.predictor=linear_regression",),
                "lmsys_synthetic": ("workload=lmsys_synthetic",),
                "lmsys_words_synthetic": ("workload=lmsys_words_synthetic",)}),
    **{f"a6_{x}": Target(
        f"A6: alpha/beta-clearing's average latency vs {x} on the A3 setup, both demands",
        (f"experiment=a6_{x}",), quick=(*A3_QUICK, "workload.n=150", quick_grid),
        figures=(partial(plot_sensitivity, x=keys[0], series=keys[1]),), needs_data=True)
       for x, keys, quick_grid in (
           ("alpha", ("policy.alpha", "policy.overflow.beta"), "policy.alpha=0.1,0.3"),
           ("beta", ("policy.overflow.beta", "policy.alpha"), "policy.overflow.beta=0.1,0.3"))},
    "a7_small": Target(
        "A7 (scaled down): alpha-protection's endless cycle at alpha = 0.15, smallest alpha "
        "that finishes per demand level and requeue position",
        ("experiment=a7_small",), quick=("workload.n=120", "kv.tokens=1500",
                                         "study.alpha_step=0.1"),
        multirun=False, figures=(study_figures,)),
    **{name: Target(
        f"A7 at the full A3 setup on {source}: the endless cycle at alpha = 0.15, smallest "
        f"alpha (step 0.01) that finishes per demand level and requeue position",
        ("experiment=a7", f"workload={source}"),
        quick=(*A3_QUICK, "workload.n=100", "study.alpha_step=0.1", "study.alpha_stop=0.2"),
        multirun=False, figures=(study_figures,), needs_data=True)
       for name, source in (("a7", "lmsys"), ("a7_lmsys_synthetic", "lmsys_synthetic"),
                            ("a7_lmsys_words_synthetic", "lmsys_words_synthetic"))},
    **{name: Target(
        f"{label}: MC-SF and FCFS against the hindsight optimum, 200 seeded trials "
        f"(histograms of TEL/OPT over proven trials and TEL/lower bound over all)",
        (f"experiment={experiment}",), quick=("study.quick=true",), multirun=False,
        figures=(study_figures,))
       for name, label, experiment in (
           ("a1s", "A1s (offline, n ~ U{5..12})", "mcsf_vs_opt_offline_small"),
           ("a2s", "A2s (online, T ~ U{5..12})", "mcsf_vs_opt_online_small"),
           ("a1", "A1 (offline, n ~ U{40..60})", "mcsf_vs_opt_offline"),
           ("a2", "A2 (online, T ~ U{40..60})", "mcsf_vs_opt_online"))},
    # First of the B series: the rate sweeps mark the saturation rates it measures.
    "b_capacity": Target(
        "Capacity check: each B scenario's fluid boundary rate (refitted linear timing) next "
        "to the measured saturation rate per policy, under timing=vidur and timing=linear",
        ("experiment=b_capacity",), quick=("study.quick=true",), multirun=False,
        needs_data=True, figures=(study_figures,)),
    "b0": Target(
        "B0 eviction cascade: the WAIT paper's FCFS and the greedy FCFS vs WAIT (n = 4), "
        "one type (1, 2), Poisson(4) per "
        "round, M = 20, 20,000 rounds: completions per round, evictions, mean latency",
        ("experiment=b0_cascade",), quick=("workload.duration_s=300",),
        figures=(partial(plot_policy_bars, name="B0: the eviction cascade (unit time)"),)),
    "b1_wait_low": wait_target("B1 low demand (WAIT vs vLLM-like vs Sarathi-like)",
                               "b1_wait_low", ("workload.duration_s=0.5",)),
    # The rate sweeps run 30 s of arrivals: the paper point's 2 s is shorter than one
    # request's service (up to 300 iterations), so below saturation the drain would dominate.
    "b1_wait_high": wait_target(
        "B1 high demand (WAIT vs vLLM-like vs Sarathi-like)", "b1_wait_high",
        ("workload.duration_s=0.05",),
        sweeps={**B_SWEEPS, "rate": (LOADS, "workload.duration_s=30"),
                "rate_linear": (LOADS, "timing=linear", "workload.duration_s=30")}),
    "b2_nested": wait_target("B2 Nested WAIT, synthetic 4 types", "b2_nested",
                             ("workload.duration_s=2",),
                             sweeps={k: v for k, v in B_SWEEPS.items() if k != "batch"}),
    "b3_nested_lmsys": wait_target("B3 Nested WAIT, LMSYS-like 10 types", "b3_nested_lmsys",
                                   ("workload.duration_s=3",), sweeps={"paper": ()}),
    "b4_nested_lmsys_real": wait_target(
        "B4 Nested WAIT, LMSYS real lengths (words), 50,000 requests at 55/s",
        "b4_nested_lmsys_real", ("workload.n=400",), sweeps={"paper": ()}),
    "b5": Target(
        "B5 fluid benchmark of every B scenario (both conventions) next to the simulated "
        "throughput; the segment design's three memory terms vs the number of segments",
        ("experiment=b5_fluid", "study.simulated_root={outputs}",
         "study.simulated_suffix={suffix}"),
        quick=("workload.n=20000", "study.segment_counts=[2,5,10]"), multirun=False,
        figures=(study_figures,)),
    **{name: membound_target(name, *setting) for name, setting in MEMBOUND.items()},
    "b3_nested_lmsys_epsilon": Target(
        "B3 Nested WAIT with the threshold margin: epsilon 0 vs 0.05 on the same seeds and "
        "rates (55 and 550/s), so that threshold rounding is separated from timing",
        ("experiment=b3_nested_lmsys_epsilon",),
        quick=(*VIDUR_QUICK, "seed=0", "workload.duration_s=3"),
        figures=(partial(plot_membound, name="B3 Nested WAIT, threshold margin", rows="epsilon",
                         file="epsilon.png"),), needs_data=True),
    "b1_authors": Target(
        "B1-high as the WAIT authors ran it (Llama-3-8B on one A100, their exact 10,000-request "
        "trace, each policy at the caps of their 84 result files): their throughput metric "
        "beside ours, and the decode pricing past the profile measured against their "
        "baselines' batch intervals",
        ("experiment=b1_authors",), quick=VIDUR_QUICK, needs_data=True,
        sweeps=AUTHORS_SWEEPS, quick_sweeps=AUTHORS_QUICK_SWEEPS,
        figures=(authors.figures,)),
    "e1": Target(
        "E1: vLLM 0.19's V1 scheduler (policy=vllm_v1) replaying two real vLLM 0.19 runs of "
        "Llama-3.1-8B (RTX 4090, memory-bound; RTX PRO 6000, bound by max_num_seqs) with the "
        "per-layer profiles measured on those GPUs and NVIDIA's kernel tables, beside the peer "
        "simulator's published errors; the factors behind the differences, one at a time",
        ("experiment=e1_engine_check",), quick=("study.quick=true",), multirun=False,
        figures=(study_figures,), needs_data=True),
    "e2": Target(
        "E2: the prefix cache: hit ratios of the Mooncake FAST'25 traces with an unbounded "
        "cache and LRU caches of 0.1M-100M tokens, and MC-SF, vLLM-like and longest prefix "
        "match on a shared-prefix workload with the cache off and on, where memory binds",
        ("experiment=e2_prefix_cache",), quick=("study.quick=true",), multirun=False,
        figures=(study_figures,), needs_data=True),
}
