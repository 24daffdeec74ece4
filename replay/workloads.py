"""Workloads: where request lengths come from.

A workload is a class instantiated by Hydra from ``configs/workload/*.yaml`` with a
``sample(rng, n=None) -> Requests`` method; ``n=None`` means "the workload's own
``n``". Trace workloads read a CSV from the data directory (:class:`CsvTrace`);
synthetic ones draw lengths from seeded generators (:class:`Synthetic`,
:class:`FittedLognormal`); :class:`Mixed` shuffles several workloads together.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy.optimize import brentq
from scipy.stats import norm

from replay.data import file_record, require_file
from replay.errors import ConfigError
from replay.fluid import TypeMix, stability_boundary
from replay.requests import RequestError, Requests

_CSV_ERRORS = (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError)
#: Lengths above this are refused as input errors (and can never overflow int64).
MAX_LENGTH = 1 << 40


def _locate_bad_value(p, columns: dict[str, str]) -> RequestError:
    """The error for the first malformed value, found by re-reading ``p`` as text (slow path)."""
    raw = pd.read_csv(p, dtype=str, keep_default_na=False, skip_blank_lines=False)
    for field_name, column in columns.items():
        text = raw[column].fillna("")
        values = pd.to_numeric(text.str.strip(), errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if field_name != "arrival":
            finite = np.where(bad, 0.0, values)
            bad |= finite != np.round(finite)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            kind = "a number" if field_name == "arrival" else "an integer"
            return RequestError(f"{p} line {i + 2}: field {column!r} = {text.iloc[i]!r} "
                                f"is not {kind} ({int(bad.sum())} such rows)")
    return RequestError(f"{p}: could not parse columns {list(columns.values())} as numbers")


def _read_length_columns(path, columns: dict[str, str]) -> tuple[pd.DataFrame, dict]:
    """Read ``columns`` (field -> CSV column) from a CSV, failing on malformed rows.

    Returns a frame with one column per field and the file's provenance record.
    Line numbers in errors are 1-based file lines (the header is line 1; blank
    lines count, and are malformed rows). The file is parsed numerically in one
    pass; only when that finds a bad value is it re-read as text to name the line.
    """
    p = require_file(path, "workload trace")
    try:
        header = pd.read_csv(p, nrows=0, dtype=str).columns
        with open(p, newline="") as fh:
            names = next(csv.reader(fh), [])
    except (*_CSV_ERRORS, OSError) as exc:
        raise RequestError(f"{p}: not a readable CSV ({exc})") from exc
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RequestError(f"{p} line 1: column(s) {repeated} appear more than once; "
                           f"which copy holds the lengths is ambiguous")
    missing = [c for c in columns.values() if c not in header]
    if missing:
        raise RequestError(f"{p}: missing column(s) {missing}; the file has {list(header)}. "
                           f"Set the workload's *_column options to the right names.")
    try:
        # All columns are read (not usecols) so that a row with extra fields is an error.
        numeric = pd.read_csv(p, skip_blank_lines=False,
                              dtype=dict.fromkeys(columns.values(), "float64"))
    except ValueError as exc:  # a non-numeric field (ParserError is a ValueError too)
        if isinstance(exc, pd.errors.ParserError):
            raise RequestError(f"{p}: malformed CSV ({exc})") from exc
        raise _locate_bad_value(p, columns) from exc
    frame = pd.DataFrame(index=numeric.index)
    for field_name, column in columns.items():
        values = numeric[column].to_numpy()
        ok = np.isfinite(values)
        if field_name != "arrival":
            ok &= values == np.round(values)
        if not ok.all():
            raise _locate_bad_value(p, columns)
        if field_name != "arrival" and np.abs(values).max(initial=0) > MAX_LENGTH:
            i = int(np.flatnonzero(np.abs(values) > MAX_LENGTH)[0])
            raise RequestError(f"{p} line {i + 2}: field {column!r} = {values[i]:g} is beyond "
                               f"any model's context ({MAX_LENGTH:,} tokens)")
        frame[field_name] = values if field_name == "arrival" else values.astype(np.int64)
    return frame, file_record(p)


def _cap_rows(requests: Requests, drop_nonpositive: bool, caps: dict[str, int | None],
              over_cap: str) -> tuple[Requests, dict[str, int]]:
    """Apply the zero-length rule and the length caps; return the kept rows and the counts.

    A dropped row is counted once, under the first rule it breaks, in the order:
    non-positive length, prompt cap, output cap, total cap. With ``over_cap=clip``
    lengths are shortened instead and a kept row is counted under every
    ``clipped:...`` rule that shortened it; a row whose (clipped) prompt leaves no
    room for one output token under the total cap is dropped.
    """
    if over_cap not in ("drop", "clip"):
        raise RequestError(f"workload: over_cap must be 'drop' or 'clip', got {over_cap!r}")
    s, o = requests.prompt_len.copy(), requests.output_len.copy()
    keep = np.ones(len(s), dtype=bool)
    counts: dict[str, int] = {}

    def drop(mask: np.ndarray, reason: str) -> None:
        mask = mask & keep
        if mask.any():
            counts[reason] = int(mask.sum())
            keep[mask] = False

    def clip(values: np.ndarray, limit: np.ndarray | int, reason: str) -> None:
        over = (values > limit) & keep
        if over.any():
            counts[f"clipped:{reason}"] = int(over.sum())
            np.minimum(values, limit, out=values)

    if drop_nonpositive:
        drop((s <= 0) | (o <= 0), "nonpositive_length")
    max_s, max_o, max_total = caps["prompt_len"], caps["output_len"], caps["total_len"]
    if over_cap == "drop":
        for values, cap, label in ((s, max_s, "prompt_len"), (o, max_o, "output_len"),
                                   (s + o, max_total, "total_len")):
            if cap is not None:
                drop(values > cap, f"{label}>{cap}")
    else:
        if max_s is not None:
            clip(s, max_s, f"prompt_len>{max_s}")
        if max_total is not None:
            drop(s >= max_total, f"prompt_len>={max_total}(no room for output)")
        if max_o is not None:
            clip(o, max_o, f"output_len>{max_o}")
        if max_total is not None:
            clip(o, max_total - s, f"total_len>{max_total}")
    capped = replace(requests, prompt_len=s, output_len=o)
    return capped.take(np.flatnonzero(keep)), counts


@dataclass(frozen=True)
class CsvTrace:
    """Request lengths (and optionally timestamps) from a CSV file.

    ``prompt_column`` / ``output_column`` / ``arrival_column`` name the columns.
    The pool is the first ``first_rows`` rows (all if null), minus rows removed
    by the filters below; ``n`` requests are drawn from it, seeded, with or
    without replacement (``n=null``: the whole pool in file order).

    Filters (each removed row counted by reason in ``Requests.dropped``, which
    the run summary reports as ``dropped_rows``): ``drop_nonpositive`` removes
    rows with a length <= 0 (otherwise they are an error when the run
    validates); ``max_prompt_len`` / ``max_output_len`` / ``max_total_len``
    (e.g. Llama-2's 4096-token context) drop longer rows, or shorten them with
    ``over_cap: clip``. ``length_unit`` says what the numbers count (``tokens``
    or ``words``) and is recorded with every result.
    """

    path: str
    prompt_column: str
    output_column: str
    arrival_column: str | None = None
    n: int | None = None
    replace: bool = False
    first_rows: int | None = None
    drop_nonpositive: bool = False
    max_prompt_len: int | None = None
    max_output_len: int | None = None
    max_total_len: int | None = None
    over_cap: str = "drop"
    length_unit: str = "tokens"
    name: str = "trace"

    def pool(self) -> Requests:
        """Every usable row (file order), with the filter counts in ``dropped``."""
        columns = {"prompt_len": self.prompt_column, "output_len": self.output_column}
        if self.arrival_column:
            columns["arrival"] = self.arrival_column
        frame, record = _read_length_columns(self.path, columns)
        if self.first_rows is not None:
            frame = frame.iloc[: self.first_rows]
        rows = Requests(
            prompt_len=frame["prompt_len"].to_numpy(),
            output_len=frame["output_len"].to_numpy(),
            arrival=frame["arrival"].to_numpy() if self.arrival_column else None,
            source=str(self.path), source_row=np.arange(len(frame)) + 2,
            length_unit=self.length_unit, files=(record,),
        )
        caps = {"prompt_len": self.max_prompt_len, "output_len": self.max_output_len,
                "total_len": self.max_total_len}
        kept, dropped = _cap_rows(rows, self.drop_nonpositive, caps, self.over_cap)
        return replace(kept, dropped=dropped)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        pool = self.pool()
        n = self.n if n is None else n
        if n is None:
            return pool
        if not self.replace and n > len(pool):
            raise RequestError(f"{self.path}: asked for n={n} requests without replacement "
                               f"but only {len(pool)} usable rows remain "
                               f"(dropped: {pool.dropped or 'none'})")
        return pool.take(rng.choice(len(pool), size=n, replace=self.replace))


def _ceil_clip(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """Continuous draws rounded up to integers, then clipped to ``[low, high]`` (EXPERIMENTS C1)."""
    return np.clip(np.ceil(values), low, high).astype(np.int64)


@dataclass(frozen=True)
class Synthetic:
    """Seeded synthetic lengths; ``s`` and ``o`` are drawn independently.

    ``distribution`` (the C1 ones use EXPERIMENTS.md C1's parameters, which are
    defined for lengths in [1, 50]; continuous draws are rounded up, then
    clipped to ``[prompt_min, prompt_max]`` / ``[output_min, output_max]``):

    * ``uniform``: ``s ~ U{prompt_min..prompt_max}``, ``o ~ U{output_min..output_max}``;
    * ``normal``: ``Normal(25, 8.33)`` for both;
    * ``binomial``: ``Binomial(49, 0.5) + 1`` for both;
    * ``exponential``: ``Exponential(scale 5)`` for both;
    * ``mixed``: inputs from ``Exponential(scale 10)`` with probability 0.8 and
      ``LogNormal(ln 40, 0.25)`` otherwise (drawn per request), values over 50
      redrawn once from ``U(40, 50)``; outputs ``Exponential(scale 5)``;
    * ``a1``: the MC-SF paper's generator (EXPERIMENTS.md A1), given the KV
      capacity ``kv_tokens``: ``s ~ U{1..prompt_max}``, ``o ~ U{1..kv_tokens - s}``.
    """

    n: int | None = None
    distribution: str = "uniform"
    prompt_min: int = 1
    prompt_max: int = 50
    output_min: int = 1
    output_max: int = 50
    kv_tokens: int | None = None
    name: str = "synthetic"

    DISTRIBUTIONS = ("uniform", "normal", "binomial", "exponential", "mixed", "a1")

    def _c1_lengths(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        s_range, o_range = (self.prompt_min, self.prompt_max), (self.output_min, self.output_max)
        if self.distribution == "normal":
            return (_ceil_clip(rng.normal(25, 8.33, n), *s_range),
                    _ceil_clip(rng.normal(25, 8.33, n), *o_range))
        if self.distribution == "binomial":
            return (np.clip(rng.binomial(49, 0.5, n) + 1, *s_range),
                    np.clip(rng.binomial(49, 0.5, n) + 1, *o_range))
        if self.distribution == "exponential":
            return (_ceil_clip(rng.exponential(5, n), *s_range),
                    _ceil_clip(rng.exponential(5, n), *o_range))
        short = rng.random(n) < 0.8
        s = np.where(short, rng.exponential(10, n), rng.lognormal(np.log(40), 0.25, n))
        over = s > 50
        s[over] = rng.uniform(40, 50, int(over.sum()))
        return _ceil_clip(s, *s_range), _ceil_clip(rng.exponential(5, n), *o_range)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        n = self.n if n is None else n
        if n is None:
            raise RequestError(f"workload {self.name}: set workload.n (number of requests)")
        if self.distribution == "uniform":
            s = rng.integers(self.prompt_min, self.prompt_max + 1, size=n)
            o = rng.integers(self.output_min, self.output_max + 1, size=n)
        elif self.distribution == "a1":
            if self.kv_tokens is None or self.kv_tokens <= self.prompt_max:
                raise RequestError("workload a1: needs kv_tokens > prompt_max")
            s = rng.integers(1, self.prompt_max + 1, size=n)
            o = rng.integers(1, self.kv_tokens - s + 1)
        elif self.distribution in self.DISTRIBUTIONS:
            s, o = self._c1_lengths(rng, n)
        else:
            raise RequestError(f"workload {self.name}: unknown distribution "
                               f"{self.distribution!r}; known: {', '.join(self.DISTRIBUTIONS)}")
        return Requests(prompt_len=s.astype(np.int64), output_len=o.astype(np.int64),
                        source=f"synthetic:{self.distribution}")


def discretised_lognormal_mean(mu: float, sigma: float, cap: int) -> float:
    """``E[min(ceil(X), cap)]`` for ``X ~ LogNormal(mu, sigma)``, exactly.

    ``ceil(X) >= k`` iff ``X > k - 1``, so the mean is ``sum_{j=0}^{cap-1} P(X > j)``.
    """
    j = np.arange(1, cap)
    return 1.0 + float(norm.sf((np.log(j) - mu) / sigma).sum())


@lru_cache(maxsize=32)
def fit_lognormal_lengths(median: float, mean: float, cap: int) -> tuple[float, float]:
    """``(mu, sigma)`` such that ``min(ceil(X), cap)``, ``X ~ LogNormal(mu, sigma)``,
    has the given median and mean.

    ``mu = ln(median - 0.5)`` puts the continuous median in the middle of the
    interval ``(median - 1, median]`` that rounds up to ``median``; ``sigma`` is
    then solved so that the exact mean of the rounded, capped lengths is ``mean``
    (for an uncapped continuous lognormal this would be ``sqrt(2 ln(mean/median))``).
    """
    if not 1 < median < mean < cap:
        raise RequestError(f"lognormal fit needs 1 < median < mean < cap, got median={median}, "
                           f"mean={mean}, cap={cap}")
    mu = float(np.log(median - 0.5))
    sigma = brentq(lambda s: discretised_lognormal_mean(mu, s, cap) - mean, 1e-3, 10.0)
    return mu, float(sigma)


@dataclass(frozen=True)
class FittedLognormal:
    """Independent lognormal prompt and output lengths fitted to a published median and mean.

    Each length is ``min(ceil(X), max)`` with ``X ~ LogNormal(mu, sigma)`` and
    ``(mu, sigma)`` from :func:`fit_lognormal_lengths`. ``workload=lmsys_synthetic``
    fits LMSYS-Chat-1M's published Llama-2 token statistics (prompts mean 41.84 /
    median 12, responses mean 85.35 / median 43) with both lengths capped at 2048
    (so ``s + o`` fits Llama-2's 4096 context): prompts ``mu = ln 11.5 = 2.4423``,
    ``sigma = 1.6142``; outputs ``mu = ln 42.5 = 3.7495``, ``sigma = 1.1805`` (the
    continuous, uncapped fit would give sigma 1.5805 and 1.1709). 100,000 draws
    (``default_rng(0)``) give prompts mean 41.81 / median 12 / p90 91 / p99 497 and
    outputs mean 85.64 / median 43 / p90 194 / p99 665; 0.07% of prompts and
    0.05% of outputs sit at the cap. Only the two published numbers per
    length are matched: the shape of the tails, and the prompt-output correlation
    of real conversations (here none), are assumptions.
    """

    prompt_median: float
    prompt_mean: float
    output_median: float
    output_mean: float
    prompt_max: int = 2048
    output_max: int = 2048
    n: int | None = None
    length_unit: str = "tokens"
    name: str = "fitted_lognormal"

    def fits(self) -> dict[str, tuple[float, float]]:
        """``{"prompt_len": (mu, sigma), "output_len": (mu, sigma)}``."""
        return {
            "prompt_len": fit_lognormal_lengths(self.prompt_median, self.prompt_mean,
                                                self.prompt_max),
            "output_len": fit_lognormal_lengths(self.output_median, self.output_mean,
                                                self.output_max),
        }

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        n = self.n if n is None else n
        if n is None:
            raise RequestError(f"workload {self.name}: set workload.n (number of requests)")
        caps = {"prompt_len": self.prompt_max, "output_len": self.output_max}
        lengths = {field: np.minimum(np.ceil(rng.lognormal(mu, sigma, n)), caps[field])
                   for field, (mu, sigma) in self.fits().items()}
        return Requests(prompt_len=lengths["prompt_len"].astype(np.int64),
                        output_len=lengths["output_len"].astype(np.int64),
                        source=f"synthetic:{self.name}", length_unit=self.length_unit)


def concatenate(parts: Mapping[str, Requests], source: str) -> Requests:
    """One request table holding ``parts`` in order; provenance is kept per part.

    Drop counts are prefixed with the part's name; the length unit is shared or,
    when the parts differ, spelled out per part (e.g. ``lmsys:words,arxiv:tokens``).
    """
    items = list(parts.items())
    units = {r.length_unit for _, r in items}
    arrivals = [r.arrival for _, r in items]
    return Requests(
        prompt_len=np.concatenate([r.prompt_len for _, r in items]),
        output_len=np.concatenate([r.output_len for _, r in items]),
        arrival=None if any(a is None for a in arrivals) else np.concatenate(arrivals),
        source=source,
        source_row=np.concatenate([r.source_row if r.source_row is not None
                                   else np.arange(len(r)) for _, r in items]),
        length_unit=units.pop() if len(units) == 1 else ",".join(
            f"{name}:{r.length_unit}" for name, r in items),
        dropped={f"{name}:{reason}": count for name, r in items
                 for reason, count in r.dropped.items()},
        files=tuple(f for _, r in items for f in r.files),
    )


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    names = list(weights)
    w = np.asarray([float(weights[k]) for k in names])
    if (w < 0).any() or w.sum() <= 0:
        raise RequestError(f"workload mixed: ratio weights must be >= 0 with a positive sum, "
                           f"got {dict(weights)}")
    exact = total * w / w.sum()
    counts = np.floor(exact).astype(int)
    shortfall = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:shortfall]] += 1
    return dict(zip(names, counts.tolist(), strict=True))


@dataclass(frozen=True)
class Mixed:
    """Several workloads shuffled together (EXPERIMENTS.md C2: 1,600 LMSYS + 400 arXiv).

    ``parts`` maps a name to a workload. Either ``counts`` (name -> number of
    requests drawn from that part) or ``ratio`` (name -> weight, with ``n`` the
    total, split by largest remainder) fixes the composition. The parts are
    drawn from independent child streams of the seed, concatenated and shuffled;
    with ``counts`` and a smaller ``n``, the first ``n`` of the shuffled pool are
    kept, so a smaller ``n`` is a uniform subsample and a prefix of a larger one.
    Drop counts are those of each part's pool (prefixed ``part:``), not of the sample.
    """

    parts: Mapping[str, object]
    counts: Mapping[str, int] | None = None
    ratio: Mapping[str, float] | None = None
    n: int | None = None
    name: str = "mixed"

    def part_counts(self, n: int | None) -> dict[str, int]:
        if (self.counts is None) == (self.ratio is None):
            raise RequestError(f"workload {self.name}: give exactly one of counts or ratio")
        weights = self.counts if self.counts is not None else self.ratio
        mismatch = set(weights) ^ set(self.parts)
        if mismatch:
            raise RequestError(f"workload {self.name}: counts/ratio name {sorted(weights)} but "
                               f"the parts are {sorted(self.parts)}")
        if self.counts is not None:
            return {k: int(v) for k, v in self.counts.items()}
        if n is None:
            raise RequestError(f"workload {self.name}: with ratio, set workload.n")
        return apportion(n, self.ratio)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        n = self.n if n is None else n
        counts = self.part_counts(n)
        total = sum(counts.values())
        if n is not None and n > total:
            raise RequestError(f"workload {self.name}: asked for n={n} but the parts give "
                               f"{total} ({counts})")
        shuffle_rng, *part_rngs = rng.spawn(len(counts) + 1)
        drawn = {k: self.parts[k].sample(r, n=counts[k])
                 for (k, r) in zip(counts, part_rngs, strict=True)}
        pool = concatenate(drawn, source=f"{self.name}({', '.join(counts)})")
        order = shuffle_rng.permutation(total)
        return pool.take(order if n is None else order[:n])


@dataclass(frozen=True)
class FixedGroups:
    """An explicit list of request groups, each ``{count, prompt_len, output_len}``.

    Used for hand-checkable instances such as EXPERIMENTS.md C3. Requests keep
    the listed order (which decides ties in FCFS).
    """

    groups: Sequence[dict]
    name: str = "fixed"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        s = np.concatenate([np.full(int(g["count"]), int(g["prompt_len"])) for g in self.groups])
        o = np.concatenate([np.full(int(g["count"]), int(g["output_len"])) for g in self.groups])
        if n is not None and n != len(s):
            raise RequestError(f"workload {self.name}: lists {len(s)} requests, asked for {n}")
        return Requests(prompt_len=s.astype(np.int64), output_len=o.astype(np.int64),
                        source=f"fixed:{self.name}")


@dataclass(frozen=True)
class Typed:
    """Known request types with their own Poisson arrivals (WAIT experiments, B0-B3).

    ``types`` is ``[{prompt_len, output_len, rate}, ...]`` in this harness's
    convention; type ``j``'s requests carry ``type_id = j``, visible to policies.
    With ``time_unit="seconds"`` each type is a Poisson process of ``rate`` per
    second over ``[0, duration_s)``; with ``"rounds"`` (unit time) each round
    ``1..duration_s`` gets ``Poisson(rate)`` arrivals of each type. The workload
    sets the arrival times itself: run it with ``arrivals=trace``. Requests are
    ordered by arrival, ties by type then draw order.

    ``total_rate`` or ``load`` (optional, not both) rescale every rate, keeping the
    mix: to that total rate, or so that the fluid load ``d1 W + d2 P``
    (:func:`replay.fluid.equilibrium`) equals ``load`` (1 is the stability boundary
    of the linear timing model ``d1, d2``).
    """

    types: Sequence[Mapping]
    duration_s: float
    time_unit: str = "seconds"
    total_rate: float | None = None
    load: float | None = None
    d1: float | None = None
    d2: float = 0.0
    name: str = "typed"

    #: The arrival times come from the workload: ``arrivals=trace`` replays them.
    defines_arrivals = True

    def __post_init__(self) -> None:
        mix = TypeMix.from_types(list(self.types))  # validates every type's fields
        if self.load is not None and self.total_rate is not None:
            raise ConfigError("workload: give total_rate or load, not both")
        scale = 1.0
        if self.total_rate is not None:
            if not self.total_rate > 0:
                raise ConfigError(f"workload.total_rate must be > 0, got {self.total_rate}")
            scale = self.total_rate / float(mix.rate.sum())
        if self.load is not None:
            if not self.load > 0 or not self.d1 or self.d1 <= 0:
                raise ConfigError(f"workload.load must be > 0 and needs d1 > 0, got load="
                                  f"{self.load}, d1={self.d1}")
            scale = self.load * stability_boundary(mix, self.d1, self.d2)
        if scale != 1.0:
            object.__setattr__(self, "types", [{**dict(t), "rate": float(t["rate"]) * scale}
                                               for t in self.types])
        if not self.duration_s > 0:
            raise ConfigError(f"workload.duration_s must be > 0, got {self.duration_s}")
        if self.time_unit not in ("seconds", "rounds"):
            raise ConfigError(f"workload.time_unit must be seconds or rounds, "
                              f"got {self.time_unit!r}")

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        if n is not None:
            raise RequestError(f"workload {self.name}: the number of requests follows from the "
                               f"rates and duration_s; it cannot be set")
        times, kinds = [], []
        for j, t in enumerate(self.types):
            if self.time_unit == "rounds":
                counts = rng.poisson(float(t["rate"]), size=int(self.duration_s))
                arrival = np.repeat(np.arange(1, int(self.duration_s) + 1, dtype=float), counts)
            else:
                count = rng.poisson(float(t["rate"]) * self.duration_s)
                arrival = np.sort(rng.uniform(0.0, self.duration_s, size=count))
            times.append(arrival)
            kinds.append(np.full(arrival.size, j, dtype=np.int64))
        arrival, type_id = np.concatenate(times), np.concatenate(kinds)
        order = np.lexsort((np.arange(arrival.size), type_id, arrival))
        s = np.array([int(t["prompt_len"]) for t in self.types], dtype=np.int64)
        o = np.array([int(t["output_len"]) for t in self.types], dtype=np.int64)
        type_id = type_id[order]
        return Requests(prompt_len=s[type_id], output_len=o[type_id], arrival=arrival[order],
                        type_id=type_id, source=f"typed:{self.name}",
                        length_unit="tokens")


def output_length_types(requests: Requests, width: int, max_len: int) -> pd.DataFrame:
    """Cluster a trace's outputs into types by length bin (EXPERIMENTS.md B3).

    Bin ``k`` holds outputs in ``((k - 1) * width, k * width]``; its type has output
    ``k * width``, the bin's mean prompt, and a rate share proportional to its
    count. Outputs above ``max_len`` are counted in the ``beyond`` row, not binned.
    """
    o, s = requests.output_len, requests.prompt_len
    upper = np.arange(width, max_len + 1, width)
    bins = np.searchsorted(upper, o, side="left")
    rows = []
    for k, edge in enumerate(upper):
        inside = bins == k
        rows.append({"output_len": int(edge), "count": int(inside.sum()),
                     "mean_prompt_len": float(s[inside].mean()) if inside.any() else np.nan})
    table = pd.DataFrame(rows)
    table["share"] = table["count"] / max(int(table["count"].sum()), 1)
    beyond = int((o > upper[-1]).sum()) if upper.size else int(o.size)
    table.attrs["beyond"] = beyond
    return table
