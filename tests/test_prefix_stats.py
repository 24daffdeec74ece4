"""Prefix-cache statistics of a trace (``python -m traces.stats prefix``): the LRU replay by
hand, against a plain set when unbounded, and the command's output and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay.engine.requests import RequestError, Requests, offsets_of
from replay.workloads.prefix_stats import prefix_cache_replay, replay_order
from replay.workloads.prefixes import Sessions, SharedPrefix
from tests.test_mooncake import LINES, write
from traces import stats

NAN = float("nan")


def with_ids(ids, unit, prompt_len=None, arrival=None) -> Requests:
    prompt_len = np.asarray(prompt_len if prompt_len is not None
                            else [len(row) * unit for row in ids], dtype=np.int64)
    return Requests(prompt_len=prompt_len, output_len=np.ones_like(prompt_len),
                    arrival=None if arrival is None else np.asarray(arrival, dtype=float),
                    block_ids=np.asarray([i for row in ids for i in row], dtype=np.int64),
                    block_offsets=offsets_of([len(row) for row in ids]), block_unit=unit)


def test_an_lru_reclaim_by_hand():
    """Blocks of 4 tokens, one id each; room for 3 blocks. Chain hashes: [a, b] and [c, d]
    share nothing, a third [a, b] matches the first.

    1. [a, b]: no hit; a request frees its blocks last-first, so the LRU order is b, a.
    2. [c, d]: no hit; 2 + 2 > 3 evicts b; order a, d, c.
    3. [a, b]: a hits, b does not (1 hit); a is held, so d is evicted; order c, b, a.
    4. [c, d]: c hits, d was evicted (1 hit); b is evicted; order a, d, c.
    """
    requests = with_ids([[1, 2], [3, 4], [1, 2], [3, 4]], unit=4)
    result, hits = prefix_cache_replay(requests, block_size=4, capacity_tokens=12)
    assert hits.tolist() == [0, 0, 1, 1]
    assert (result.capacity_blocks, result.evicted_blocks) == (3, 3)
    assert (result.hit_blocks, result.full_blocks, result.hit_tokens) == (2, 8, 8)
    assert result.hit_ratio_blocks == 2 / 8 and result.hit_ratio_tokens == 8 / 32
    assert result.distinct_blocks == 4
    # (An LRU that let request 3 evict its own block a, and request 4 its own c, only to
    # insert them again would count 5 evictions.)
    unbounded, hits = prefix_cache_replay(requests, block_size=4)
    assert hits.tolist() == [0, 0, 2, 2] and unbounded.evicted_blocks == 0


def test_the_hit_run_stops_at_the_first_miss_and_tokens_count_whole_blocks():
    # Request 2 shares block 0 with request 1, then differs; its third id equals request 1's
    # but the chain makes block 2 a different block. Request 3 stops 1000 tokens in: 7 full
    # 128-token blocks, all cached; its partial block is never a hit.
    requests = with_ids([[1, 2, 3], [1, 9, 3], [1, 2]], unit=512,
                        prompt_len=[1536, 1536, 1000])
    result, hits = prefix_cache_replay(requests, block_size=128)
    assert hits.tolist() == [0, 4, 7]
    assert result.hit_tokens == 11 * 128 and result.prompt_tokens == 4072
    assert result.full_blocks == 12 + 12 + 7


def test_a_cache_smaller_than_a_request_keeps_its_first_blocks_and_zero_keeps_none():
    requests = with_ids([[1, 2, 3], [1, 2, 3]], unit=1)
    _, hits = prefix_cache_replay(requests, block_size=1, capacity_tokens=2)
    assert hits.tolist() == [0, 2]
    result, hits = prefix_cache_replay(requests, block_size=1, capacity_tokens=0)
    assert hits.tolist() == [0, 0] and result.evicted_blocks == 0


def set_based(requests: Requests, block_size: int) -> list[int]:
    """The unbounded cache written plainly: a set of every block seen so far."""
    hashes, offsets = requests.block_hashes(block_size)
    seen, hits = set(), np.zeros(len(requests), dtype=int)
    for i in replay_order(requests):
        blocks = hashes[offsets[i]:offsets[i + 1]].tolist()
        while hits[i] < len(blocks) and blocks[hits[i]] in seen:
            hits[i] += 1
        seen.update(blocks)
    return hits.tolist()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_size", [8, 16, 24])
def test_unbounded_equals_a_set_and_a_huge_lru(seed, block_size):
    rng = np.random.default_rng(seed)
    workload = SharedPrefix(n=150, groups=3, users_per_group=4, system_prompt_len={
        "low": 10, "high": 90}, user_prefix_len={"low": 0, "high": 60},
        suffix_len={"low": 1, "high": 50}, output_len={"low": 1, "high": 5}, block_unit=16)
    requests = workload.sample(rng).with_arrivals(rng.integers(0, 40, 150).astype(float))
    unbounded, hits = prefix_cache_replay(requests, block_size)
    assert hits.tolist() == set_based(requests, block_size)
    assert unbounded.hit_blocks > 0
    huge, lru_hits = prefix_cache_replay(requests, block_size, capacity_tokens=10**9)
    assert lru_hits.tolist() == hits.tolist()
    assert huge.distinct_blocks == unbounded.distinct_blocks
    small, _ = prefix_cache_replay(requests, block_size, capacity_tokens=10 * block_size)
    assert small.hit_blocks < unbounded.hit_blocks and small.evicted_blocks > 0


def test_requests_are_replayed_in_arrival_order_ties_in_table_order():
    requests = with_ids([[1, 2], [1, 2], [1, 2]], unit=4, arrival=[5.0, 1.0, 1.0])
    _, hits = prefix_cache_replay(requests, block_size=4)
    assert hits.tolist() == [2, 0, 2]


def test_later_turns_are_placed_by_their_think_times():
    requests = Sessions(sessions=3, turns={"low": 3, "high": 3}).sample(np.random.default_rng())
    order = replay_order(requests)
    placed = requests.arrival.copy()
    for i in range(len(requests)):
        if requests.predecessor[i] >= 0:
            placed[i] = placed[requests.predecessor[i]] + requests.think_time[i]
    assert np.all(np.diff(placed[order]) >= 0)
    result, hits = prefix_cache_replay(requests, block_size=16)
    assert (hits[requests.predecessor < 0] == 0).all()  # a first turn shares nothing
    later = np.flatnonzero(requests.predecessor >= 0)
    full = requests.prompt_len[requests.predecessor[later]] // 16
    assert (hits[later] == full).all()  # every full block of the previous turn


def test_requests_without_ids_are_refused():
    requests = Requests(prompt_len=np.array([4]), output_len=np.array([1]))
    with pytest.raises(RequestError, match="carry no prompt-content ids"):
        prefix_cache_replay(requests, block_size=4)


def test_the_command_prints_the_ratios_as_its_last_line(tmp_path, capsys):
    path = write(tmp_path, LINES)
    stats.main(["prefix", str(path), "--block-size", "256", "--capacity-tokens", "100000"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads(last)
    # Blocks of 256: request 1 has 3 full, request 2 has 2 (both cached), request 3 has 4
    # (the first 3 cached: its 1100 tokens share ids 0, 1 with request 1's 1000).
    assert (record["full_blocks"], record["hit_blocks"]) == (9, 5)
    assert record["hit_ratio_blocks"] == 5 / 9
    assert record["hit_ratio_tokens"] == 5 * 256 / (1000 + 512 + 1100)
    assert record["block_size"] == 256 and record["capacity_blocks"] == 390
    assert record["input_files"][0]["path"] == str(path)


def test_the_command_uses_the_traces_block_unit_by_default(tmp_path, capsys):
    stats.main(["prefix", str(write(tmp_path, LINES))])
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["block_size"] == 512 and record["capacity_tokens"] is None
    # Full 512-token blocks: 1, 1, 2. Request 3's second block (id 1) was only a partial
    # block of request 1, never cached: 2 hits.
    assert (record["full_blocks"], record["hit_blocks"]) == (4, 2)


@pytest.mark.parametrize(("args", "message"), [
    (["prefix", "workload=synthetic"], "carry no prompt-content ids"),
    (["prefix", "a.jsonl", "b.jsonl"], "prefix takes one trace FILE"),
    (["--output-types", "0:0", "workload=synthetic"], "need whole numbers 1 <= WIDTH <= MAX"),
    (["--output-types", "-5:10", "workload=synthetic"], "need whole numbers 1 <= WIDTH <= MAX"),
    (["--output-types", "50", "workload=synthetic"], "needs WIDTH:MAX"),
    (["workload=synthetic", "--output-types"], "needs WIDTH:MAX"),
])
def test_bad_arguments_are_one_error_line(args, message, capsys):
    with pytest.raises(SystemExit) as done:
        stats.main(args)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("error:") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_a_bad_capacity_is_refused(value, capsys):
    with pytest.raises(SystemExit) as done:
        stats.main(["prefix", "x.jsonl", "--capacity-tokens", value])
    assert done.value.code == 2 and "--capacity-tokens" in capsys.readouterr().err
