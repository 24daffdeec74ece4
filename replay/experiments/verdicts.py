"""The rules that turn measured numbers into verdicts (:mod:`replay.experiments.claims` holds
the claims they judge).

A claim is a list of **parts**, each a quantity the paper states: a value, a ratio, a
ranking, a slope, a shape, or a premise (a precondition the claim rests on). Each part
carries the paper's number, the tolerance within which ours agrees, and the smallest
sample that may be judged at all; the results pages print all three. The verdict words:

``agrees``
    within the tolerance (a ranking: the paper's winner is ahead of every other policy by
    its 95 % interval);
``in shape``
    outside the tolerance, but the direction holds (a ratio whose winner is the paper's);
``differs``
    neither, and no cause is measured;
``differs (measured cause)``
    it differs, and a run in which one named factor was varied alone moves our number to
    within the tolerance (the verdict names that run);
``premise absent: ...``
    a precondition of the claim does not hold in our runs (for example memory never
    binds), so the claim is not tested there;
``not measured``
    the sample is smaller than the part's minimum, or the outputs lack the numbers;
``no check``
    no quantitative part (judged by eye from the figure), or no paper value at this size.

A claim's verdict is its weakest part's (premises first: a claim whose premise is absent
is not judged on its other parts), and its one-sentence summary is that part's.

**Ties are ties.** Rankings compare 95 % intervals over seeds or trials: two results are
ordered only when the interval of their difference excludes zero (paired over shared
samples where there are any, Welch's otherwise); equal results are reported as equal,
never ordered by the row they happen to sit in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

AGREES = "agrees"
IN_SHAPE = "in shape"
DIFFERS = "differs"
MEASURED_CAUSE = "differs (measured cause)"
PREMISE_ABSENT = "premise absent"
NOT_MEASURED = "not measured"
NO_CHECK = "no check"

#: A claim's verdict is the first of these its parts have (premises are judged before).
WEAKEST_FIRST = (DIFFERS, MEASURED_CAUSE, NOT_MEASURED, IN_SHAPE, AGREES)

#: Every verdict word, in the order the results index counts them.
VERDICTS = (AGREES, IN_SHAPE, MEASURED_CAUSE, DIFFERS, PREMISE_ABSENT, NOT_MEASURED, NO_CHECK)

#: Confidence level of every interval.
LEVEL = 0.95


def verdict_word(verdict: str) -> str:
    """The verdict without its premise text (``premise absent: x`` -> ``premise absent``)."""
    return PREMISE_ABSENT if verdict.startswith(PREMISE_ABSENT) else verdict


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Result:
    """One part's verdict: ``sentence`` is the one sentence a verdict cell shows;
    ``measured`` and ``sample`` fill the parts table; ``detail`` holds the per-case lines
    shown in the target's own section."""

    verdict: str
    sentence: str
    measured: str = ""
    sample: str = ""
    detail: tuple[str, ...] = ()


class TooFewSamples(ValueError):
    """Raised by a reader whose data hold fewer samples than the part needs."""


@dataclass(frozen=True)
class Part:
    """One quantitative part of a claim, as printed in the claim's table: ``kind`` (value,
    ratio, ranking, slope, shape, premise, observed), the quantity, the paper's number, the
    tolerance and the minimum sample; ``judge`` reads a target's outputs into a
    :class:`Result`."""

    kind: str
    quantity: str
    paper: str
    tolerance: str
    min_sample: str
    judge: Callable[[Path], Result] = field(repr=False, compare=False)

    def result(self, out_dir: Path) -> Result:
        try:
            return self.judge(out_dir)
        except TooFewSamples as exc:
            return Result(NOT_MEASURED, f"Not measured: {exc}.")
        except (FileNotFoundError, KeyError, IndexError, ValueError) as exc:
            return Result(NOT_MEASURED, f"Not measured: the outputs lack what this part "
                                        f"reads ({exc}).")


