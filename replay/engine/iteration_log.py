"""The per-iteration table, recorded step by step or a whole fast-forwarded stretch at once."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: One row per step, failed attempts included.
ITERATION_DTYPES = {
    "start_time": np.float64, "duration": np.float64, "batch_size": np.int64,
    "n_started": np.int64, "prefill_tokens": np.int64, "decode_requests": np.int64,
    "kv_peak": np.int64, "kv_after": np.int64, "n_completed": np.int64, "n_evicted": np.int64,
    "failed": bool}
ITERATION_COLUMNS = list(ITERATION_DTYPES)
_ROW = np.dtype(list(ITERATION_DTYPES.items()))
#: What a stretch records per step, and what is the same for all of its steps.
_VARYING = ("start_time", "duration", "kv_peak", "kv_after")
_CONSTANT = ("batch_size", "n_started", "prefill_tokens", "decode_requests", "n_completed",
             "n_evicted", "failed")
#: Step rows kept as tuples before they are packed into a structured array.
_PACK_ROWS = 1 << 16


class IterationLog:
    """Rows in step order. A single step is a tuple (cheap to append), packed into a
    structured array every :data:`_PACK_ROWS` rows (a tuple row takes about four times
    the memory: a million-step run would hold 300 MB of them); a stretch is kept as
    columns, because turning tens of thousands of stretch steps into tuples costs more
    than the engine spends on the stretch itself. :meth:`frame` places both in one pass
    per column (a run can hold tens of thousands of stretches)."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._packed: list[np.ndarray] = []
        self._packed_rows = 0
        self._stretch_at: list[int] = []  # step rows logged before each stretch
        self._stretch_len: list[int] = []
        self._varying: dict[str, list[np.ndarray]] = {name: [] for name in _VARYING}
        self._constant: dict[str, list] = {name: [] for name in _CONSTANT}

    def append(self, row: tuple) -> None:
        """One step's row, in :data:`ITERATION_COLUMNS` order."""
        self._rows.append(row)
        if len(self._rows) == _PACK_ROWS:
            self._packed.append(np.array(self._rows, dtype=_ROW))
            self._packed_rows += _PACK_ROWS
            self._rows = []

    def extend_stretch(self, start_time: np.ndarray, duration: np.ndarray, batch_size: int,
                       prefill_tokens: int, decode_requests: int, kv_peak: np.ndarray,
                       kv_after: np.ndarray) -> None:
        """Steps of a stretch: nothing starts, completes, is evicted or fails in them."""
        self._stretch_at.append(self._packed_rows + len(self._rows))
        self._stretch_len.append(start_time.size)
        for name, values in zip(_VARYING, (start_time, duration, kv_peak, kv_after),
                                strict=True):
            self._varying[name].append(values)
        for name, value in zip(_CONSTANT, (batch_size, 0, prefill_tokens, decode_requests,
                                           0, 0, False), strict=True):
            self._constant[name].append(value)

    def frame(self) -> pd.DataFrame:
        rows = np.concatenate((*self._packed, np.array(self._rows, dtype=_ROW)))
        lengths = np.array(self._stretch_len, dtype=np.int64)
        total = rows.size + int(lengths.sum())
        # Stretch k begins after the rows logged before it and the stretches before it.
        before = np.cumsum(lengths) - lengths
        first = np.array(self._stretch_at, dtype=np.int64) + before
        in_stretch = np.repeat(first - before, lengths) + np.arange(total - rows.size)
        is_row = np.ones(total, dtype=bool)
        is_row[in_stretch] = False
        columns = {}
        for name in ITERATION_COLUMNS:
            column = np.empty(total, dtype=ITERATION_DTYPES[name])
            column[is_row] = rows[name]
            if name in self._varying:
                if lengths.size:
                    column[in_stretch] = np.concatenate(self._varying[name])
            else:
                column[in_stretch] = np.repeat(
                    np.array(self._constant[name], dtype=ITERATION_DTYPES[name]), lengths)
            columns[name] = column
        return pd.DataFrame(columns)
