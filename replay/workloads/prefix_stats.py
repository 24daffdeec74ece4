"""How much of a workload's prompts a prefix cache would find: requests replayed in arrival
order through an LRU cache of chain-hashed blocks (``python -m traces.stats prefix``).

The model, stated exactly (docs/workloads.md repeats it):

* Each request's prompt is cut into full blocks of ``block_size`` tokens, each named by
  its chain hash (:func:`replay.engine.requests.prefix_block_hashes`); a last partial
  block is never cached and never hit.
* Requests arrive in arrival order (ties: table order); each is served at once (no
  queueing, no service time): it looks its blocks up, then holds all of them, then frees
  them.
* Its **hits** are the leading run of its blocks that are cached when it arrives: the
  run stops at the first block that is not, as in vLLM (a block past a miss cannot be
  reused, its chain hash differs anyway). Hit tokens are ``hit blocks x block_size``.
* Then every full block of the request is in the cache (the hits and the new ones):
  its blocks are freed in reverse order, so its last block is the least recently used
  of them and its first block the most recently used (vLLM frees a request's blocks in
  reverse order for the same reason: a prefix's tail is worth less than its head).
* With a capacity of ``C`` blocks (``capacity_tokens // block_size``), the least
  recently used cached blocks not held by the arriving request are evicted to make room
  for its blocks; a request with more than ``C`` blocks keeps only its first ``C``.
  Without a capacity nothing is evicted.

``hit_ratio_blocks`` = hit blocks / full blocks of all prompts; ``hit_ratio_tokens`` =
hit tokens / prompt tokens of all prompts (the share of prefill tokens a cache saves).
A request never hits its own blocks: the lookup comes before its insertion.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np

from replay.engine.requests import RequestError, Requests


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counts of one replay through the prefix cache, and the two hit ratios."""

    requests: int
    block_size: int
    capacity_tokens: int | None
    capacity_blocks: int | None
    prompt_tokens: int
    full_blocks: int
    hit_blocks: int
    hit_tokens: int
    evicted_blocks: int
    distinct_blocks: int

    @property
    def hit_ratio_blocks(self) -> float | None:
        return self.hit_blocks / self.full_blocks if self.full_blocks else None

    @property
    def hit_ratio_tokens(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def as_dict(self) -> dict:
        return {"hit_ratio_blocks": self.hit_ratio_blocks,
                "hit_ratio_tokens": self.hit_ratio_tokens, **asdict(self)}


def replay_order(requests: Requests) -> np.ndarray:
    """Rows in arrival order (ties: table order). A later turn of a session, whose arrival
    the engine sets, is placed at its predecessor's place plus its think time, as if every
    turn completed the moment it arrived; without arrival times, table order."""
    if requests.arrival is None:
        return np.arange(len(requests))
    arrival = requests.arrival.astype(np.float64, copy=True)
    if requests.predecessor is not None:
        pending = np.flatnonzero(np.isnan(arrival) & (requests.predecessor >= 0))
        while pending.size:
            parent = requests.predecessor[pending]
            ready = ~np.isnan(arrival[parent])
            if not ready.any():
                raise RequestError(f"{requests.source}: a session's turns never reach a turn "
                                   f"with an arrival time")
            arrival[pending[ready]] = arrival[parent[ready]] + requests.think_time[pending[ready]]
            pending = pending[~ready]
    return np.lexsort((np.arange(len(requests)), arrival))


def _hits_unbounded(hashes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """Per request (in replay order), its blocks some earlier request had; and the number
    of distinct blocks.

    With no eviction every block of every earlier request is cached, and a chain hash
    seen before means its whole chain was seen before (the request that had it had all
    its parents), so the cached blocks of a request are exactly its leading run of hits.
    """
    request = np.repeat(np.arange(counts.size), counts)
    order = np.argsort(hashes)
    ordered = hashes[order]
    starts = np.ones(hashes.size, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    group_start = np.flatnonzero(starts)
    by_request = request[order]
    earliest = (np.minimum.reduceat(by_request, group_start) if hashes.size
                else np.empty(0, dtype=np.int64))
    group_size = np.diff(np.append(group_start, hashes.size))
    cached = by_request > np.repeat(earliest, group_size)
    return np.bincount(by_request[cached], minlength=counts.size), int(group_start.size)


def _leading_hits_lru(hashes: np.ndarray, counts: np.ndarray, capacity: int
                      ) -> tuple[np.ndarray, int]:
    """Per request (in replay order), its leading run of cached blocks under an LRU cache
    of ``capacity`` blocks; and the number of blocks evicted (about 1.5 microseconds per
    block: the dictionary operations, not the loop, dominate)."""
    cache: OrderedDict[int, None] = OrderedDict()  # least recently used first
    hits = np.zeros(counts.size, dtype=np.int64)
    evicted = 0
    flat = hashes.tolist()
    end = 0
    for r, count in enumerate(counts.tolist()):
        blocks, end = flat[end:end + count], end + count
        run = 0
        for block in blocks:
            if block not in cache:
                break
            run += 1
        hits[r] = run
        held = blocks[:capacity]
        for block in held:  # held by the request: not evictable while it makes room
            cache.pop(block, None)
        while cache and len(cache) + len(held) > capacity:
            cache.popitem(last=False)
            evicted += 1
        for block in reversed(held):  # freed last block first: the tail is evicted first
            cache[block] = None
    return hits, evicted


def prefix_cache_replay(requests: Requests, block_size: int,
                        capacity_tokens: int | None = None) -> tuple[PrefixCacheStats, np.ndarray]:
    """Replay ``requests`` through the prefix cache of the module's model; returns the
    counts and each request's hit blocks (in table order)."""
    if requests.block_ids is None:
        raise RequestError(f"{requests.source}: the requests carry no prompt-content ids, so "
                           f"no two prompts can share a block; use a workload with ids "
                           f"(mooncake, shared_prefix, sessions)")
    if block_size < 1 or (capacity_tokens is not None and capacity_tokens < 0):
        raise RequestError(f"block_size must be >= 1 and capacity_tokens >= 0, got "
                           f"{block_size} and {capacity_tokens}")
    order = replay_order(requests)
    hashes, offsets = requests.take(order).block_hashes(block_size)
    counts = np.diff(offsets)
    capacity = None if capacity_tokens is None else capacity_tokens // block_size
    if capacity is None:
        (hits, distinct), evicted = _hits_unbounded(hashes, counts), 0
    else:
        hits, evicted = _leading_hits_lru(hashes, counts, capacity)
        distinct = int(np.unique(hashes).size)
    per_request = np.empty_like(hits)
    per_request[order] = hits
    stats = PrefixCacheStats(
        requests=len(requests), block_size=block_size, capacity_tokens=capacity_tokens,
        capacity_blocks=capacity, prompt_tokens=int(requests.prompt_len.sum()),
        full_blocks=int(counts.sum()), hit_blocks=int(hits.sum()),
        hit_tokens=int(hits.sum()) * block_size, evicted_blocks=evicted,
        distinct_blocks=distinct)
    return stats, per_request
