"""Workloads: where request lengths come from.

A workload is a class instantiated by Hydra from ``configs/workload/*.yaml`` with a
``sample(rng, n=None) -> Requests`` method; ``n=None`` means "the workload's own
``n``". Trace workloads read a CSV from the data directory; synthetic ones draw
lengths from seeded generators.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replay.data import file_record, require_file
from replay.requests import RequestError, Requests


def _read_length_columns(path, columns: dict[str, str]) -> tuple[pd.DataFrame, dict]:
    """Read ``columns`` (field -> CSV column) from a CSV, failing on malformed rows.

    Returns a frame with one column per field and the file's provenance record.
    Line numbers in errors are 1-based file lines (the header is line 1).
    """
    p = require_file(path, "workload trace")
    try:
        header = pd.read_csv(p, nrows=0).columns
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise RequestError(f"{p}: not a readable CSV ({exc})") from exc
    missing = [c for c in columns.values() if c not in header]
    if missing:
        raise RequestError(f"{p}: missing column(s) {missing}; the file has {list(header)}. "
                           f"Set the workload's *_column options to the right names.")
    try:
        raw = pd.read_csv(p, usecols=list(columns.values()), dtype=str, keep_default_na=False)
    except pd.errors.ParserError as exc:
        raise RequestError(f"{p}: malformed CSV ({exc})") from exc
    frame = pd.DataFrame(index=raw.index)
    for field_name, column in columns.items():
        values = pd.to_numeric(raw[column].str.strip(), errors="coerce")
        bad = values.isna().to_numpy()
        if field_name != "arrival":
            bad |= ~np.isclose(values.fillna(0) % 1, 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            kind = "a number" if field_name == "arrival" else "an integer"
            raise RequestError(f"{p} line {i + 2}: field {column!r} = {raw[column].iloc[i]!r} "
                               f"is not {kind} ({int(bad.sum())} such rows)")
        frame[field_name] = values.to_numpy(dtype=float if field_name == "arrival" else np.int64)
    return frame, file_record(p)


@dataclass(frozen=True)
class CsvTrace:
    """Request lengths (and optionally timestamps) from a CSV file.

    ``prompt_column`` / ``output_column`` / ``arrival_column`` name the columns.
    Sampling: the first ``first_rows`` rows (all if null) form the pool; ``n``
    requests are drawn from it with or without replacement (``n=null``: the
    whole pool in file order). Rows with a non-positive length are an error
    unless ``drop_nonpositive`` is set, in which case they are dropped and
    counted in the run summary under ``dropped``.
    """

    path: str
    prompt_column: str
    output_column: str
    arrival_column: str | None = None
    n: int | None = None
    replace: bool = False
    first_rows: int | None = None
    drop_nonpositive: bool = False
    length_unit: str = "tokens"
    name: str = "trace"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        columns = {"prompt_len": self.prompt_column, "output_len": self.output_column}
        if self.arrival_column:
            columns["arrival"] = self.arrival_column
        frame, record = _read_length_columns(self.path, columns)
        lines = np.arange(len(frame)) + 2
        if self.first_rows is not None:
            frame, lines = frame.iloc[: self.first_rows], lines[: self.first_rows]
        dropped: dict[str, int] = {}
        if self.drop_nonpositive:
            keep = ((frame["prompt_len"] > 0) & (frame["output_len"] > 0)).to_numpy()
            if (~keep).any():
                dropped["nonpositive_length"] = int((~keep).sum())
            frame, lines = frame[keep], lines[keep]
        n = self.n if n is None else n
        pool = len(frame)
        if n is None:
            index = np.arange(pool)
        elif not self.replace and n > pool:
            raise RequestError(f"{self.path}: asked for n={n} requests without replacement "
                               f"but only {pool} usable rows remain")
        else:
            index = rng.choice(pool, size=n, replace=self.replace)
        arrival = frame["arrival"].to_numpy()[index] if self.arrival_column else None
        return Requests(
            prompt_len=frame["prompt_len"].to_numpy()[index],
            output_len=frame["output_len"].to_numpy()[index],
            arrival=arrival,
            source=str(self.path), source_row=lines[index], length_unit=self.length_unit,
            dropped=dropped, files=(record,),
        )


@dataclass(frozen=True)
class Synthetic:
    """Seeded synthetic lengths.

    ``distribution``:

    * ``uniform``: ``s ~ U{prompt_min..prompt_max}``, ``o ~ U{output_min..output_max}``;
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
        else:
            raise RequestError(f"workload {self.name}: unknown distribution "
                               f"{self.distribution!r}; known: uniform, a1")
        return Requests(prompt_len=s.astype(np.int64), output_len=o.astype(np.int64),
                        source=f"synthetic:{self.distribution}")


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
