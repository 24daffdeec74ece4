"""The command line: `python -m replay`, its outputs, determinism, sweeps and resuming."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO


def run_cli(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replay", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, check=False)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# The default run has the same command line in-process (test_engine_cases: C3's TEL) and
# a replay's stdout and stderr in a process (the test below).
@pytest.mark.slow
def test_c3_example_prints_summary_as_last_line_and_writes_tables(tmp_path):
    out = tmp_path / "c3"
    proc = run_cli("experiment=c3_example", "policy=mcsf", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    summary = last_json(proc.stdout)
    assert (summary["status"], summary["tel"], summary["n_completed"]) == ("completed", 64, 22)
    assert summary["kv_mode"] == "explicit" and summary["kv_capacity"] == 64
    for key in ("mean_latency", "p50_latency", "p99_latency", "mean_ttft", "makespan",
                "throughput_tokens_per_s", "evictions", "wall_time_s", "decision_time_s",
                "loop_time_s", "packages", "config", "input_files"):
        assert key in summary
    assert json.loads((out / "summary.json").read_text())["tel"] == 64
    requests = pd.read_parquet(out / "requests.parquet")
    assert {"arrival", "start", "first_token", "completion", "latency", "ttft",
            "evictions"} <= set(requests.columns)
    iterations = pd.read_parquet(out / "iterations.parquet")
    assert {"start_time", "duration", "batch_size", "prefill_tokens", "decode_requests",
            "kv_after"} <= set(iterations.columns)


@pytest.mark.slow
def test_same_config_and_seed_give_identical_outputs(tmp_path):
    args = ("policy=clearing", "kv.tokens=3000", "arrivals.rate=30", "workload.n=300",
            "seed=7")
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert run_cli(*args, f"hydra.run.dir={out}").returncode == 0
    for table in ("requests.parquet", "iterations.parquet"):
        assert pd.read_parquet(first / table).equals(pd.read_parquet(second / table))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (first, second))
    for summary in (a, b):
        # The summary's digest of its own content covers the times too.
        for timing in ("wall_time_s", "decision_time_s", "loop_time_s", "compile_time_s",
                       "summary_sha256"):
            summary.pop(timing)
    assert a == b


@pytest.mark.slow
def test_multirun_sweeps_in_parallel_and_resumes(tmp_path):
    sweep = ("-m", "experiment=c3_example", "policy=fcfs,mcsf",
             "workload.groups=[{count:21,prompt_len:1,output_len:2},"
             "{count:1,prompt_len:63,output_len:1}]", f"hydra.sweep.dir={tmp_path}")
    proc = run_cli(*sweep)
    assert proc.returncode == 0, proc.stderr
    # stdout is the jobs' summaries alone, a JSON object a line (Hydra's launcher lines and
    # the table go to stderr): `| jq .` reads it.
    assert [json.loads(line)["status"] for line in proc.stdout.splitlines()] == ["completed"] * 2
    assert "Launching jobs" in proc.stderr
    # The sweep ends with one table of its jobs, policies by their labels.
    table = proc.stderr[proc.stderr.index("2 jobs in"):].splitlines()
    assert table[1].split()[:3] == ["job", "status", "policy"]
    rows = "\n".join(table[2:4])
    assert "FCFS (MC-Benchmark)" in rows and "MC-SF" in rows
    summaries = sorted(tmp_path.glob("*/summary.json"))
    tels = {p.parent.name: json.loads(p.read_text())["tel"] for p in summaries}
    assert len(tels) == 2
    assert {k.split("policy=")[1].split(",")[0]: v for k, v in tels.items()} == {
        "fcfs": 45, "mcsf": 64}
    stamps = {p: p.stat().st_mtime_ns for p in summaries}
    again = run_cli(*sweep)
    assert again.returncode == 0
    assert "skipping" in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in summaries} == stamps


@pytest.mark.parametrize(("overrides", "says"), [
    (["policy=mscf"], "policy=mscf: no such option in config group 'policy'; choose one of: "
                      "a_min, clearing, fcfs,"),
    # Slow: a process each, for lines the default run checks elsewhere (a sweep's bad option
    # in test_sweeper, an unknown key in-process in test_robustness_config).
    pytest.param(["-m", "policy=fcfs,mscf"], "policy=mscf: no such option",
                 marks=pytest.mark.slow),
    pytest.param(["policy.alphaa=1"], "policy.alphaa: no such config key; the keys there are: "
                 "_target_, overflow (to add a new key, write +policy.alphaa=...)",
                 marks=pytest.mark.slow),
    (["seed=[1"], "override 'seed=[1' is not valid Hydra override syntax"),
])
def test_a_config_that_does_not_compose_is_one_error_line_with_the_choices(
        tmp_path, overrides, says):
    proc = run_cli(*overrides, f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr


@pytest.mark.slow
def test_a_run_prints_a_summary_for_people_on_stderr_and_json_last_on_stdout(tmp_path):
    proc = run_cli("workload.n=50", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["n_completed"] == 50
    block = {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
             for line in proc.stderr.splitlines() if ":" in line}
    assert block["Policy"] == "FCFS (MC-Benchmark)"
    assert block["Completed requests"] == "50 of 50"
    assert block["Run folder"] == str(tmp_path / "run")
    # Every time in ms, whatever its size (vLLM's printout), the median and P90 by default.
    assert block["Mean TTFT (ms)"] == f"{summary['mean_ttft'] * 1e3:,.2f}"
    assert block["Median TPOT (ms)"] == f"{summary['p50_tpot'] * 1e3:,.2f}"
    assert block["P90 E2EL (ms)"] == f"{summary['p90_latency'] * 1e3:,.2f}"
    assert block["Total generated tokens"] == f"{summary['total_output_tokens']:,}"
    # Every field of a whole run's summary is documented (docs/metrics.md).
    from tests.test_docs_match_code import metrics_table

    assert set(summary) <= metrics_table("Per run: `summary.json`")
    again = run_cli("workload.n=50", f"hydra.run.dir={tmp_path / 'run'}")  # logs "skipping"
    assert "skipping" in again.stderr  # log lines go to stderr: stdout is the summary alone
    assert len(again.stdout.strip().splitlines()) == 1


@pytest.mark.slow
def test_bad_input_is_one_error_line_without_traceback(tmp_path):
    impossible = run_cli("kv.tokens=100", f"hydra.run.dir={tmp_path / 'a'}")
    assert impossible.returncode == 2
    assert "exceeds the KV capacity M = 100" in impossible.stderr
    # The run folder keeps the error too.
    assert "exceeds the KV capacity M = 100" in (tmp_path / "a" / "app.log").read_text()
    assert "Traceback" not in impossible.stderr + impossible.stdout
    missing = run_cli("workload=lmsys", f"data_dir={tmp_path / 'nowhere'}",
                      f"hydra.run.dir={tmp_path / 'b'}")
    assert missing.returncode == 2
    assert "file not found" in missing.stderr and "KVSCHED_DATA_DIR" in missing.stderr
    assert "Traceback" not in missing.stderr + missing.stdout
    refused = "is not allowed: it must be a finite number"
    for option, message in (("arrivals.rate=-1", f"arrivals.rate=-1 {refused} (> 0)"),
                            ("policy.alpha=1.5", f"policy.alpha=1.5 {refused} (>= 0 and < 1)")):
        rejected = run_cli("policy=protection", option, f"hydra.run.dir={tmp_path / 'c'}")
        assert rejected.returncode == 2, option
        assert message in rejected.stderr


def test_long_job_folder_names_are_cut_to_a_file_name_with_a_hash_of_the_whole():
    from replay.config import MAX_DIRNAME_BYTES, job_dirname

    overrides = ",".join(f"option_{k}=value_{k}" for k in range(40))
    name = job_dirname(overrides)
    assert len(name.encode()) <= MAX_DIRNAME_BYTES
    assert name.startswith("option_0=value_0,") and name == job_dirname(overrides)
    assert job_dirname(overrides + "x") != name  # differs past the cut: still unique
    assert job_dirname("policy=mcsf,seed=1") == "policy=mcsf,seed=1"  # short names stay


@pytest.mark.slow
def test_new_commands_answer_bad_input_with_one_error_line(tmp_path):
    (tmp_path / "a_file").write_text("in the way")
    for module, args, message in (
            ("replay.reproduce", ["c3", "--quick", "--outputs", str(tmp_path / "a_file" / "o")],
             "cannot write"),
            ("replay.reproduce", ["report", "--outputs", str(tmp_path / "none")],
             "no reproduction outputs to report on"),
            ("replay.crosscheck", ["--n", "0", "--out", str(tmp_path / "x")], "at least 1")):
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                              capture_output=True)
        assert done.returncode == 2, module
        assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "report").exists()  # nothing written for a missing outputs folder


COMMANDS_WITH_FLAGS = ("replay.bench", "replay.compile", "replay.crosscheck", "replay.results",
                       "replay.plots", "replay.reproduce", "replay.engine_check",
                       "replay.experiments.authors", "replay.tools.fit_linear",
                       "replay.tools.shapes", "replay.tools.timing_sources",
                       "replay.tools.attention_sources", "traces.build", "traces.fetch",
                       "traces.stats")


@pytest.mark.parametrize("name", COMMANDS_WITH_FLAGS)
def test_an_unknown_flag_is_one_error_line(name, monkeypatch, capsys):
    # argparse's own answer is its usage block and then a line of its own form.
    import importlib

    monkeypatch.setattr(sys, "argv", [name, "--no-such-flag"])
    with pytest.raises(SystemExit) as ended:
        importlib.import_module(name).main()
    lines = capsys.readouterr().err.splitlines()
    assert ended.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    if name == "traces.stats":  # its arguments are Hydra overrides: the override is named
        assert "'--no-such-flag' is not valid Hydra override syntax" in lines[0]
    else:  # the first problem argparse finds (a required argument missing, or the flag)
        assert lines[0].endswith(f" (see python -m {name} --help)")
