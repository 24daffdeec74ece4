"""A waiting queue kept sorted across steps by a key fixed per request.

A policy that walks the waiting queue in a fixed per-request order (MC-SF: the
predicted output, ties by id) would otherwise sort the whole queue every step,
which dominates a run once the queue is long (an overloaded 100,000-request
replay holds tens of thousands waiting). The queue only changes by arrivals,
admissions and evictions, so :class:`KeptOrder` keeps the sorted order and each
step removes the requests that left the queue and merges in those that joined:
``O(waiting)`` vectorised work and a sort of the newcomers only. The order is
exactly ``waiting[np.lexsort((waiting, key[waiting]))]`` (tested).

Most steps of an overloaded run change nothing in the queue (the backlog drains
after the last arrival, and a full batch admits nothing). The engine hands out
the same read-only array object until its queue changes, and never rewrites an
array it handed out (:mod:`replay.engine.waiting`), so the very object seen last time
means the same queue: that step costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
#: Combined keys ``key * n + id`` must stay below this (int64, with headroom).
_KEY_LIMIT = 2 ** 62


@dataclass
class KeptOrder:
    """The waiting requests in ascending ``(key, id)``, kept across steps."""

    order: np.ndarray = field(default_factory=lambda: _EMPTY)
    _combined: np.ndarray = field(default_factory=lambda: _EMPTY)
    _member: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _waiting: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    _key: np.ndarray | None = None  # the key array of the run being ordered
    _seen: np.ndarray | None = None  # the waiting array the order was last computed for

    def ordered(self, waiting: np.ndarray, key: np.ndarray) -> np.ndarray:
        """``waiting`` sorted by ``(key[i], i)``; ``key`` is indexed by request id and must
        not change for a request while it waits (a new key array starts afresh: a new run)."""
        if waiting is self._seen and key is self._key:
            return self.order
        n = key.size
        if key is not self._key:
            self._key = key
            if int(key.max(initial=0)) >= _KEY_LIMIT // max(n, 1):
                raise ValueError("KeptOrder: keys too large to combine with request ids")
            self.order, self._combined = _EMPTY, _EMPTY
            self._member = np.zeros(n, dtype=bool)
            self._waiting = np.zeros(n, dtype=bool)
        self._waiting[waiting] = True
        stays = self._waiting[self.order]
        if not stays.all():  # admitted since the last step
            self._member[self.order[~stays]] = False
            self.order, self._combined = self.order[stays], self._combined[stays]
        self._waiting[waiting] = False
        joined = waiting[~self._member[waiting]]  # arrived or evicted since the last step
        if joined.size:
            combined = key[joined].astype(np.int64) * n + joined
            by_key = np.argsort(combined, kind="stable")
            joined, combined = joined[by_key], combined[by_key]
            where = np.searchsorted(self._combined, combined)
            self.order = np.insert(self.order, where, joined)
            self._combined = np.insert(self._combined, where, combined)
            self._member[joined] = True
        # Only a read-only array is known not to change in place (the engine's views are).
        self._seen = None if waiting.flags.writeable else waiting
        return self.order
