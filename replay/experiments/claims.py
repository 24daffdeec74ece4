"""What each paper reports for each reproduction target, as data: every claim lists its
quantitative parts (a value, a ratio, a ranking, a slope, a shape, a premise), each with
the paper's number, the tolerance, the minimum sample and the reader that finds ours in
the target's outputs (the CSVs behind its figures, or its runs' summaries). The report
(:mod:`replay.experiments.report`) prints this table on every target's section and the
verdicts it gives; the rules are in :mod:`replay.experiments.verdicts`.

Tolerances are ours: the papers state numbers, not error bars. They are set per kind of
quantity (a fraction of a latency, an absolute step of a ratio or of alpha), not per
result, and printed beside every verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from replay.experiments import authors
from replay.experiments.plots.common import PAPER_C3_TEL, PAPER_SMALLEST_ALPHA, PAPER_TABLE_1
from replay.experiments.plots.wait import capacity_summary
from replay.experiments.studies.c1_synthetic import PAPER_TABLE_4
from replay.experiments.verdicts import (
    AGREES,
    DIFFERS,
    IN_SHAPE,
    LEVEL,
    MEASURED_CAUSE,
    NO_CHECK,
    NOT_MEASURED,
    WEAKEST_FIRST,
    Estimate,
    Part,
    Result,
    Tolerance,
    TooFewSamples,
    claim_verdict,
    fmt,
    judge_ranking,
    premise_result,
    ranking_part,
    ratio_part,
    upper_first,
    value_part,
    values_part,
)

PAPERS = {"mcsf_journal": "Jaillet et al., MC-SF (journal version)",
          "mcsf_conference": "Jaillet et al., MC-SF (conference version)",
          "wait_fluid": "WAIT / Nested WAIT (fluid-guided scheduling)",
          "sorted_f": "Sorted-F (heterogeneous prompts)"}


@dataclass(frozen=True)
class Claim:
    paper: str      # a key of PAPERS
    section: str
    statement: str  # our paraphrase of what the paper reports
    parts: tuple[Part, ...] = ()

    def judge(self, out_dir: Path) -> dict:
        """The claim's verdict, its one-sentence summary and every part's result."""
        results = [(part, part.result(out_dir)) for part in self.parts]
        verdict, sentence = claim_verdict(results)
        return {"verdict": verdict, "sentence": sentence, "parts": results}


# ------------------------------------------------------------------------------ reading
def _csv(out_dir: Path, name: str) -> pd.DataFrame:
    found = sorted(Path(out_dir).rglob(name))
    if not found:
        raise FileNotFoundError(name)
    return pd.read_csv(found[0])


def sibling(out_dir: Path, target: str) -> Path:
    """Another target's folder beside ``out_dir`` (its quick folder for a quick one)."""
    quick = Path(out_dir).name.endswith("-quick")
    return Path(out_dir).parent / (f"{target}-quick" if quick else target)


def _worst(verdicts: list[str]) -> str:
    return next(v for v in WEAKEST_FIRST if v in verdicts)


# ------------------------------------------------------------------ A1/A2: hindsight ratio
def _proven(out_dir: Path) -> pd.Series:
    trials = _csv(out_dir, "ratio_hist.csv")
    return trials.loc[trials["status"] == "optimal", "ratio"].astype(float)


def _ratio_stat(stat: str, out_dir: Path) -> tuple[float, int]:
    proven = _proven(out_dir)
    if proven.empty:
        return math.nan, 0
    value = {"mean": proven.mean(), "max": proven.max(), "exact": (proven == 1).mean()}[stat]
    return float(value), len(proven)


def _hindsight_parts(mean: float, worst: float, exact_share: float | None) -> tuple[Part, ...]:
    proven = partial(value_part, tolerance=Tolerance(absolute=0.02), min_sample=10,
                     sample_unit="trials proven optimal")
    parts = [proven("mean of MC-SF / OPT", mean, read=partial(_ratio_stat, "mean")),
             value_part("worst MC-SF / OPT", worst, Tolerance(absolute=0.05), 10,
                        "trials proven optimal", partial(_ratio_stat, "max"))]
    if exact_share is not None:
        parts.append(value_part("share of trials where MC-SF is optimal", exact_share,
                                Tolerance(absolute=0.10), 10, "trials proven optimal",
                                partial(_ratio_stat, "exact")))
    return tuple(parts)


def _scaled_down_observation(out_dir: Path) -> Result:
    proven = _proven(out_dir)
    if proven.empty:
        return Result(NO_CHECK, "No trial was proven optimal; no paper value at this size.")
    return Result(NO_CHECK, f"Mean {proven.mean():.3f}, worst {proven.max():.3f}, exact in "
                            f"{int((proven == 1).sum())} of {len(proven)} proven trials; the "
                            f"paper has no value at this size.",
                  f"mean {proven.mean():.3f}", f"{len(proven)} trials proven optimal")


SCALED_DOWN = Part("observed", "MC-SF / OPT over proven trials", "none at this size", "",
                   "", _scaled_down_observation)


# ------------------------------------------------------------------------ A3: latency vs n
def _a3_runs(rate: int, out_dir: Path) -> pd.DataFrame:
    runs = _csv(out_dir, f"latency_vs_n_runs_rate{rate}.csv")
    return runs[runs["status"] == "completed"]


