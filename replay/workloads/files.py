"""Trace workloads: request lengths read from a CSV file in the data directory.

Every row is checked; a row that cannot be a request is refused with its file, row
and field named, or dropped and counted when the workload's options say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from replay.engine.requests import RequestError, Requests
from replay.errors import InputError
from replay.params import check
from replay.storage.data import file_record, read_csv, require_file

WHAT = "workload trace"


def _read(path, **options) -> pd.DataFrame:
    """:func:`replay.storage.data.read_csv` of a trace; a refusal is a :class:`RequestError`, as a
    bad row's is."""
    try:
        return read_csv(path, WHAT, **options)
    except InputError as exc:
        raise RequestError(str(exc)) from None


#: Lengths above this are refused as input errors (and can never overflow int64).
MAX_LENGTH = 1 << 40


def _locate_bad_value(p, columns: dict[str, str]) -> RequestError:
    """The error for the first malformed value, found by re-reading ``p`` as text (slow path)."""
    raw = _read(p, dtype=str, keep_default_na=False, skip_blank_lines=False)
    for field_name, column in columns.items():
        text = raw[column].fillna("")
        values = pd.to_numeric(text.str.strip(), errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if field_name != "arrival":
            finite = np.where(bad, 0.0, values)
            bad |= finite != np.round(finite)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            kind = "a number" if field_name == "arrival" else "an integer"
            return RequestError(f"{p} line {i + 2}: field {column!r} = {text.iloc[i]!r} "
                                f"is not {kind} ({int(bad.sum())} such rows)")
    return RequestError(f"{p}: could not parse columns {list(columns.values())} as numbers")


def _read_length_columns(path, columns: dict[str, str]) -> tuple[pd.DataFrame, dict]:
    """Read ``columns`` (field -> CSV column) from a CSV, failing on malformed rows.

    Returns a frame with one column per field and the file's provenance record.
    Line numbers in errors are 1-based file lines (the header is line 1; blank
    lines count, and are malformed rows). The file is parsed numerically in one
    pass; only when that finds a bad value is it re-read as text to name the line.
    A file ``traces.fetch`` knows must have its recorded SHA-256
    (:func:`replay.storage.data.require_file`), and one that is not CSV text, not UTF-8, cut short
    or damaged is refused by :func:`replay.storage.data.read_csv`.
    """
    p = require_file(path, WHAT)
    header = _read(p, nrows=0, dtype=str).columns
    # The raw header (pandas would rename a repeated column), read by pandas too so that
    # a compressed trace (.csv.gz, .zip, ...) is decompressed the same way.
    first = _read(p, header=None, nrows=1, dtype=str, keep_default_na=False)
    names = first.iloc[0].tolist() if len(first) else []
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RequestError(f"{p} line 1: column(s) {repeated} appear more than once; "
                           f"which copy holds the lengths is ambiguous")
    missing = [c for c in columns.values() if c not in header]
    if missing:
        raise RequestError(f"{p}: missing column(s) {missing}; the file has {list(header)}. "
                           f"Set the workload's *_column options to the right names.")
    try:
        # All columns are read (not usecols) so that a row with extra fields is an error.
        numeric = _read(p, skip_blank_lines=False,
                        dtype=dict.fromkeys(columns.values(), "float64"))
    except RequestError:
        raise
    except ValueError as exc:  # a non-numeric field
        raise _locate_bad_value(p, columns) from exc
    frame = pd.DataFrame(index=numeric.index)
    for field_name, column in columns.items():
        values = numeric[column].to_numpy()
        ok = np.isfinite(values)
        if field_name != "arrival":
            ok &= values == np.round(values)
        if not ok.all():
            raise _locate_bad_value(p, columns)
        if field_name != "arrival" and np.abs(values).max(initial=0) > MAX_LENGTH:
            i = int(np.flatnonzero(np.abs(values) > MAX_LENGTH)[0])
            raise RequestError(f"{p} line {i + 2}: field {column!r} = {values[i]:g} is beyond "
                               f"any model's context ({MAX_LENGTH:,} tokens)")
        frame[field_name] = values if field_name == "arrival" else values.astype(np.int64)
    return frame, file_record(p)


def cap_rows(requests: Requests, drop_nonpositive: bool, caps: dict[str, int | None],
              over_cap: str) -> tuple[Requests, dict[str, int]]:
    """Apply the zero-length rule and the length caps; return the kept rows and the counts.

    A dropped row is counted once, under the first rule it breaks, in the order:
    non-positive length, prompt cap, output cap, total cap. With ``over_cap=clip``
    lengths are shortened instead and a kept row is counted under every
    ``clipped:...`` rule that shortened it; a row whose (clipped) prompt leaves no
    room for one output token under the total cap is dropped.
    """
    if over_cap not in ("drop", "clip"):
        raise RequestError(f"workload: over_cap must be 'drop' or 'clip', got {over_cap!r}")
    s, o = requests.prompt_len.copy(), requests.output_len.copy()
    keep = np.ones(len(s), dtype=bool)
    counts: dict[str, int] = {}

    def drop(mask: np.ndarray, reason: str) -> None:
        mask = mask & keep
        if mask.any():
            counts[reason] = int(mask.sum())
            keep[mask] = False

    def clip(values: np.ndarray, limit: np.ndarray | int, reason: str) -> None:
        over = (values > limit) & keep
        if over.any():
            counts[f"clipped:{reason}"] = int(over.sum())
            np.minimum(values, limit, out=values)

    if drop_nonpositive:
        drop((s <= 0) | (o <= 0), "nonpositive_length")
    max_s, max_o, max_total = caps["prompt_len"], caps["output_len"], caps["total_len"]
    if over_cap == "drop":
        for values, cap, label in ((s, max_s, "prompt_len"), (o, max_o, "output_len"),
                                   (s + o, max_total, "total_len")):
            if cap is not None:
                drop(values > cap, f"{label}>{cap}")
    else:
        if max_s is not None:
            clip(s, max_s, f"prompt_len>{max_s}")
        if max_total is not None:
            drop(s >= max_total, f"prompt_len>={max_total}(no room for output)")
        if max_o is not None:
            clip(o, max_o, f"output_len>{max_o}")
        if max_total is not None:
            clip(o, max_total - s, f"total_len>{max_total}")
    capped = replace(requests, prompt_len=s, output_len=o)
    return capped.take(np.flatnonzero(keep)), counts


def draw_from_pool(pool: Requests, rng: np.random.Generator, n: int | None, replace: bool,
                   path: str) -> Requests:
    """``n`` requests drawn from a trace file's ``pool`` (read from ``path``), seeded, with or
    without replacement; ``n=None``: the whole pool in file order."""
    if n is None:
        return pool
    if not replace and n > len(pool):
        raise RequestError(f"{path}: asked for n={n} requests without replacement but only "
                           f"{len(pool)} usable rows remain (dropped: {pool.dropped or 'none'})")
    return pool.take(rng.choice(len(pool), size=n, replace=replace))


@dataclass(frozen=True)
class CsvTrace:
    """Request lengths (and optionally timestamps) from a CSV file.

    ``prompt_column`` / ``output_column`` / ``arrival_column`` name the columns.
    The pool is the first ``first_rows`` rows (all if null), minus rows removed
    by the filters below; ``n`` requests are drawn from it, seeded, with or
    without replacement (``n=null``: the whole pool in file order).

    Filters (each removed row counted by reason in ``Requests.dropped``, which
    the run summary reports as ``dropped_rows``): ``drop_nonpositive`` removes
    rows with a length <= 0 (otherwise they are an error when the run
    validates); ``max_prompt_len`` / ``max_output_len`` / ``max_total_len``
    (e.g. Llama-2's 4096-token context) drop longer rows, or shorten them with
    ``over_cap: clip``. ``length_unit`` says what the numbers count (``tokens``
    or ``words``) and is recorded with every result.
    """

    path: str
    prompt_column: str
    output_column: str
    arrival_column: str | None = None
    n: int | None = field(default=None, metadata=check(ge=1))
    replace: bool = False
    first_rows: int | None = field(default=None, metadata=check(ge=1))
    drop_nonpositive: bool = False
    max_prompt_len: int | None = field(default=None, metadata=check(ge=1))
    max_output_len: int | None = field(default=None, metadata=check(ge=1))
    max_total_len: int | None = field(default=None, metadata=check(ge=2))
    over_cap: Literal["drop", "clip"] = "drop"
    length_unit: str = "tokens"
    name: str = "trace"

    def pool(self) -> Requests:
        """Every usable row (file order), with the filter counts in ``dropped``."""
        columns = {"prompt_len": self.prompt_column, "output_len": self.output_column}
        if self.arrival_column:
            columns["arrival"] = self.arrival_column
        frame, record = _read_length_columns(self.path, columns)
        if self.first_rows is not None:
            frame = frame.iloc[: self.first_rows]
        rows = Requests(
            prompt_len=frame["prompt_len"].to_numpy(),
            output_len=frame["output_len"].to_numpy(),
            arrival=frame["arrival"].to_numpy() if self.arrival_column else None,
            source=str(self.path), source_row=np.arange(len(frame)) + 2,
            source_columns=columns,
            length_unit=self.length_unit, files=(record,),
        )
        caps = {"prompt_len": self.max_prompt_len, "output_len": self.max_output_len,
                "total_len": self.max_total_len}
        kept, dropped = cap_rows(rows, self.drop_nonpositive, caps, self.over_cap)
        return replace(kept, dropped=dropped)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        return draw_from_pool(self.pool(), rng, self.n if n is None else n, self.replace,
                              self.path)
