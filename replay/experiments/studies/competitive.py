"""MC-SF against the hindsight optimum (docs/reproducing/mcsf.md A1, A2 and the small A1s, A2s).

Each trial draws ``M``, then either ``n`` requests at time 0 (offline) or a
horizon ``T`` and a rate ``lambda`` with Poisson arrivals per round (online);
lengths follow the MC-SF paper's generator (``workload=synthetic``,
``distribution=a1``). MC-SF and FCFS with lookahead are replayed by the real
engine under unit time; the better of the two schedules bounds the horizon of
the integer program and warm-starts the solver (:mod:`replay.bounds`).
The LP relaxation adds a second lower bound.

A trial is a pure function of its seed (``SeedSequence([seed, trial])``).
Rows are appended to ``trials.csv`` as trials finish, so a study rerun in the
same directory (``hydra.run.dir=...``) skips the trials already there; the
study parameters are stored in ``study.json`` and a rerun with different
parameters is refused rather than mixed in.

Ratios (``_fcfs`` columns: the same for FCFS): ``ratio = TEL(MC-SF) / best
objective`` is the competitive ratio where the status is ``optimal`` (proven by
the solver, or by a lower bound that meets the best schedule) and a lower bound
on it elsewhere; ``ratio_upper = TEL(MC-SF) / best bound`` (the larger of the
solver's and the LP's bound) is an upper bound on it for every trial. The
ratio statistics use only the proven trials and say how many; as proofs get
rarer with ``n``, that subset leans towards small instances, which is why the
summary also reports both bounds over all trials.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig
from tqdm.auto import tqdm

from policies.fcfs import FCFSLookahead
from policies.mcsf import MCSF
from replay.bounds import Instance, is_feasible, lp_bound, solve, tel
from replay.engine.kv import explicit
from replay.engine.loop import Engine
from replay.engine.overflow import EvictLIFO
from replay.engine.requests import Requests
from replay.experiments.studies.trials import counted, finished_trials, run_parallel
from replay.run import make_requests, package_versions
from replay.storage.outputs import append_row, atomic_write_text, summary_json
from replay.timing.simple import UnitTiming
from replay.workloads.arrivals import AllAtOnce, PoissonRounds
from replay.workloads.synthetic import Synthetic

log = logging.getLogger(__name__)

COLUMNS = ("trial", "seed", "M", "n", "horizon", "rate", "tel_mcsf", "tel_fcfs",
           "best_objective", "best_bound", "solver_bound", "lp_bound", "status", "proven_by",
           "gap", "ratio", "ratio_fcfs", "ratio_upper", "ratio_upper_fcfs", "solve_time_s",
           "lp_time_s", "solver", "message")
QUICK = {"trials": 4, "n_requests": (3, 5), "horizon": (3, 4), "time_limit_s": 5.0}


def trial_seed(base_seed: int, trial: int) -> int:
    return int(np.random.SeedSequence([base_seed, trial]).generate_state(1)[0])


def sample_trial(seed: int, params: dict) -> tuple[Requests, int, dict]:
    """The trial's requests, its ``M`` and the drawn parameters (``horizon``/``rate`` online)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5D]))
    kv_tokens = int(rng.integers(params["kv_tokens"][0], params["kv_tokens"][1] + 1))
    drawn = {"M": kv_tokens, "horizon": None, "rate": None}
    if params["online"]:
        drawn["horizon"] = int(rng.integers(params["horizon"][0], params["horizon"][1] + 1))
        drawn["rate"] = float(rng.uniform(params["rate"][0], params["rate"][1]))
        arrivals, n = PoissonRounds(rate=drawn["rate"], horizon=drawn["horizon"]), None
    else:
        arrivals = AllAtOnce()
        n = int(rng.integers(params["n_requests"][0], params["n_requests"][1] + 1))
    workload = Synthetic(n=n, distribution="a1", prompt_max=params["prompt_max"],
                         kv_tokens=kv_tokens, name="competitive")
    return make_requests(workload, arrivals, seed, "rounds"), kv_tokens, drawn


