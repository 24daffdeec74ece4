"""Workloads whose prompts share prefixes: the shared-prefix generator and multi-turn
sessions (sharing structure, determinism, sizes), and the configs of all four."""

from __future__ import annotations

import numpy as np
import pytest
from hydra.utils import instantiate

from replay.config import compose_config
from replay.engine.requests import RequestError, Requests
from replay.errors import ConfigError, LimitError
from replay.run import make_requests
from replay.workloads.arrivals import Poisson, TraceTimestamps
from replay.workloads.prefixes import Lengths, Sessions, SharedPrefix, lengths
from tests.conftest import DATA_DIR


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def ids(requests: Requests) -> list[list[int]]:
    return [requests.ids_of(i).tolist() for i in range(len(requests))]


def common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def fixed(n: int) -> dict:
    return {"low": n, "high": n}


# ------------------------------------------------------------------ shared prefixes
def test_requests_share_exactly_their_groups_system_prompt_and_their_users_prefix():
    # System prompts of 70 tokens (4 whole 16-token blocks, the 5th mixes in the user's
    # prefix), user prefixes of 40 (to token 110: 6 whole blocks), suffixes of 1..40.
    workload = SharedPrefix(n=300, groups=3, users_per_group=2, system_prompt_len=fixed(70),
                            user_prefix_len=fixed(40), suffix_len={"low": 1, "high": 40},
                            output_len=fixed(5), block_unit=16)
    requests = workload.sample(rng())
    rows = ids(requests)
    assert (requests.prompt_len >= 111).all() and (requests.prompt_len <= 150).all()
    assert [len(r) for r in rows] == (-(-requests.prompt_len // 16)).tolist()
    group = [r[0] for r in rows]
    user = [r[4] for r in rows]
    assert len(set(group)) == 3 and len(set(user)) == 6
    seen = set()
    for i in range(len(rows)):
        for j in range(i):
            shared = common(rows[i], rows[j])
            expected = 6 if user[i] == user[j] else 4 if group[i] == group[j] else 0
            assert shared == expected, (i, j)
            seen.add(shared)
    assert seen == {0, 4, 6}
    last = [r[-1] for r in rows]  # the suffix's blocks are nobody else's
    assert len(set(last)) == len(rows)


def test_shared_blocks_become_shared_kv_block_hashes():
    workload = SharedPrefix(n=50, groups=1, users_per_group=2, system_prompt_len=fixed(64),
                            user_prefix_len=fixed(32), suffix_len=fixed(10),
                            output_len=fixed(5), block_unit=16)
    requests = workload.sample(rng())
    hashes, offsets = requests.block_hashes(32)  # 106-token prompts: 3 full 32-token blocks
    assert np.diff(offsets).tolist() == [3] * 50
    per_request = hashes.reshape(50, 3)
    assert len(set(per_request[:, 0])) == 1 and len(set(per_request[:, 1])) == 1
    assert len(set(per_request[:, 2])) == 2  # the block holding the user's prefix


def test_the_generator_is_a_function_of_its_seed():
    workload = SharedPrefix(n=200)
    a, b, c = workload.sample(rng(1)), workload.sample(rng(1)), workload.sample(rng(2))
    for name in ("prompt_len", "output_len", "block_ids", "block_offsets"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.prompt_len, c.prompt_len)


def test_lengths_follow_their_distributions():
    workload = SharedPrefix(n=2000, groups=50, users_per_group=1,
                            system_prompt_len={"low": 100, "high": 200},
                            user_prefix_len=fixed(0), suffix_len=fixed(1),
                            output_len={"distribution": "lognormal", "median": 50,
                                        "sigma": 1.0, "low": 1, "high": 400})
    requests = workload.sample(rng())
    system = requests.prompt_len - 1
    assert system.min() >= 100 and system.max() <= 200
    assert requests.output_len.min() >= 1 and requests.output_len.max() <= 400
    assert 40 <= np.median(requests.output_len) <= 60  # ceil of a lognormal of median 50
    assert (requests.output_len == 400).any()  # the tail is clipped, not redrawn


def test_zipf_popularity_favours_the_first_group():
    skewed = SharedPrefix(n=2000, groups=10, group_zipf=3.0).sample(rng())
    first = np.array([r[0] for r in ids(skewed)])
    _, counts = np.unique(first, return_counts=True)
    assert counts.max() / counts.sum() == pytest.approx(1 / 1.2021, abs=0.03)  # 1/zeta(3)


@pytest.mark.parametrize(("change", "message"), [
    ({"suffix_len": {"low": 0, "high": 5}}, "workload.suffix_len: need 1 <= low <= high"),
    ({"output_len": {"low": 9, "high": 5}}, "workload.output_len: need 1 <= low <= high"),
    ({"system_prompt_len": {"distribution": "lognormal", "low": 1, "high": 5}},
     "workload.system_prompt_len: a lognormal needs median > 0 and sigma > 0"),
    ({"user_prefix_len": {"low": 1}}, "workload.user_prefix_len: .*high"),
    ({"groups": 10_000, "users_per_group": 10_000}, "100,000,000 users"),
])
def test_bad_generator_settings_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        SharedPrefix(n=10, **change)


def test_a_workload_with_too_many_ids_is_refused_before_building_them():
    workload = SharedPrefix(n=1000, system_prompt_len=fixed(10**9), block_unit=1)
    with pytest.raises(LimitError, match="content ids"):
        workload.sample(rng())


def test_lengths_records_are_checked():
    assert lengths({"low": 2, "high": 3}, "k") == Lengths(2, 3)
    with pytest.raises(ConfigError, match="k: need 0 <= low"):
        lengths(Lengths(5, 3), "k")


# ------------------------------------------------------------------ sessions
def session_rows(requests: Requests) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for i, s in enumerate(requests.session.tolist()):
        rows.setdefault(s, []).append(i)
    return rows


def test_each_turn_extends_the_previous_turns_prompt_and_answer():
    workload = Sessions(sessions=30, turns={"low": 1, "high": 6}, message_len={"low": 3,
                        "high": 40}, output_len={"low": 2, "high": 30}, block_unit=8)
    requests = workload.sample(rng())
    rows = ids(requests)
    turns = session_rows(requests)
    assert len(turns) == 30 and sum(map(len, turns.values())) == len(requests)
    for members in turns.values():
        first, *later = members
        assert requests.predecessor[first] == -1 and requests.think_time[first] == 0
        assert np.isfinite(requests.arrival[first])
        for previous, turn in zip(members, later, strict=False):
            assert requests.predecessor[turn] == previous
            message = (requests.prompt_len[turn] - requests.prompt_len[previous]
                       - requests.output_len[previous])
            assert 3 <= message <= 40
            assert rows[turn][:len(rows[previous])] == rows[previous]  # ids extend
            assert np.isnan(requests.arrival[turn]) and requests.think_time[turn] >= 0
    requests.validate(kv_capacity=10**6)


def test_sessions_share_only_the_common_system_prompt():
    workload = Sessions(sessions=20, system_prompt_len=40, block_unit=16)
    requests = workload.sample(rng())
    turns = session_rows(requests)
    firsts = [members[0] for members in turns.values()]
    rows = ids(requests)
    for a in firsts:
        for b in firsts:
            if a != b:
                assert common(rows[a], rows[b]) == 2  # 40 tokens: 2 whole 16-token blocks
    # A later turn's full KV blocks start with all of the earlier turn's full blocks.
    hashes, offsets = requests.block_hashes(16)
    for members in turns.values():
        for previous, turn in zip(members, members[1:], strict=False):
            before = hashes[offsets[previous]:offsets[previous + 1]]
            after = hashes[offsets[turn]:offsets[turn + 1]]
            assert np.array_equal(after[:before.size], before)


def test_a_session_stops_before_a_turn_beyond_max_total_len():
    free = Sessions(sessions=40, turns=fixed(6)).sample(rng())
    capped = Sessions(sessions=40, turns=fixed(6), max_total_len=1500).sample(rng())
    over = int((free.prompt_len + free.output_len > 1500).sum())
    assert over > 0 and capped.dropped == {"total_len>1500": over}
    assert len(capped) == len(free) - over
    assert (capped.prompt_len + capped.output_len).max() <= 1500
    capped.validate(kv_capacity=10**6)  # kept turns are each session's first: chains intact


def test_sessions_are_a_function_of_the_seed_and_start_as_a_poisson_stream():
    workload = Sessions(sessions=4000, session_rate=5.0, turns=fixed(1))
    a, b = workload.sample(rng(3)), workload.sample(rng(3))
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.block_ids, b.block_ids)
    gaps = np.diff(np.concatenate(([0.0], a.arrival)))
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)  # 1 / session_rate
    assert (gaps > 0).all()


