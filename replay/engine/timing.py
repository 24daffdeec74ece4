"""The timing-backend contract: one iteration's batch composition in, seconds out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the GPU processes in one iteration, one entry per request in the batch.

    ``new_tokens[k]`` is the number of tokens request ``k`` feeds through the model
    this iteration: its prompt chunk while it is prefilling, else 1.
    ``context[k]`` is the number of KV-cache slots request ``k`` holds *before*
    the iteration (already-cached tokens, not cached + new). Under the convention
    of docs/model.md a request that has emitted ``j`` tokens holds ``s + j`` slots,
    which is also what Vidur calls ``num_processed_tokens`` for a decode.
    ``is_prefill[k]`` is true when request ``k`` processes prompt tokens.
    """

    new_tokens: np.ndarray
    context: np.ndarray
    is_prefill: np.ndarray

    @property
    def size(self) -> int:
        return int(self.new_tokens.shape[0])


@runtime_checkable
class TimingBackend(Protocol):
    """Maps one iteration's :class:`BatchShape` to its duration.

    ``time_unit`` is ``"rounds"`` for the unit-time model (arrivals then live on
    integer rounds) and ``"seconds"`` otherwise. ``describe()`` returns what
    the run summary records about the backend (coefficients, profile files and
    their hashes, provenance of any substituted data).

    A backend written in Python runs through the engine's bridge; a built-in backend's
    price is a compiled function (:class:`replay.engine.rules.CompiledTiming`).
    """

    time_unit: str

    def duration(self, batch: BatchShape) -> float: ...

    def describe(self) -> dict: ...
