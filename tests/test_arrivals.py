"""Arrival processes: shapes, units and rates (seeded, so the tolerances are exact checks)."""

from __future__ import annotations

import numpy as np
import pytest

from replay.workloads.arrivals import (
    AllAtOnce,
    ArrivalError,
    PiecewisePoisson,
    Poisson,
    PoissonRounds,
    TraceTimestamps,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_all_at_once():
    assert AllAtOnce().sample(rng(), 3).tolist() == [0, 0, 0]


def test_poisson_rate_and_order():
    times = Poisson(rate=50).sample(rng(), 20_000)
    assert (np.diff(times) >= 0).all() and times[0] > 0
    assert 20_000 / times[-1] == pytest.approx(50, rel=0.03)


def test_poisson_rounds_are_integers_in_one_to_horizon():
    times = PoissonRounds(rate=1.0, horizon=40).sample(rng(), None)
    assert set(np.unique(times)) <= set(range(1, 41))
    assert np.array_equal(times, np.sort(times))
    counts = np.bincount(PoissonRounds(rate=2.0, horizon=5000).sample(rng(), None).astype(int))
    assert counts[1:].mean() == pytest.approx(2.0, rel=0.05)


def test_piecewise_rate_changes_at_boundaries():
    times = PiecewisePoisson(rates=[10, 100, 10], boundaries=[100, 200]).sample(rng(), 13_000)
    in_first = ((times >= 0) & (times < 100)).sum()
    in_second = ((times >= 100) & (times < 200)).sum()
    assert in_first == pytest.approx(1000, rel=0.1)
    assert in_second == pytest.approx(10_000, rel=0.05)


def test_trace_timestamps_start_at_zero_and_rescale():
    times = TraceTimestamps(speedup=2.0).sample(rng(), 3, np.array([10.0, 12.0, 16.0]))
    assert times.tolist() == [0.0, 1.0, 3.0]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Poisson(rate=0), "rate must be > 0"),
    (lambda: PoissonRounds(rate=1, horizon=0), "horizon >= 1"),
    (lambda: PiecewisePoisson(rates=[1, 2], boundaries=[]), "len\\(boundaries\\)"),
    (lambda: TraceTimestamps(speedup=-1), "speedup must be > 0"),
])
def test_bad_parameters_are_rejected(make, message):
    with pytest.raises(ArrivalError, match=message):
        make()


def test_trace_arrivals_need_a_timestamp_column():
    with pytest.raises(ArrivalError, match="arrival column"):
        TraceTimestamps().sample(rng(), 3, None)
