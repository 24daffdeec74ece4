"""Plain numpy statements of every built-in compiled rule, for the oracle engine.

Each takes the production object for its parameters (so both read the same config) and
decides from a :class:`~replay.engine.policy.PolicyView` with whole-array numpy, as the
policies were written before their decisions were compiled, without the speed-ups (kept
orders, hints, galloping) and without steady-step promises (the oracle asks at every
step). :func:`oracle_of` maps a production policy to its oracle twin.
"""

from __future__ import annotations

import copy

import numpy as np

from policies.fcfs import FCFSLookahead
from policies.lpm import LongestPrefixMatch
from policies.mcsf import MCSF
from policies.nested_wait import NestedWait
from policies.paper_fcfs import PaperFCFS
from policies.protection import AlphaProtection
from policies.sarathi import SarathiLike
from policies.vllm import VLLMLike
from policies.vllm_v1 import VLLMV1
from policies.wait import Wait
from replay.engine.overflow import ClearAll, ClearEachWithProb, EvictLIFO
from replay.engine.policy import Batch, PolicyView
from replay.errors import ConfigError

_EMPTY = np.zeros(0, dtype=np.int64)


def blocks(tokens, block_size: int):
    """Blocks needed to hold ``tokens >= 0`` slots (elementwise)."""
    if not isinstance(tokens, int):
        tokens = np.asarray(tokens)
    return (tokens + (block_size - 1)) // block_size


# ------------------------------------------------------------------------ overflow rules
class OracleClearAll:
    def evict(self, holders, held_after, kv_capacity, rng, n_running):
        return holders[:n_running]


class OracleClearEachWithProb:
    def __init__(self, beta: float) -> None:
        self.beta = beta

    def evict(self, holders, held_after, kv_capacity, rng, n_running):
        return holders[:n_running][rng.random(holders.size)[:n_running] < self.beta]


class OracleEvictLIFO:
    def evict(self, holders, held_after, kv_capacity, rng, n_running):
        excess = int(held_after.sum()) - kv_capacity
        order = np.arange(n_running)[::-1]
        if excess <= 0 or order.size == 0:
            return holders[:0]
        freed = np.cumsum(held_after[order])
        return holders[order[:int(np.searchsorted(freed, excess, side="left")) + 1]]


def oracle_overflow(rule):
    if isinstance(rule, ClearEachWithProb):
        return OracleClearEachWithProb(rule.beta)
    return {ClearAll: OracleClearAll, EvictLIFO: OracleEvictLIFO}[type(rule)]()


# ------------------------------------------------------------------------- lookahead
def peak_kv(base: np.ndarray, remaining: np.ndarray, block: int) -> int:
    """The largest KV the requests hold at any checkpoint ``c`` in ``remaining`` (those with
    ``remaining >= c`` hold ``base + c`` slots, in whole blocks)."""
    best = 0
    for c in np.unique(remaining):
        alive = remaining >= c
        best = max(best, int((blocks(base[alive] + c, block) * block).sum()))
    return best


def cache_hits(view: PolicyView, rid: int) -> tuple[int, int]:
    """Waiting ``rid``'s blocks found in the prefix cache, and how many of those are free
    entries (that admitting it takes out of the free memory); zeros with the cache off."""
    cache = getattr(view, "cache", None)
    if cache is None:
        return 0, 0
    hits = cache.hits(rid, int(view.prefill_len[rid]))
    return hits, cache.free_among_hits(rid, hits)


def free_blocks(view: PolicyView, capacity: int) -> int:
    """Blocks a serving policy may still allocate: shared blocks once, free cache entries
    as free."""
    running, block = view.running, view.kv_block_size
    cache = getattr(view, "cache", None)
    if cache is None:
        return capacity - int(blocks(view.held[running], block).sum())
    return capacity - cache.taken(view.held[running], running)


def freed_by(view: PolicyView, rid: int) -> int:
    """Blocks that preempting running ``rid`` frees for a serving policy."""
    cache = getattr(view, "cache", None)
    if cache is None:
        return int(blocks(int(view.held[rid]), view.kv_block_size))
    return cache.blocks_freed_by(rid, int(view.held[rid]))