def claim_verdict(results: Sequence[tuple[Part, Result]]) -> tuple[str, str]:
    """A claim's verdict and sentence from its parts' results (module doc)."""
    if not results:
        return NO_CHECK, "No quantitative part: judged by eye from the figure."
    for part, result in results:
        if part.kind == "premise" and result.verdict.startswith(PREMISE_ABSENT):
            return result.verdict, result.sentence
    # A premise that holds says least about the claim: its sentence is the last choice.
    judged = ([(p, r) for p, r in results if p.kind not in ("observed", "premise")]
              + [(p, r) for p, r in results if p.kind == "premise"])
    if not judged:
        return NO_CHECK, results[0][1].sentence
    for word in WEAKEST_FIRST:
        for _, result in judged:
            if result.verdict == word:
                return word, result.sentence
    raise ValueError(f"unknown verdicts: {[r.verdict for _, r in judged]}")


# ---------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` samples with the half-width of its 95 % t-interval (NaN for n < 2)."""

    mean: float
    half_width: float
    n: int

    @classmethod
    def of(cls, values) -> Estimate:
        x = np.asarray(values, dtype=float)
        x = x[np.isfinite(x)]
        if x.size == 0:
            return cls(math.nan, math.nan, 0)
        return cls(float(x.mean()), half_width(float(x.std(ddof=1)) if x.size > 1 else math.nan,
                                               x.size), int(x.size))

    @classmethod
    def from_summary(cls, mean: float, std: float, n: int) -> Estimate:
        return cls(float(mean), half_width(float(std), int(n)), int(n))

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def half_width(std: float, n: int) -> float:
    """``t(0.975, n - 1) * std / sqrt(n)``; NaN below two samples."""
    if n < 2 or not math.isfinite(std):
        return math.nan
    return float(stats.t.ppf(0.5 + LEVEL / 2, n - 1) * std / math.sqrt(n))


def welch_difference(a: Estimate, b: Estimate) -> tuple[float, float]:
    """``a - b`` and the half-width of its 95 % Welch interval (NaN if either n < 2)."""
    if a.n < 2 or b.n < 2:
        return a.mean - b.mean, math.nan
    va = (a.half_width / stats.t.ppf(0.5 + LEVEL / 2, a.n - 1)) ** 2  # s^2 / n
    vb = (b.half_width / stats.t.ppf(0.5 + LEVEL / 2, b.n - 1)) ** 2
    if va + vb == 0:
        return a.mean - b.mean, 0.0
    dof = (va + vb) ** 2 / ((va ** 2 / (a.n - 1) if va else 0) + (vb ** 2 / (b.n - 1) if vb else 0))
    return a.mean - b.mean, float(stats.t.ppf(0.5 + LEVEL / 2, dof) * math.sqrt(va + vb))


def paired_difference(a: pd.Series, b: pd.Series) -> tuple[float, float, int]:
    """Mean of ``a - b`` over the samples both have (index), its 95 % half-width, and the
    number of pairs."""
    both = pd.concat([a, b], axis=1, join="inner").dropna()
    d = (both.iloc[:, 0] - both.iloc[:, 1]).to_numpy(float)
    est = Estimate.of(d)
    if d.size and np.all(d == 0):
        return 0.0, 0.0, int(d.size)
    return est.mean, est.half_width, est.n


#: How two results compare: ``equal`` (the same numbers), ``tie`` (the interval of their
#: difference holds zero), ``ahead`` or ``behind``.
EQUAL, TIE, AHEAD, BEHIND = "equal", "tie", "ahead", "behind"


def compare(diff: float, half: float, lower_is_better: bool) -> str:
    """Where a result stands against another, from their difference ``diff`` (this minus
    that) and its interval's half-width."""
    if diff == 0:
        return EQUAL
    if math.isnan(half) or abs(diff) <= half:
        return TIE
    return AHEAD if (diff < 0) == lower_is_better else BEHIND


# ------------------------------------------------------------------------------ rules
@dataclass(frozen=True)
class Tolerance:
    """How far ours may lie from the paper's number: relative (a fraction of it), absolute
    (in its unit), or a factor (ours within ``paper / f .. paper * f``)."""

    relative: float | None = None
    absolute: float | None = None
    factor: float | None = None

    def bounds(self, low: float, high: float) -> tuple[float, float]:
        if self.factor is not None:
            return low / self.factor, high * self.factor
        if self.relative is not None:
            return low * (1 - self.relative), high * (1 + self.relative)
        return low - (self.absolute or 0.0), high + (self.absolute or 0.0)

    def says(self, unit: str = "") -> str:
        if self.factor is not None:
            return f"within a factor {self.factor:g}"
        if self.relative is not None:
            return f"± {self.relative:.0%}"
        if self.absolute:
            return f"± {self.absolute:g}{unit}"
        return "exact"


