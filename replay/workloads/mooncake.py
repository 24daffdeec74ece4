"""The Mooncake FAST'25 traces: requests with arrival times and prompt-content block ids.

Each line of a trace is one JSON object: ``timestamp`` (arrival, milliseconds from the
trace's start), ``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (one
id per 512-token block of the prompt; equal ids mean equal blocks). Every line is
checked; a line that cannot be a request is refused with the file and line named.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replay.engine.requests import RequestError, Requests, offsets_of
from replay.params import check
from replay.storage.data import file_record, require_file
from replay.workloads.files import MAX_LENGTH, cap_rows, draw_from_pool

#: The token count behind one id of the published traces.
MOONCAKE_BLOCK_TOKENS = 512
#: Content ids are int64 >= 0 (negative and larger values are reserved by the hashing).
MAX_ID = (1 << 63) - 1


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Lines:
    """The parsed columns of a trace, filled line by line."""

    def __init__(self) -> None:
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.counts: list[int] = []
        self.ids: list[int] = []

    def add(self, record, where: str, block_unit: int) -> None:
        if not isinstance(record, dict):
            raise RequestError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for name in ("timestamp", "input_length", "output_length", "hash_ids"):
            if name not in record:
                raise RequestError(f"{where}: field {name!r} is missing")
        timestamp = record["timestamp"]
        if (not isinstance(timestamp, int | float) or isinstance(timestamp, bool)
                or not math.isfinite(timestamp) or timestamp < 0):
            raise RequestError(f"{where}: field 'timestamp' = {timestamp!r} must be a finite "
                               f"number of milliseconds >= 0")
        lengths = []
        for name in ("input_length", "output_length"):
            value = record[name]
            if not _whole(value) or value < 0 or value > MAX_LENGTH:
                raise RequestError(f"{where}: field {name!r} = {value!r} must be a whole number "
                                   f"of tokens in [0, {MAX_LENGTH:,}]")
            lengths.append(value)
        ids = record["hash_ids"]
        if not isinstance(ids, list):
            raise RequestError(f"{where}: field 'hash_ids' = {ids!r} must be a list of ids")
        bad = next((x for x in ids if not _whole(x) or not 0 <= x <= MAX_ID), None)
        if bad is not None:
            raise RequestError(f"{where}: field 'hash_ids' holds {bad!r}; ids are whole "
                               f"numbers in [0, 2^63)")
        needed = -(-lengths[0] // block_unit)
        if len(ids) != needed:
            raise RequestError(
                f"{where}: field 'hash_ids' has {len(ids)} ids, but input_length = "
                f"{lengths[0]} in blocks of {block_unit} tokens needs {needed} (one per block)")
        self.arrival.append(timestamp / 1000.0)
        self.prompt.append(lengths[0])
        self.output.append(lengths[1])
        self.counts.append(len(ids))
        self.ids.extend(ids)


def read_mooncake(path: str | Path, block_unit: int = MOONCAKE_BLOCK_TOKENS,
                  first_rows: int | None = None) -> Requests:
    """The requests of a Mooncake-format JSONL trace (the first ``first_rows`` lines if
    given), in file order, with arrivals in seconds and the trace's block ids."""
    p = require_file(path, "workload trace")
    lines = _Lines()
    try:
        with open(p, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if first_rows is not None and number > first_rows:
                    break
                where = f"{p} line {number}"
                if not raw.strip():
                    raise RequestError(f"{where}: empty line (every line is one JSON record)")
                try:
                    record = json.loads(raw)
                except UnicodeDecodeError as exc:
                    raise RequestError(f"{where}: not UTF-8 text ({exc.reason})") from exc
                except json.JSONDecodeError as exc:
                    if not raw.endswith(b"\n"):  # only the file's last line can end so
                        raise RequestError(f"{where}: the file ends inside a JSON record "
                                           f"(truncated?): {exc.msg}") from exc
                    raise RequestError(f"{where}: not valid JSON ({exc.msg} at column "
                                       f"{exc.colno})") from exc
                lines.add(record, where, block_unit)
    except OSError as exc:
        raise RequestError(f"{p}: cannot be read ({exc.strerror or exc})") from exc
    if not lines.prompt:
        raise RequestError(f"{p}: the trace has no requests")
    return Requests(
        prompt_len=np.asarray(lines.prompt, dtype=np.int64),
        output_len=np.asarray(lines.output, dtype=np.int64),
        arrival=np.asarray(lines.arrival, dtype=np.float64),
        source=str(path), source_row=np.arange(1, len(lines.prompt) + 1),
        files=(file_record(p),), length_unit="tokens",
        block_ids=np.asarray(lines.ids, dtype=np.int64),
        block_offsets=offsets_of(lines.counts), block_unit=block_unit,
    )


@dataclass(frozen=True)
class MooncakeTrace:
    """A Mooncake FAST'25 trace (or any JSONL file in its format): lengths, arrival times
    (``arrivals=trace`` replays them) and the prompt's block ids.

    ``block_unit`` is the token count behind one id (512 in the published traces). The
    pool is the first ``first_rows`` lines (all if null), minus rows over the length caps
    (``max_prompt_len``, ``max_output_len``, ``max_total_len``; dropped and counted by
    reason, as for the CSV traces; dropping rows removes their blocks from the cache's
    history too). ``n`` requests are drawn from it, seeded, with or without replacement
    (``n=null``: the whole pool in file order).
    """

    path: str
    block_unit: int = field(default=MOONCAKE_BLOCK_TOKENS, metadata=check(ge=1))
    n: int | None = field(default=None, metadata=check(ge=1))
    replace: bool = False
    first_rows: int | None = field(default=None, metadata=check(ge=1))
    max_prompt_len: int | None = field(default=None, metadata=check(ge=1))
    max_output_len: int | None = field(default=None, metadata=check(ge=1))
    max_total_len: int | None = field(default=None, metadata=check(ge=2))
    name: str = "mooncake"

    def pool(self) -> Requests:
        rows = read_mooncake(self.path, self.block_unit, self.first_rows)
        caps = {"prompt_len": self.max_prompt_len, "output_len": self.max_output_len,
                "total_len": self.max_total_len}
        kept, dropped = cap_rows(rows, False, caps, "drop")
        return replace(kept, dropped=dropped)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        return draw_from_pool(self.pool(), rng, self.n if n is None else n, self.replace,
                              self.path)
