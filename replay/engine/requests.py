"""The request table every workload produces and the engine consumes.

A :class:`Requests` is a struct of numpy arrays, one entry per request, in
workload order (``request_id`` = position). ``source_row`` remembers where each
request came from (a 1-based line number in the source file, or the index in a
generator's output) so that every error can name the file, row and field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from replay.errors import InputError

#: Arrival times above this (about 30,000 years in seconds) lose the float64 resolution
#: that millisecond iterations need (the spacing of doubles there is ~0.1 ms).
MAX_ARRIVAL = 1e12


class RequestError(InputError, ValueError):
    """A request (or a row of a trace) the model cannot accept."""


@dataclass(frozen=True)
class Requests:
    prompt_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray | None = None
    predicted_lo: np.ndarray | None = None
    predicted_hi: np.ndarray | None = None
    type_id: np.ndarray | None = None
    source: str = "<generated>"
    source_row: np.ndarray | None = None
    length_unit: str = "tokens"
    dropped: dict[str, int] = field(default_factory=dict)
    files: tuple[dict, ...] = ()
    predictor: object = None  # what filled predicted_lo/hi (workloads.prediction), if any

    def __post_init__(self) -> None:
        n = len(self.prompt_len)
        for name in ("output_len", "arrival", "predicted_lo", "predicted_hi", "type_id",
                     "source_row"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise RequestError(f"{self.source}: column {name} has {len(value)} rows, "
                                   f"prompt_len has {n}")

    def __len__(self) -> int:
        return len(self.prompt_len)

    def row(self, i: int) -> str:
        """Human-readable location of request ``i`` for error messages."""
        where = int(self.source_row[i]) if self.source_row is not None else i
        return f"{self.source} row {where}"

    def with_arrivals(self, arrival: np.ndarray) -> Requests:
        return replace(self, arrival=np.asarray(arrival, dtype=np.float64))

    def take(self, index: np.ndarray) -> Requests:
        """The requests at ``index`` (in that order), keeping provenance."""
        def pick(a):
            return None if a is None else a[index]
        return replace(
            self, prompt_len=self.prompt_len[index], output_len=self.output_len[index],
            arrival=pick(self.arrival), predicted_lo=pick(self.predicted_lo),
            predicted_hi=pick(self.predicted_hi), type_id=pick(self.type_id),
            source_row=pick(self.source_row) if self.source_row is not None else index,
        )

    def validate(self, kv_capacity: int) -> None:
        """Reject lengths the model cannot serve, naming the first offending row.

        A request needs ``prompt_len + output_len`` slots at its last iteration;
        if that exceeds the KV capacity it can never complete under any policy.
        """
        for name in ("prompt_len", "output_len"):
            values = getattr(self, name)
            bad = np.flatnonzero(values < 1)
            if bad.size:
                i = int(bad[0])
                raise RequestError(f"{self.row(i)}: field {name} = {values[i]} must be >= 1 "
                                   f"({bad.size} such rows)")
        if len(self) == 0:
            dropped = f" (dropped: {self.dropped})" if self.dropped else ""
            raise RequestError(f"{self.source}: the workload has no requests{dropped}; an empty "
                               f"replay would report a meaningless 'completed'")
        if self.arrival is not None:
            bad = np.flatnonzero(~np.isfinite(self.arrival) | (self.arrival < 0)
                                 | (self.arrival > MAX_ARRIVAL))
            if bad.size:
                i = int(bad[0])
                raise RequestError(f"{self.row(i)}: field arrival = {self.arrival[i]} must be a "
                                   f"finite time in [0, {MAX_ARRIVAL:g}] (beyond that, float64 "
                                   f"times cannot resolve iteration durations; is a rate tiny?)")
        peak = self.prompt_len + self.output_len
        bad = np.flatnonzero(peak > kv_capacity)
        if bad.size:
            i = int(bad[0])
            raise RequestError(
                f"{self.row(i)}: prompt_len + output_len = {peak[i]} exceeds the KV capacity "
                f"M = {kv_capacity}, so this request can never complete ({bad.size} such rows). "
                f"Raise M, or cap lengths in the workload config."
            )
        if self.predicted_lo is not None and self.predicted_hi is not None:
            bad = np.flatnonzero((self.predicted_lo < 1) | (self.predicted_lo > self.predicted_hi))
            if bad.size:
                i = int(bad[0])
                raise RequestError(f"{self.row(i)}: predicted interval [{self.predicted_lo[i]}, "
                                   f"{self.predicted_hi[i]}] is empty or below 1")
