"""D3 at a tiny size: Vidur's simulator and this harness on the same requests."""

from __future__ import annotations

import pandas as pd
import pytest

from replay.crosscheck import Setup, crosscheck, parse_arguments
from tests.conftest import DATA_DIR

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (DATA_DIR / "vidur").is_dir(),
                                 reason=f"needs the Vidur profiles under {DATA_DIR}")]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("crosscheck")
    # arXiv at 0.3/s preempts (memory binds); LMSYS at 20/s does not.
    speed = crosscheck(Setup(n=40, quick=True), out, cases={"lmsys": (20.0,), "arxiv": (0.3,)})
    return out, speed


def test_both_simulators_agree_within_the_named_causes(checked):
    out, _ = checked
    comparison = pd.read_csv(out / "comparison.csv")
    assert len(comparison) == 2 * 2 * 3  # workloads x schedulers x metrics
    # Matched settings: latency and time between tokens within 5 %. TTFT is where the
    # prefill KV accounting shows: Vidur prices a prompt as if already cached, so its
    # first tokens come later, never earlier (up to ~11 % at this size).
    by_metric = comparison.set_index("metric")["diff_mean"]
    assert (by_metric[["latency", "tbt_mean"]].abs() < 0.05).all(), comparison
    assert by_metric["ttft"].between(-0.15, 0.01).all(), comparison
    requests = pd.read_csv(out / "requests.csv")
    assert set(requests["simulator"]) == {"kvsched", "vidur"}
    assert requests.groupby(["simulator", "workload", "scheduler"]).size().eq(40).all()
    assert (out / "distributions.png").stat().st_size > 1000


def test_vidur_runs_past_a_preemption_with_the_restart_fix(checked):
    out, _ = checked
    comparison = pd.read_csv(out / "comparison.csv")
    arxiv = comparison[(comparison["workload"] == "arxiv") & (comparison["metric"] == "latency")]
    assert (arxiv["restarts_vidur"] > 0).any()  # without the fix Vidur asserts at the first


def test_speed_is_measured_for_both_on_the_same_requests(checked):
    _, speed = checked
    assert (speed["requests"] == 40).all()
    assert (speed[["kvsched_wall_s", "vidur_wall_s"]] > 0).all().all()
    assert (speed["speedup"] == speed["vidur_wall_s"] / speed["kvsched_wall_s"]).all()


def test_the_report_stamps_d3_with_the_commit_that_ran_it(checked):
    import json

    from replay.experiments.report import CROSSCHECK_PROVENANCE, _crosscheck
    from replay.storage.outputs import git_describe

    out, _ = checked
    recorded = json.loads((out / CROSSCHECK_PROVENANCE).read_text())
    assert recorded["commit"] == git_describe() and "vidur" in recorded["packages"]
    stamp = _crosscheck(out, out.parent / "reproduce")["stamp"]
    assert stamp["commit"] == recorded["commit"] and stamp["date"] == recorded["date"]


REQUESTS = pd.DataFrame({"request_id": [0], "arrival": [0.0], "prompt_len": [3],
                         "output_len": [2], "latency": [1.0], "ttft": [0.5], "tbt_mean": [0.5],
                         "evictions": [0]})


def fake_simulators(monkeypatch, tmp_path, harness, vidur):
    """Both simulators replaced: ``harness()`` gives kvsched's (loop, call) seconds of each
    run, ``vidur()`` Vidur's; returns the module and the list of predictor loads."""
    from types import SimpleNamespace

    import replay.crosscheck as cc

    loaded = []

    class Timing:
        spec = type("Spec", (), {"model_name": "m", "tensor_parallel": 1})
        cache_path = tmp_path / "predictor-of-m"

        def vidur_predictor(self):
            loaded.append(self.cache_path)
            return object()

    monkeypatch.setattr(cc, "run_harness", lambda *a: (REQUESTS, *harness(),
                                                       SimpleNamespace(timing=None)))
    monkeypatch.setattr(cc, "instantiate", lambda cfg: Timing())
    monkeypatch.setattr(cc, "run_vidur", lambda *a: (REQUESTS.assign(restarts=0), *vidur()))
    return cc, loaded