def _a3_latency(rate: int, out_dir: Path) -> pd.DataFrame:
    runs = _a3_runs(rate, out_dir)
    return runs.rename(columns={"n": "sample", "mean_latency": "value"})[
        ["policy", "sample", "value"]]


def _slopes(rate: int, out_dir: Path) -> pd.DataFrame:
    """Least-squares slope of mean latency in n per policy over its completed runs, with
    its standard error and the number of runs (no slope under three runs)."""
    rows = []
    for policy, line in _a3_runs(rate, out_dir).groupby("policy"):
        fit = (stats.linregress(line["n"].astype(float), line["mean_latency"].astype(float))
               if len(line) >= 3 else None)
        rows.append({"policy": policy, "slope": fit.slope if fit else math.nan,
                     "se": fit.stderr if fit else math.nan, "n": len(line)})
    return pd.DataFrame(rows, columns=["policy", "slope", "se", "n"]).set_index("policy")


def _best_other_slope_ratio(rate: int, out_dir: Path) -> pd.DataFrame:
    """The paper's ratio: the best (smallest) other slope over MC-SF's, with a conservative
    lower end (both slopes at the ends of their 95 % intervals that bring them closest)."""
    slopes = _slopes(rate, out_dir)
    if "MC-SF" not in slopes.index or len(slopes) < 2:
        raise TooFewSamples("MC-SF and at least one other policy need completed runs")
    mcsf = slopes.loc["MC-SF"]
    others = slopes.drop("MC-SF").dropna(subset=["slope"])
    if others.empty or not math.isfinite(mcsf["slope"]):
        runs = int(min(mcsf["n"], slopes.drop("MC-SF")["n"].max()))
        return pd.DataFrame([{"label": "every other policy", "ratio": math.nan, "n": runs}])
    best = others["slope"].idxmin()
    row = others.loc[best]
    t = stats.t.ppf(0.5 + LEVEL / 2, max(int(min(row["n"], mcsf["n"])) - 2, 1))
    low = (row["slope"] - t * row["se"]) / (mcsf["slope"] + t * mcsf["se"])
    return pd.DataFrame([{"label": best, "ratio": row["slope"] / mcsf["slope"], "low": low,
                          "n": int(min(row["n"], mcsf["n"]))}])


def _a3_parts(rate: int, ratio_low: float, ratio_high: float,
              ranking: bool) -> tuple[Part, ...]:
    parts = []
    if ranking:
        parts.append(ranking_part("mean latency, paired over n", "MC-SF", True, 5,
                                  "runs (values of n)", partial(_a3_latency, rate)))
    parts.append(ratio_part("best other slope over MC-SF's", ratio_low, ratio_high,
                            Tolerance(relative=0.25), 5, "runs (values of n)", "MC-SF",
                            partial(_best_other_slope_ratio, rate), kind="slope"))
    return tuple(parts)


#: The journal text gives the slopes (1/6 and 1/2 at high demand, 1/800 and 1/100 at low)
#: without their unit; only their ratio, which has none, is judged.
_A3 = (Claim("mcsf_journal", "5.2.1, Figure 3 (left)",
             "High demand (50/s): latency grows linearly in n for every policy; MC-SF's is "
             "the lowest, and the best other policy's slope is about 3 times MC-SF's (1/2 "
             "against 1/6).", _a3_parts(50, 3.0, 3.0, ranking=True)),
       Claim("mcsf_journal", "5.2.1, Figure 3 (right)",
             "Low demand (10/s): MC-SF's latency grows over eight times more slowly with n "
             "than the best other policy's (slopes about 1/800 against 1/100).",
             _a3_parts(10, 8.0, math.inf, ranking=False)))


# ---------------------------------------------------------------------------- A4: Table 1
def _a4_stats(out_dir: Path) -> pd.DataFrame:
    stats_ = _csv(out_dir, "seed_statistics.csv")
    return stats_[stats_["count"] > 0]


def _a4_summary(out_dir: Path) -> pd.DataFrame:
    found = _a4_stats(out_dir)
    return pd.DataFrame({"policy": found["policy"], "mean": found["mean"],
                         "std": found["std"], "n": found["count"]})


def _a4_mcsf(out_dir: Path) -> tuple[float, int]:
    row = _a4_stats(out_dir).set_index("policy").loc["MC-SF"]
    return float(row["mean"]), int(row["count"])


def _ratios_to(table: pd.DataFrame, winner: str) -> pd.DataFrame:
    """Others' mean over ``winner``'s (columns policy, mean, std, n), with the ratio's
    conservative lower end from both 95 % intervals."""
    est = {r["policy"]: Estimate.from_summary(r["mean"], r["std"], r["n"])
           for _, r in table.iterrows()}
    base = est[winner]
    rows = [{"label": p, "ratio": e.mean / base.mean,
             "low": (e.low / base.high) if math.isfinite(e.half_width) else math.nan,
             "n": min(e.n, base.n)} for p, e in est.items() if p != winner]
    return pd.DataFrame(rows)


def _a4_ratios(out_dir: Path) -> pd.DataFrame:
    return _ratios_to(_a4_summary(out_dir), "MC-SF")