def test_arrivals_trace_shifts_the_first_turns_and_leaves_the_rest_to_the_engine():
    workload = Sessions(sessions=5, turns=fixed(3))
    requests, slow = (make_requests(workload, TraceTimestamps(speedup=speedup), seed=0,
                                    time_unit="seconds") for speedup in (2.0, 1.0))
    first = requests.predecessor < 0
    assert first.sum() == 5 and requests.arrival[first].min() == 0.0
    assert np.isnan(requests.arrival[~first]).all()
    assert np.allclose(requests.arrival[first], slow.arrival[first] / 2)  # starts only
    assert np.array_equal(requests.think_time, slow.think_time)
    requests.validate(kv_capacity=10**6)
    with pytest.raises(ConfigError, match="arrivals=trace"):
        make_requests(workload, Poisson(rate=1.0), seed=0, time_unit="seconds")
    with pytest.raises(RequestError, match="cannot be set"):
        workload.sample(rng(), n=5)


# ------------------------------------------------------------------ configs
@pytest.mark.parametrize(("name", "extra"), [("shared_prefix", []),
                                             ("sessions", ["arrivals=trace"])])
def test_the_generated_configs_replay_their_requests(name, extra):
    cfg = compose_config([f"data_dir={DATA_DIR}", f"workload={name}", *extra])
    requests = make_requests(instantiate(cfg.workload), instantiate(cfg.arrivals), seed=0,
                             time_unit="seconds")
    requests.validate(kv_capacity=16492)
    assert requests.block_unit == 16 and len(requests.block_ids) > 0


@pytest.mark.parametrize("name", ["mooncake", "mooncake_synthetic"])
def test_the_mooncake_configs_read_their_files(name, data_dir):
    cfg = compose_config([f"data_dir={data_dir}", f"workload={name}"])
    requests = instantiate(cfg.workload).sample(rng())
    assert requests.block_unit == 512 and requests.source.endswith(
        "conversation_trace.jsonl" if name == "mooncake" else "synthetic_trace.jsonl")
    requests.validate(kv_capacity=10**6)
