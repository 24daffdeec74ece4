"""The request table every workload produces and the engine consumes.

A :class:`Requests` is a struct of numpy arrays, one entry per request, in
workload order (``request_id`` = position). ``source_row`` remembers where each
request came from (a 1-based line number in the source file, or the index in a
generator's output) so that every error can name the file, row and field.

Two optional groups of columns describe what a prefix cache needs:

* **Prompt content** (``block_ids``, ``block_offsets``, ``block_unit``): request ``i``'s
  prompt is cut into trace blocks of ``block_unit`` tokens, and
  ``block_ids[block_offsets[i]:block_offsets[i + 1]]`` names the content of its first
  blocks (equal ids, equal tokens). :func:`prefix_block_hashes` maps them onto the
  engine's KV block size.
* **Sessions** (``session``, ``predecessor``, ``think_time``): a later turn of a
  multi-turn session is released ``think_time`` seconds after its ``predecessor`` (a
  row of this table) completes, so its ``arrival`` is NaN until then.
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


def segment_arange(counts: np.ndarray) -> np.ndarray:
    """``0..counts[0]-1, 0..counts[1]-1, ...`` in one array (the position inside each segment)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """Offsets ``[0, c0, c0 + c1, ...]`` of a ragged array with segment sizes ``counts``."""
    return np.concatenate(([0], np.cumsum(np.asarray(counts, dtype=np.int64)))).astype(np.int64)


# ------------------------------------------------------------------ prefix block hashes
#: MurmurHash3's 64-bit finaliser constants: a bijection of uint64 that spreads every bit.
_FMIX1, _FMIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
#: The odd multiplier of the chain (invertible modulo 2^64), its inverse, the chain's start
#: and the odd step that makes a piece's offset inside its trace block part of its content.
_CHAIN = 0x9E3779B97F4A7C15
_CHAIN_INVERSE = pow(_CHAIN, -1, 1 << 64)
_CHAIN_START = np.uint64(0x243F6A8885A308D3)
_OFFSET_STEP = np.uint64(0xD6E8FEB86659FD93)
_ALL_ONES = np.uint64((1 << 64) - 1)


def _fmix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(33))  # a new array: the argument is left alone
    x *= _FMIX1
    x ^= x >> np.uint64(33)
    x *= _FMIX2
    x ^= x >> np.uint64(33)
    return x


def _powers(base: int, count: int) -> np.ndarray:
    """``base**0 .. base**(count - 1)`` modulo 2^64."""
    steps = np.full(count, base, dtype=np.uint64)
    steps[0] = 1
    return np.cumprod(steps, dtype=np.uint64)