PAPER_A4_RATIOS = sorted(mean / PAPER_TABLE_1["MC-SF"][0]
                         for p, (mean, _) in PAPER_TABLE_1.items() if p != "MC-SF")
PAPER_A4_SPREAD = sorted(100 * std / mean for mean, std in PAPER_TABLE_1.values())


def _a4_spread(out_dir: Path) -> pd.DataFrame:
    found = _a4_stats(out_dir)
    return pd.DataFrame({"label": found["policy"], "value": 100 * found["std"] / found["mean"],
                         "n": found["count"]})


def _timescale_variants(out_dir: Path) -> pd.DataFrame:
    """A4's setup with one factor varied at a time (target ``a4_timescale``: the running
    cap, the predictor, the length source), one row per variant and policy."""
    found = sibling(out_dir, "a4_timescale") / "timescale.csv"
    if not found.is_file():
        return pd.DataFrame()
    table = pd.read_csv(found)
    return table[(table["count"] > 0) & (table["variant"] != "baseline")]


def _with_cause(base: Result, tolerance_ok, out_dir: Path, factor_runs: str) -> Result:
    """``base`` (a part that differs or holds only in shape), with the a4_timescale
    variants read as measured causes: a variant that varied one factor alone and brings
    the quantity within its tolerance is a measured cause; none doing so is said too."""
    if base.verdict not in (DIFFERS, IN_SHAPE):
        return base
    variants = _timescale_variants(out_dir)
    if variants.empty:
        return base
    moved, tried = [], []
    for variant, rows in variants.groupby("variant"):
        ok, shown = tolerance_ok(rows)
        tried.append(f"{variant}: {shown}")
        if ok:
            moved.append(variant)
    detail = (f"{factor_runs} (one factor varied alone each): " + "; ".join(tried),)
    if moved and base.verdict == DIFFERS:
        return Result(MEASURED_CAUSE, base.sentence.rstrip(".") + f"; varying "
                      f"{', '.join(moved)} alone (a4_timescale) brings it within tolerance.",
                      base.measured, base.sample, base.detail + detail)
    note = (f" Within tolerance under {', '.join(moved)} (a4_timescale)." if moved else
            " No a4_timescale variant brings it within tolerance.")
    return Result(base.verdict, base.sentence, base.measured, base.sample,
                  base.detail + detail + (note.strip(),))


def _a4_mcsf_part() -> Part:
    paper, tol = PAPER_TABLE_1["MC-SF"][0], Tolerance(relative=0.10)
    plain = value_part("MC-SF's mean latency", paper, tol, 10, "seeds", _a4_mcsf, unit=" s")
    lo, hi = tol.bounds(paper, paper)

    def within(rows: pd.DataFrame):
        mean = float(rows.set_index("policy").loc["MC-SF", "mean"])
        return lo <= mean <= hi, f"MC-SF {mean:.1f} s"

    def judge(out_dir: Path) -> Result:
        return _with_cause(plain.judge(out_dir), within, out_dir, "a4_timescale")
    return Part(plain.kind, plain.quantity, plain.paper, plain.tolerance, plain.min_sample, judge)


def _a4_ratio_part() -> Part:
    low, high, tol = PAPER_A4_RATIOS[0], PAPER_A4_RATIOS[-1], Tolerance(relative=0.05)
    plain = ratio_part("other settings' means over MC-SF's", low, high, tol, 10, "seeds",
                       "MC-SF", _a4_ratios)
    lo, hi = tol.bounds(low, high)

    def within(rows: pd.DataFrame):
        by = rows.set_index("policy")["mean"]
        ratios = by.drop("MC-SF") / by["MC-SF"]
        return bool(((ratios >= lo) & (ratios <= hi)).all()), \
            f"{ratios.min():.2f}-{ratios.max():.2f}"

    def judge(out_dir: Path) -> Result:
        return _with_cause(plain.judge(out_dir), within, out_dir, "a4_timescale")
    return Part(plain.kind, plain.quantity, plain.paper, plain.tolerance, plain.min_sample, judge)


# --------------------------------------------------------------------------- A7: alpha
def _smallest_alpha(rate: float, out_dir: Path) -> tuple[float, int]:
    """The smallest alpha from which every larger alpha searched finishes (requeue at the
    front), and how many alpha values were searched at this rate."""
    search = _csv(out_dir, "alpha_search.csv")
    rows = search[(search["requeue"] == "front") & (search["rate"] == rate)].sort_values("alpha")
    if rows.empty:
        return math.nan, 0
    finished = (rows["status"] == "completed").to_numpy()
    # The first alpha of the trailing run of finishing ones.
    failing = np.flatnonzero(~finished)
    first = 0 if failing.size == 0 else failing[-1] + 1
    value = float(rows["alpha"].iloc[first]) if first < len(rows) else math.nan
    return value, len(rows)


_A7 = (Claim("mcsf_conference", "7.1 and 7.2",
             "A grid search (step 0.01) finds the smallest alpha for which alpha-protection "
             "avoids the endless clearing cycle: 0.21 at high demand, 0.24 at low demand.",
             tuple(value_part(f"smallest finishing alpha at {rate}/s", alpha,
                              Tolerance(absolute=0.02), 20, "alpha values searched",
                              partial(_smallest_alpha, float(rate)))
                   for rate, alpha in PAPER_SMALLEST_ALPHA.items())),)


