"""Output-length predictions (docs/policies/sorted-f.md), a config group (``prediction=``).

A predictor turns the true outputs ``o`` into an interval ``[lo, hi]`` and a point
estimate; policies see them as the view's ``predicted_lo``, ``predicted_hi`` and
``predicted_output``. The papers assume exact lengths; these model imperfect
ones:

* ``exact``: ``lo = hi = o``;
* ``ratio(alpha)``: ``U ~ Uniform[alpha, 1]``, ``hi = ceil(o / U)``,
  ``lo = max(1, floor(alpha * hi))``; ``o`` is always inside and ``lo/hi ~ alpha``;
* ``noisy(sigma)``: the point ``max(1, round(o * exp(N(0, sigma^2))))`` and the
  interval collapsed on it (for point-estimate policies such as MC-SF);
* ``bucketed(width)``: the bucket ``[(k-1) width + 1, k width]`` holding ``o``.

Choices beyond the spec: the point estimate is ``hi`` (the conservative end; the
truth under ``exact``); and ``hi`` (with ``lo`` below it) is capped at
``M - s``, because a request longer than that could never run and the engine
rejects it, so ``M - s`` is a known bound. The predictor draws from its own
seeded stream, so switching predictors leaves lengths and arrivals unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from replay.errors import ConfigError
from replay.params import check

#: The largest ``prediction.sigma``: ``exp(4 sigma)`` is already a factor of 2e17.
MAX_SIGMA = 10.0
#: Predicted lengths are clipped to this (as trace lengths are refused above it).
MAX_PREDICTED = 1 << 40


@dataclass(frozen=True)
class Exact:
    name: str = "exact"

    def interval(self, o: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return o.copy(), o.copy()


@dataclass(frozen=True)
class Ratio:
    alpha: float = field(metadata=check(gt=0, le=1))
    name: str = "ratio"

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ConfigError(f"prediction.alpha={self.alpha}: must be in (0, 1]")

    def interval(self, o, rng):
        draw = rng.uniform(self.alpha, 1.0, size=o.size)
        hi = np.ceil(o / draw).astype(np.int64)
        lo = np.maximum(1, np.floor(self.alpha * hi)).astype(np.int64)
        return np.minimum(lo, o), hi


@dataclass(frozen=True)
class Noisy:
    sigma: float = field(metadata=check(ge=0, le=MAX_SIGMA))
    name: str = "noisy"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and 0 <= self.sigma <= MAX_SIGMA):
            raise ConfigError(f"prediction.sigma={self.sigma}: must be a finite number in "
                              f"[0, {MAX_SIGMA:g}]")

    def interval(self, o, rng):
        # The factor is capped where the point would pass MAX_PREDICTED (never for sane
        # sigma: the values below the cap are computed exactly as before), so exp cannot
        # overflow and the cast to int64 cannot wrap.
        z = np.minimum(rng.normal(0.0, self.sigma, size=o.size),
                       np.log(MAX_PREDICTED / np.maximum(o, 1)))
        point = np.maximum(1, np.rint(o * np.exp(z)))
        point = point.astype(np.int64)
        return point, point.copy()


@dataclass(frozen=True)
class Bucketed:
    width: int = field(metadata=check(ge=1))
    name: str = "bucketed"

    def __post_init__(self) -> None:
        if int(self.width) != self.width or self.width < 1:
            raise ConfigError(f"prediction.width={self.width}: must be an integer >= 1")

    def interval(self, o, rng):
        lo = (o - 1) // self.width * self.width + 1
        return lo.astype(np.int64), (lo + self.width - 1).astype(np.int64)


def predict(predictor, prompt_len: np.ndarray, output_len: np.ndarray, kv_capacity: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per request, ``hi`` (and ``lo``) capped at ``M - s``."""
    lo, hi = predictor.interval(np.asarray(output_len, dtype=np.int64), rng)
    cap = kv_capacity - np.asarray(prompt_len, dtype=np.int64)
    return np.minimum(lo, cap), np.minimum(hi, cap)


def error_summary(predictor, lo: np.ndarray, hi: np.ndarray, output_len: np.ndarray) -> dict:
    """What the run summary records: the predictor, the relative error of the point
    estimate ``|hi - o| / o`` (mean, p90) and how often ``o`` lies in ``[lo, hi]``."""
    o = np.asarray(output_len, dtype=np.float64)
    error = np.abs(hi - o) / o
    params = {k: v for k, v in vars(predictor).items() if k != "name"}
    return {"name": predictor.name, **params, "mean_relative_error": float(error.mean()),
            "p90_relative_error": float(np.quantile(error, 0.9)),
            "covered": float(((lo <= o) & (o <= hi)).mean()),
            "mean_interval_ratio": float((lo / hi).mean())}
