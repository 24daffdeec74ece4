"""Arrival processes. Each maps ``(rng, n, trace_arrival)`` to arrival times.

Times are seconds for real-time replays and integer rounds for unit-time
replays (:class:`PoissonRounds`, or :class:`AllAtOnce`). Every process is a
plain class instantiated by Hydra from ``configs/arrivals/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from replay.errors import InputError
from replay.params import check


class ArrivalError(InputError, ValueError):
    """An arrival process that cannot produce the requested times."""


@dataclass(frozen=True)
class AllAtOnce:
    """Every request arrives at time ``at`` (0 by default): the offline backlog."""

    at: float = field(default=0.0, metadata=check(ge=0))
    sets_count = False

    def sample(self, rng: np.random.Generator, n: int, trace_arrival=None) -> np.ndarray:
        return np.full(n, float(self.at))


@dataclass(frozen=True)
class Poisson:
    """Poisson process with ``rate`` requests per second, first arrival after one gap."""

    rate: float = field(metadata=check(gt=0))
    sets_count = False

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ArrivalError(f"arrivals.rate must be > 0, got {self.rate}")

    def sample(self, rng: np.random.Generator, n: int, trace_arrival=None) -> np.ndarray:
        return np.cumsum(rng.exponential(1.0 / self.rate, size=n))


@dataclass(frozen=True)
class PiecewisePoisson:
    """Poisson process whose rate changes at given times.

    ``rates[k]`` applies on ``[boundaries[k-1], boundaries[k])`` with
    ``boundaries`` the ``len(rates) - 1`` change points in seconds; the last
    rate applies forever. Sampled exactly by inverting the cumulative intensity.
    """

    rates: Sequence[float] = field(metadata=check(gt=0))
    boundaries: Sequence[float] = field(default=(), metadata=check(ge=0))
    sets_count = False

    def __post_init__(self) -> None:
        if len(self.boundaries) != len(self.rates) - 1:
            raise ArrivalError("arrivals: need len(boundaries) == len(rates) - 1")
        if any(r <= 0 for r in self.rates):
            raise ArrivalError(f"arrivals.rates must all be > 0, got {list(self.rates)}")
        if list(self.boundaries) != sorted(self.boundaries):
            raise ArrivalError("arrivals.boundaries must be increasing")

    def sample(self, rng: np.random.Generator, n: int, trace_arrival=None) -> np.ndarray:
        rates = np.asarray(self.rates, dtype=float)
        edges = np.concatenate([[0.0], np.asarray(self.boundaries, dtype=float)])
        widths = np.diff(edges)
        cum = np.concatenate([[0.0], np.cumsum(rates[:-1] * widths)])  # intensity at edges
        mass = np.cumsum(rng.exponential(1.0, size=n))
        seg = np.searchsorted(cum, mass, side="right") - 1
        return edges[seg] + (mass - cum[seg]) / rates[seg]


@dataclass(frozen=True)
class PoissonRounds:
    """Unit time: Poisson(``rate``) arrivals in each round ``1..horizon``.

    The number of requests is decided by the process (the workload then draws
    that many), as in experiment A2.
    """

    rate: float = field(metadata=check(gt=0))
    horizon: int = field(metadata=check(ge=1))
    sets_count = True

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.horizon < 1:
            raise ArrivalError(f"arrivals: need rate > 0 and horizon >= 1, got rate="
                               f"{self.rate}, horizon={self.horizon}")

    def expected_requests(self) -> tuple[float, str]:
        """The mean number of arrivals, and the keys that set it."""
        return self.rate * self.horizon, "arrivals.rate x arrivals.horizon"

    def sample(self, rng: np.random.Generator, n: int | None = None,
               trace_arrival=None) -> np.ndarray:
        counts = rng.poisson(self.rate, size=self.horizon)
        return np.repeat(np.arange(1, self.horizon + 1, dtype=float), counts)


@dataclass(frozen=True)
class TraceTimestamps:
    """Replay the trace's own timestamps, shifted to start at 0 and divided by ``speedup``."""

    speedup: float = field(default=1.0, metadata=check(gt=0))
    sets_count = False
    replays_workload_times = True

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ArrivalError(f"arrivals.speedup must be > 0, got {self.speedup}")

    def sample(self, rng: np.random.Generator, n: int, trace_arrival=None) -> np.ndarray:
        if trace_arrival is None:
            raise ArrivalError("arrivals=trace needs a workload with an arrival column "
                               "(e.g. workload=splitwise_conv)")
        t = np.asarray(trace_arrival, dtype=float)
        # NaN marks a later turn of a session, released by the engine: it stays NaN.
        return (t - np.nanmin(t)) / self.speedup if t.size else t
