"""The shared lookahead check against a brute-force round-by-round simulation (the compiled
rule, called from Python as the policies written in Python call it)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.common.lookahead import (
    admissible_prefix,
    lookahead_memory,
    ordered_profile_into,
    peak_kv,
)
from policies.fcfs import FCFSLookahead
from replay.engine.overflow import EvictLIFO
from replay.engine.policy import PolicyView

lengths = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=0, max_size=30)


def brute_peak(base, remaining, block_size=1) -> int:
    horizon = int(remaining.max(initial=0))
    blocks = [-(-(base + k) // block_size) * block_size for k in range(1, horizon + 1)]
    return max((int((b * (remaining >= k)).sum()) for k, b in enumerate(blocks, start=1)),
               default=0)


@settings(max_examples=300, deadline=None)
@given(pairs=lengths, block_size=st.sampled_from([1, 1, 4, 16]))
def test_peak_equals_round_by_round_maximum(pairs, block_size):
    base = np.array([b for b, _ in pairs], dtype=np.int64)
    remaining = np.array([r for _, r in pairs], dtype=np.int64)
    assert peak_kv(base, remaining, block_size) == brute_peak(base, remaining, block_size)


def make_view(kv, prompt, output, generated, running, waiting) -> PolicyView:
    n = len(prompt)
    arr = np.asarray
    zeros = np.zeros(n, dtype=np.int64)
    held = np.where(np.isin(np.arange(n), running), arr(prompt) + arr(generated), 0)
    # Waiting requests that generated tokens kept them (recompute) and re-prefill them.
    prefill_len = arr(prompt) + np.where(held > 0, 0, arr(generated))
    return PolicyView(kv_capacity=kv, arrival=np.zeros(n), prompt_len=arr(prompt),
                      prefill_len=prefill_len,
                      predicted_output=arr(output), predicted_lo=arr(output),
                      predicted_hi=arr(output), type_id=zeros - 1,
                      prefilled=np.where(held > 0, arr(prompt), 0), generated=arr(generated),
                      held=held, start_iteration=zeros, rng=np.random.default_rng(0),
                      waiting=arr(waiting, dtype=np.int64), running=arr(running, dtype=np.int64))


def draw_view(data) -> tuple[PolicyView, list[int], list[int], list[int], list[int]]:
    """A random token-exact view, with its prompts, outputs, generated counts and queue."""
    n = data.draw(st.integers(1, 25))
    kv = data.draw(st.integers(10, 300))
    prompt = data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    output = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    is_running = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    generated = [data.draw(st.integers(1, o)) if r else 0
                 for o, r in zip(output, is_running, strict=True)]
    running = [i for i in range(n) if is_running[i]]
    waiting = data.draw(st.permutations([i for i in range(n) if not is_running[i]]))
    return make_view(kv, prompt, output, generated, running, waiting), prompt, output, \
        generated, waiting


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_admissible_prefix_equals_walk_and_stop(data):
    view, prompt, output, generated, waiting = draw_view(data)
    running = view.running.tolist()
    base = np.array([prompt[j] + generated[j] for j in running], dtype=np.int64)
    rem = np.array([max(output[j] - generated[j], 1) for j in running], dtype=np.int64)
    expected = 0
    for i in waiting:
        base, rem = np.append(base, prompt[i]), np.append(rem, output[i])
        if peak_kv(base, rem) > view.kv_capacity:
            break
        expected += 1
    assert admissible_prefix(view, np.asarray(waiting, dtype=np.int64)) == expected


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_fcfs_starts_the_admissible_prefix_of_its_queue(data):
    view = draw_view(data)[0]
    batch = FCFSLookahead(EvictLIFO()).decide(view)
    assert batch.start.tolist() == view.waiting[:admissible_prefix(view, view.waiting)].tolist()
    assert batch.advance is None and batch.preempt.size == 0


def test_a_request_that_kept_tokens_is_checked_with_them():
    # Waiting request 0 (s=4, o=10) kept 6 tokens from a recompute preemption: started now it
    # re-prefills 10 tokens and then holds 11, 12, 13, 14: its peak s + o = 14 comes 4
    # iterations from now (not 10), which is what the second case below depends on.
    assert admissible_prefix(make_view(13, [4], [10], [6], [], [0]), np.array([0])) == 0
    assert admissible_prefix(make_view(14, [4], [10], [6], [], [0]), np.array([0])) == 1
    # With a running request (s=1, o=12, 2 generated, holds 3) for 10 more iterations:
    # at request 0's completion (4 iterations from now) they hold 14 + 7 = 21.
    view = make_view(21, [4, 1], [10, 12], [6, 2], [1], [0])
    assert admissible_prefix(view, np.array([0])) == 1
    view = make_view(20, [4, 1], [10, 12], [6, 2], [1], [0])
    assert admissible_prefix(view, np.array([0])) == 0


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_kept_running_order_is_the_sorted_profile_after_any_change(data):
    """The compiled check keeps the running set's order between calls. Whatever happens
    between two calls (requests start and leave; most advance a token, some do not, some
    restart from nothing), each call's rows are the running set's profile in descending
    iterations left; a memory of the wrong size only costs a sort."""
    n = data.draw(st.integers(1, 30))
    prompt = np.array(data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)))
    estimate = np.array(data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)))
    generated = np.zeros(n, dtype=np.int64)
    # a memory for the run, none (from Python), or one too small to index by request
    memory = lookahead_memory(data.draw(st.sampled_from([n, n, 0, n // 2])))
    base, remaining, keys = (np.zeros(n, dtype=np.int64) for _ in range(3))
    running: list[int] = []
    for _ in range(data.draw(st.integers(1, 8))):
        running = [rid for rid in running if data.draw(st.booleans())]
        running += [rid for rid in range(n) if rid not in running and data.draw(st.booleans())]
        for rid in running:
            generated[rid] = data.draw(st.sampled_from(
                [generated[rid] + 1, generated[rid] + 1, generated[rid], 0]))
        ids = np.array(running, dtype=np.int64)
        total = ordered_profile_into(memory, ids, ids.size, prompt, generated, estimate, base,
                                     remaining, keys)
        want_remaining = np.maximum(estimate[ids] - generated[ids], 1)
        pairs = sorted(zip(prompt[ids] + generated[ids], want_remaining, strict=True))
        got = sorted(zip(base[:ids.size], remaining[:ids.size], strict=True))
        assert got == pairs
        assert total == sum(b for b, _ in pairs)
        assert (np.diff(remaining[:ids.size]) <= 0).all()
