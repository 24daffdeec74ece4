"""``python -m replay.engine_check``: the log is read as the peer reads it, the helpers on
hand-made series, bad input as one ``error:`` line, and (slow) a whole check."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from policies.vllm_v1 import VLLMV1
from replay import engine_check
from replay.config.cli import run_or_exit
from replay.engine.overflow import EvictLIFO
from tests.conftest import DATA_DIR, replay

LOGS = DATA_DIR / "vllm_logs" / "llmservingsim"
GPUS = ("RTX4090", "RTXPRO6000")


def log_dir(gpu: str):
    folder = LOGS / gpu / "Llama-3.1-8B"
    if not folder.is_dir():
        pytest.skip(f"{folder} not present (set KVSCHED_DATA_DIR)")
    return folder


def published(summary_path) -> dict[str, tuple[float, float]]:
    """The (vLLM, Sim) columns of a validation/summary.txt, by our row keys."""
    rows = {}
    for line in summary_path.read_text().splitlines():
        match = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([\d.]+)\s+([\d.]+)",
                         line)
        if match:
            key = f"{match[1].lower()}_{match[2].lower()}"
            rows[key] = (float(match[3]), float(match[4]))
    return rows


@pytest.mark.parametrize("gpu", GPUS)
def test_the_vllm_column_is_the_peers(gpu):
    # The vLLM side of the table, computed from requests.jsonl, is the vLLM column of the
    # peer's own summary.txt to its printed precision.
    folder = log_dir(gpu)
    run = engine_check.read_run(folder)
    r = run.requests
    reference = engine_check.latencies_ms(r["arrival"], r["first_token"], r["last_token"],
                                          r["output_toks"])
    table = engine_check.comparison(reference, reference)
    theirs = published(folder / "validation" / "summary.txt")
    assert len(theirs) == 15
    for row in table.itertuples():
        assert abs(row.vllm - theirs[row.key][0]) <= 0.05 + 1e-9, row.key
    assert run.anchor == "queued_ts"  # arrival_time is on the wall clock in these logs


def test_the_preemption_bound_counts_every_rise():
    assert engine_check.preemption_bound(np.array([0, 2, 1, 3, 3, 0, 1])) == 5
    assert engine_check.preemption_bound(np.array([0, 0])) == 0


def test_the_replays_series_follow_its_steps():
    # The preemption case of tests/test_vllm_v1.py: after step 13 (ending at 14), A runs, B
    # (preempted) and C wait.
    result = replay([7, 7, 1], [20, 20, 1], VLLMV1(EvictLIFO(), reserved_blocks=0), 40,
                    arrival=[0, 0, 13], block_size=4, preemption="recompute")
    series = engine_check.replay_series(result, np.array([0.0, 0.0, 13.0]),
                                        np.array([1.0, 14.0, 28.0]), 40)
    assert series["running"].tolist() == [2, 1, 0]
    assert series["waiting"].tolist() == [0, 2, 0]
    assert series["preempted_waiting"].tolist() == [0, 1, 0]
    assert series["kv_pct"].tolist()[0] == 100 * 16 / 40


def test_the_logs_clocks_are_aligned_by_the_waiting_requests():
    # 300 requests over 30 s, each waiting up to 3 s; the stat logger's clock runs 0.5 s
    # ahead of the requests' clock.
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 30, 300))
    scheduled = arrival + rng.uniform(0, 3, 300)
    requests = pd.DataFrame({"arrival": arrival, "scheduled": scheduled})
    ticks = np.arange(1.0, 35.0)
    waiting = engine_check._unscheduled(arrival, scheduled, ticks - 0.5)
    run = engine_check.LoggedRun(
        folder=None, requests=requests, anchor="queued_ts", model="m", tensor_parallel=1,
        max_num_seqs=1, max_num_batched_tokens=1, kv_blocks=None, block_size=None,
        gpu_memory_utilization=None, prefix_caching=True, gpu=None, files=[],
        timeseries=pd.DataFrame({"t": ticks, "running": 0, "waiting": waiting}))
    assert engine_check.clock_offset(run) == pytest.approx(0.5, abs=0.1)


def test_a_kv_column_of_zeros_while_requests_run_was_not_recorded():
    requests = pd.DataFrame({"arrival": [0.0, 0.5], "scheduled": [0.1, 0.6]})
    series = pd.DataFrame({"t": [1.0, 2.0], "running": [2, 1], "waiting": [0, 0],
                           "kv_cache_pct": [0.0, 0.0]})
    run = engine_check.LoggedRun(
        folder=None, requests=requests, anchor="queued_ts", model="m", tensor_parallel=1,
        max_num_seqs=1, max_num_batched_tokens=1, kv_blocks=None, block_size=None,
        gpu_memory_utilization=None, prefix_caching=True, gpu=None, files=[], timeseries=series)
    assert engine_check.log_series(run, 0.0)["kv_pct"].isna().all()
    series["kv_cache_pct"] = [40.0, 20.0]
    assert engine_check.log_series(run, 0.0)["kv_pct"].tolist() == [40.0, 20.0]


# ------------------------------------------------------------------------- bad input
def copy_log(tmp_path, gpu: str = "RTX4090", lines: int = 3, edit=None, meta_edit=None):
    source = log_dir(gpu)
    folder = tmp_path / "run"
    (folder / "vllm").mkdir(parents=True)
    rows = (source / "vllm" / "requests.jsonl").read_text().splitlines()[:lines]
    if edit:
        rows = edit(rows)
    (folder / "vllm" / "requests.jsonl").write_text("\n".join(rows) + "\n")
    meta = json.loads((source / "vllm" / "meta.json").read_text())
    if meta_edit:
        meta_edit(meta)
    (folder / "vllm" / "meta.json").write_text(json.dumps(meta))
    return folder


def error_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        engine_check.main([str(a) for a in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def drop_field(rows):
    record = json.loads(rows[1])
    del record["output_toks"]
    return [rows[0], json.dumps(record), *rows[2:]]


def test_a_request_without_a_field_is_named_by_line(tmp_path, capsys):
    folder = copy_log(tmp_path, edit=drop_field)
    assert error_of(capsys, folder).endswith("requests.jsonl: line 2: missing field 'output_toks'")


def test_a_line_that_is_not_json_is_named(tmp_path, capsys):
    folder = copy_log(tmp_path, edit=lambda rows: [rows[0], "{oops", *rows[2:]])
    assert "requests.jsonl: line 2: not valid JSON" in error_of(capsys, folder)


def test_meta_without_the_engines_arguments_is_named(tmp_path, capsys):
    folder = copy_log(tmp_path, meta_edit=lambda m: m["engine_kwargs"].pop("max_num_seqs"))
    assert error_of(capsys, folder).endswith(
        "meta.json: engine_kwargs: missing field 'max_num_seqs'")


def test_a_model_without_a_config_is_an_error(tmp_path, capsys):
    folder = copy_log(tmp_path, meta_edit=lambda m: m.update(model="acme/Unknown-1B"))
    message = error_of(capsys, folder)
    assert "'acme/Unknown-1B', which no model config has" in message
    assert "meta-llama/Llama-3.1-8B (llama3_1_8b)" in message


def test_a_run_that_records_no_gpu_needs_hardware(tmp_path, capsys):
    folder = copy_log(tmp_path, meta_edit=lambda m: m.pop("hardware"))
    assert "records no GPU" in error_of(capsys, folder)


def test_a_gpu_the_kernel_database_lacks_is_an_error(tmp_path, capsys):
    folder = copy_log(tmp_path)
    message = error_of(capsys, folder, "--timing", "aiconfigurator")
    assert "kernel database" in message and "rtx_pro_6000_server" in message


def test_a_profile_folder_of_another_model_is_an_error(tmp_path, capsys):
    folder = copy_log(tmp_path)
    profile = tmp_path / "profile"
    source = DATA_DIR / "llmservingsim_perf" / "RTX4090" / "meta-llama" / "Llama-3.1-8B"
    shutil.copytree(source, profile)
    meta = profile / "bf16" / "meta.yaml"
    meta.write_text(meta.read_text().replace("model: meta-llama/Llama-3.1-8B",
                                             "model: Qwen/Qwen3-8B"))
    message = error_of(capsys, folder, "--profile-dir", profile)
    assert "is of 'Qwen/Qwen3-8B', not 'meta-llama/Llama-3.1-8B'" in message


# ------------------------------------------------------------------------ a whole check
@pytest.mark.slow
def test_a_whole_check_prints_the_table_and_ends_with_one_json_line(tmp_path, capsys):
    folder = log_dir("RTXPRO6000")
    engine_check.main([str(folder), "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(lines[-1])
    assert list(rows) == [f"{m}_{s}" for m, _ in engine_check.METRICS
                          for s, _ in engine_check.STATISTICS]
    for key, row in rows.items():
        assert set(row) == {"vllm", "kvsched", "diff_pct"}
        assert row["diff_pct"] == pytest.approx((row["kvsched"] - row["vllm"]) / row["vllm"]
                                                * 100, abs=2e-3), key
    assert lines[0].split() == ["Metric", "vLLM", "kvsched", "Diff%"]
    assert any(line.startswith("preemptions: kvsched 0 ") for line in lines)
    for name in ("comparison.csv", "requests.csv", "timeseries.csv", "timeseries.png",
                 "summary.json"):
        assert (tmp_path / "out" / name).is_file()


def test_the_prefix_cache_follows_the_log_and_vllms_default(tmp_path, capsys):
    def recorded(value):
        def edit(meta):
            meta["kv_cache"]["enable_prefix_caching"] = value
        return edit
    for value, expected in ((True, True), (False, False)):
        folder = copy_log(tmp_path / str(value), meta_edit=recorded(value))
        assert engine_check.read_run(folder).prefix_caching is expected
    folder = copy_log(tmp_path / "unrecorded", meta_edit=lambda meta: meta.pop("kv_cache"))
    run = engine_check.read_run(folder)
    assert run.prefix_caching  # vLLM 0.19's default
    assert "kv.prefix_cache=block_hash" in engine_check.overrides_for(run, "layer_profile")
    folder = copy_log(tmp_path / "text", meta_edit=recorded("yes"))
    with pytest.raises(SystemExit) as stop:
        run_or_exit(engine_check.read_run, folder)
    assert stop.value.code == 2
    assert "enable_prefix_caching' must be true or false, got 'yes'" in capsys.readouterr().err