def engine_schedule(requests: Requests, policy, kv_tokens: int) -> tuple[np.ndarray, int]:
    """Start rounds (workload order) and TEL of ``policy`` replayed by the engine, unit time."""
    result = Engine(requests, policy, UnitTiming(), explicit(kv_tokens)).run()
    if result.status != "completed":
        raise RuntimeError(f"{type(policy).__name__} did not finish: {result.message}")
    table = result.requests
    return table["start"].to_numpy().astype(np.int64), int(table["latency"].sum())


def run_trial(trial: int, seed: int, params: dict) -> dict:
    requests, kv_tokens, drawn = sample_trial(seed, params)
    row = dict.fromkeys(COLUMNS)
    row.update(trial=trial, seed=seed, n=len(requests), solver=params["solver"], **drawn)
    if len(requests) == 0:
        row.update(status="empty", message="no request arrived")
        return row
    inst = Instance.from_requests(requests, kv_tokens)
    schedules = {name: engine_schedule(requests, policy, kv_tokens)
                 for name, policy in (("mcsf", MCSF(EvictLIFO())),
                                      ("fcfs", FCFSLookahead(EvictLIFO())))}
    for name, (starts, engine_tel) in schedules.items():
        # The program's TEL of the engine's own schedule must be the engine's TEL.
        if tel(inst, starts) != engine_tel or not is_feasible(inst, starts):
            raise RuntimeError(f"trial {trial} (seed {seed}): {name}'s engine schedule disagrees "
                               f"with the integer program's model")
    best_known = min(schedules.values(), key=lambda item: item[1])
    result = solve(inst, best_known[0], solver=params["solver"],
                   time_limit_s=params["time_limit_s"], workers=params["solver_threads"],
                   symmetry_breaking=params["symmetry_breaking"],
                   tail_disjunction=params["tail_disjunction"])
    bounds = {"solver": result.bound}
    if params["lp_bound"]:
        lp = lp_bound(inst, best_known[1], time_limit_s=params["lp_time_limit_s"],
                      tail_cuts=params["lp_tail_cuts"])
        bounds["lp"] = lp.bound
        row["lp_time_s"] = lp.solve_time_s
    known = {k: v for k, v in bounds.items() if v is not None}
    best_bound = max(known.values()) if known else None
    status, proven_by = result.status, result.solver if result.status == "optimal" else None
    if status == "time_limit" and best_bound is not None and best_bound >= result.objective:
        status, proven_by = "optimal", max(known, key=known.get)
    objective = result.objective
    row.update(
        tel_mcsf=schedules["mcsf"][1], tel_fcfs=schedules["fcfs"][1], best_objective=objective,
        best_bound=best_bound, solver_bound=bounds["solver"], lp_bound=bounds.get("lp"),
        status=status, proven_by=proven_by,
        gap=None if best_bound is None else max(0.0, (objective - best_bound) / objective),
        solve_time_s=result.solve_time_s, message=result.message,
        ratio=schedules["mcsf"][1] / objective, ratio_fcfs=schedules["fcfs"][1] / objective)
    if best_bound:
        row.update(ratio_upper=schedules["mcsf"][1] / best_bound,
                   ratio_upper_fcfs=schedules["fcfs"][1] / best_bound)
    return row


def _study_params(trials, online, kv_tokens, n_requests, horizon, rate, prompt_max, solver,
                  time_limit_s, solver_threads, symmetry_breaking, tail_disjunction, lp_bound,
                  lp_time_limit_s, lp_tail_cuts, seed, quick) -> dict:
    params = {"trials": trials, "online": online, "kv_tokens": list(kv_tokens),
              "n_requests": list(n_requests), "horizon": list(horizon), "rate": list(rate),
              "prompt_max": prompt_max, "solver": solver, "time_limit_s": time_limit_s,
              "solver_threads": solver_threads, "symmetry_breaking": symmetry_breaking,
              "tail_disjunction": tail_disjunction,
              "lp_bound": lp_bound, "lp_time_limit_s": lp_time_limit_s,
              "lp_tail_cuts": lp_tail_cuts, "seed": seed,
              "quick": quick}
    if quick:
        params.update({k: list(v) if isinstance(v, tuple) else v for k, v in QUICK.items()})
        params["time_limit_s"] = min(time_limit_s, QUICK["time_limit_s"])
    return params


