"""The timing-backend contract: one iteration's batch composition in, seconds out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the GPU processes in one iteration, one entry per request in the batch.

    ``new_tokens[k]`` is the number of tokens request ``k`` feeds through the model
    this iteration: its prompt chunk while it is prefilling, else 1.
    ``context[k]`` is the number of KV-cache slots request ``k`` holds *before*
    the iteration (already-cached tokens, not cached + new). Under the convention
    of MODEL.md a request that has emitted ``j`` tokens holds ``s + j`` slots,
    which is also what Vidur calls ``num_processed_tokens`` for a decode.
    ``is_prefill[k]`` is true when request ``k`` processes prompt tokens.
    """

    new_tokens: np.ndarray
    context: np.ndarray
    is_prefill: np.ndarray

    @property
    def size(self) -> int:
        return int(self.new_tokens.shape[0])


_NO_CHUNKS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Stretch:
    """Consecutive iterations of one batch in which nothing starts or finishes its prompt
    and nothing completes before the last: the shape the engine fast-forwards.

    ``decodes`` requests decode; before the first iteration their contexts sum to
    ``decode_context_sum`` (largest ``decode_context_max``), and each grows by one
    slot per iteration. Prefilling member ``k`` (in batch order, after the decodes)
    feeds ``chunk[k]`` prompt tokens every iteration and holds ``chunk_context[k]``
    slots before the first, so ``chunk_context[k] + j * chunk[k]`` before iteration
    ``j`` (counted from 0).
    """

    decodes: int
    decode_context_sum: int
    decode_context_max: int
    chunk: np.ndarray = field(default_factory=lambda: _NO_CHUNKS)
    chunk_context: np.ndarray = field(default_factory=lambda: _NO_CHUNKS)


@runtime_checkable
class TimingBackend(Protocol):
    """Maps one iteration's :class:`BatchShape` to its duration.

    ``time_unit`` is ``"rounds"`` for the unit-time model (arrivals then live on
    integer rounds) and ``"seconds"`` otherwise. ``describe()`` returns what
    the run summary records about the backend (coefficients, profile files and
    their hashes, provenance of any substituted data).

    A backend may also offer ``stretch_durations(stretch, steps)``: the durations
    of the first ``steps`` iterations of a :class:`Stretch`, each exactly what
    :meth:`duration` returns for that iteration's shape. It may return a shorter
    prefix (e.g. up to the edge of a profile). The engine uses it to price a
    steady stretch at once (see ``Batch.steady_steps``); without it every
    iteration is priced on its own.
    """

    time_unit: str

    def duration(self, batch: BatchShape) -> float: ...

    def describe(self) -> dict: ...
