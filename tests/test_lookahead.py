"""The shared lookahead check against a brute-force round-by-round simulation."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.lookahead import admissible_prefix, peak_kv
from replay.policy import PolicyView

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
    return PolicyView(kv_capacity=kv, arrival=np.zeros(n), prompt_len=arr(prompt),
                      predicted_output=arr(output), predicted_lo=arr(output),
                      predicted_hi=arr(output), type_id=zeros - 1,
                      prefilled=np.where(held > 0, arr(prompt), 0), generated=arr(generated),
                      held=held, start_iteration=zeros, rng=np.random.default_rng(0),
                      waiting=arr(waiting, dtype=np.int64), running=arr(running, dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_admissible_prefix_equals_walk_and_stop(data):
    n = data.draw(st.integers(1, 25))
    kv = data.draw(st.integers(10, 300))
    prompt = data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    output = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    is_running = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    generated = [data.draw(st.integers(1, o)) if r else 0
                 for o, r in zip(output, is_running, strict=True)]
    running = [i for i in range(n) if is_running[i]]
    waiting = data.draw(st.permutations([i for i in range(n) if not is_running[i]]))
    view = make_view(kv, prompt, output, generated, running, waiting)
    base = np.array([prompt[j] + generated[j] for j in running], dtype=np.int64)
    rem = np.array([max(output[j] - generated[j], 1) for j in running], dtype=np.int64)
    expected = 0
    for i in waiting:
        base, rem = np.append(base, prompt[i]), np.append(rem, output[i])
        if peak_kv(base, rem) > kv:
            break
        expected += 1
    assert admissible_prefix(view, np.asarray(waiting, dtype=np.int64)) == expected