# ---------------------------------------------------------------------------- B0: cascade
def _b0_ratio(out_dir: Path) -> pd.DataFrame:
    bars = _csv(out_dir, "policies.csv").set_index("policy")
    wait, fcfs = bars.loc["WAIT"], bars.loc["FCFS (WAIT paper)"]
    return pd.DataFrame([{"label": "FCFS (WAIT paper)",
                          "ratio": wait["throughput"] / fcfs["throughput"],
                          "n": int(min(wait.get("seeds", 1), fcfs.get("seeds", 1)))}])


# ----------------------------------------------------------------- B: WAIT vs baselines
#: The serving baselines the WAIT paper compares against (policy labels).
BASELINES = ("vLLM-like", "Sarathi-like")


def _summary_rows(group: pd.DataFrame, mean: str, spread: str, kind: str) -> pd.DataFrame:
    """One row per policy (policy, mean, std, n) from a figure's table, whose spread column
    is a standard deviation (``kind="std"``) or a 95 % half-width (``"ci95"``)."""
    n = group["seeds"].astype(int)
    spread_values = group[spread].astype(float)
    if kind == "ci95":
        t = np.array([stats.t.ppf(0.5 + LEVEL / 2, k - 1) if k > 1 else np.nan for k in n])
        spread_values = spread_values * np.sqrt(n) / t
    return pd.DataFrame({"policy": group["policy"], "mean": group[mean].astype(float),
                         "std": spread_values.to_numpy(), "n": n.to_numpy()})


@dataclass(frozen=True)
class Case:
    """One point a B claim is judged at (a rate, or a memory budget and a rate, for one
    WAIT variant): whether its premises hold, and its result if they do."""

    label: str
    premise_ok: bool
    premise_text: str
    result: Result | None = None
    detail: list[str] = field(default_factory=list)


def _wait_cases(policy: str, out_dir: Path) -> list[Case]:
    bars = _csv(out_dir, "policies.csv")
    saturation = capacity_summary(out_dir)
    scenario = out_dir.name.removesuffix("-quick")
    if len(saturation):
        saturation = saturation[saturation["scenario"] == scenario]
    slowest = float(saturation["saturation_above"].min()) if len(saturation) else None
    cases = []
    for rate, group in bars.groupby("total_rate"):
        evictions = group.set_index("policy")["evictions"].reindex(BASELINES).fillna(0)
        label = f"rate {rate:g}/s"
        if (evictions <= 0).all():
            cases.append(Case(label, False, "memory never binds (the baselines evict "
                                            "nothing)"))
            continue
        if slowest is not None and rate <= slowest:
            cases.append(Case(label, False, f"the rate is below every policy's measured "
                                            f"saturation rate ({slowest:.4g}/s, b_capacity)"))
            continue
        table = _summary_rows(group, "throughput", "throughput_std", "std")
        cases.append(Case(label, True, "", judge_ranking(table, policy, False, 3,
                                                          "throughput", "seeds")))
    return cases


def _premise_part(cases_of, quantity: str, absent_default: str) -> Part:
    def judge(out_dir: Path) -> Result:
        cases = cases_of(out_dir)
        if not cases:
            raise TooFewSamples("no point to judge")
        absent = [c for c in cases if not c.premise_ok]
        detail = tuple(f"{c.label}: premise absent, {c.premise_text}" for c in absent)
        if len(absent) < len(cases):
            return premise_result(True, "", f"The premise holds at {len(cases) - len(absent)} "
                                            f"of {len(cases)} points.",
                                  f"{len(cases) - len(absent)} of {len(cases)}",
                                  f"{len(cases)} points", detail)
        texts = list(dict.fromkeys(c.premise_text for c in absent))
        return premise_result(False, texts[0] if len(texts) == 1 else absent_default,
                              f"At every point judged: {'; '.join(texts)}.",
                              f"0 of {len(cases)}", f"{len(cases)} points", detail)
    return Part("premise", quantity, "holds (the claim rests on it)", "", "1 point", judge)


def _cases_part(cases_of, kind: str, quantity: str, paper: str, tolerance: str,
                min_sample: str) -> Part:
    """The weakest result over the cases whose premises hold."""
    def judge(out_dir: Path) -> Result:
        judged = [c for c in cases_of(out_dir) if c.premise_ok and c.result is not None]
        if not judged:
            return Result(NOT_MEASURED, "Not judged: the premise is absent at every point.")
        verdicts = [c.result.verdict for c in judged]
        worst = _worst(verdicts)
        count = sum(v == worst for v in verdicts)
        first = next(c for c in judged if c.result.verdict == worst)
        sentence = (first.result.sentence if len(judged) == 1 else
                    f"At {count} of {len(judged)} points ({first.label} first): "
                    f"{first.result.sentence[0].lower()}{first.result.sentence[1:]}")
        detail = tuple(f"{c.label}: {c.result.verdict}; {c.result.sentence}"
                       for c in judged) + tuple(line for c in judged for line in c.detail)
        return Result(worst, sentence, first.result.measured,
                      f"{len(judged)} points, {first.result.sample}", detail)
    return Part(kind, quantity, paper, tolerance, min_sample, judge)