def lookahead_prefix(view: PolicyView, candidates: np.ndarray) -> int:
    """The longest prefix of ``candidates`` that passes the lookahead check beside the
    running set, walking it and stopping at the first failure. A candidate's prompt tokens
    in cached blocks that running requests hold already are not in its base."""
    run = view.running
    est, gen = view.predicted_output, view.generated
    base = view.prompt_len[run] + gen[run]
    remaining = np.maximum(est[run] - gen[run], 1)
    count = 0
    for rid in candidates:
        hits, free = cache_hits(view, int(rid))
        base = np.append(base, view.prefill_len[rid] - (hits - free) * view.kv_block_size)
        remaining = np.append(remaining, max(int(est[rid]) - int(gen[rid]), 1))
        if peak_kv(base, remaining, view.kv_block_size) > view.kv_capacity:
            break
        count += 1
    return count


class OracleFCFS:
    def __init__(self, policy) -> None:
        self.overflow = oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        return Batch(start=view.waiting[:lookahead_prefix(view, view.waiting)])


class OracleMCSF(OracleFCFS):
    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting
        order = waiting[np.lexsort((waiting, view.predicted_output[waiting]))]
        return Batch(start=order[:lookahead_prefix(view, order)])


class OracleProtection:
    def __init__(self, policy) -> None:
        self.alpha, self.overflow = policy.alpha, oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        waiting = view.waiting
        budget = (1.0 - self.alpha) * view.kv_capacity - view.kv_held
        first_step = np.cumsum(view.prompt_len[waiting] + 1)
        return Batch(start=waiting[: int(np.searchsorted(first_step, budget, side="right"))])


class OraclePaperFCFS(OracleFCFS):
    def decide(self, view: PolicyView) -> Batch:
        block, running, waiting = view.kv_block_size, view.running, view.waiting
        capacity = view.kv_capacity // block
        free = free_blocks(view, capacity)
        need = np.cumsum(blocks(view.prefill_len[waiting] + 1, block))
        start = waiting[: int(np.searchsorted(need, free, side="right"))]
        admitted = int(need[start.size - 1]) if start.size else 0
        gain = view.prefill_len[running] - view.prefilled[running] + 1
        after, shared = attribute_to_victims(view, running,
                                             blocks(view.held[running] + gain, block))
        excess = int(after.sum()) + shared + admitted - capacity
        if excess <= 0:
            return Batch(start=start)
        latest_first = np.argsort(view.start_iteration[running], kind="stable")[::-1]
        freed = np.cumsum(after[latest_first])
        evict = latest_first[: int(np.searchsorted(freed, excess, side="left")) + 1]
        keep = np.ones(running.size, dtype=bool)
        keep[evict] = False
        return Batch(start=start, advance=running[keep], preempt=running[~keep])


# ---------------------------------------------------------------------------- serving
def preempt_latest_until_fit(ids, blocks_after, capacity_blocks):
    """Mask of ``ids`` kept when the latest arrivals (largest ids) are preempted until the
    rest fit; None when all fit."""
    excess = int(blocks_after.sum()) - capacity_blocks
    if excess <= 0:
        return None
    keep = np.ones(ids.size, dtype=bool)
    latest_first = np.argsort(ids, kind="stable")[::-1]
    freed = np.cumsum(blocks_after[latest_first])
    keep[latest_first[: int(np.searchsorted(freed, excess, side="left")) + 1]] = False
    return keep


def attribute_to_victims(view: PolicyView, running: np.ndarray, after: np.ndarray
                         ) -> tuple[np.ndarray, int]:
    """With the cache: each running request's blocks after the step as what preempting it
    frees plus its growth, and the blocks no single preemption frees (shared entries)."""
    cache = getattr(view, "cache", None)
    if cache is None:
        return after, 0
    freed = np.array([freed_by(view, int(r)) for r in running], dtype=np.int64)
    own = blocks(view.held[running], view.kv_block_size)
    return after - own + freed, cache.taken(view.held[running], running) - int(freed.sum())


