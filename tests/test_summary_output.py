"""What a run reports: the summary's percentiles and totals, the printed block (vLLM's
benchmark layout, fixed ms) and the multirun tables (units, mean and interval over seeds)."""

from __future__ import annotations

import pytest

from policies.fcfs import FCFSLookahead
from replay.app import human_summary
from replay.config import compose_config
from replay.config.validate import validate_config
from replay.engine.metrics import summarize
from replay.engine.overflow import EvictLIFO
from replay.errors import ConfigError
from replay.results import SweepJob, sweep_tables, sweep_text
from tests.conftest import replay


@pytest.fixture(scope="module")
def three_in_a_row():
    """Unit time, KV for one request at a time: three requests (s=1, o=2) served one after
    the other. Request k (k = 0, 1, 2) starts at round 2k: first token at 2k + 1, done at
    2k + 2, so TTFT 1, 3, 5 and latency 2, 4, 6."""
    return replay([1, 1, 1], [2, 2, 2], FCFSLookahead(EvictLIFO()), 3)


def test_the_summary_has_the_chosen_percentiles_and_always_the_median_and_p99(three_in_a_row):
    assert three_in_a_row.requests["ttft"].tolist() == [1, 3, 5]
    default = summarize(three_in_a_row)
    # numpy's linear interpolation between order statistics (vLLM's too).
    assert (default["mean_ttft"], default["p50_ttft"], default["p90_ttft"]) == (3, 3, 4.6)
    assert default["p99_latency"] == pytest.approx(5.96)
    chosen = summarize(three_in_a_row, percentiles=[75])
    assert chosen["p75_latency"] == 5
    assert {"p50_ttft", "p99_ttft", "p50_tpot", "p99_tbt"} <= chosen.keys()
    assert "p90_ttft" not in chosen


def test_the_summary_has_vllm_token_totals(three_in_a_row):
    summary = summarize(three_in_a_row)
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (3, 6)
    assert summary["makespan"] == 6
    assert summary["throughput_total_tokens_per_s"] == pytest.approx(9 / 6)


SUMMARY = {"status": "completed", "n_requests": 3, "n_completed": 3, "makespan": 12.5,
           "total_input_tokens": 1200, "total_output_tokens": 3400,
           "mean_ttft": 0.5525, "p50_ttft": 0.25, "p99_ttft": 6.18, "p90_ttft": 1.5,
           "config": {"policy": {"_target_": "policies.mcsf.MCSF"},
                      "output": {"percentiles": [50, 99]}}}


def test_the_printed_block_gives_every_time_in_ms_with_the_chosen_percentiles(tmp_path):
    text = human_summary({**SUMMARY, "mean_latency": 1.0}, tmp_path)
    rows = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    rows = {label: value.strip() for label, value in rows.items()}
    # One unit in a line, whatever the size of the number (not "552.5 ms ... 6.18 s").
    assert rows["Mean TTFT (ms)"] == "552.50"
    assert rows["Median TTFT (ms)"] == "250.00"
    assert rows["P99 TTFT (ms)"] == "6,180.00"
    assert "P90 TTFT (ms)" not in rows  # output.percentiles chose 50 and 99
    assert rows["Duration (s)"] == "12.50"
    assert rows["Total input tokens"] == "1,200"
    assert rows["Policy"] == "MC-SF"
    assert rows["Mean TPOT (ms)"] == "-"  # not in this summary


def test_under_unit_time_the_block_speaks_in_rounds(tmp_path):
    text = human_summary({**SUMMARY, "mean_latency": 4.0, "time_unit": "rounds"}, tmp_path)
    assert "Mean TTFT (rounds):" in text and "Request throughput (req/round):" in text
    assert "0.55" in text.split("Mean TTFT (rounds):")[1].splitlines()[0]


def job(policy: str, seed: int, ttft_s: float) -> SweepJob:
    summary = {"status": "completed", "n_requests": 2, "n_completed": 2, "mean_ttft": ttft_s,
               "config": {"policy": {"_target_": f"policies.{policy}"}}}
    return SweepJob(summary, f"policy={policy}")


def test_the_sweep_tables_name_units_and_give_mean_and_interval_over_seeds():
    jobs = {"a0": job("fcfs.FCFS", 0, 0.1), "a1": job("fcfs.FCFS", 1, 0.2),
            "b0": job("mcsf.MCSF", 0, 0.3), "b1": job("mcsf.MCSF", 1, 0.3)}
    per_job, per_configuration = sweep_tables(jobs)
    assert per_job["TTFT mean (ms)"].tolist() == pytest.approx([100, 200, 300, 300])
    assert "throughput (req/s)" in per_job.columns
    # Two seeds: mean 150 ms, half-width t(0.975, 1) * 50 / 1 = 12.706 * 50 = 635.31.
    assert per_configuration["seeds"].tolist() == [2, 2]
    assert per_configuration["TTFT mean (ms)"].tolist() == ["150.00 ± 635.31", "300.00 ± 0.00"]
    assert "mean ± 95 % interval over seeds" in sweep_text(jobs)


def test_a_sweep_of_one_seed_per_configuration_has_no_interval_table():
    _, per_configuration = sweep_tables({"a": job("fcfs.FCFS", 0, 0.1)})
    assert per_configuration is None


@pytest.mark.parametrize("value", ["[]", "[101]", "[-1]", "[true]", "50"])
def test_percentiles_must_be_a_list_of_numbers_from_0_to_100(value):
    with pytest.raises(ConfigError, match=r"output.percentiles=.* it must be a list of "
                                          r"percentiles"):
        validate_config(compose_config([f"output.percentiles={value}"]))


def test_the_kv_plot_labels_a_run_by_its_policy():
    from replay.plots import run_label

    summary = {"status": "livelock", "config": {"policy": {"_target_": "policies.mcsf.MCSF"}}}
    assert run_label(summary) == "MC-SF (livelock)"
