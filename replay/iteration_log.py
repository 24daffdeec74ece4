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


class IterationLog:
    """Rows in step order. A single step is a tuple (cheap to append); a stretch is kept as
    columns, because turning tens of thousands of stretch steps into tuples costs more than
    the engine spends on the stretch itself."""

    def __init__(self) -> None:
        self._parts: list[list[tuple] | tuple[dict, dict]] = []  # step rows | a stretch
        self._rows: list[tuple] = []
        self._parts.append(self._rows)

    def append(self, row: tuple) -> None:
        """One step's row, in :data:`ITERATION_COLUMNS` order."""
        self._rows.append(row)

    def extend_stretch(self, start_time: np.ndarray, duration: np.ndarray, batch_size: int,
                       prefill_tokens: int, decode_requests: int, kv_peak: np.ndarray,
                       kv_after: np.ndarray) -> None:
        """Steps of a stretch: nothing starts, completes, is evicted or fails in them."""
        self._parts.append(({"start_time": start_time, "duration": duration,
                             "kv_peak": kv_peak, "kv_after": kv_after},
                            {"batch_size": batch_size, "n_started": 0,
                             "prefill_tokens": prefill_tokens,
                             "decode_requests": decode_requests, "n_completed": 0,
                             "n_evicted": 0, "failed": False}))
        self._rows = []
        self._parts.append(self._rows)

    def frame(self) -> pd.DataFrame:
        columns = {name: [] for name in ITERATION_COLUMNS}
        for part in self._parts:
            if isinstance(part, tuple):
                varying, constant = part
                steps = varying["start_time"].size
                for name, values in varying.items():
                    columns[name].append(values)
                for name, value in constant.items():
                    columns[name].append(np.full(steps, value, dtype=ITERATION_DTYPES[name]))
            elif part:
                table = np.array(part, dtype=_ROW)
                for name in ITERATION_COLUMNS:
                    columns[name].append(table[name])
        return pd.DataFrame({name: (np.concatenate(parts) if parts
                                    else np.zeros(0, dtype=ITERATION_DTYPES[name]))
                             for name, parts in columns.items()})