def _piece_starts(full_blocks: np.ndarray, unit: int, block_size: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The token positions where a block or a trace block begins, inside each request's full
    blocks, in (request, position) order: ``(request, start)`` per piece. Between two
    consecutive starts lies one piece, inside one KV block and one trace block."""
    n = full_blocks.size
    hashed = full_blocks * block_size
    step = min(unit, block_size)
    if unit % block_size == 0 or block_size % unit == 0:  # one grid holds both
        counts = hashed // step
        return np.repeat(np.arange(n), counts), segment_arange(counts) * step
    unit_counts = -(-hashed // unit)
    request = np.concatenate((np.repeat(np.arange(n), full_blocks),
                              np.repeat(np.arange(n), unit_counts)))
    start = np.concatenate((segment_arange(full_blocks) * block_size,
                            segment_arange(unit_counts) * unit))
    keep = (np.arange(start.size) < full_blocks.sum()) | (start % block_size != 0)
    request, start = request[keep], start[keep]
    order = np.lexsort((start, request))
    return request[order], start[order]


def prefix_block_hashes(prompt_len: np.ndarray, block_ids: np.ndarray | None,
                        block_offsets: np.ndarray | None, block_unit: int,
                        block_size: int, own_from: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The chain hash of every full ``block_size``-token block of every prompt.

    Request ``i``'s hashes are ``hashes[offsets[i]:offsets[i + 1]]``, one per full block
    (``prompt_len[i] // block_size`` of them; a last partial block has none, so it is
    never shared). Block ``k``'s hash combines block ``k - 1``'s hash with block ``k``'s
    own content, as vLLM's prefix cache hashes a block with its parent's hash, so two
    requests have equal hashes at block ``k`` exactly when their prompts agree on every
    block up to ``k`` (up to 64-bit hash collisions).

    The content of block ``k`` is read from the trace's ids, ``block_unit`` tokens each:
    the block is cut at trace-block boundaries into pieces, each piece being "the tokens of
    trace block ``j`` from offset ``r``" (its length follows from its position). Any
    relation of the two sizes works: a block inside one trace block (``block_size``
    divides ``block_unit``), a block spanning several (``block_unit`` divides
    ``block_size``), or neither, where a block straddling two trace blocks depends on
    both. Tokens beyond a request's last id have unknown content, taken as that
    request's own (never shared with another row); so are tokens from ``own_from[i]`` on
    (a request's answer, where ``prompt_len`` counts it: an id that runs past the prompt
    does not make the answer equal another prompt), and a block holding any of them.

    The chain is linear modulo 2^64 (``g = g * C + piece``, with ``C`` odd), so it is
    computed for all requests at once with prefix sums; each block's hash is the chain
    value at its last piece passed through MurmurHash3's finaliser. Returns int64
    ``(hashes, offsets)``.
    """
    if block_size < 1 or block_unit < 1:
        raise RequestError(f"block sizes must be >= 1 token, got block_size = {block_size}, "
                           f"block_unit = {block_unit}")
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    n = prompt_len.size
    if block_ids is None:
        block_ids, block_offsets = np.empty(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
    full_blocks = np.maximum(prompt_len, 0) // block_size
    request, start = _piece_starts(full_blocks, block_unit, block_size)
    trace_block = start // block_unit
    first = block_offsets[request]
    covered = trace_block < (block_offsets[request + 1] - first)
    if own_from is not None:  # a piece ends at its trace block's or its KV block's end
        piece_end = np.minimum((trace_block + 1) * block_unit,
                               (start // block_size + 1) * block_size)
        covered &= piece_end <= np.asarray(own_from, dtype=np.int64)[request]
    key = _ALL_ONES - request.astype(np.uint64)  # >= 2^63: never an id (ids are < 2^63)
    key[covered] = block_ids[(first + trace_block)[covered]].astype(np.uint64)
    offset = (start - trace_block * block_unit).astype(np.uint64)
    piece = _fmix(_fmix(key) + offset * _OFFSET_STEP)
    # g_t = START * C^(t+1) + sum_{i<=t} piece_i * C^(t-i), with t the piece's index inside
    # its request: C^(t+1) * (START + sum_{i<=t} piece_i * C^-(i+1)), a segmented prefix sum.
    pieces_per_request = np.bincount(request, minlength=n)
    local = segment_arange(pieces_per_request)
    top = int(local.max(initial=-1)) + 2
    scaled = piece * _powers(_CHAIN_INVERSE, top)[local + 1]
    running = np.cumsum(scaled, dtype=np.uint64)
    first_piece, some = offsets_of(pieces_per_request)[:-1], pieces_per_request > 0
    before = np.zeros(n, dtype=np.uint64)  # the running sum before each request's first piece
    before[some] = running[first_piece[some]] - scaled[first_piece[some]]
    own = running - np.repeat(before, pieces_per_request)
    chain = _powers(_CHAIN, top)[local + 1] * (_CHAIN_START + own)
    last_of_block = np.ones(start.size, dtype=bool)
    last_of_block[:-1] = start[1:] % block_size == 0
    hashes = _fmix(chain[last_of_block]).view(np.int64)
    return hashes, offsets_of(full_blocks)



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
    #: The source's own name of a field where it differs (a CSV's column: ``{"prompt_len":
    #: "input_tokens"}``), so that an error names what the user's file says.
    source_columns: dict[str, str] = field(default_factory=dict)
    length_unit: str = "tokens"
    dropped: dict[str, int] = field(default_factory=dict)
    files: tuple[dict, ...] = ()
    predictor: object = None  # what filled predicted_lo/hi (workloads.prediction), if any
    #: Prompt content: flat int64 ids (>= 0), one per trace block of ``block_unit`` tokens.
    block_ids: np.ndarray | None = None
    #: Request ``i``'s ids are ``block_ids[block_offsets[i]:block_offsets[i + 1]]`` (n + 1).
    block_offsets: np.ndarray | None = None
    #: Tokens per trace block (512 for the Mooncake traces).
    block_unit: int | None = None
    #: Sessions: the session of each request (int64).
    session: np.ndarray | None = None
    #: The row of the previous turn of the same session, -1 for a first turn.
    predecessor: np.ndarray | None = None
    #: Seconds between the predecessor's completion and this turn's arrival (0 for first turns).
    think_time: np.ndarray | None = None

    CONTENT = ("block_ids", "block_offsets", "block_unit")
    SESSIONS = ("session", "predecessor", "think_time")

    def __post_init__(self) -> None:
        n = len(self.prompt_len)
        for name in ("output_len", "arrival", "predicted_lo", "predicted_hi", "type_id",
                     "source_row", "session", "predecessor", "think_time"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise RequestError(f"{self.source}: column {name} has {len(value)} rows, "
                                   f"prompt_len has {n}")
        for group in (self.CONTENT, self.SESSIONS):
            given = [name for name in group if getattr(self, name) is not None]
            if given and len(given) != len(group):
                raise RequestError(f"{self.source}: {', '.join(group)} go together; only "
                                   f"{', '.join(given)} given")
        if self.block_ids is not None:
            self._check_content()

    def _check_content(self) -> None:
        """The ragged id table is well formed and each request's ids fit its prompt."""
        ids, offsets, unit = self.block_ids, self.block_offsets, self.block_unit
        if isinstance(unit, bool) or not isinstance(unit, int | np.integer) or unit < 1:
            raise RequestError(f"{self.source}: block_unit = {unit!r} must be a whole number "
                               f"of tokens >= 1")
        if (len(offsets) != len(self) + 1 or (len(offsets) and offsets[0] != 0)
                or np.any(np.diff(offsets) < 0) or offsets[-1] != len(ids)):
            raise RequestError(f"{self.source}: block_offsets must rise from 0 to "
                               f"len(block_ids) = {len(ids)} with one entry per request and "
                               f"one more")
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            i = int(np.searchsorted(offsets, bad[0], side="right") - 1)
            raise RequestError(f"{self.row(i)}: block id {ids[bad[0]]} is negative (content "
                               f"ids are >= 0)")
        count = np.diff(offsets)
        fits = -(-np.maximum(self.prompt_len, 0) // unit)  # ceil(prompt_len / unit)
        bad = np.flatnonzero(count > fits)
        if bad.size:
            i = int(bad[0])
            raise RequestError(
                f"{self.row(i)}: {count[i]} block ids do not fit prompt_len = "
                f"{self.prompt_len[i]}: blocks of {unit} tokens allow at most {fits[i]} "
                f"({bad.size} such rows)")

    def __len__(self) -> int:
        return len(self.prompt_len)

    def row(self, i: int) -> str:
        """Human-readable location of request ``i`` for error messages."""
        where = int(self.source_row[i]) if self.source_row is not None else i
        return f"{self.source} row {where}"

    def field_name(self, name: str) -> str:
        """Field ``name`` as errors name it: the source's column, then the field."""
        column = self.source_columns.get(name)
        return name if column is None else f"{column!r} ({name})"

    def with_arrivals(self, arrival: np.ndarray) -> Requests:
        return replace(self, arrival=np.asarray(arrival, dtype=np.float64))

    def block_hashes(self, block_size: int,
                     with_output: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """:func:`prefix_block_hashes` of these requests for KV blocks of ``block_size``
        tokens (without content ids, every block is its own request's). ``with_output``:
        the full blocks of the whole sequence, the answer's tokens being the request's own,
        as an engine's cache holds them once generated."""
        length = self.prompt_len + self.output_len if with_output else self.prompt_len
        return prefix_block_hashes(length, self.block_ids, self.block_offsets,
                                   self.block_unit or block_size, block_size,
                                   own_from=self.prompt_len)

    def ids_of(self, i: int) -> np.ndarray:
        """Request ``i``'s prompt-content ids (empty without content ids)."""
        if self.block_ids is None:
            return np.empty(0, dtype=np.int64)
        return self.block_ids[self.block_offsets[i]:self.block_offsets[i + 1]]

    def take(self, index: np.ndarray) -> Requests:
        """The requests at ``index`` (in that order), keeping provenance, content ids and
        sessions (whose predecessors are renumbered; a kept turn whose predecessor is not
        kept is an error)."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        index = index.astype(np.int64, copy=False)

        def pick(a):
            return None if a is None else a[index]
        content = {}
        if self.block_ids is not None:
            counts = np.diff(self.block_offsets)[index]
            offsets = offsets_of(counts)
            gather = np.repeat(self.block_offsets[index], counts) + segment_arange(counts)
            content = {"block_ids": self.block_ids[gather], "block_offsets": offsets}
        sessions = {}
        if self.predecessor is not None:
            sessions = {"session": pick(self.session), "think_time": pick(self.think_time),
                        "predecessor": self._renumbered_predecessors(index)}
        return replace(
            self, prompt_len=self.prompt_len[index], output_len=self.output_len[index],
            arrival=pick(self.arrival), predicted_lo=pick(self.predicted_lo),
            predicted_hi=pick(self.predicted_hi), type_id=pick(self.type_id),
            source_row=pick(self.source_row) if self.source_row is not None else index,
            **content, **sessions,
        )

    def _renumbered_predecessors(self, index: np.ndarray) -> np.ndarray:
        if np.unique(index).size != index.size:
            raise RequestError(f"{self.source}: a table of sessions cannot repeat a request "
                               f"(a turn would have two copies of its successor)")
        position = np.full(len(self), -1, dtype=np.int64)
        position[index] = np.arange(index.size, dtype=np.int64)
        predecessor = self.predecessor[index]
        renumbered = np.where(predecessor >= 0, position[np.maximum(predecessor, 0)], -1)
        lost = np.flatnonzero((predecessor >= 0) & (renumbered < 0))
        if lost.size:
            i = int(index[lost[0]])
            raise RequestError(f"{self.row(i)}: its predecessor turn (row "
                               f"{int(self.predecessor[i])}) is not among the requests kept; "
                               f"a session's turns are kept or dropped together")
        return renumbered

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
                raise RequestError(f"{self.row(i)}: field {self.field_name(name)} = "
                                   f"{values[i]} must be >= 1 ({bad.size} such rows)")
        if len(self) == 0:
            dropped = f" (dropped: {self.dropped})" if self.dropped else ""
            raise RequestError(f"{self.source}: the workload has no requests{dropped}; an empty "
                               f"replay would report a meaningless 'completed'")
        if self.predecessor is not None:
            self._check_sessions()
        if self.arrival is not None:
            # A later turn of a session has no arrival yet (NaN): the engine releases it.
            released = (self.predecessor >= 0 if self.predecessor is not None
                        else np.zeros(len(self), dtype=bool))
            bad = np.flatnonzero(~released & (~np.isfinite(self.arrival) | (self.arrival < 0)
                                              | (self.arrival > MAX_ARRIVAL)))
            if bad.size:
                i = int(bad[0])
                raise RequestError(f"{self.row(i)}: field {self.field_name('arrival')} = "
                                   f"{self.arrival[i]} must be a "
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

    def _check_sessions(self) -> None:
        """Each session is one chain of turns: a first turn (predecessor -1) with an arrival
        time, and later turns whose predecessor is another row of the same session, each
        row the predecessor of at most one, no cycles; later turns' arrival is NaN (the
        engine sets it: predecessor's completion + think_time)."""
        n = len(self)
        predecessor, session, think = self.predecessor, self.session, self.think_time
        bad = np.flatnonzero((predecessor < -1) | (predecessor >= n)
                             | (predecessor == np.arange(n)))
        if bad.size:
            i = int(bad[0])
            raise RequestError(f"{self.row(i)}: field predecessor = {predecessor[i]} must be "
                               f"-1 (a first turn) or another row in [0, {n})")
        later = predecessor >= 0
        parent = np.where(later, predecessor, 0)
        bad = np.flatnonzero(later & (session[parent] != session))
        if bad.size:
            i = int(bad[0])
            raise RequestError(f"{self.row(i)}: its predecessor (row {predecessor[i]}) belongs "
                               f"to session {session[predecessor[i]]}, not {session[i]}")
        successors = np.bincount(predecessor[later], minlength=n)
        bad = np.flatnonzero(successors > 1)
        if bad.size:
            i = int(bad[0])
            raise RequestError(f"{self.row(i)}: it is the predecessor of {successors[i]} turns; "
                               f"a session is one chain of turns")
        bad = np.flatnonzero(later & ~(np.isfinite(think) & (think >= 0)))
        if bad.size:
            i = int(bad[0])
            raise RequestError(f"{self.row(i)}: field think_time = {think[i]} must be a finite "
                               f"number of seconds >= 0")
        if self.arrival is not None:
            bad = np.flatnonzero(later & ~np.isnan(self.arrival))
            if bad.size:
                i = int(bad[0])
                raise RequestError(
                    f"{self.row(i)}: a later turn of a session has arrival = "
                    f"{self.arrival[i]}, but its arrival is set by the engine (its "
                    f"predecessor's completion + think_time) and must be NaN here; run a "
                    f"session workload with arrivals=trace")
        # Following predecessors from any row must reach a first turn: pointer doubling
        # finds the 2^k-th ancestor, so ceil(log2 n) + 1 rounds reach -1 unless there is a cycle.
        ancestor = predecessor.copy()
        for _ in range(int(n).bit_length() + 1):
            if not np.any(ancestor >= 0):
                return
            ancestor = np.where(ancestor >= 0, ancestor[np.maximum(ancestor, 0)], -1)
        if not np.any(ancestor >= 0):
            return
        i = int(np.flatnonzero(ancestor >= 0)[0])
        raise RequestError(f"{self.row(i)}: its chain of predecessors never reaches a first "
                           f"turn (a cycle)")
