"""The engine's waiting queue: engine ids in queue order, cheap to append to and pop from.

Under overload the queue holds most of the trace (a million-request replay keeps
hundreds of thousands waiting), so rebuilding it at every step (concatenating
arrivals, filtering out admissions) would make each step cost O(waiting). The
queue lives in a growable buffer instead: arrivals are written after its end, and
admissions that are a prefix of the queue (FCFS-like policies) only move its
start. Other admissions, and evictions requeued at their old position, copy it once
into a new buffer.

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
        if not np.count_nonzero(status[front] == waiting):
            self._head += n_left
            self._view = None
        else:
            queue = self.ids
            self.replace(queue[status[queue] == waiting])

    def insert(self, at: np.ndarray, ids: np.ndarray) -> None:
        """Insert ``ids[k]`` before the entry now at position ``at[k]`` (``at`` ascending, as
        ``np.insert``), copying the queue once into a new buffer."""
        queue, k = self.ids, ids.size
        buffer = self._new_buffer(queue.size + k)
        copied = 0
        for moved, (position, rid) in enumerate(zip(at.tolist(), ids.tolist(), strict=True)):
            buffer[copied + moved:position + moved] = queue[copied:position]
            buffer[position + moved] = rid
            copied = position
        buffer[copied + k:queue.size + k] = queue[copied:]
        self._buffer, self._head, self._tail, self._view = buffer, 0, queue.size + k, None

    def replace(self, ids: np.ndarray) -> None:
        """Make ``ids`` the queue (a reordering the caller computed), in a new buffer."""
        self._buffer = self._new_buffer(ids.size)
        self._buffer[:ids.size] = ids
        self._head, self._tail = 0, ids.size
        self._view = None

    @staticmethod
    def _new_buffer(size: int) -> np.ndarray:
        # Room to grow, so the arrivals that follow a rebuild do not copy the queue again.
        return np.empty(max(2 * size, _INITIAL_CAPACITY), dtype=np.int64)