def run_study(cfg: DictConfig, out_dir: Path, *, trials: int = 200, online: bool = False,
              kv_tokens=(30, 50), n_requests=(40, 60), horizon=(40, 60), rate=(0.5, 1.5),
              prompt_max: int = 5, solver: str = "cpsat_cumulative", time_limit_s: float = 10.0,
              solver_threads: int = 1, symmetry_breaking: bool = True,
              tail_disjunction: bool = True, lp_bound: bool = True,
              lp_time_limit_s: float = 30.0, lp_tail_cuts: bool = True, workers: int = 2,
              quick: bool = False,
              progress: bool = True) -> dict:
    """Run the trials (``workers`` processes), then write histograms and the summary."""
    out_dir = Path(out_dir)
    params = _study_params(trials, online, kv_tokens, n_requests, horizon, rate, prompt_max,
                           solver, time_limit_s, solver_threads, symmetry_breaking,
                           tail_disjunction, lp_bound, lp_time_limit_s, lp_tail_cuts,
                           int(cfg.seed), quick)
    done = finished_trials(out_dir, params)
    finished = set() if done is None else set(done["trial"].astype(int))
    todo = [t for t in range(params["trials"]) if t not in finished]
    if finished:
        log.info("resuming: %d of %d trials already in %s", len(finished), params["trials"],
                 out_dir / "trials.csv")
    started = time.perf_counter()
    trials_file = out_dir / "trials.csv"
    bar = tqdm(total=len(todo), desc="trials", disable=not progress)
    seeds = {t: trial_seed(params["seed"], t) for t in todo}
    for row in run_parallel(run_trial, ((t, seeds[t], params) for t in todo), workers):
        append_row(trials_file, row, COLUMNS)
        bar.update(1)
    bar.close()
    table = counted(pd.read_csv(trials_file), params).sort_values("trial")
    summary = summarize_trials(table)
    summary.update(wall_time_s=time.perf_counter() - started, resumed_trials=len(finished),
                   params=params, packages=package_versions(), out_dir=str(out_dir))
    plot_histograms(table, out_dir, online=bool(params["online"]))
    atomic_write_text(out_dir / "summary.json", summary_json(summary) + "\n")
    log.info("%s", format_summary(summary))
    return summary


def _stats(values: pd.Series) -> dict:
    values = values.dropna()
    if values.empty:
        return {"count": 0}
    return {"count": int(values.size), "mean": float(values.mean()),
            "median": float(values.median()), "p90": float(values.quantile(0.9)),
            "max": float(values.max()), "min": float(values.min())}


def summarize_trials(table: pd.DataFrame) -> dict:
    """Ratio statistics over proven-optimal trials, upper bounds over all, solver outcomes."""
    solved = table[table["status"] != "empty"]
    proven = solved[solved["status"] == "optimal"]
    summary = {"trials": int(len(table)), "empty_trials": int((table["status"] == "empty").sum()),
               "status_counts": {k: int(v) for k, v in solved["status"].value_counts().items()},
               "proven_optimal": int(len(proven)),
               "proven_by": {k: int(v) for k, v in proven["proven_by"].value_counts().items()},
               "solve_time_s": _stats(solved["solve_time_s"]),
               "lp_time_s": _stats(solved["lp_time_s"]),
               "gap_unproven": _stats(solved.loc[solved["status"] != "optimal", "gap"]),
               "n": _stats(solved["n"])}
    for policy, suffix in (("mcsf", ""), ("fcfs", "_fcfs")):
        ratio = proven["ratio" + suffix]
        summary[policy] = {
            "ratio_over_proven_optimal": _stats(ratio),
            "ratio_exactly_1": int(np.isclose(ratio, 1.0, rtol=0, atol=1e-12).sum()),
            # TEL / best schedule found: a lower bound on the true ratio where unproven.
            "ratio_lower_over_all": _stats(solved["ratio" + suffix]),
            "ratio_upper_over_all": _stats(solved["ratio_upper" + suffix])}
    return summary


