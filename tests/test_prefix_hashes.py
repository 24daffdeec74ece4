"""Prompt-content ids on the request table, and their chain hashes at the KV block size."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from replay.engine.requests import (
    RequestError,
    Requests,
    offsets_of,
    prefix_block_hashes,
)


def with_ids(prompt_len, ids, unit, **extra) -> Requests:
    """Requests with the given prompt lengths and per-request id lists."""
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    return Requests(prompt_len=prompt_len, output_len=np.ones_like(prompt_len),
                    block_ids=np.asarray([i for row in ids for i in row], dtype=np.int64),
                    block_offsets=offsets_of([len(row) for row in ids]), block_unit=unit,
                    **extra)


def hashes_of(requests: Requests, block_size: int) -> list[list[int]]:
    hashes, offsets = requests.block_hashes(block_size)
    return [hashes[offsets[i]:offsets[i + 1]].tolist() for i in range(len(requests))]


def shared_blocks(a: list[int], b: list[int]) -> int:
    """How many leading blocks two requests' hashes have in common."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def reference_hashes(prompt_len, ids, unit, block_size, output_len=None) -> list[list[str]]:
    """vLLM's rule written out token by token: token t of request r is "trace block
    ids[t // unit] at offset t % unit" (or its own, beyond its ids or its prompt); block k's
    hash is a SHA-256 of its parent's hash and its tokens; full blocks only (of the prompt
    and, given ``output_len``, the answer)."""
    out = []
    answers = output_len if output_len is not None else [0] * len(prompt_len)
    for r, (length, row, answer) in enumerate(zip(prompt_len, ids, answers, strict=True)):
        parent, hashes = "start", []
        for k in range((length + answer) // block_size):
            tokens = tuple((row[t // unit], t % unit) if t // unit < len(row) and t < length
                           else ("own", r, t)
                           for t in range(k * block_size, (k + 1) * block_size))
            parent = hashlib.sha256(repr((parent, tokens)).encode()).hexdigest()
            hashes.append(parent)
        out.append(hashes)
    return out


# ------------------------------------------------------------------ the hashing rule
def test_a_shared_prefix_has_equal_hashes_exactly_up_to_the_first_difference():
    # 512-token trace blocks, 16-token KV blocks: 32 KV blocks per trace block.
    requests = with_ids([1536, 1536, 1536], [[1, 2, 3], [1, 2, 4], [1, 5, 3]], 512)
    a, b, c = hashes_of(requests, 16)
    assert len(a) == len(b) == len(c) == 96
    assert shared_blocks(a, b) == 64      # ids 1, 2 in common
    assert shared_blocks(a, c) == 32      # id 1 only: the equal id 3 after a difference ...
    assert not set(a[64:]) & set(c[64:])  # ... does not make block 64 onwards equal
    assert len(set(a)) == 96              # positions differ: no two blocks of a prompt equal


def test_kv_blocks_larger_than_trace_blocks_depend_on_every_trace_block_inside():
    # block_unit divides block_size: a 1024-token KV block holds two trace blocks.
    requests = with_ids([2048, 2048, 2048], [[1, 2, 3, 4], [1, 2, 3, 9], [1, 9, 3, 4]], 512)
    a, b, c = hashes_of(requests, 1024)
    assert (len(a), shared_blocks(a, b), shared_blocks(a, c)) == (2, 1, 0)


def test_a_kv_block_straddling_two_trace_blocks_depends_on_both():
    # Neither size divides the other: 768-token blocks over 512-token trace blocks.
    # Block 0 = trace block 0 + first half of 1; block 1 = second half of 1 + trace block 2.
    requests = with_ids([1536] * 4, [[1, 2, 3], [1, 2, 9], [1, 9, 3], [9, 2, 3]], 512)
    a, b, c, d = hashes_of(requests, 768)
    assert len(a) == 2
    assert shared_blocks(a, b) == 1  # differs only in trace block 2: block 1
    assert shared_blocks(a, c) == 0  # trace block 1 is in block 0 too
    assert shared_blocks(a, d) == 0
    # And with 100-token blocks: block 5 (tokens 500-599) straddles trace blocks 0 and 1.
    a, b, c, _ = hashes_of(requests, 100)
    assert (shared_blocks(a, b), shared_blocks(a, c)) == (10, 5)


def test_a_last_partial_block_is_never_hashed():
    requests = with_ids([1000, 1024, 1023, 15], [[1, 2], [1, 2], [1, 2], [1]], 512)
    assert [len(h) for h in hashes_of(requests, 512)] == [1, 2, 1, 0]
    assert [len(h) for h in hashes_of(requests, 16)] == [62, 64, 63, 0]
    a, b, c, _ = hashes_of(requests, 16)
    assert a == b[:62] and c == b[:63]  # the same tokens, whatever the prompt's end


def test_tokens_beyond_the_ids_are_the_requests_own():
    # The same two ids, but only the first 512 tokens have ids in the second request:
    # its remaining blocks are its own, even beside an identical row.
    requests = with_ids([1024, 1024, 1024], [[1, 2], [1], [1]], 512)
    a, b, c = hashes_of(requests, 256)
    assert shared_blocks(a, b) == 2 and shared_blocks(b, c) == 2
    assert not set(b[2:]) & set(c[2:])


def test_without_ids_every_block_is_its_own():
    requests = Requests(prompt_len=np.array([64, 64]), output_len=np.array([1, 1]))
    a, b = hashes_of(requests, 16)
    assert len(a) == 4 and not set(a) & set(b)


def test_an_answer_is_its_requests_own_even_where_an_id_runs_past_the_prompt():
    # Request 0's 4-token prompt holds half of 8-token trace block 7; its answer fills the
    # rest of that span. Request 1's prompt holds all of block 7: they share the first KV
    # block only (found by the engine's cache check: the answer hit request 1's prompt).
    requests = Requests(prompt_len=np.array([4, 32]), output_len=np.array([5, 1]),
                        block_ids=np.array([7, 7]), block_offsets=offsets_of([1, 1]),
                        block_unit=8)
    hashes, offsets = requests.block_hashes(4, with_output=True)
    a, b = hashes[offsets[0]:offsets[1]].tolist(), hashes[offsets[1]:offsets[2]].tolist()
    assert len(a) == 2 and shared_blocks(a, b) == 1


@pytest.mark.parametrize("with_output", [False, True])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("unit", "block_size"), [(8, 4), (4, 8), (6, 4), (4, 6), (5, 5),
                                                  (3, 7)])
def test_equal_hashes_are_exactly_equal_token_prefixes(seed, unit, block_size, with_output):
    """Against the rule written out token by token (as vLLM hashes blocks): two blocks
    have equal hashes if and only if the reference's hashes are equal (with the answers'
    blocks, as the engine's cache holds them, or without)."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 4, size=(3, 12))
    prompt_len, ids = [], []
    for _ in range(12):
        length = int(rng.integers(0, 12 * unit + 1))
        row = templates[rng.integers(0, 3)].copy()
        row[rng.integers(0, 12):] = rng.integers(0, 4)  # diverge somewhere
        ids.append(row[: int(rng.integers(0, -(-length // unit) + 1))].tolist())
        prompt_len.append(length)
    output_len = rng.integers(1, 3 * unit, size=len(prompt_len))
    requests = with_ids(prompt_len, ids, unit)
    requests = replace(requests, output_len=output_len)
    hashes, offsets = requests.block_hashes(block_size, with_output=with_output)
    mine = [hashes[offsets[i]:offsets[i + 1]].tolist() for i in range(len(requests))]
    theirs = reference_hashes(prompt_len, ids, unit, block_size,
                              output_len.tolist() if with_output else None)
    flat_mine = [h for row in mine for h in row]
    flat_theirs = [h for row in theirs for h in row]
    answers = output_len if with_output else np.zeros_like(output_len)
    assert len(flat_mine) == len(flat_theirs) == sum(
        (n + o) // block_size for n, o in zip(prompt_len, answers, strict=True))
    same_mine = np.equal.outer(flat_mine, flat_mine)
    same_theirs = np.array([[x == y for y in flat_theirs] for x in flat_theirs])
    assert (same_mine == same_theirs).all()


def test_block_sizes_must_be_positive():
    with pytest.raises(RequestError, match="block_size = 0"):
        prefix_block_hashes(np.array([4]), None, None, 4, 0)


# ------------------------------------------------------------------ the table
def test_ids_must_fit_the_prompt_and_the_error_names_the_row():
    with pytest.raises(RequestError, match=r"t.jsonl row 3: 3 block ids do not fit prompt_len "
                                           r"= 1024: blocks of 512 tokens allow at most 2"):
        with_ids([512, 513, 1024], [[1], [1, 2], [1, 2, 3]], 512, source="t.jsonl",
                 source_row=np.array([1, 2, 3]))


@pytest.mark.parametrize(("change", "message"), [
    ({"block_offsets": np.array([0, 2, 1])}, "block_offsets must rise"),
    ({"block_offsets": np.array([0, 1])}, "block_offsets must rise"),
    ({"block_ids": np.array([1, -2])}, "block id -2 is negative"),
    ({"block_unit": 0}, "block_unit = 0"),
    ({"block_unit": None}, "go together"),
])
def test_a_malformed_id_table_is_refused(change, message):
    fields = {"block_ids": np.array([1, 2]), "block_offsets": np.array([0, 1, 2]),
              "block_unit": 4, **change}
    with pytest.raises(RequestError, match=message):
        Requests(prompt_len=np.array([4, 4]), output_len=np.array([1, 1]), **fields)


def test_take_keeps_each_requests_ids():
    requests = with_ids([3, 5, 1, 8], [[10], [20, 21], [], [30, 31]], 4)
    taken = requests.take(np.array([3, 1, 1, 2]))
    assert [taken.ids_of(i).tolist() for i in range(4)] == [[30, 31], [20, 21], [20, 21], []]
    assert taken.block_unit == 4 and taken.block_offsets.tolist() == [0, 2, 4, 6, 6]
    mask = requests.take(np.array([True, False, False, True]))
    assert [mask.ids_of(i).tolist() for i in range(2)] == [[10], [30, 31]]


# ------------------------------------------------------------------ sessions
def sessions(predecessor, arrival, session=None, think=None) -> Requests:
    n = len(predecessor)
    predecessor = np.asarray(predecessor, dtype=np.int64)
    return Requests(prompt_len=np.full(n, 4), output_len=np.full(n, 2),
                    arrival=np.asarray(arrival, dtype=float),
                    session=np.asarray(session if session is not None else np.zeros(n),
                                       dtype=np.int64),
                    predecessor=predecessor,
                    think_time=np.asarray(think if think is not None else np.ones(n),
                                          dtype=float))


NAN = float("nan")


def test_later_turns_without_an_arrival_are_accepted():
    table = sessions([-1, 0, 1, -1, 3], [0.5, NAN, NAN, 2.0, NAN], session=[0, 0, 0, 1, 1])
    table.validate(kv_capacity=100)


@pytest.mark.parametrize(("predecessor", "arrival", "session", "message"), [
    ([-1, 0], [NAN, NAN], [0, 0], "row 0: field arrival = nan"),
    ([-1, 0], [0.0, 1.0], [0, 0], "row 1: a later turn of a session has arrival = 1.0"),
    ([-1, 0], [0.0, NAN], [0, 1], "row 1: its predecessor .row 0. belongs to session 0, not 1"),
    ([-1, 0, 0], [0.0, NAN, NAN], [0, 0, 0], "row 0: it is the predecessor of 2 turns"),
    ([-1, 2, 1], [0.0, NAN, NAN], [0, 0, 0], "never reaches a first turn"),
    ([-1, 5], [0.0, NAN], [0, 0], "row 1: field predecessor = 5"),
    ([-1, 1], [0.0, NAN], [0, 0], "row 1: field predecessor = 1"),
])
def test_malformed_sessions_are_refused(predecessor, arrival, session, message):
    with pytest.raises(RequestError, match=message):
        sessions(predecessor, arrival, session).validate(kv_capacity=100)


def test_a_negative_think_time_is_refused():
    with pytest.raises(RequestError, match="row 1: field think_time = -1.0"):
        sessions([-1, 0], [0.0, NAN], think=[0.0, -1.0]).validate(kv_capacity=100)


def test_a_long_chain_is_not_mistaken_for_a_cycle():
    n = 1000
    sessions(np.arange(n) - 1, [0.0] + [NAN] * (n - 1)).validate(kv_capacity=100)


def test_take_renumbers_predecessors_and_refuses_orphans():
    table = sessions([-1, 0, -1, 2], [0.0, NAN, 1.0, NAN], session=[0, 0, 1, 1])
    taken = table.take(np.array([2, 3, 0, 1]))
    assert taken.predecessor.tolist() == [-1, 0, -1, 2]
    assert taken.session.tolist() == [1, 1, 0, 0]
    taken.validate(kv_capacity=100)
    with pytest.raises(RequestError, match="row 1: its predecessor turn .row 0. is not among"):
        table.take(np.array([1, 2, 3]))
    with pytest.raises(RequestError, match="cannot repeat a request"):
        table.take(np.array([0, 0, 1]))