def test_each_simulator_is_timed_by_its_fastest_of_repeated_runs(monkeypatch, tmp_path):
    ours = iter([(0.3, 0.9), (0.1, 0.5), (0.2, 0.7)])
    theirs = iter([(5.0, 6.0), (7.0, 9.0), (4.0, 8.0)])
    cc, _ = fake_simulators(monkeypatch, tmp_path, lambda: next(ours), lambda: next(theirs))
    monkeypatch.setattr(cc, "SCHEDULERS", ("vllm",))
    speed = cc.crosscheck(Setup(n=1, quick=True), tmp_path, cases={"lmsys": (5.0,)},
                          repeat=3)
    row = speed.iloc[0]
    assert (row["kvsched_wall_s"], row["vidur_wall_s"], row["runs_each"]) == (0.1, 4.0, 3)
    assert (row["kvsched_call_s"], row["vidur_call_s"]) == (0.5, 6.0)
    assert row["call_speedup"] == 6.0 / 0.5


def test_vidur_predictor_is_loaded_once_per_model(monkeypatch, tmp_path):
    cc, loaded = fake_simulators(monkeypatch, tmp_path, lambda: (0.1, 0.2), lambda: (1.0, 2.0))
    cc.crosscheck(Setup(n=1, quick=True), tmp_path, cases={"lmsys": (5.0, 20.0)}, repeat=2)
    assert loaded == [tmp_path / "predictor-of-m"]  # 2 rates x 2 schedulers x 2 runs: one load


def test_set_overrides_reach_every_harness_run():
    setup, *_ = parse_arguments(["--set", "engine.fast_forward=false", "--set", "seed=3"])
    overrides = setup.overrides("lmsys", 5.0, "vllm")
    assert overrides[-2:] == ["engine.fast_forward=false", "seed=3"]


def test_whole_processes_are_timed_only_when_asked_and_reported_beside_the_loops(
        monkeypatch, tmp_path):
    from replay.experiments.report import _whole_process_summary

    cc, _ = fake_simulators(monkeypatch, tmp_path, lambda: (0.1, 0.5), lambda: (4.0, 6.0))
    timed = []
    monkeypatch.setattr(cc, "SCHEDULERS", ("vllm",))
    monkeypatch.setattr(cc, "time_whole_processes", lambda *a: timed.append(a) or (2.0, 8.0))
    without = cc.crosscheck(Setup(n=1, quick=True), tmp_path / "a", cases={"lmsys": (5.0,)})
    assert not timed and without[["kvsched_process_s", "process_speedup"]].isna().all().all()
    assert "whole processes" not in _whole_process_summary(without)
    speed = cc.crosscheck(Setup(n=1, quick=True), tmp_path / "b", cases={"lmsys": (5.0,)},
                          whole_process=True)
    assert len(timed) == 1 and speed.iloc[0]["process_speedup"] == 8.0 / 2.0
    assert _whole_process_summary(speed) == (" Vidur's time over kvsched's: step loops 40.0x, "
                                             "in-process calls 12.0x, whole processes 4.0x.")


def test_a_whole_process_that_fails_is_one_line_naming_the_case():
    import sys

    from replay.crosscheck import time_process
    from replay.errors import InputError

    with pytest.raises(InputError, match=r"^lmsys 5/s: the whole-process run exited 1: boom$"):
        time_process([sys.executable, "-c", "import sys; sys.exit('boom')"], "lmsys 5/s")


def test_both_whole_processes_run_the_case(tmp_path):
    """The real thing at a tiny size: ``python -m replay`` and Vidur in a fresh interpreter,
    the same requests, both exit 0 and are timed."""
    speed = crosscheck(Setup(n=20, quick=True), tmp_path, cases={"lmsys": (20.0,)},
                       whole_process=True)
    assert (speed[["kvsched_process_s", "vidur_process_s"]] > 0).all().all()
    assert (tmp_path / "runs" / "lmsys_rate20_vllm" / "whole_process" / "kvsched"
            / "summary.json").is_file()