def _wait_best(policy: str) -> tuple[Part, ...]:
    cases = partial(_wait_cases, policy)
    return (_premise_part(cases, "memory binds at the paper's rate (a baseline evicts) and "
                                 "the rate exceeds every policy's saturation rate",
                          "memory never binds or the server is not short of capacity"),
            _cases_part(cases, "ranking", f"{policy}'s throughput", f"{policy} highest",
                        "95 % intervals separate", "3 seeds"))


# ------------------------------------------------------- B: where memory binds (issue 30)
def _recorded_false(value) -> bool:
    """A recorded condition that was checked and failed (a CSV cell: bool, text or empty)."""
    return str(value) == "False"


def _membound_cases(out_dir: Path) -> list[Case]:
    """Per WAIT variant and point (M, rate) where a baseline evicts: the variant's own
    recorded checks (``m_pi``, conditions (11) and (12), read from its runs' ``policy_info``
    into ``membound.csv``) are its premises; where they hold, a ranking against the
    baselines by 95 % intervals over seeds."""
    stats_ = _csv(out_dir, "membound.csv")
    waits = [p for p in stats_["policy"].unique() if "WAIT" in p]
    cases = []
    for (kv, rate), point in stats_.groupby(["kv_tokens", "total_rate"]):
        by = point.set_index("policy")
        baselines = by.reindex([b for b in BASELINES if b in by.index])
        for wait in waits:
            if wait not in by.index:
                continue
            own = by.loc[wait]
            label = f"{wait}, M = {kv:,.0f}, rate {rate:g}/s"
            if baselines.empty or not (baselines["evictions"] > 0).any():
                cases.append(Case(label, False, "memory never binds (the baselines evict "
                                                "nothing)"))
            elif pd.notna(own.get("m_pi")) and float(own["m_pi"]) > kv:
                cases.append(Case(label, False, f"WAIT's own batch does not fit M (its runs "
                                                f"record m_pi = {float(own['m_pi']):,.0f} > "
                                                f"M = {kv:,.0f})"))
            elif _recorded_false(own.get("condition_11")):
                cases.append(Case(label, False, "condition (11) fails in WAIT's own runs (its "
                                                "thresholds cannot keep up with the rates)"))
            elif _recorded_false(own.get("condition_12")):
                cases.append(Case(label, False, "condition (12) fails in Nested WAIT's own "
                                                "runs"))
            else:
                table = _summary_rows(point[point["policy"].isin([wait, *baselines.index])],
                                      "throughput", "throughput_ci95", "ci95")
                cases.append(Case(label, True, "", judge_ranking(table, wait, False, 3,
                                                                  "throughput", "seeds")))
    return cases


_B_MEMBOUND_PARTS = (
    _premise_part(_membound_cases, "memory binds (a baseline evicts) and the WAIT run's own "
                                   "checks hold: m_pi <= M, condition (11)",
                  "memory never binds or WAIT's own checks fail"),
    _cases_part(_membound_cases, "ranking", "WAIT's throughput against the baselines",
                "WAIT highest", "95 % intervals separate", "3 seeds"))


# ------------------------------------------------------------ B: the fluid boundary
def _capacity_cases(out_dir: Path) -> list[Case]:
    summary = _csv(out_dir, "capacity_summary.csv")
    if "timing" not in summary.columns:
        raise KeyError("timing")
    vidur = summary[summary["timing"] == "vidur"].set_index(["scenario", "label"])
    linear = summary[summary["timing"] == "linear"].set_index(["scenario", "label"])
    cases = []
    for key, row in vidur.iterrows():
        label = f"{key[0]} {key[1]}"
        ratio = float(row["saturation_above_over_boundary"])
        unstable = row["fluid_stable_but_unstable_in_simulation"] not in ("[]", "")
        shown = f"stable up to {ratio:.2g}x the fluid boundary"
        if not unstable:
            cases.append(Case(label, True, "", Result(AGREES, f"{label}: {shown}.")))
        elif key in linear.index and linear.loc[key, "fluid_stable_but_unstable_in_simulation"] \
                in ("[]", ""):
            cases.append(Case(label, True, "", Result(
                MEASURED_CAUSE, f"{label}: {shown} under Vidur timing, up to the boundary "
                                f"under the fluid model's own linear timing (b_capacity, "
                                f"timing=linear): the timing model.")))
        elif key in linear.index:
            cases.append(Case(label, True, "", Result(
                DIFFERS, f"{label}: {shown}, and unstable below the boundary under linear "
                         f"timing too (b_capacity, timing=linear), which rules the timing "
                         f"model out.")))
        else:
            cases.append(Case(label, True, "", Result(DIFFERS, f"{label}: {shown}.")))
    # A scenario whose own rate is fluid-stable is also tested by its full-length runs.
    quick = out_dir.name.endswith("-quick")
    stable = vidur[vidur["fluid_label_at_own_rate"] == "stable"]
    for scenario in dict.fromkeys(stable.index.get_level_values(0)):
        bars = out_dir.parent / (f"{scenario}-quick" if quick else scenario) / "policies.csv"
        if not bars.is_file():
            continue
        for _, row in pd.read_csv(bars).iterrows():
            if row.get("not_completed", 0) > 0:
                text = (f"{scenario} at its paper rate {row['total_rate']:g}/s (fluid-stable): "
                        f"{row['policy']} did not complete {int(row['not_completed'])} of "
                        f"{int(row['seeds'])} full-length runs")
                if row["evictions"] > 0:
                    text += f", evicting {row['evictions']:,.0f} times per run"
                cases.append(Case(f"{scenario} {row['policy']} (paper runs)", True, "",
                                  Result(DIFFERS, text + ".")))
    return cases


