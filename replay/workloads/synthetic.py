"""Synthetic workloads: seeded length generators (the Sorted-F paper's C1
distributions, and lognormals fitted to a trace's published median and mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from replay.engine.requests import RequestError, Requests
from replay.errors import ConfigError
from replay.params import check


def _ceil_clip(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """Continuous draws rounded up to integers, then clipped to ``[low, high]`` (EXPERIMENTS C1)."""
    return np.clip(np.ceil(values), low, high).astype(np.int64)


@dataclass(frozen=True)
class Synthetic:
    """Seeded synthetic lengths; ``s`` and ``o`` are drawn independently.

    ``distribution`` (the C1 ones use docs/reproducing/sorted-f.md C1's parameters, which are
    defined for lengths in [1, 50]; continuous draws are rounded up, then
    clipped to ``[prompt_min, prompt_max]`` / ``[output_min, output_max]``):

    * ``uniform``: ``s ~ U{prompt_min..prompt_max}``, ``o ~ U{output_min..output_max}``;
    * ``normal``: ``Normal(25, 8.33)`` for both;
    * ``binomial``: ``Binomial(49, 0.5) + 1`` for both;
    * ``exponential``: ``Exponential(scale 5)`` for both;
    * ``mixed``: inputs from ``Exponential(scale 10)`` with probability 0.8 and
      ``LogNormal(ln 40, 0.25)`` otherwise (drawn per request), values over 50
      redrawn once from ``U(40, 50)``; outputs ``Exponential(scale 5)``;
    * ``a1``: the MC-SF paper's generator (docs/reproducing/mcsf.md A1), given the KV
      capacity ``kv_tokens``: ``s ~ U{1..prompt_max}``, ``o ~ U{1..kv_tokens - s}``.
    """

    n: int | None = field(default=None, metadata=check(ge=1))
    distribution: str = "uniform"
    prompt_min: int = field(default=1, metadata=check(ge=1))
    prompt_max: int = field(default=50, metadata=check(ge=1))
    output_min: int = field(default=1, metadata=check(ge=1))
    output_max: int = field(default=50, metadata=check(ge=1))
    kv_tokens: int | None = field(default=None, metadata=check(ge=1))
    name: str = "synthetic"

    DISTRIBUTIONS = ("uniform", "normal", "binomial", "exponential", "mixed", "a1")

    def __post_init__(self) -> None:
        # Checked whatever the distribution: numpy's uniform draw refuses an empty range,
        # and the other draws would clip every length to the max without a word.
        for length in ("prompt", "output"):
            low, high = getattr(self, f"{length}_min"), getattr(self, f"{length}_max")
            if low > high:
                raise ConfigError(f"workload.{length}_min={low} is above workload.{length}_max="
                                  f"{high}: no {length} length lies between them")

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
                raise RequestError(f"workload.distribution=a1 needs workload.kv_tokens above "
                                   f"workload.prompt_max={self.prompt_max}, got "
                                   f"{self.kv_tokens}")
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

    ``ceil(X) >= k`` iff ``X > k - 1``, so the mean is ``sum_{j=0}^{cap-1} P(X > j)``,
    with the normal's survival function ``P(Z > z) = erfc(z / sqrt 2) / 2``.
    """
    z = (np.log(np.arange(1, cap)) - mu) / (sigma * math.sqrt(2.0))
    return 1.0 + 0.5 * float(_ERFC(z).astype(float).sum())


#: ``math.erfc`` over an array. scipy.special's ``ndtr`` does the same, but importing scipy
#: costs about half a second of a default run's start-up (issue 44), and a fit needs only
#: a few thousand values.
_ERFC = np.frompyfunc(math.erfc, 1, 1)


@lru_cache(maxsize=32)
def fit_lognormal_lengths(median: float, mean: float, cap: int) -> tuple[float, float]:
    """``(mu, sigma)`` such that ``min(ceil(X), cap)``, ``X ~ LogNormal(mu, sigma)``,
    has the given median and mean.

    ``mu = ln(median - 0.5)`` puts the continuous median in the middle of the
    interval ``(median - 1, median]`` that rounds up to ``median``; ``sigma`` is
    then solved so that the exact mean of the rounded, capped lengths is ``mean``
    (for an uncapped continuous lognormal this would be ``sqrt(2 ln(mean/median))``).
    The mean grows with ``sigma`` over the bracket ``[0.001, 10]``, so the root is found by
    halving it until the two ends are neighbouring floats (scipy's ``brentq`` would do,
    at the cost of importing ``scipy.optimize``: see :data:`_ERFC`).
    """
    if not 1 < median < mean < cap:
        raise RequestError(f"lognormal fit needs 1 < median < mean < cap, got median={median}, "
                           f"mean={mean}, cap={cap}")
    mu = float(np.log(median - 0.5))
    low, high = 1e-3, 10.0
    if not discretised_lognormal_mean(mu, low, cap) < mean < discretised_lognormal_mean(
            mu, high, cap):
        raise RequestError(f"lognormal fit: no sigma in [{low}, {high}] gives mean={mean} "
                           f"with median={median}, cap={cap}")
    while (middle := (low + high) / 2) not in (low, high):
        if discretised_lognormal_mean(mu, middle, cap) < mean:
            low = middle
        else:
            high = middle
    return mu, low


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

    prompt_median: float = field(metadata=check(gt=1))
    prompt_mean: float = field(metadata=check(gt=1))
    output_median: float = field(metadata=check(gt=1))
    output_mean: float = field(metadata=check(gt=1))
    prompt_max: int = field(default=2048, metadata=check(ge=1))
    output_max: int = field(default=2048, metadata=check(ge=1))
    n: int | None = field(default=None, metadata=check(ge=1))
    length_unit: str = "tokens"
    name: str = "fitted_lognormal"

    def __post_init__(self) -> None:
        for length in ("prompt", "output"):
            median, mean, cap = (getattr(self, f"{length}_{key}")
                                 for key in ("median", "mean", "max"))
            if not median < mean < cap:
                raise ConfigError(
                    f"workload.{length}_median={median}, workload.{length}_mean={mean} and "
                    f"workload.{length}_max={cap}: a lognormal fit needs median < mean < max")

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