def format_summary(summary: dict) -> str:
    lines = [f"trials: {summary['trials']} ({summary['empty_trials']} empty), "
             f"status: {summary['status_counts']}, proven optimal: {summary['proven_optimal']} "
             f"(by {summary['proven_by']})"]
    for policy in ("mcsf", "fcfs"):
        r, low, u = (summary[policy][k] for k in ("ratio_over_proven_optimal",
                                                  "ratio_lower_over_all", "ratio_upper_over_all"))
        if r["count"]:
            lines.append(f"{policy}: TEL/OPT over {r['count']} proven trials: mean {r['mean']:.4f}"
                         f", max {r['max']:.4f}, exactly 1: {summary[policy]['ratio_exactly_1']}")
        if u["count"]:
            lines.append(f"{policy}: over all {u['count']} trials, TEL/best schedule (lower "
                         f"bound on TEL/OPT): mean {low['mean']:.4f}, max {low['max']:.4f}; "
                         f"TEL/best bound (upper bound): mean {u['mean']:.4f}, "
                         f"max {u['max']:.4f}")
    t = summary["solve_time_s"]
    if t["count"]:
        lines.append(f"solve time s: median {t['median']:.2f}, p90 {t['p90']:.2f}, "
                     f"max {t['max']:.2f}; wall {summary.get('wall_time_s', math.nan):.1f} s")
    return "\n".join(lines)


#: The MC-SF journal paper's Section 5.1 (n ~ U{40..60}, 200 trials): MC-SF's TEL/OPT,
#: mean and worst, offline (Figure 2 left, A1) and online (Figure 2 right, A2).
PAPER_MCSF_RATIO = {False: (1.005, 1.074), True: (1.047, 1.227)}


def plot_histograms(table: pd.DataFrame, out_dir: Path, online: bool | None = None) -> None:
    """Histograms of TEL/OPT over the proven trials and TEL/best bound over all, MC-SF and
    FCFS; the paper's MC-SF mean and worst ratio (``online`` picks A1 or A2) drawn dashed on
    the first. An empty histogram is replaced by a note."""
    import matplotlib.pyplot as plt

    from replay.experiments.plots.common import save_figure  # selects the Agg backend

    proven = table[table["status"] == "optimal"]
    solved = table[table["status"] != "empty"]
    for name, frame, columns, label, paper in (
            ("ratio_hist.png", proven, ("ratio", "ratio_fcfs"),
             f"TEL / OPT over the {len(proven)} trials proven optimal (1 = optimal)",
             PAPER_MCSF_RATIO.get(online)),
            ("ratio_upper_hist.png", solved, ("ratio_upper", "ratio_upper_fcfs"),
             f"TEL / best lower bound, {len(solved)} trials (an upper bound on TEL / OPT)",
             None)):
        fig, ax = plt.subplots(figsize=(6.8, 4.2))
        values = [frame[c].dropna().to_numpy() for c in columns]
        data = np.concatenate(values) if values else np.zeros(0)
        if data.size:
            edges = np.histogram_bin_edges(data, bins=30)
            for v, policy in zip(values, ("MC-SF", "FCFS (lookahead)"), strict=True):
                if v.size:
                    ax.hist(v, bins=edges, alpha=0.6,
                            label=f"{policy} (mean {v.mean():.3f}, {v.size} trials)")
                else:
                    ax.plot([], [], label=f"{policy}: no trial with a value")
            if paper is not None:
                ax.axvline(paper[0], color="tab:red", ls="--", lw=1.2,
                           label=f"paper: MC-SF mean {paper[0]:g} (n ~ U{{40..60}})")
                ax.axvline(paper[1], color="tab:red", ls=":", lw=1.2,
                           label=f"paper: MC-SF worst {paper[1]:g}")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no trial here has a value\n(none proven optimal or solved)",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label)
        ax.set_ylabel("trials")
        kind = {True: "Online", False: "Offline", None: "All"}[online]
        ax.set_title(f"{kind} trials: MC-SF and FCFS against the hindsight optimum",
                     fontsize=10)
        save_figure(fig, out_dir / name, frame[["trial", "status", *columns]])