class OracleVLLM:
    def __init__(self, policy: VLLMLike) -> None:
        self.p, self.overflow = policy, oracle_overflow(policy.overflow)

    def candidates(self, view: PolicyView) -> np.ndarray:
        return view.waiting

    def decide(self, view: PolicyView) -> Batch:
        p, block = self.p, view.kv_block_size
        capacity = view.kv_capacity // block
        running = view.running
        free = free_blocks(view, capacity)
        waiting = self.candidates(view)[: max(0, p.max_num_seqs - running.size)]
        if waiting.size:
            if int(view.prefill_len[waiting[0]]) > p.max_num_batched_tokens:
                raise ConfigError("max_num_batched_tokens below a prefill")
            watermark = int(p.watermark * capacity)
            hits, taken = np.array([cache_hits(view, int(r)) for r in waiting]).reshape(-1, 2).T
            prefill = view.prefill_len[waiting] - hits * block
            needed = np.cumsum(blocks(view.prefill_len[waiting] + 1, block) - hits + taken)
            fits = (np.cumsum(prefill) <= p.max_num_batched_tokens) & (
                free - needed >= watermark)
            count = int(np.argmin(fits)) if not fits.all() else fits.size
            if count == 0 and running.size == 0:
                count = 1  # the watermark is waived for a lone request
            if count:
                return Batch(start=waiting[:count], advance=_EMPTY)
        after, shared = attribute_to_victims(view, running,
                                             blocks(view.held[running] + 1, block))
        keep = preempt_latest_until_fit(running, after, capacity - shared)
        if keep is None:
            return Batch()
        return Batch(advance=running[keep], preempt=running[~keep])


class OracleSarathi:
    def __init__(self, policy: SarathiLike) -> None:
        self.p, self.overflow = policy, oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        p, block = self.p, view.kv_block_size
        running = view.running
        remaining = view.prefill_len[running] - view.prefilled[running]
        if p.reserve_prompt:
            occupied = np.where(remaining == 0, view.held[running] + 1,
                                view.prefill_len[running] + 1)
        else:
            occupied = view.held[running] + (remaining == 0)
        capacity = view.kv_capacity // block
        occupied, shared = attribute_to_victims(view, running, blocks(occupied, block))
        keep = preempt_latest_until_fit(running, occupied, capacity - shared)
        if keep is None:
            keep = np.ones(running.size, dtype=bool)
        kept, preempted = running[keep], running[~keep]
        remaining, occupied = remaining[keep], occupied[keep]
        decodes, prefilling = kept[remaining == 0], kept[remaining > 0]
        used = int(occupied.sum()) + shared
        plan = _ChunkPlan(view, p.chunk_size - decodes.size, capacity - used, p.reserve_prompt)
        for rid in prefilling:
            plan.continue_prefill(int(rid))
        while not plan.chunks and decodes.size == 0 and prefilling.size > 1:
            victim, prefilling = prefilling[-1], prefilling[:-1]
            preempted = np.append(preempted, victim)
            plan.free += freed_by(view, int(victim))
            plan.continue_prefill(int(prefilling[0]))
        watermark = int(p.watermark * capacity)
        seats = p.max_num_seqs - kept.size
        for rid in view.waiting:
            if seats <= 0 or not plan.admit(int(rid), watermark,
                                            lone=kept.size + len(plan.started) == 0):
                break
            seats -= 1
        chunked = np.array([r for r in prefilling if r in plan.chunks], dtype=np.int64)
        return Batch(start=np.array(plan.started, dtype=np.int64),
                     advance=np.concatenate((decodes, chunked)), preempt=preempted,
                     prefill_chunks=plan.partial or None)


class _ChunkPlan:
    """Hands out the iteration's prompt-token budget and free blocks, chunk by chunk."""

    def __init__(self, view: PolicyView, budget: int, free_blocks: int, reserve: bool) -> None:
        self.view, self.budget, self.free, self.reserve = view, budget, free_blocks, reserve
        self.block = view.kv_block_size
        self.chunks: dict[int, int] = {}
        self.partial: dict[int, int] = {}
        self.started: list[int] = []

    def _chunk(self, rid: int, room_blocks: int | None, skip: int = 0) -> int:
        view = self.view
        remaining = int(view.prefill_len[rid] - view.prefilled[rid]) - skip
        chunk = min(remaining, self.budget)
        if room_blocks is not None:
            held = int(view.held[rid]) + skip
            room = room_blocks * self.block + (-held) % self.block
            chunk = min(chunk, room)
            if chunk == remaining and chunk + 1 > room:
                chunk = room - 1
        return max(chunk, 0)

    def _take(self, rid: int, chunk: int, skip: int = 0) -> None:
        view = self.view
        self.chunks[rid] = chunk
        self.budget -= chunk
        emits = bool(chunk == view.prefill_len[rid] - view.prefilled[rid] - skip)
        if not emits:
            self.partial[rid] = chunk
        if not self.reserve:
            held = int(view.held[rid]) + skip
            self.free -= blocks(held + chunk + emits, self.block) - blocks(held, self.block)

    def continue_prefill(self, rid: int) -> None:
        chunk = self._chunk(rid, None if self.reserve else self.free)
        if chunk > 0:
            self._take(rid, chunk)

    def admit(self, rid: int, watermark: int, lone: bool) -> bool:
        floor = 0 if lone else watermark
        hits, taken = cache_hits(self.view, rid)
        skip = hits * self.block
        if self.reserve:
            needed = blocks(int(self.view.prefill_len[rid]) + 1, self.block) - hits + taken
            if self.free - needed < floor:
                return False
            chunk = self._chunk(rid, None, skip)
            if chunk > 0:
                self.free -= needed
        else:
            chunk = self._chunk(rid, self.free - floor - taken, skip)
            if chunk > 0:
                self.free -= taken
        if chunk <= 0:
            return False
        self._take(rid, chunk, skip)
        self.started.append(rid)
        return True