def _capacity_part() -> Part:
    def judge(out_dir: Path) -> Result:
        judged = _capacity_cases(out_dir)
        if not judged:
            raise TooFewSamples("no scenario measured")
        verdicts = [c.result.verdict for c in judged]
        counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
        worst = _worst(verdicts)
        below = len(judged) - counts.get(AGREES, 0)
        sentence = (f"Every scenario-policy pair ({len(judged)}) is stable up to the fluid "
                    f"boundary." if not below else
                    f"{below} of {len(judged)} scenario-policy pairs are unstable below the "
                    f"fluid boundary: the linear-timing runs name the timing model for "
                    f"{counts.get(MEASURED_CAUSE, 0)} and rule it out for "
                    f"{counts.get(DIFFERS, 0)}.")
        return Result(worst, sentence, f"{counts.get(AGREES, 0)} of {len(judged)} stable",
                      f"{len(judged)} pairs", tuple(c.result.sentence for c in judged))
    return Part("value", "saturation rate over the fluid boundary rate", ">= 1 (stable below "
                "the boundary)", "one grid step (0.1)", "1 rate grid", judge)


# ------------------------------------------------------------------------ B5: segments
def _segments_part() -> Part:
    def judge(out_dir: Path) -> Result:
        terms = _csv(out_dir, "segment_terms.csv").dropna(subset=["total"])
        lines, ok, sizes = [], [], []
        for key, group in terms.groupby(["rate", "horizon", "delta"]):
            best = group.loc[group["total"].idxmin()]
            dominant = best[["term1", "term2", "term3"]].astype(float).idxmax()
            holds = 5 <= int(best["segments"]) <= 10 and dominant == "term1"
            ok.append(holds)
            sizes.append(len(group))
            lines.append(f"(rate {key[0]:g}, T {key[1]:g}, delta {key[2]:g}): best L = "
                         f"{int(best['segments'])}, largest {dominant}")
        if not lines:
            raise TooFewSamples("no segment count with a finite total")
        n = min(sizes)
        if n < 4:
            return Result(NOT_MEASURED, f"Not measured: only {n} segment counts per setting "
                                        f"(needs 4).", sample=f"{n} segment counts")
        verdict = AGREES if all(ok) else DIFFERS
        return Result(verdict, f"The total is lowest at L in 5-10 with the first term largest "
                               f"in {sum(ok)} of {len(ok)} settings.",
                      f"{sum(ok)} of {len(ok)}", f"{n} segment counts", tuple(lines))
    return Part("shape", "segments minimising the total; its largest term", "5-10; term 1",
                "exact", "4 segment counts", judge)


# --------------------------------------------------------------------------- C series
def _c1_sample(out_dir: Path) -> pd.Series:
    trials = _csv(out_dir, "trials.csv")
    return trials.groupby("distribution").size()


def _c1_values(out_dir: Path) -> pd.DataFrame:
    tel = _csv(out_dir, "c1_tel.csv")
    swap = tel[tel["policy"] == "sorted_f_swap"].set_index("distribution")["mean_tel"]
    counts = _c1_sample(out_dir)
    return pd.DataFrame([{"label": d, "value": swap[d] / paper["sorted_f_swap"],
                          "n": int(counts.get(d, 0))}
                         for d, paper in PAPER_TABLE_4.items() if d in swap])


def _c1_lp_ratios(out_dir: Path) -> pd.DataFrame:
    tel = _csv(out_dir, "c1_tel.csv").set_index(["distribution", "policy"])["mean_tel"]
    counts = _c1_sample(out_dir)
    rows = []
    for d in PAPER_TABLE_4:
        for lp in ("sorted_lp", "lp_swap"):
            if (d, lp) in tel.index and (d, "sorted_f_swap") in tel.index:
                rows.append({"label": f"{d} {lp}", "n": int(counts.get(d, 0)),
                             "value": tel[(d, lp)] / tel[(d, "sorted_f_swap")]})
    return pd.DataFrame(rows)


def _c2_at_largest(name: str, out_dir: Path) -> pd.DataFrame:
    table = _csv(out_dir, name)
    at = table[table["n"] == table["n"].max()]
    return pd.DataFrame({"policy": at["policy"], "mean": at["mean"], "std": at["std"],
                         "n": at["count"]})