def fmt(x: float, digits: int = 3) -> str:
    """A number as the pages print it: ``digits`` significant digits, thousands grouped."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def count(n: int, unit: str) -> str:
    """``n`` with its unit, singular for one: ``1 run (values of n)``, ``3 seeds``."""
    word, _, rest = unit.partition(" ")
    if n == 1 and word.endswith("s"):
        word = word[:-1]
    return f"{n} {word}" + (f" {rest}" if rest else "")


def span(values, unit: str = "") -> str:
    """The range of ``values`` as the pages print it (one number when all are equal)."""
    x = np.asarray(values, dtype=float)
    low, high = float(np.nanmin(x)), float(np.nanmax(x))
    return f"{fmt(low)}{unit}" if low == high else f"{fmt(low)}-{fmt(high)}{unit}"


def upper_first(text: str) -> str:
    """``text`` with its first letter upper-case; a first word that is a name with capitals
    of its own (MC-SF, vLLM-like) keeps its case."""
    first = text.split(" ", 1)[0]
    return text if first != first.lower() else text[:1].upper() + text[1:]


def within(tolerance: Tolerance, unit: str = "") -> str:
    """How a sentence says "inside the tolerance of" the paper's number."""
    says = tolerance.says(unit)
    return "equal to" if says == "exact" else f"within {says} of"


def paper_range(low: float, high: float, unit: str = "") -> str:
    if low == high:
        return f"{fmt(low, 4)}{unit}"
    if math.isinf(high):
        return f"≥ {fmt(low, 4)}{unit}"
    return f"{fmt(low, 4)}-{fmt(high, 4)}{unit}"


def judge_value(measured: float, n: int, low: float, high: float, tolerance: Tolerance,
                min_sample: int, what: str, sample_unit: str, unit: str = "") -> Result:
    """A measured value against the paper's (a point ``low == high`` or a range)."""
    sample = count(n, sample_unit)
    if n < min_sample or not math.isfinite(measured):
        return Result(NOT_MEASURED, f"Not measured: {what} rests on {sample} (needs "
                                    f"{min_sample}).", f"{fmt(measured)}{unit}", sample)
    lo, hi = tolerance.bounds(low, high)
    shown = f"{fmt(measured)}{unit}"
    paper = paper_range(low, high, unit)
    if lo <= measured <= hi:
        return Result(AGREES, f"{upper_first(what)} is {shown}, {within(tolerance, unit)} the "
                              f"paper's {paper}.", shown, sample)
    scale = f" ({measured / low:.2f}x)" if low == high and low else ""
    return Result(DIFFERS, f"{upper_first(what)} is {shown} against the paper's "
                           f"{paper}{scale}, outside {tolerance.says(unit)}.", shown, sample)


def judge_ratios(ratios: pd.DataFrame, low: float, high: float, tolerance: Tolerance,
                 min_sample: int, what: str, winner: str, sample_unit: str) -> Result:
    """Ratios of others to the paper's ``winner`` (columns ``label``, ``ratio``, ``n`` and
    optionally ``low``/``high``, the ratio's interval) against the paper's range. Outside
    the tolerance, the ratio still holds in shape when ``winner`` wins every comparison
    (every ratio, or its interval's low end, above 1)."""
    if ratios.empty:
        raise TooFewSamples(f"no ratio to {winner} could be formed")
    n = int(ratios["n"].min())
    sample = count(n, sample_unit)
    values = ratios["ratio"].to_numpy(float)
    measured = span(values) if np.isfinite(values).any() else ""
    if n < min_sample or not np.isfinite(values).all():
        return Result(NOT_MEASURED, f"Not measured: {what} rests on {sample} (needs "
                                    f"{min_sample}).", measured, sample)
    lo, hi = tolerance.bounds(low, high)
    paper = paper_range(low, high)
    inside = (values >= lo) & (values <= hi)
    if inside.all():
        return Result(AGREES, f"{upper_first(what)} is {measured}, {within(tolerance)} the "
                              f"paper's {paper}.", measured, sample)
    floor = ratios["low"].to_numpy(float) if "low" in ratios else values
    floor = np.where(np.isfinite(floor), floor, values)
    outside = ", ".join(f"{label} {fmt(r)}" for label, r in
                        zip(ratios["label"][~inside], values[~inside], strict=True))
    if np.all(floor > 1):
        return Result(IN_SHAPE, f"{winner} wins every comparison, but {what} is {measured}, "
                                f"outside the paper's {paper} ({tolerance.says()}): "
                                f"{outside}.", measured, sample)
    equal = [str(label) for label, r in zip(ratios["label"], values, strict=True) if r == 1]
    behind = [str(label) for label, r, f in zip(ratios["label"], values, floor, strict=True)
              if f <= 1 and r != 1]
    said = ([f"{winner} equals {', '.join(equal)} (ratio exactly 1)"] if equal else []) + (
        [f"{winner} is not ahead of {', '.join(behind)} by the 95 % intervals"] if behind else [])
    return Result(DIFFERS, f"{upper_first('; '.join(said))} ({what} {measured}, paper "
                           f"{paper}).", measured, sample)


