"""Results that can be trusted after crashes and edits (issue: resume integrity).

Each case drives the command line (exit status and message), not internals.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replay.storage.outputs import append_row, drop_partial_last_row
from tests.test_cli import last_json, run_cli

#: Slow (subprocess runs per resume case):
#: CI runs it, and so does `pytest -m slow`.
pytestmark = pytest.mark.slow

TRACE = "prompt,output\n3,4\n5,2\n2,6\n"


def finished_run(tmp_path):
    """``(trace, out)``: the three-request trace written and run once into ``out``."""
    trace, out = tmp_path / "trace.csv", tmp_path / "run"
    trace.write_text(TRACE)
    first = csv_run(trace, out)
    assert first.returncode == 0, first.stderr
    return trace, out


def csv_run(trace, out, *extra):
    return run_cli("workload=csv", f"workload.path={trace}", "workload.prompt_column=prompt",
                   "workload.output_column=output", "arrivals=all_at_once", "timing=unit",
                   f"hydra.run.dir={out}", *extra)


def test_a_changed_input_file_is_recomputed_not_reused(tmp_path):
    trace, out = tmp_path / "trace.csv", tmp_path / "run"
    trace.write_text(TRACE)
    first = csv_run(trace, out)
    assert first.returncode == 0, first.stderr
    assert last_json(first.stdout)["n_requests"] == 3
    trace.write_text(TRACE + "4,4\n")
    second = csv_run(trace, out)
    assert second.returncode == 0, second.stderr
    assert last_json(second.stdout)["n_requests"] == 4
    assert "input files changed" in second.stderr + second.stdout
    assert json.loads((out / "summary.json").read_text())["n_requests"] == 4


def test_a_truncated_summary_is_recomputed(tmp_path):
    trace, out = finished_run(tmp_path)
    text = (out / "summary.json").read_text()
    (out / "summary.json").write_text(text[: len(text) // 2])
    again = csv_run(trace, out)
    assert again.returncode == 0, again.stderr
    assert "unreadable" in again.stderr + again.stdout
    assert json.loads((out / "summary.json").read_text())["n_requests"] == 3


def test_a_folder_holding_another_config_is_refused_unless_overwrite(tmp_path):
    trace, out = finished_run(tmp_path)
    refused = csv_run(trace, out, "policy=mcsf")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error:") and str(out) in refused.stderr
    assert "Traceback" not in refused.stderr
    replaced = csv_run(trace, out, "policy=mcsf", "output.overwrite=true")
    assert replaced.returncode == 0, replaced.stderr
    assert "MCSF" in json.loads((out / "summary.json").read_text())["config"]["policy"][
        "_target_"]


def test_a_reused_folder_keeps_no_table_of_an_older_run(tmp_path):
    trace, out = finished_run(tmp_path)
    assert (out / "requests.parquet").is_file()
    again = csv_run(trace, out, "output.request_table=false", "output.overwrite=true")
    assert again.returncode == 0, again.stderr
    assert not (out / "requests.parquet").exists()
    assert (out / "iterations.parquet").is_file()


def test_a_missing_table_makes_the_run_recompute(tmp_path):
    trace, out = finished_run(tmp_path)
    (out / "iterations.parquet").unlink()
    again = csv_run(trace, out)
    assert again.returncode == 0 and (out / "iterations.parquet").is_file()


def test_rows_are_appended_whole_and_a_partial_last_row_is_dropped(tmp_path):
    path = tmp_path / "rows.csv"
    for k in range(3):
        append_row(path, {"a": k, "b": k * k}, ["a", "b"])
    assert not drop_partial_last_row(path)
    with path.open("a") as fh:
        fh.write("3,")  # an interrupted write
    assert drop_partial_last_row(path)
    append_row(path, {"a": 4, "b": 16}, ["a", "b"])
    table = pd.read_csv(path)
    assert table["a"].tolist() == [0, 1, 2, 4] and table["b"].tolist() == [0, 1, 4, 16]


def test_a_multirun_goes_on_past_a_failed_job_and_exits_non_zero(tmp_path):
    proc = run_cli("-m", "experiment=c3_example", "engine.requeue=front,sideways",
                   f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 1
    assert "1 of 2 jobs" in proc.stderr and "Traceback" not in proc.stderr
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    assert sorted(s["status"] for s in summaries) == ["completed", "error"]
    error = next(s for s in summaries if s["status"] == "error")
    assert "engine.requeue" in error["message"] and error["partial"]


#: Eight (s=10, o=80) requests fit alpha-protection's admission at M = 100 but not their
#: growth: clear-all restores the same state forever (tests/test_engine_cases.py).
LIVELOCK = ("workload=fixed", "workload.groups=[{count:8,prompt_len:10,output_len:80}]",
            "kv.tokens=100", "timing=unit", "arrivals=all_at_once", "policy=protection",
            "policy.alpha=0.1")


def test_livelock_is_marked_partial_and_fails_a_sweep_only_when_asked(tmp_path):
    single = run_cli(*LIVELOCK, f"hydra.run.dir={tmp_path / 'one'}")
    assert single.returncode == 0
    assert (last_json(single.stdout)["status"], last_json(single.stdout)["partial"]) == (
        "livelock", True)
    lenient = run_cli("-m", *LIVELOCK, "seed=0,1", f"hydra.sweep.dir={tmp_path / 'lenient'}")
    assert lenient.returncode == 0, lenient.stderr
    strict = run_cli("-m", *LIVELOCK, "seed=0,1", "output.fail_on=[livelock]",
                     f"hydra.sweep.dir={tmp_path / 'strict'}")
    assert strict.returncode == 1 and "2 of 2 jobs" in strict.stderr


def refused(proc, *fragments):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error:") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_ambiguous_or_empty_traces_are_refused(tmp_path):
    cases = {
        "dup.csv": ("prompt,output,prompt\n3,4,5\n", ["line 1", "'prompt'", "more than once"]),
        "header_only.csv": ("prompt,output\n", ["no requests"]),
        "huge.csv": ("prompt,output\n3,1e19\n", ["line 2", "'output'", "beyond"]),
    }
    for name, (text, fragments) in cases.items():
        trace = tmp_path / name
        trace.write_text(text)
        refused(csv_run(trace, tmp_path / name.replace(".csv", "")), *fragments)


def test_bad_engine_values_and_empty_workloads_are_refused(tmp_path):
    refused(run_cli("engine.livelock_window=-1", f"hydra.run.dir={tmp_path / 'a'}"),
            "engine.livelock_window")
    refused(run_cli("engine.max_steps=0", f"hydra.run.dir={tmp_path / 'b'}"),
            "engine.max_steps")
    refused(run_cli("workload.n=0", f"hydra.run.dir={tmp_path / 'c'}"), "workload.n=0")
    refused(run_cli("arrivals.rate=1e-300", "workload.n=5", f"hydra.run.dir={tmp_path / 'd'}"),
            "arrival")


def test_a_path_valued_sweep_override_cannot_leave_the_sweep_folder(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    sweep = tmp_path / "sweep"
    # The second path climbs out of the working directory (it does not exist: that job
    # fails with an error summary, which is enough to see where its folder went).
    proc = run_cli("-m", "workload=csv", f"workload.path={trace},../../missing/t.csv",
                   "workload.prompt_column=prompt", "workload.output_column=output",
                   "timing=unit", "arrivals=all_at_once", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stderr  # one job failed: the missing file
    jobs = [p.parent for p in tmp_path.rglob("summary.json")]
    assert len(jobs) == 2 and all(job.parent == sweep for job in jobs), jobs


COMMANDS = ["replay", "replay.reproduce", "replay.plots", "replay.bench", "replay.fluid",
            "replay.tools.shapes", "replay.tools.fit_linear", "replay.tools.attention_sources",
            "traces.stats", "traces.fetch", "traces.build"]


def module(name: str, *args: str):
    import subprocess
    import sys

    from tests.conftest import REPO

    return subprocess.run([sys.executable, "-m", name, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, check=False)


# A process per command; the default run checks their help in-process
# (tests/test_docs_match_code.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name):
    done = module(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


@pytest.mark.parametrize(("name", "args", "fragment"), [
    ("replay.plots", ["kv", "/nonexistent"], "/nonexistent: no such run folder"),
    ("replay.tools.shapes", ["policy=nope"], "policy=nope: no such option"),
    ("replay.tools.shapes", ["data_dir=/nonexistent"], "not found"),
    ("replay.tools.attention_sources", ["data_dir=/nonexistent"], "not found"),
    ("replay.fluid", ["workload=lmsys_synthetic"], "typed workload"),
    ("traces.stats", ["workload=csv", "workload.path=/nonexistent.csv"], "not found"),
    ("replay.reproduce", ["nope"], "nope: no such target"),
])
def test_every_command_answers_bad_input_with_one_line(name, args, fragment):
    done = module(name, *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and fragment in done.stderr
