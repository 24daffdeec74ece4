"""Sarathi-like: decode-prioritising with chunked prefill, non-clairvoyant (POLICIES.md §5).

Modelled on Sarathi-Serve (and Vidur's ``sarathi`` replica scheduler). Every
iteration has a budget of ``chunk_size`` tokens:

1. Every running request whose prefill is complete decodes one token (one
   token of budget each). If the running set's blocks after the iteration
   exceed ``M``, the latest arrivals are preempted until it fits (as vLLM).
2. The remaining budget goes to prompt chunks: first requests whose prefill
   is under way (oldest first), then waiting requests in queue order while the
   running set stays within ``max_num_seqs``. A request decodes after its last
   chunk, which emits its first token.

KV: by default a chunk's KV is taken when it runs (a request holds what it has
prefilled), so a chunk is cut to the free blocks, and admission keeps
``watermark * M`` free. With ``reserve_prompt=true`` admission reserves the
blocks of the whole prefill (plus the first token) up front, as Vidur's
Sarathi scheduler does; the engine still records the slots actually written,
and this policy counts the reserved remainder as used. Output lengths are not
used.

Where the papers say nothing: with nothing running, the head of the queue is
admitted even if it would break the watermark; and if requests are part-way
through their prefill but none can take a chunk for lack of KV (possible only
without reservation), the latest of them is preempted so the oldest can go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from policies.common.serving import check_serving_limits, preempt_latest_until_fit
from replay.engine.paging import BlockGrowth, blocks
from replay.engine.policy import UNTIL_CHANGE, Batch, OverflowRule, PolicyView
from replay.params import check

_EMPTY = np.zeros(0, dtype=np.int64)
#: How far ahead a decision with reserved prompt chunks is checked for repeating (a longer
#: promise saves little: a decision every 256 steps is cheap).
_STEADY_HORIZON = 256


@dataclass
class SarathiLike:
    overflow: OverflowRule
    chunk_size: int = field(default=512, metadata=check(ge=1))
    max_num_seqs: int = field(default=256, metadata=check(ge=1))
    watermark: float = field(default=0.01, metadata=check(ge=0, lt=1))
    reserve_prompt: bool = False
    block_size: int = field(default=16, metadata=check(ge=1))
    preemption: Literal["recompute", "restart"] = "recompute"

    def __post_init__(self) -> None:
        check_serving_limits(chunk_size=self.chunk_size, max_num_seqs=self.max_num_seqs,
                             watermark=self.watermark)

    def decide(self, view: PolicyView) -> Batch:
        block = view.kv_block_size
        running = view.running
        remaining = view.prefill_len[running] - view.prefilled[running]
        # Blocks each running request occupies after this iteration before any new chunk:
        # decodes grow by one token; prefills keep (or have reserved) their blocks.
        if self.reserve_prompt:
            occupied = np.where(remaining == 0, view.held[running] + 1,
                                view.prefill_len[running] + 1)
        else:
            occupied = view.held[running] + (remaining == 0)
        occupied = blocks(occupied, block)
        capacity = view.kv_capacity // block
        keep = preempt_latest_until_fit(running, occupied, capacity)
        if keep is None:
            kept, preempted = running, _EMPTY
        else:
            kept, preempted = running[keep], running[~keep]
            remaining, occupied = remaining[keep], occupied[keep]
        if np.count_nonzero(remaining):
            decodes, prefilling = kept[remaining == 0], kept[remaining > 0]
        else:
            decodes, prefilling = kept, _EMPTY
        free = capacity - int(occupied.sum())
        plan = _ChunkPlan(view, self.chunk_size - decodes.size, free, self.reserve_prompt)
        for rid in prefilling:
            plan.continue_prefill(int(rid))
        while not plan.chunks and decodes.size == 0 and prefilling.size > 1:
            # Part-way prefills starve each other of KV: free the latest for the oldest.
            victim, prefilling = prefilling[-1], prefilling[:-1]
            preempted = np.append(preempted, victim)
            plan.free += blocks(int(view.held[victim]), block)
            plan.continue_prefill(int(prefilling[0]))
        watermark = int(self.watermark * capacity)
        seats = self.max_num_seqs - kept.size
        for rid in view.waiting:
            if seats <= 0 or not plan.admit(int(rid), watermark, lone=kept.size + len(plan.started)
                                            == 0):
                break
            seats -= 1
        chunked = (np.fromiter((r for r in prefilling if r in plan.chunks), dtype=np.int64)
                   if prefilling.size else _EMPTY)
        started = np.asarray(plan.started, dtype=np.int64) if plan.started else _EMPTY
        if preempted.size or plan.watermark_cut:
            steady = 0
        elif prefilling.size == 0 and started.size == 0:
            # Every running request decodes and nothing starts: the free blocks only shrink
            # until a completion, so the queue head stays out (see _ChunkPlan._chunk).
            steady = UNTIL_CHANGE
        else:
            # Requests started now go on as prefills after the running ones, in this order.
            steady = self._steady_chunk_steps(view, decodes,
                                              np.concatenate((prefilling, started)),
                                              np.concatenate((chunked, started)), plan.chunks)
        # Only chunks short of the whole remaining prompt need naming (the engine's default),
        # and a batch of every running request in order is advance=None: less to validate.
        everyone = prefilling.size == 0 and preempted.size == 0
        return Batch(start=started,
                     advance=None if everyone else np.concatenate((decodes, chunked)),
                     preempt=preempted, prefill_chunks=plan.partial or None,
                     steady_steps=steady)

    def _steady_chunk_steps(self, view: PolicyView, decodes: np.ndarray,
                            prefilling: np.ndarray, chunked: np.ndarray,
                            chunks: dict[int, int]) -> int:
        """For how many more steps a decision of decodes and prompt chunks repeats.

        ``prefilling`` and ``chunked`` include the requests the decision starts: at the
        next step they are running prefills after the others, and (the budget and the
        earlier chunks being the same) take the same chunks, as a first chunk and a
        continuing one are sized alike unless the watermark cut the first (then
        :meth:`decide` promises nothing). While no chunk is its prompt's last (the
        engine stops a stretch before one is), the chunks get the same token budget
        and the free blocks only shrink, so nothing that waits or is paused gets a
        chunk. Without reservation a chunk keeps its size exactly while the step fits
        the KV capacity, which the engine checks; with it, the reserved prompts and
        the growing decodes must also fit, or the latest running request is
        preempted: counted from the blocks they occupy at each step ahead, as
        :meth:`decide` counts them.
        """
        if not chunked.size:
            return 0
        if not self.reserve_prompt:
            return UNTIL_CHANGE
        chunk = np.fromiter((chunks[r] for r in chunked), dtype=np.int64, count=chunked.size)
        left = view.prefill_len[chunked] - view.prefilled[chunked] - chunk
        horizon = min(int(((left - 1) // chunk).min()), _STEADY_HORIZON)
        if horizon <= 0:
            return 0
        block = view.kv_block_size
        decoding = view.held[decodes] + 1
        room = view.kv_capacity // block - int(blocks(decoding, block).sum()) - int(
            blocks(view.prefill_len[prefilling] + 1, block).sum())
        # A decode gains at most ceil(j / block) blocks in j steps: if that fits, all steps do.
        if decodes.size * -(-horizon // block) <= room:
            return horizon
        fits = BlockGrowth(decoding, block)(np.arange(1, horizon + 1)) <= room
        return int(np.argmin(fits)) if np.count_nonzero(~fits) else horizon


class _ChunkPlan:
    """Hands out the iteration's prompt-token budget and free blocks, chunk by chunk."""

    def __init__(self, view: PolicyView, budget: int, free_blocks: int, reserve: bool) -> None:
        self.view, self.budget, self.free, self.reserve = view, budget, free_blocks, reserve
        self.block = view.kv_block_size
        self.chunks: dict[int, int] = {}
        self.partial: dict[int, int] = {}  # the chunks that leave part of the prompt
        self.started: list[int] = []
        # A first chunk the watermark made smaller than the budget allowed: as a
        # continuing prefill (no watermark) the request would take more next step.
        self.watermark_cut = False

    def _chunk(self, rid: int, room_blocks: int | None) -> int:
        """The largest chunk of ``rid``'s remaining prefill within budget and room."""
        view = self.view
        remaining = int(view.prefill_len[rid] - view.prefilled[rid])
        chunk = min(remaining, self.budget)
        if room_blocks is not None:
            held = int(view.held[rid])
            room = room_blocks * self.block + (-held) % self.block  # + slack in its last block
            chunk = min(chunk, room)
            if chunk == remaining and chunk + 1 > room:
                chunk = room - 1  # the last chunk also writes token 1: leave it for later
        return max(chunk, 0)

    def _take(self, rid: int, chunk: int) -> None:
        view = self.view
        self.chunks[rid] = chunk
        self.budget -= chunk
        emits = bool(chunk == view.prefill_len[rid] - view.prefilled[rid])
        if not emits:
            self.partial[rid] = chunk
        if not self.reserve:
            held = int(view.held[rid])
            self.free -= blocks(held + chunk + emits, self.block) - blocks(held, self.block)

    def continue_prefill(self, rid: int) -> None:
        chunk = self._chunk(rid, None if self.reserve else self.free)
        if chunk > 0:
            self._take(rid, chunk)

    def admit(self, rid: int, watermark: int, lone: bool) -> bool:
        """Start ``rid`` with a first chunk if budget and KV allow; False stops admission."""
        floor = 0 if lone else watermark
        if self.reserve:
            needed = blocks(int(self.view.prefill_len[rid]) + 1, self.block)
            if self.free - needed < floor:
                return False
            chunk = self._chunk(rid, None)
            if chunk > 0:
                self.free -= needed
        else:
            chunk = self._chunk(rid, self.free - floor)
            if floor and 0 < chunk < self._chunk(rid, self.free):
                self.watermark_cut = True
        if chunk <= 0:
            return False
        self._take(rid, chunk)
        self.started.append(rid)
        return True