def _pair_part(quantity: str, paper: str, file: str, winner: str, losers: tuple[str, ...],
               lower_is_better: bool = True) -> Part:
    """``winner`` ahead of each of ``losers`` at the largest n (a ranking among them)."""
    def read(out_dir: Path) -> pd.DataFrame:
        table = _c2_at_largest(file, out_dir)
        return table[table["policy"].isin([winner, *losers])]
    part = ranking_part(quantity, winner, lower_is_better, 3, "shuffles", read)
    return Part(part.kind, part.quantity, paper, part.tolerance, part.min_sample, part.judge)


def _c2_ratio_part(quantity: str, paper: str, file: str, num: str, den: tuple[str, ...],
                   low: float, high: float, tolerance_text: str) -> Part:
    """``min(den) / num`` (a speed-up or latency ratio at the largest n) within
    ``low..high``."""
    def judge(out_dir: Path) -> Result:
        table = _c2_at_largest(file, out_dir).set_index("policy")
        n = int(table.loc[[num, *den], "n"].min())
        ratio = float(table.loc[list(den), "mean"].min() / table.loc[num, "mean"])
        if n < 3:
            return Result(NOT_MEASURED, f"Not measured: {n} shuffles (needs 3).",
                          fmt(ratio), f"{n} shuffles")
        verdict = AGREES if low <= ratio <= high else DIFFERS
        return Result(verdict, f"{upper_first(quantity)} is {fmt(ratio)} ({tolerance_text} "
                               f"{'holds' if verdict == AGREES else 'does not hold'}).",
                      fmt(ratio), f"{n} shuffles")
    return Part("ratio", quantity, paper, tolerance_text, "3 shuffles", judge)


def _c3_values(prefix: str, out_dir: Path) -> pd.DataFrame:
    tel = _csv(out_dir, "tel.csv")
    rows = tel[tel["policy"].str.startswith(prefix)]
    return pd.DataFrame({"label": rows["policy"] + ", " + rows["order"],
                         "value": rows["tel"].astype(float), "n": len(rows)})


# ------------------------------------------------------------------------ the table
_A1_PAPER = {"a1": (1.005, 1.074, 114 / 200, "1.005 mean, 1.074 worst, exact in 114 of 200 "
                                             "trials"),
             "a2": (1.047, 1.227, None, "1.047 mean, 1.227 worst")}

_B_WAIT = (Claim("wait_fluid", "6.1, Figures 7-8",
                 "WAIT's throughput exceeds the vLLM-like and Sarathi-like baselines' at every "
                 "tested rate, at similar latency.", _wait_best("WAIT")),)
_B_MEMBOUND = (Claim("wait_fluid", "4, Example 2 and Theorem 4.3",
                     "The mechanism WAIT is built on: where memory binds, admitting by fluid "
                     "thresholds avoids the eviction cascade of greedy admission, so WAIT's "
                     "throughput exceeds the baselines' (tested at rates below saturation, "
                     "where the baselines evict).", _B_MEMBOUND_PARTS),)
_B_NESTED = (Claim("wait_fluid", "6.2, Figures 11-14",
                   "Nested WAIT reaches higher throughput than the baselines, with at most a "
                   "modest latency increase.", _wait_best("Nested WAIT")),)