def judge_ranking(table: pd.DataFrame, paper_best: str, lower_is_better: bool,
                  min_sample: int, what: str, sample_unit: str) -> Result:
    """Is ``paper_best`` ahead of every other policy? ``table`` is either one row per
    policy and sample (``policy``, ``sample``, ``value``: compared paired over shared
    samples) or one row per policy (``policy``, ``mean``, ``std``, ``n``: Welch). Ties
    and equal results are named as such; a leader is only a leader by its interval."""
    paired = "sample" in table.columns
    if paired:
        series = {p: g.set_index("sample")["value"].astype(float)
                  for p, g in table.groupby("policy", sort=False)}
        sizes = {p: int(s.notna().sum()) for p, s in series.items()}
        means = {p: float(s.mean()) for p, s in series.items()}
    else:
        rows = table.set_index("policy")
        estimates = {p: Estimate.from_summary(r["mean"], r["std"], r["n"])
                     for p, r in rows.iterrows()}
        sizes = {p: e.n for p, e in estimates.items()}
        means = {p: e.mean for p, e in estimates.items()}
    if paper_best not in means or not math.isfinite(means[paper_best]):
        raise TooFewSamples(f"no result of {paper_best}")
    finite = {p: m for p, m in means.items() if math.isfinite(m)}
    n = min(sizes[p] for p in finite)
    sample = count(n, sample_unit)
    if n < min_sample:
        return Result(NOT_MEASURED, f"Not measured: {what} rests on {sample} per policy (needs "
                                    f"{min_sample}).", sample=sample)

    def against(p: str, q: str) -> str:
        if paired:
            diff, half, _ = paired_difference(series[p], series[q])
        else:
            diff, half = welch_difference(estimates[p], estimates[q])
        return compare(diff, half, lower_is_better)

    standing = {p: against(paper_best, p) for p in finite if p != paper_best}
    equal = [p for p, s in standing.items() if s == EQUAL]
    tied = [p for p, s in standing.items() if s == TIE]
    ahead = [p for p, s in standing.items() if s == BEHIND]
    best_word = "lowest" if lower_is_better else "highest"
    measured = f"{paper_best} {fmt(means[paper_best])}"
    if not standing:
        raise TooFewSamples(f"only {paper_best} has a result")
    if not (equal or tied or ahead):
        return Result(AGREES, f"{paper_best} has the {best_word} {what}, ahead of all "
                              f"{len(standing)} others by 95 % intervals over {sample}.",
                      measured, sample)
    parts = []
    if ahead:
        leader = min(ahead, key=means.get) if lower_is_better else max(ahead, key=means.get)
        parts.append(f"{', '.join(ahead)} {'is' if len(ahead) == 1 else 'are'} ahead of "
                     f"{paper_best} (best: {leader}, {fmt(means[leader])} against "
                     f"{fmt(means[paper_best])})")
    if equal:
        parts.append(f"{paper_best} equals {', '.join(equal)} (the same {what})")
    if tied:
        parts.append(f"{paper_best} ties with {', '.join(tied)} (95 % intervals overlap "
                     f"zero difference)")
    return Result(DIFFERS, f"Not the {best_word} {what}: " + "; ".join(parts) + ".",
                  measured, sample)


