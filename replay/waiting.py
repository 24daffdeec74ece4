"""The engine's waiting queue: engine ids in queue order, cheap to append to and pop from.

Under overload the queue holds most of the trace (a million-request replay keeps
hundreds of thousands waiting), so rebuilding it at every step (concatenating
arrivals, filtering out admissions) would make each step cost O(waiting). The
queue lives in a growable buffer instead: arrivals are written after its end, and
admissions that are a prefix of the queue (FCFS-like policies) only move its
start. Other admissions, and evictions requeued at their old position, rebuild it
once, as before.

Policies receive :attr:`ids`, a read-only view. The buffer is only ever written
beyond the current end and is replaced (never rewritten) when the queue is
rebuilt, so a view a policy kept from an earlier step still reads that step's queue.
"""

from __future__ import annotations

import numpy as np

_INITIAL_CAPACITY = 1024


class WaitingQueue:
    def __init__(self) -> None:
        self._buffer = np.empty(_INITIAL_CAPACITY, dtype=np.int64)
        self._head = self._tail = 0
        self._view: np.ndarray | None = None

    @property
    def size(self) -> int:
        return self._tail - self._head

    @property
    def ids(self) -> np.ndarray:
        """The queue in order, read-only (the same object until the queue changes)."""
        if self._view is None:
            view = self._buffer[self._head:self._tail]
            view.flags.writeable = False
            self._view = view
        return self._view

    def append(self, ids: np.ndarray) -> None:
        """Queue ``ids`` behind everything waiting."""
        k = ids.size
        if self._tail + k > self._buffer.size:
            size = self.size
            grown = np.empty(max(2 * (size + k), _INITIAL_CAPACITY), dtype=np.int64)
            grown[:size] = self._buffer[self._head:self._tail]
            self._buffer, self._head, self._tail = grown, 0, size
        self._buffer[self._tail:self._tail + k] = ids
        self._tail += k
        self._view = None

    def drop_left(self, status: np.ndarray, waiting: int, n_left: int) -> None:
        """Drop the ``n_left`` entries that left the queue: those whose ``status`` (indexed by
        id) is no longer ``waiting``. O(n_left) when they are the queue's first entries."""
        front = self._buffer[self._head:self._head + n_left]
        if (status[front] != waiting).all():
            self._head += n_left
            self._view = None
        else:
            queue = self.ids
            self.replace(queue[status[queue] == waiting])

    def replace(self, ids: np.ndarray) -> None:
        """Make ``ids`` the queue (a reordering the caller computed), in a new buffer."""
        # Room to grow, so the arrivals that follow a rebuild do not copy the queue again.
        self._buffer = np.empty(max(2 * ids.size, _INITIAL_CAPACITY), dtype=np.int64)
        self._buffer[:ids.size] = ids
        self._head, self._tail = 0, ids.size
        self._view = None
