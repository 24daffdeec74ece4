"""The iteration log: step rows and fast-forwarded stretches, in step order."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import replay.engine.iteration_log as iteration_log
from replay.engine.iteration_log import ITERATION_COLUMNS, ITERATION_DTYPES, IterationLog

#: A step row, or a stretch given by its length and first start time.
_PARTS = st.lists(st.one_of(st.tuples(st.just("row"), st.integers(0, 9)),
                            st.tuples(st.just("stretch"), st.integers(1, 6))), max_size=40)


def logged(parts) -> tuple[IterationLog, list[tuple]]:
    """The log of ``parts``, and the rows it must give, one tuple per step."""
    log, expected, t = IterationLog(), [], 0.0
    for kind, value in parts:
        if kind == "row":
            row = (t, 0.5, value, 1, value, 2, 10 + value, 5 + value, 1, 0, value % 2 == 0)
            log.append(row)
            expected.append(row)
            t += 1.0
        else:
            start = t + np.arange(value, dtype=float)
            peak, after = np.arange(value) + 20, np.arange(value) + 19
            log.extend_stretch(start, np.full(value, 0.25), 3, 7, 2, peak, after)
            expected += [(start[j], 0.25, 3, 0, 7, 2, int(peak[j]), int(after[j]), 0, 0, False)
                         for j in range(value)]
            t += value
    return log, expected


@settings(max_examples=150, deadline=None)
@given(parts=_PARTS, pack_rows=st.integers(1, 5))
def test_the_table_has_every_step_in_order_however_rows_are_packed(parts, pack_rows):
    expected_log, expected = logged(parts)
    original = iteration_log._PACK_ROWS
    iteration_log._PACK_ROWS = pack_rows
    try:
        packed_log, _ = logged(parts)
    finally:
        iteration_log._PACK_ROWS = original
    want = pd.DataFrame.from_records(expected, columns=ITERATION_COLUMNS).astype(
        ITERATION_DTYPES) if expected else pd.DataFrame(
        {name: np.zeros(0, dtype=dtype) for name, dtype in ITERATION_DTYPES.items()})
    for log in (expected_log, packed_log):
        pd.testing.assert_frame_equal(log.frame(), want)
