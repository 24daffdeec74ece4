"""LinearTiming with its per-token terms, priced by hand."""

from __future__ import annotations

import numpy as np
import pytest

from replay.engine.timing import BatchShape
from replay.errors import ConfigError
from replay.timing import LinearTiming

FULL = LinearTiming(d0=0.0097, d1=3.2e-7, d2=6.4e-5, d3=5.4e-5, d4=2.0e-4)


def test_terms_and_duration_by_hand():
    # Two prompts (10 and 5 tokens, 3 cached before the second) and three decodes.
    batch = BatchShape(new_tokens=np.array([10, 5, 1, 1, 1]),
                       context=np.array([0, 3, 20, 30, 40]),
                       is_prefill=np.array([True, True, False, False, False]))
    assert LinearTiming.terms(batch) == (10 + 8 + 21 + 31 + 41, 15, 3, 2)
    timing = LinearTiming(1.0, 0.01, 0.1, 0.2, 0.5)
    assert timing.duration(batch) == pytest.approx(1 + 1.11 + 1.5 + 0.6 + 1.0)
    assert timing.describe()["d3"] == 0.2 and timing.describe()["d4"] == 0.5


def test_zero_new_terms_price_as_before():
    batch = BatchShape(np.array([7, 1, 1]), np.array([0, 9, 12]), np.array([True, False, False]))
    old = LinearTiming(0.01, 1e-4, 5e-4)
    # touched: 7 + (9 + 1) + (12 + 1) = 30 tokens; prefill: 7
    assert old.duration(batch) == pytest.approx(0.01 + 1e-4 * 30 + 5e-4 * 7, rel=1e-12)


def test_coefficients_are_checked():
    with pytest.raises(ConfigError, match="d3"):
        LinearTiming(0.01, 1e-7, d3=-1.0)
    with pytest.raises(ConfigError):
        LinearTiming(0.0, 0.0)
