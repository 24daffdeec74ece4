"""The prefix cache of the test oracle, stated with Python containers.

The same model as :mod:`replay.engine.prefix_cache` (see docs/model.md, "Prefix cache"):
an *entry* per cached block, found by the chain hash of the block; running requests
reference the entries of their leading full blocks; an entry nobody references stays
cached, free, until a step needs its memory and reclaims it (least recently freed first,
or oldest first). Admissions of a step pin the entries they found, so that step's reclaim
never takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.oracle.policies import blocks


@dataclass
class _Entry:
    references: int
    inserted: int  # insertion number: the order ``fifo`` reclaims in


class OraclePrefixCache:
    """Entries by hash, each request's hashes and references, the free entries in reclaim
    order, and the totals the engine reports."""

    def __init__(self, hashes: list[np.ndarray], block: int, rule: str) -> None:
        self.hashes = [h.tolist() for h in hashes]  # by engine id
        self.block, self.rule = block, rule
        self.entries: dict[int, _Entry] = {}
        self.free: list[int] = []  # free entries' hashes, the next reclaimed first
        self.references = [0] * len(hashes)  # leading blocks each request references
        self.pinned: set[int] = set()
        self.inserted = 0
        self.totals = dict(hit_blocks=0, lookup_blocks=0, hit_tokens=0, prompt_tokens=0,
                           reclaimed_blocks=0)

    # ------------------------------------------------------------------ what policies see
    def hits(self, rid: int, prefill_len: int) -> int:
        """Leading blocks of ``rid``'s prefill cached now (one prompt token is always left
        to compute)."""
        count = 0
        for key in self.hashes[rid][: (prefill_len - 1) // self.block]:
            if key not in self.entries:
                break
            count += 1
        return count

    def free_among_hits(self, rid: int, hits: int) -> int:
        return sum(self.entries[key].references == 0 for key in self.hashes[rid][:hits])

    def blocks_freed_by(self, rid: int, held: int) -> int:
        """What preempting running ``rid`` frees: its own blocks, and the entries only it
        references."""
        own = blocks(held, self.block) - self.references[rid]
        return own + sum(self.entries[key].references == 1
                         for key in self.hashes[rid][: self.references[rid]])

    def taken(self, running_held: np.ndarray, running: np.ndarray) -> int:
        """Blocks the running requests occupy, shared ones once, free entries not."""
        return self.physical(running_held, running) - len(self.free)

    def physical(self, running_held: np.ndarray, running: np.ndarray) -> int:
        """Blocks in use: the running requests' own blocks and every entry."""
        own = sum(blocks(int(h), self.block) - self.references[int(r)]
                  for h, r in zip(running_held, running, strict=True))
        return own + len(self.entries)

    # ------------------------------------------------------------------ what the engine does
    def pin(self, rid: int, hits: int) -> None:
        self.pinned.update(self.hashes[rid][:hits])

    def unpin(self) -> None:
        self.pinned = set()

    def reclaimable(self) -> int:
        return sum(key not in self.pinned for key in self.free)

    def reclaim(self, count: int) -> None:
        for _ in range(count):
            key = next(key for key in self.free if key not in self.pinned)
            self.free.remove(key)
            del self.entries[key]
        self.totals["reclaimed_blocks"] += count

    def _reference(self, key: int) -> None:
        entry = self.entries[key]
        if entry.references == 0:
            self.free.remove(key)
        entry.references += 1

    def admit(self, rid: int, hits: int, prefill_len: int) -> None:
        """``rid`` starts with its first ``hits`` blocks taken from the cache."""
        for key in self.hashes[rid][:hits]:
            self._reference(key)
        self.references[rid] = hits
        self.totals["hit_blocks"] += hits
        self.totals["lookup_blocks"] += min(len(self.hashes[rid]), prefill_len // self.block)
        self.totals["hit_tokens"] += hits * self.block
        self.totals["prompt_tokens"] += prefill_len

    def insert_full(self, rid: int, held: int) -> None:
        """``rid``'s full blocks of known content beyond its references join the cache."""
        full = min(held // self.block, len(self.hashes[rid]))
        for key in self.hashes[rid][self.references[rid]:full]:
            if key in self.entries:
                self._reference(key)
            else:
                self.entries[key] = _Entry(1, self.inserted)
                self.inserted += 1
        self.references[rid] = max(self.references[rid], full)

    def release(self, rid: int) -> None:
        """``rid`` lets its entries go, its last block first."""
        for key in reversed(self.hashes[rid][: self.references[rid]]):
            entry = self.entries[key]
            entry.references -= 1
            if entry.references == 0:
                self.free.append(key)
                if self.rule == "fifo":
                    self.free.sort(key=lambda k: self.entries[k].inserted)
        self.references[rid] = 0

    def summary(self) -> dict:
        return {**self.totals, "entries_at_end": len(self.entries)}