CLAIMS: dict[str, tuple[Claim, ...]] = {
    **{name: (Claim("mcsf_journal", f"5.1, Figure 2 ({side})",
                    f"MC-SF over the hindsight optimum, arrival model {model}: {text}.",
                    _hindsight_parts(mean, worst, exact)),)
       for name, side, model, (mean, worst, exact, text) in (
           ("a1", "left", 1, _A1_PAPER["a1"]), ("a2", "right", 2, _A1_PAPER["a2"]))},
    **{f"{name}s": (Claim("mcsf_journal", "5.1 (scaled down: ours)",
                          f"No paper value at this size; the paper's full-size result is "
                          f"{paper[3]}.", (SCALED_DOWN,)),)
       for name, paper in _A1_PAPER.items()},
    **{name: _A3 for name in ("a3", "a3_small", "a3_lmsys_synthetic",
                              "a3_lmsys_words_synthetic")},
    "a4": (Claim("mcsf_journal", "Appendix, Table 1",
                 "n = 1,000 at 50/s over 50 runs: MC-SF 32.112 s on average, the lowest; the "
                 "other seven settings 46.4-53.4 s (1.45-1.66x MC-SF), each with a spread "
                 "(std / mean) of 0.6-2.7 %.",
                 (ranking_part("mean latency over arrival seeds", "MC-SF", True, 10, "seeds",
                               _a4_summary),
                  _a4_mcsf_part(), _a4_ratio_part(),
                  values_part("spread (std / mean) over seeds", PAPER_A4_SPREAD[0],
                              PAPER_A4_SPREAD[-1], Tolerance(factor=2), 10, "seeds",
                              _a4_spread, unit=" %"))),),
    "a4_timescale": (Claim("mcsf_journal", "Appendix, Table 1",
                           "Absolute latencies of Table 1 (no Vidur configuration or batch "
                           "cap given)."),),
    "a6_alpha": (Claim("mcsf_journal", "Appendix, Figures 7 and 10",
                       "Latency of alpha/beta-clearing depends on alpha; no single alpha is "
                       "best at both demands."),),
    "a6_beta": (Claim("mcsf_journal", "Appendix, Figures 8 and 11",
                      "Latency varies with beta for alpha 0.1 and 0.2; beta matters less than "
                      "alpha."),),
    **{name: _A7 for name in ("a7", "a7_small", "a7_lmsys_synthetic",
                              "a7_lmsys_words_synthetic")},
    "b0": (Claim("wait_fluid", "4.1, Example 2",
                 "With capacity at the fluid equilibrium, greedy FCFS falls into an eviction "
                 "cascade and loses 12-25 % throughput against WAIT.",
                 (ratio_part("WAIT's throughput over the paper's FCFS's", 1 / 0.88, 1 / 0.75,
                             Tolerance(absolute=0.02), 1, "runs of 20,000 rounds", "WAIT",
                             _b0_ratio),)),),
    "b_capacity": (Claim("wait_fluid", "4, the fluid equilibrium and its stability",
                         "A rate is sustainable when its fluid load is below 1: below the "
                         "boundary queues stay bounded, above it they grow.",
                         (_capacity_part(),)),),
    "b1_wait_low": _B_WAIT, "b1_wait_high": _B_WAIT,
    "b1_wait_low_membound": _B_MEMBOUND, "b1_wait_high_membound": _B_MEMBOUND,
    "b2_nested_membound": _B_MEMBOUND,
    "b1_authors": (Claim("wait_fluid", "6.1 (the authors' own runs)",
                         "B1-high as the authors ran it: their simulator's count of batch "
                         "members over time, per policy and cap (84 result files), and their "
                         "batch intervals.", authors.PARTS),),
    "b2_nested": _B_NESTED, "b3_nested_lmsys": _B_NESTED, "b4_nested_lmsys_real": _B_NESTED,
    "b5": (Claim("wait_fluid", "7.2",
                 "In the segment design, the first memory term dominates and the total is "
                 "U-shaped in the number of segments, lowest near 5-10.",
                 (_segments_part(),)),),
    "c1": (Claim("sorted_f", "7, Table 4",
                 "Average TEL of Sorted-F (swap): Uniform 9,748, Normal 9,417, Binomial "
                 "10,697, Exponential 6,017, Mixed 22,100, with Sorted-LP and LP-Swap within "
                 "2 % (the setup stated cannot give these; see the README).",
                 (values_part("Sorted-F (swap) mean TEL over the paper's", 1.0, 1.0,
                              Tolerance(relative=0.10), 50, "trials", _c1_values),
                  values_part("Sorted-LP and LP-Swap over Sorted-F (swap)", 0.98, 1.02,
                              Tolerance(absolute=0.01), 50, "trials", _c1_lp_ratios))),),
    "c2": (Claim("sorted_f", "7, Figure 8",
                 "MC-SF is worse than Sorted-F and Sorted-LP; quantile decides faster and swap "
                 "gives lower latency; LP-Swap is clearly better than Sorted-LP and close to "
                 "Sorted-F (swap); Sorted-F decides much faster than the LP methods.",
                 (_pair_part("latency: Sorted-F (swap) and Sorted-LP below MC-SF",
                             "MC-SF worse", "c2_latency.csv", "Sorted-F (swap)", ("MC-SF",)),
                  _pair_part("latency: Sorted-LP below MC-SF", "MC-SF worse",
                             "c2_latency.csv", "Sorted-LP", ("MC-SF",)),
                  _pair_part("decision time: quantile below swap", "quantile faster",
                             "c2_decision_time.csv", "Sorted-F (quantile)",
                             ("Sorted-F (swap)",)),
                  _pair_part("latency: swap below quantile", "swap lower",
                             "c2_latency.csv", "Sorted-F (swap)", ("Sorted-F (quantile)",)),
                  _c2_ratio_part("Sorted-LP's latency over LP-Swap's", "clearly better",
                                 "c2_latency.csv", "LP-Swap", ("Sorted-LP",), 1.05, math.inf,
                                 ">= 1.05"),
                  _c2_ratio_part("Sorted-F (swap)'s latency over LP-Swap's", "close",
                                 "c2_latency.csv", "LP-Swap", ("Sorted-F (swap)",), 0.9, 1.1,
                                 "0.9-1.1"),
                  _c2_ratio_part("the LP methods' decision time over Sorted-F (swap)'s",
                                 "much faster", "c2_decision_time.csv", "Sorted-F (swap)",
                                 ("LP-Swap", "Sorted-LP"), 10.0, math.inf, ">= 10"))),),
    "c3": (Claim("sorted_f", "3, the example of Table 1",
                 "One request (63, 1) and 21 requests (1, 2) with M = 64: MC-SF's TEL is 64 and "
                 "Sorted-F's 45.",
                 (values_part("MC-SF's TEL", PAPER_C3_TEL["MC-SF"], PAPER_C3_TEL["MC-SF"],
                              Tolerance(), 2, "runs (arrival orders)",
                              partial(_c3_values, "MC-SF"), unit=" rounds"),
                  values_part("Sorted-F's TEL (every solver)", PAPER_C3_TEL["Sorted-F"],
                              PAPER_C3_TEL["Sorted-F"], Tolerance(), 2,
                              "runs (arrival orders)", partial(_c3_values, "Sorted-F"),
                              unit=" rounds"))),),
    "d1": (), "d2": (),
}