# ------------------------------------------------------------------- WAIT, Nested WAIT
def first_per_group(keys: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Mask of the first ``limits[i]`` elements of each key, in input order."""
    keep = np.zeros(keys.size, dtype=bool)
    seen: dict[int, int] = {}
    for i, key in enumerate(keys.tolist()):
        seen[key] = seen.get(key, 0) + 1
        keep[i] = seen[key] <= limits[i]
    return keep


class OracleWait:
    def __init__(self, policy: Wait) -> None:
        self.p, self.overflow = policy, oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        p = self.p
        waiting, running = view.waiting, view.running
        per_stage = p.per_stage
        wait_type, run_type = view.type_id[waiting], view.type_id[running]
        ready = np.bincount(wait_type, minlength=per_stage.size) >= per_stage
        if not view.more_arrivals:
            ready[:] = True
        elif p.max_wait is not None:
            cutoff = view.now - p.max_wait
            ready[np.unique(wait_type[view.arrival[waiting] < cutoff])] = True
            ready[np.unique(run_type[view.arrival[running] < cutoff])] = True
        if not ready.any():
            return Batch(advance=_EMPTY)
        start = waiting[ready[wait_type]]
        start = start[first_per_group(view.type_id[start], per_stage[view.type_id[start]])]
        active = np.sort(running[ready[run_type]])
        active_type = view.type_id[active]
        stage_key = active_type * int(p.output_len.max() + 1) + view.generated[active]
        return Batch(start=start, advance=active[first_per_group(stage_key,
                                                                  per_stage[active_type])])


class OracleNestedWait:
    def __init__(self, policy: NestedWait) -> None:
        self.p, self.overflow = policy, oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        p = self.p
        waiting, running = view.waiting, view.running
        stage = view.generated[running]
        inner = p.edges[1:-1]
        entry = np.empty(p.per_stage.size, dtype=np.int64)
        entry[0] = waiting.size
        position = np.searchsorted(inner, stage)
        at_entry = (inner[np.minimum(position, inner.size - 1)] == stage if inner.size
                    else stage < 0)
        entry[1:] = np.bincount(position[at_entry], minlength=inner.size)
        meets = entry >= p.per_stage
        open_segments = int(np.argmin(meets)) if not meets.all() else meets.size
        if not view.more_arrivals or (
                p.max_wait is not None and (
                    (waiting.size and view.arrival[waiting[0]] < view.now - p.max_wait)
                    or (running.size and view.arrival[running].min() < view.now - p.max_wait))):
            open_segments = meets.size
        if open_segments == 0:
            return Batch(advance=_EMPTY)
        segment = position + at_entry
        active = running[segment < open_segments]
        by_age = np.argsort(active)
        active, active_segment = active[by_age], segment[segment < open_segments][by_age]
        keep = first_per_group(view.generated[active], p.per_stage[active_segment])
        return Batch(start=waiting[: p.per_stage[0]], advance=active[keep])


ORACLES = {FCFSLookahead: OracleFCFS, MCSF: OracleMCSF, AlphaProtection: OracleProtection,
           PaperFCFS: OraclePaperFCFS, VLLMLike: OracleVLLM, SarathiLike: OracleSarathi,
           Wait: OracleWait, NestedWait: OracleNestedWait}


def oracle_of(policy):
    """The oracle twin of a built-in compiled policy."""
    return ORACLES[type(policy)](policy)


# ------------------------------------------- WAIT, Nested WAIT: the WAIT authors' options
def oracle_authors_wait(types, batch_limit):
    """The WAIT authors' per-type in-flight limits and thresholds, stated as their scheduler
    computes them: ``L_j = (w_j / sum w) B`` with ``w_j = rate_j (o_j + 1)``, ``n_j =
    int(max(L_j / (o_j + 1), 1))``."""
    weight = [float(t["rate"]) * (float(t["output_len"]) + 1) for t in types]
    total = sum(weight)
    limits = [w / total * float(batch_limit) for w in weight]
    n = [int(max(limit / (float(t["output_len"]) + 1), 1))
         for limit, t in zip(limits, types, strict=True)]
    return np.array(limits), np.array(n, dtype=np.int64)


def oracle_authors_nested(types, batch_limit):
    """The WAIT authors' Nested WAIT segments and thresholds, as their scheduler computes
    them: the first segment has ``1 + d_1`` stages, the next ``d_i - d_(i-1)``; weight =
    stages x the rate of the types with output above the previous ``d``."""
    decodes = sorted({int(t["output_len"]) for t in types})
    segments = [(1 + decodes[0], sum(float(t["rate"]) for t in types))]
    for i in range(1, len(decodes)):
        segments.append((decodes[i] - decodes[i - 1],
                         sum(float(t["rate"]) for t in types
                             if int(t["output_len"]) > decodes[i - 1])))
    total = sum(count * rate for count, rate in segments)
    n = [int(max(float(batch_limit) * (count * rate / total) / count, 1))
         for count, rate in segments]
    edges = np.cumsum([0] + [count for count, _ in segments])
    return edges, np.array(n, dtype=np.int64)


class OracleWaitOptions(OracleWait):
    """WAIT with the authors' options (``in_flight_limit``, ``readiness``, ``force_clear``,
    ``thresholds: authors``); the paper's rule is :class:`OracleWait`'s."""

    def __init__(self, policy: Wait) -> None:
        p = copy.copy(policy)
        self.limits = None
        if policy.thresholds == "authors" or policy.in_flight_limit == "per_type":
            self.limits, authors_n = oracle_authors_wait(policy.types, policy.batch_limit)
            if policy.thresholds == "authors" and policy.n is None:
                p.per_stage = authors_n
        super().__init__(p)

    def decide(self, view: PolicyView) -> Batch:
        p = self.p
        if (p.in_flight_limit, p.readiness, p.force_clear) == ("per_stage", "own_type", False):
            return super().decide(view)
        waiting, running = view.waiting, view.running
        per_stage = p.per_stage
        wait_type, run_type = view.type_id[waiting], view.type_id[running]
        if p.in_flight_limit == "per_type":
            in_flight = np.bincount(run_type, minlength=per_stage.size)
            need = np.minimum(per_stage, np.trunc(self.limits - in_flight).astype(np.int64))
            take = np.maximum(need, 0)
        else:
            need = take = per_stage
        ready = np.bincount(wait_type, minlength=per_stage.size) >= need
        if not view.more_arrivals:
            if not p.force_clear:
                ready[:] = True
            elif not ready.any():
                return Batch(advance=_EMPTY, drop=np.concatenate((waiting, running)))
        elif p.max_wait is not None:
            cutoff = view.now - p.max_wait
            ready[np.unique(wait_type[view.arrival[waiting] < cutoff])] = True
            ready[np.unique(run_type[view.arrival[running] < cutoff])] = True
        if p.readiness == "any_type" and ready.any():
            ready[:] = True
        if not ready.any():
            return Batch(advance=_EMPTY)
        start = waiting[ready[wait_type]]
        start = start[first_per_group(view.type_id[start], take[view.type_id[start]])]
        if p.in_flight_limit == "per_type":
            advance = None if ready.all() else np.sort(running[ready[run_type]])
            return Batch(start=start, advance=advance)
        active = np.sort(running[ready[run_type]])
        active_type = view.type_id[active]
        stage_key = active_type * int(p.output_len.max() + 1) + view.generated[active]
        return Batch(start=start, advance=active[first_per_group(stage_key,
                                                                  per_stage[active_type])])


class OracleNestedWaitOptions(OracleNestedWait):
    """Nested WAIT with the authors' options (``thresholds: authors``, ``force_clear``); the
    paper's rule, and theirs before the last arrival, is :class:`OracleNestedWait`'s."""

    def __init__(self, policy: NestedWait) -> None:
        p = copy.copy(policy)
        if policy.thresholds == "authors":
            p.edges, authors_n = oracle_authors_nested(policy.types, policy.batch_limit)
            if policy.n is None:
                p.per_stage = authors_n
        super().__init__(p)

    def decide(self, view: PolicyView) -> Batch:
        p = self.p
        if not p.force_clear or view.more_arrivals:
            return super().decide(view)
        waiting, running = view.waiting, view.running
        stage = view.generated[running]
        inner = p.edges[1:-1]
        segment = np.searchsorted(inner, stage, side="right")  # b_(i-1) <= stage < b_i
        entry = np.concatenate(([waiting.size], [np.count_nonzero(stage == b) for b in inner]))
        is_open = entry >= p.per_stage  # each segment on its own
        if not is_open.any():
            return Batch(advance=_EMPTY, drop=np.concatenate((waiting, running)))
        active = np.sort(running[is_open[segment]])
        active_segment = np.searchsorted(inner, view.generated[active], side="right")
        keep = first_per_group(view.generated[active], p.per_stage[active_segment])
        start = waiting[: p.per_stage[0]] if is_open[0] else _EMPTY
        return Batch(start=start, advance=active[keep])


ORACLES.update({Wait: OracleWaitOptions, NestedWait: OracleNestedWaitOptions})


class OracleVLLMV1:
    """vLLM 0.19's V1 ``schedule()`` stated over Python lists: the running list served
    first, preempting from its tail, then the waiting list while no request was preempted."""

    def __init__(self, policy: VLLMV1) -> None:
        self.p, self.overflow = policy, oracle_overflow(policy.overflow)

    def decide(self, view: PolicyView) -> Batch:
        p, block = self.p, view.kv_block_size
        running = view.running.tolist()
        free = free_blocks(view, view.kv_capacity // block) - p.reserved_blocks
        budget = p.max_num_batched_tokens

        def remaining(rid, skip=0):  # skip: the prompt tokens an admission finds cached
            return int(view.prefill_len[rid] - view.prefilled[rid]) - skip

        def tokens(rid, skip=0):
            wanted = remaining(rid, skip) or 1
            if 0 < p.long_prefill_token_threshold < wanted:
                wanted = p.long_prefill_token_threshold
            return min(wanted, budget)

        def blocks_for(rid, n, skip=0):
            held = int(view.held[rid]) + skip
            left = remaining(rid, skip)
            gain = 1 if left == 0 else n + (n == left)
            return blocks(held + gain, block) - blocks(held, block)

        scheduled, preempted, chunks = [], [], {}
        for rid in list(running):
            if budget <= 0 or rid not in running:
                break
            n = tokens(rid)
            need = blocks_for(rid, n)
            while need > free:
                victim = running.pop()
                preempted.append(victim)
                free += freed_by(view, victim)
                if victim == rid:
                    break
            if preempted and preempted[-1] == rid:
                break
            scheduled.append(rid)
            if n < remaining(rid):
                chunks[rid] = n
            free -= need
            budget -= n
        started = []
        if not preempted:
            for rid in view.waiting.tolist():
                if budget <= 0 or len(running) + len(started) >= p.max_num_seqs:
                    break
                hits, taken = cache_hits(view, rid)
                n = tokens(rid, hits * block)
                full = blocks(int(view.prefill_len[rid]), block) - hits + taken
                if p.reserve_full_isl and full > free:
                    break
                need = blocks_for(rid, n, hits * block) + taken
                if need > free:
                    break
                started.append(rid)
                if n < remaining(rid, hits * block):
                    chunks[rid] = n
                free -= need
                budget -= n
        return Batch(start=np.array(started, dtype=np.int64),
                     advance=np.array(scheduled, dtype=np.int64),
                     preempt=np.array(preempted, dtype=np.int64), prefill_chunks=chunks or None)


ORACLES[VLLMV1] = OracleVLLMV1


class OracleLPM(OracleVLLM):
    """Longest prefix match: the window at the queue's head, most cached blocks first (ties
    in queue order), admitted as vLLM-like admits."""

    def candidates(self, view: PolicyView) -> np.ndarray:
        window = view.waiting[: self.p.window]
        hits = np.array([cache_hits(view, int(rid))[0] for rid in window], dtype=np.int64)
        return window[np.argsort(-hits, kind="stable")]


ORACLES[LongestPrefixMatch] = OracleLPM