def judge_values(table: pd.DataFrame, low: float, high: float, tolerance: Tolerance,
                 min_sample: int, what: str, sample_unit: str, unit: str = "",
                 reference: str = "the paper's", cases: str = "cases") -> Result:
    """Several values (``label``, ``value``, ``n``), each against the ``reference`` range
    (the paper's, or another's such as the authors' own runs)."""
    if table.empty:
        raise TooFewSamples(f"no value of {what}")
    n = int(table["n"].min())
    values = table["value"].to_numpy(float)
    measured = span(values, unit)
    sample = count(n, sample_unit)
    if n < min_sample:
        return Result(NOT_MEASURED, f"Not measured: {what} rests on {sample} (needs "
                                    f"{min_sample}).", measured, sample)
    lo, hi = tolerance.bounds(low, high)
    outside = table[(values < lo) | (values > hi)]
    paper = paper_range(low, high, unit)
    if outside.empty:
        return Result(AGREES, f"{upper_first(what)} is {measured} in all {len(table)} {cases}, "
                              f"{within(tolerance, unit)} {f'{reference} {paper}'.strip()}.",
                      measured, sample)
    listed = ", ".join(f"{r['label']} {fmt(r['value'])}{unit}" for _, r in outside.iterrows())
    return Result(DIFFERS, f"{upper_first(what)} lies outside {f'{reference} {paper}'.strip()} "
                           f"({tolerance.says(unit)}) in {len(outside)} of {len(table)} {cases}: "
                           f"{listed}.", measured, sample)


def values_part(quantity: str, low: float, high: float, tolerance: Tolerance, min_sample: int,
                sample_unit: str, read, unit: str = "", kind: str = "value") -> Part:
    """Several values (one per policy, distribution, ...) each within the paper's range."""
    def judge(out_dir: Path) -> Result:
        return judge_values(read(out_dir), low, high, tolerance, min_sample, quantity,
                            sample_unit, unit)
    return Part(kind, quantity, paper_range(low, high, unit), tolerance.says(unit),
                f"{min_sample} {sample_unit}", judge)


# --------------------------------------------------------------------- part constructors
def value_part(quantity: str, low: float, tolerance: Tolerance, min_sample: int,
               sample_unit: str, read: Callable[[Path], tuple[float, int]],
               high: float | None = None, unit: str = "", kind: str = "value") -> Part:
    """A value (or range ``low..high``) part; ``read`` returns (measured, sample size)."""
    high = low if high is None else high

    def judge(out_dir: Path) -> Result:
        measured, n = read(out_dir)
        return judge_value(measured, n, low, high, tolerance, min_sample, quantity,
                           sample_unit, unit)
    return Part(kind, quantity, paper_range(low, high, unit), tolerance.says(unit),
                f"{min_sample} {sample_unit}", judge)


def ratio_part(quantity: str, low: float, high: float, tolerance: Tolerance, min_sample: int,
               sample_unit: str, winner: str, read: Callable[[Path], pd.DataFrame],
               kind: str = "ratio") -> Part:
    """A ratio part: ``read`` returns the ratios of others to ``winner`` (see
    :func:`judge_ratios`)."""
    def judge(out_dir: Path) -> Result:
        return judge_ratios(read(out_dir), low, high, tolerance, min_sample, quantity, winner,
                            sample_unit)
    return Part(kind, quantity, paper_range(low, high), tolerance.says(),
                f"{min_sample} {sample_unit}", judge)


def ranking_part(quantity: str, paper_best: str, lower_is_better: bool, min_sample: int,
                 sample_unit: str, read: Callable[[Path], pd.DataFrame]) -> Part:
    """A ranking part: ``paper_best`` ahead of every other (see :func:`judge_ranking`)."""
    def judge(out_dir: Path) -> Result:
        return judge_ranking(read(out_dir), paper_best, lower_is_better, min_sample, quantity,
                             sample_unit)
    best = "lowest" if lower_is_better else "highest"
    return Part("ranking", quantity, f"{paper_best} {best}", "95 % intervals separate",
                f"{min_sample} {sample_unit}", judge)


def premise_result(holds: bool, absent: str, sentence: str, measured: str = "",
                   sample: str = "", detail: tuple[str, ...] = ()) -> Result:
    """A premise's result: ``premise absent: <absent>`` when it does not hold."""
    if holds:
        return Result(AGREES, sentence, measured, sample, detail)
    return Result(f"{PREMISE_ABSENT}: {absent}", sentence, measured, sample, detail)
