"""Issue 32 class 1: sizes a config implies are checked on an estimate before anything that
size is allocated; solver time limits end the solve; a large LP stops at once on Ctrl-C."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hydra.errors import InstantiationException

import replay.bounds.lp as lp
from replay.bounds.instance import Instance
from replay.config import compose_config
from replay.config.cli import input_error_message, is_input_error
from replay.errors import LimitError
from replay.run import build_and_run
from replay.workloads.composite import FixedGroups
from replay.workloads.typed import Typed


def test_an_absurd_typed_rate_is_refused_on_its_estimate_before_drawing(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("sampled: the guard must come before any allocation")

    monkeypatch.setattr(Typed, "sample", never)
    cfg = compose_config(["policy=wait", "workload=typed", "arrivals=trace",
                          "workload.duration_s=2",
                          "workload.types=[{prompt_len:10,output_len:10,rate:1e9}]"])
    with pytest.raises(LimitError, match=r"~2e\+09 requests .*workload.types\[\*\].rate x "
                                         r"workload.duration_s"):
        build_and_run(cfg)


@pytest.mark.parametrize(("scale", "keys"), [
    ("workload.total_rate=1e300", "workload.total_rate x workload.duration_s"),
    ("workload.load=1e300", "workload.load x workload.duration_s"),
])
def test_a_rescaled_typed_rate_names_the_key_that_rescaled_it(monkeypatch, scale, keys):
    monkeypatch.setattr(Typed, "sample", None)
    cfg = compose_config(["policy=wait", "workload=typed", "arrivals=trace", scale])
    with pytest.raises(LimitError, match=rf"requests \(limit 2e\+07\); it follows from {keys}:"):
        build_and_run(cfg)


def test_a_billion_fixed_requests_are_refused_before_allocation(monkeypatch):
    """Issue 45 item 3: ``count: 1000000000`` allocated 7.45 GiB."""
    def never(*args, **kwargs):
        raise AssertionError("sampled: the guard must come before any allocation")

    monkeypatch.setattr(FixedGroups, "sample", never)
    cfg = compose_config(["workload=fixed", "arrivals=all_at_once", "timing=unit",
                          "workload.groups=[{count:1000000000,prompt_len:10,output_len:10},"
                          "{count:5,prompt_len:1,output_len:1}]"])
    with pytest.raises(LimitError) as caught:
        build_and_run(cfg)
    assert str(caught.value) == ("this run would draw ~1e+09 requests (limit 2e+07); it "
                                 "follows from workload.groups[*].count: lower it (or raise "
                                 "+limits.max_requests=N)")


def test_a_fixed_workload_without_groups_is_refused_naming_the_key():
    cfg = compose_config(["workload=fixed", "workload.groups=[]"])
    with pytest.raises(InstantiationException) as caught:
        build_and_run(cfg)
    assert is_input_error(caught.value)
    assert input_error_message(caught.value) == (
        "workload.groups: lists no request group; give at least one {count, prompt_len, "
        "output_len} (config node workload)")


def test_the_request_limit_is_a_config_key():
    cfg = compose_config(["workload.n=50", "+limits.max_requests=10"])
    with pytest.raises(LimitError, match=r"~50 requests \(limit 10\).*workload.n"):
        build_and_run(cfg)


def big_instance(n: int, longest: int = 2000, kv: int = 16_492) -> Instance:
    rng = np.random.default_rng(0)
    return Instance(rng.integers(1, 50, n), rng.integers(10, longest, n),
                    np.zeros(n, dtype=np.int64), kv)


def test_an_lp_too_large_is_refused_on_its_estimate_before_building(monkeypatch):
    monkeypatch.setattr(lp, "time_indexed", lambda *a: pytest.fail("built the LP"))
    started = time.perf_counter()
    with pytest.raises(LimitError, match=r"nonzeros .*limit 3e\+07\); coarsen"):
        lp.lp_bound(big_instance(500), tail_cuts=False)
    assert time.perf_counter() - started < 5


def test_lp_size_is_exactly_what_is_built():
    inst = big_instance(12, longest=200, kv=2000)
    window = lp.first_window(inst)
    model = lp.time_indexed(inst, window)
    assert lp.lp_size(inst, window) == (model.n_columns, model.memory.nnz + model.n_columns)
    coarse = lp.bucketed(inst, window, 7)
    assert lp.lp_size(inst, window, 7) == (coarse.n_columns,
                                           coarse.memory.nnz + coarse.n_columns)


def test_sorted_lp_names_the_grid_when_its_lp_is_too_large():
    cfg = compose_config(["policy=sorted_lp", "workload.n=500", "arrivals=all_at_once",
                          "timing=unit", "policy.grid=1"])
    with pytest.raises(LimitError, match="policy.grid"):
        build_and_run(cfg)


@pytest.mark.parametrize("where", ["in_process", "worker"])
def test_a_tiny_time_limit_ends_the_solve_with_the_time_limit_status(monkeypatch, where):
    if where == "worker":
        monkeypatch.setattr(lp, "WORKER_NONZEROS", 0)
    inst = big_instance(40, longest=200, kv=2000)  # ~1.9e6 nonzeros, ~9 s to optimality
    started = time.perf_counter()
    # 0.3 s: past building the LP, well before HiGHS's interior point finishes it.
    result = lp.lp_bound(inst, tail_cuts=False, time_limit_s=0.3)
    assert result.status == "time_limit", result.message
    assert time.perf_counter() - started < 0.3 + 8


def test_the_interrupt_callback_leaves_a_solve_unchanged():
    inst = big_instance(8, longest=200, kv=2000)
    plain = lp.lp_bound(inst, tail_cuts=False, grid=3)
    assert plain.status == "optimal"
    original = lp.WORKER_NONZEROS
    try:
        lp.WORKER_NONZEROS = 0
        worker = lp.lp_bound(inst, tail_cuts=False, grid=3)
    finally:
        lp.WORKER_NONZEROS = original
    assert worker.value == plain.value and np.array_equal(worker.mean_start, plain.mean_start)


def solve_in_worker_process(inst: Instance) -> lp.LPBound:
    """lp_bound with every LP sent to the worker process (run inside a joblib worker)."""
    lp.WORKER_NONZEROS = 0
    return lp.lp_bound(inst, tail_cuts=False, grid=3)


@pytest.mark.slow
def test_the_lp_worker_runs_inside_a_multirun_job():
    # Multirun jobs run in joblib's loky workers; a multiprocessing child spawned there
    # died at start and the job hung for ever (C2 and D1's Sorted-LP jobs).
    from joblib import Parallel, delayed

    inst = big_instance(8, longest=200, kv=2000)
    plain = lp.lp_bound(inst, tail_cuts=False, grid=3)
    (in_job,) = Parallel(n_jobs=2, backend="loky", timeout=120)(
        [delayed(solve_in_worker_process)(inst)])
    assert in_job.status == "optimal" and in_job.value == plain.value
    assert np.array_equal(in_job.mean_start, plain.mean_start)
