"""The lookahead memory check shared by every policy that plans with output lengths.

Starting the set ``U`` now is feasible iff, for every future completion
iteration of a request in ``S ∪ U`` (running plus started), the KV held then by
``S ∪ U`` is at most ``M`` (POLICIES.md, "Lookahead feasibility"). Between
completions footprints only grow, so the completion iterations are the peaks.

In iterations counted from now (``c = 1`` is the end of the coming
iteration), request ``j`` holds ``base_j + c`` while ``c <= remaining_j``:
``base_j = s_j + generated_j`` and ``remaining_j`` is the iterations it still
needs. Sorting by ``remaining`` descending, the KV at checkpoint
``remaining[k]`` is ``cumsum(base)[k] + (k + 1) * remaining[k]`` (entries tied
with ``k`` only add to it), so the whole check is one sort and one cumsum.

With paged memory (``block_size > 1``) a request holding ``h`` slots occupies
``ceil(h / block_size)`` whole blocks. Footprints still only grow between
completions, so the checkpoints are the same, but the sum no longer telescopes:
the check evaluates every checkpoint explicitly (``O(n * checkpoints)``, only in
that mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.engine.paging import blocks
from replay.engine.policy import UNTIL_CHANGE, Batch, PolicyView


def peak_kv(base: np.ndarray, remaining: np.ndarray, block_size: int = 1) -> int:
    """Largest KV held at any future completion iteration by requests ``(base, remaining)``."""
    if base.size == 0:
        return 0
    if block_size > 1:
        checkpoints = np.unique(remaining)[:, None]
        held = base[None, :] + checkpoints
        slots = blocks(held, block_size) * block_size
        return int(np.where(remaining[None, :] >= checkpoints, slots, 0).sum(axis=1).max())
    order = np.argsort(-remaining, kind="stable")
    return int((np.cumsum(base[order]) + np.arange(1, base.size + 1) * remaining[order]).max())


def _peak_with_one_more(base: np.ndarray, remaining: np.ndarray, new_base: int,
                        new_remaining: int) -> tuple[int, int]:
    """``peak_kv`` of ``(base, remaining)`` plus one request ``(new_base, new_remaining)``
    (token-exact, ``base`` not empty), and the checkpoint where it is reached, without
    building the joined arrays.

    In the descending order the newcomer goes after the ties of its ``remaining``: it
    adds ``new_base + c`` at every checkpoint ``c <= new_remaining`` and its own
    checkpoint holds everything still there then (ties counted at the newcomer's own).
    """
    order = np.argsort(-remaining, kind="stable")
    remaining = remaining[order]
    cumulative = np.cumsum(base[order])
    at_checkpoints = cumulative + np.arange(1, base.size + 1) * remaining
    joined = np.where(remaining <= new_remaining, at_checkpoints + new_base + remaining,
                      at_checkpoints)
    staying = int(np.count_nonzero(remaining >= new_remaining))
    own = (int(cumulative[staying - 1]) if staying else 0) + (staying + 1) * new_remaining \
        + new_base
    highest = int(joined.argmax())
    if own >= joined[highest]:
        return own, new_remaining
    return int(joined[highest]), int(remaining[highest])


def kv_at(base: np.ndarray, remaining: np.ndarray, checkpoint: int) -> int:
    """KV held ``checkpoint`` iterations from now by requests ``(base, remaining)``
    (token-exact): a lower bound of their ``peak_kv`` at any ``checkpoint >= 1``, because
    the same requests are still there at the next completion and hold more by then."""
    alive = remaining >= checkpoint
    return int(base[alive].sum()) + checkpoint * int(np.count_nonzero(alive))


@dataclass
class PeakHint:
    """Where a policy's last rejected lookahead check peaked, as an absolute iteration.

    A policy keeps one across steps. A decoding request's KV at a fixed future
    iteration does not move (each step it holds one more slot and that iteration
    comes one step nearer), and a request that completes on time never counted
    there, so the iteration that overflowed at the last step usually still
    overflows. The KV there is a lower bound of the peak (:func:`kv_at`, one
    masked sum), and when it already exceeds ``M`` the full check is skipped: the
    answer is the same with any hint, only the speed depends on it.
    """

    iteration: int = -1


def remaining_iterations(view: PolicyView, ids: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """Iterations requests ``ids`` still need by ``estimate`` (at least one: a request that
    has generated its estimate is assumed to need one more)."""
    return np.maximum(estimate[ids] - view.generated[ids], 1)


def running_profile(view: PolicyView, estimate: np.ndarray | None = None,
                    running: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(base, remaining)`` of the running set, assuming every running request advances.

    ``estimate`` replaces the view's ``predicted_output``; a request that has
    already generated its estimate is assumed to need one more iteration. A
    request still prefilling in chunks is counted as if its prompt were in KV
    (conservative). ``running`` replaces the view's running set (a policy that
    evicts some first).
    """
    run = view.running if running is None else running
    est = view.predicted_output if estimate is None else estimate
    generated = view.generated[run]
    return view.prompt_len[run] + generated, remaining_iterations(view, run, est)


def first_cannot_join(view: PolicyView, candidates: np.ndarray) -> bool:
    """True if the first of ``candidates`` cannot start even beside the running set's KV now.

    What the running set holds now is a lower bound of its KV at the first
    checkpoint (each holds at most ``s + generated`` slots, and grows by one),
    so then no prefix can start. While the running set only decodes (no
    arrival, start or completion) its KV only grows, so the answer stays true:
    a policy that starts nothing for this reason may promise ``UNTIL_CHANGE``
    (``Batch.steady_steps``).
    """
    return (view.kv_held + view.running.size + int(view.prefill_len[candidates[0]]) + 1
            > view.kv_capacity)


def admissible_prefix(view: PolicyView, candidates: np.ndarray,
                      estimate: np.ndarray | None = None, running: np.ndarray | None = None
                      ) -> int:
    """Length of the longest prefix of ``candidates`` that can start now.

    Feasibility is monotone in the prefix (adding a request never lowers the
    KV at any checkpoint), so "walk the list and stop at the first failure"
    equals "the longest feasible prefix", found by galloping then bisection:
    ``O(log k)`` vectorised checks for an answer ``k``.
    """
    if candidates.size == 0 or (running is None and first_cannot_join(view, candidates)):
        return 0
    est = view.predicted_output if estimate is None else estimate
    run_base, run_rem = running_profile(view, est, running)
    if _first_rejection(view, run_base, run_rem, int(candidates[0]), est) is not None:
        return 0
    return _prefix_after_first(view, candidates, run_base, run_rem, est)


def start_admissible(view: PolicyView, candidates: np.ndarray,
                     hint: PeakHint | None = None) -> Batch:
    """The batch of a policy that walks ``candidates`` and starts what the lookahead admits
    (``hint``: the policy's :class:`PeakHint`, for speed only).

    When nothing waits, or the first candidate cannot join (:func:`first_cannot_join`),
    that stays so until a request arrives or completes. When the first candidate fails
    the full check, that stays so for as many steps as :func:`_first_rejection` can
    prove. Either way the batch says so in ``steady_steps``.
    """
    if candidates.size == 0 or first_cannot_join(view, candidates):
        return Batch(steady_steps=UNTIL_CHANGE)
    run_base, run_rem = running_profile(view)
    est = view.predicted_output
    rejected_for = _first_rejection(view, run_base, run_rem, int(candidates[0]), est, hint)
    if rejected_for is not None:
        return Batch(steady_steps=rejected_for)
    return Batch(start=candidates[: _prefix_after_first(view, candidates, run_base, run_rem,
                                                        est)])


def _first_rejection(view: PolicyView, run_base: np.ndarray, run_rem: np.ndarray,
                     first_id: int, estimate: np.ndarray, hint: PeakHint | None = None
                     ) -> int | None:
    """``None`` if candidate ``first_id`` can start beside the running set
    ``(run_base, run_rem)``; otherwise for how many following steps it provably still
    cannot, while the running set only decodes (no arrival, start or completion).

    Token-exact, that count comes from a checkpoint ``c`` where the joined KV exceeds
    ``M`` by ``excess``: there the running set's KV stays put (see :class:`PeakHint`)
    and the candidate, starting a step later, holds one slot less (or is not there
    yet, and holds more when it is), so the KV there drops by at most one per step.
    It stays above ``M`` for ``excess - 1`` more steps, while ``c`` is still ahead.
    """
    new_base = int(view.prefill_len[first_id])
    # remaining_iterations for one request, without the arrays.
    new_remaining = max(int(estimate[first_id]) - int(view.generated[first_id]), 1)
    budget = view.kv_capacity
    if view.kv_block_size > 1 or run_base.size == 0:
        peak = peak_kv(np.append(run_base, new_base), np.append(run_rem, new_remaining),
                       view.kv_block_size)
        return None if peak <= budget else 0
    if hint is not None:
        checkpoint = hint.iteration - view.iteration
        # Checkpoint 1 is what first_cannot_join has already ruled out.
        if checkpoint > 1:
            excess = kv_at(run_base, run_rem, checkpoint) - budget + (
                new_base + checkpoint if checkpoint <= new_remaining else 0)
            if excess > 0:
                return min(excess, checkpoint) - 1
    peak, checkpoint = _peak_with_one_more(run_base, run_rem, new_base, new_remaining)
    if peak <= budget:
        return None
    if hint is not None:
        hint.iteration = view.iteration + checkpoint
    return min(peak - budget, checkpoint) - 1


def _prefix_after_first(view: PolicyView, candidates: np.ndarray, run_base: np.ndarray,
                        run_rem: np.ndarray, estimate: np.ndarray) -> int:
    """:func:`admissible_prefix` once its first candidate is known to fit."""
    budget = view.kv_capacity
    first = int(run_base.sum()) + run_base.size
    # A candidate holds at least two slots after its first iteration (a prompt token and
    # the token it emits), so at most (budget - first) // 2 can start: only that many of a
    # long queue need looking at.
    candidates = candidates[: max(0, (budget - first) // 2) + 1]
    # A waiting request that kept tokens (recompute preemption) re-prefills them.
    cand_base = view.prefill_len[candidates]
    cand_rem = remaining_iterations(view, candidates, estimate)
    # Necessary condition at the first checkpoint bounds the prefix length.
    upper = int(np.searchsorted(np.cumsum(cand_base + 1), budget - first, side="right"))
    if upper <= 1:
        return upper

    def fits(k: int) -> bool:
        base = np.concatenate((run_base, cand_base[:k]))
        rem = np.concatenate((run_rem, cand_rem[:k]))
        return peak_kv(base, rem, view.kv_block_size) <= budget

    if fits(upper):
        return upper
    good, bad = 1, 2
    while bad < upper and fits(bad):
        good, bad = bad, min(2 * bad, upper)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
