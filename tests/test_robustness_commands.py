"""Issue 32 class 5 and issue 45: secondary commands answer bad input with one ``error:``
line, a full disk with one ``cannot write`` line and Ctrl-C with one line."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from replay import plots, reproduce
from replay.config import compose_config
from replay.config.cli import run_or_exit
from replay.crosscheck import crosscheck, parse_arguments
from replay.errors import ConfigError, InputError, OutputError
from replay.plots import finished_run
from replay.results import collect, query
from replay.run import run
from tests.conftest import REPO
from tests.test_resume_integrity import finished_run as finished_cli_run
from tests.test_resume_integrity import module


def two_runs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, first = finished_cli_run(tmp_path / "a")
    _, second = finished_cli_run(tmp_path / "b")
    return first, second


@pytest.mark.slow
def test_an_empty_query_and_a_corrupt_table_are_input_errors(tmp_path):
    first, _ = two_runs(tmp_path)
    table = tmp_path / "t.parquet"
    collect([first], table, quiet=True)
    with pytest.raises(InputError, match="empty"):
        query("  ", table)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(table.read_bytes()[:300])
    with pytest.raises(InputError, match="not a readable results table"):
        query("SELECT count(*) FROM runs", corrupt)
    done = module("replay.results", "query", "", "--table", str(table))
    assert done.returncode == 2 and done.stderr.startswith("error:"), done.stderr


@pytest.mark.slow
def test_a_non_numeric_metric_refuses_its_run_not_the_column(tmp_path, capsys):
    first, second = two_runs(tmp_path)
    summary = json.loads((second / "summary.json").read_text())
    summary["tel"] = "n/a"
    (second / "summary.json").write_text(json.dumps(summary))
    table = collect([tmp_path / "a", tmp_path / "b"], tmp_path / "t.parquet", quiet=True)
    assert len(table) == 1 and pd.api.types.is_numeric_dtype(table["tel"])
    assert "tel = 'n/a' is not a number" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "args", "fragment"), [
    ("replay.bench", ["--n", "-5"], "at least 1"),
    ("replay.bench", ["--repeat", "0"], "at least 1"),
    ("replay.bench", ["--rates", "abc"], "--rates"),
    ("replay.bench", ["--rates", "5,-1"], "--rates"),
    ("traces.stats", ["workload.n=abc"], "workload.n='abc' is not allowed"),
    ("replay.crosscheck", ["--n", "0"], "at least 1"),
    ("replay.tools.fit_linear", ["--batches", "0"], "must be 1..1,000,000"),
    ("replay.tools.fit_linear", ["--seed", "-1"], "--seed: must be 0 or more, got -1"),
    ("replay.tools.shapes", ["--explain", "--experiment", "c3_example"],
     "--explain needs an experiment with request types"),
    ("replay.fluid", ["experiment=b1_wait_low", "fluid_convention=banana"],
     "fluid_convention='banana' is not allowed"),
    ("replay.tools.timing_sources", ["--frameworks", "vllm,nosuch"],
     "--frameworks: nosuch is not one of vllm,sglang,trtllm"),
])
@pytest.mark.slow
def test_bad_arguments_are_one_line(name, args, fragment):
    done = module(name, *args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and fragment in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: ")


@pytest.mark.slow
def test_an_output_folder_that_is_a_file_is_refused_before_the_work(tmp_path):
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("")
    done = module("replay.tools.attention_sources", "--out", str(in_the_way),
                  f"data_dir={tmp_path / 'no_data'}")  # checked before the data is read
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: cannot write {in_the_way} (a file is in the "
                                        f"way: {in_the_way})"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["experiment=d4_linear_fit", "study.batches=1000000000000"],
     "study.batches=1000000000000 is not allowed"),
    (["experiment=b_capacity", "study.fractions=[-1]"], "study.fractions: -1 is not allowed"),
    (["experiment=b_capacity", "study.horizons=[0,5]"], "two horizons > 0"),
])
@pytest.mark.slow
def test_study_sizes_are_bounded_before_any_run(tmp_path, args, fragment):
    done = module("replay", *args, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and fragment in done.stderr


# ------------------------------------------------------------ issue 45 items 5, 6 and 9
def exits(capsys, main, *argv: str, monkeypatch) -> tuple[int, str]:
    """Run a command's ``main`` in this process with ``argv``: its exit status and stderr."""
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as caught:
        main()
    return caught.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "nosuch"], "error: policy=nosuch: no such option in config group 'policy'; "
                               "choose one of: a_min, clearing, fcfs, "),
    (["--timing", "nosuch"], "error: timing=nosuch: no such option in config group 'timing'; "
                             "choose one of: aiconfigurator, layer_profile, linear, unit, vidur"),
    (["--workload", "nosuch"], "error: workload=nosuch: no such option in config group "
                               "'workload'; choose one of: arxiv, csv, fixed, "),
    (["--scenarios", "nosuch"], "error: argument --scenarios: no scenario 'nosuch'; choose from "
                                "wait_b1_low_linear, wait_b1_high_vidur, nested_b3_550_vidur, "
                                "nested_b4_vidur or all"),
])
def test_bench_names_a_wrong_choice_in_one_line(capsys, monkeypatch, args, message):
    from replay import bench

    code, err = exits(capsys, lambda: run_or_exit(bench.main), *args, monkeypatch=monkeypatch)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1, err


def damaged_runs(tmp_path) -> dict[str, Path]:
    """A finished run and copies of it damaged in each way ``replay.plots kv`` meets."""
    cfg = compose_config(["workload=synthetic", "workload.n=6", "arrivals=all_at_once",
                          "timing=unit", "kv.tokens=200", "engine.fast_forward=false"])
    good = tmp_path / "good"
    run(cfg, good)
    runs = {"good": good, "missing": tmp_path / "missing"}
    for name in ("no_summary", "cut_summary", "cut_table", "no_table", "failed"):
        runs[name] = tmp_path / name
        shutil.copytree(good, runs[name])
    (runs["no_summary"] / "summary.json").unlink()
    text = (good / "summary.json").read_text()
    (runs["cut_summary"] / "summary.json").write_text(text[: len(text) // 2])
    table = good / "iterations.parquet"
    (runs["cut_table"] / "iterations.parquet").write_bytes(table.read_bytes()[:300])
    (runs["no_table"] / "iterations.parquet").unlink()
    (runs["failed"] / "summary.json").write_text(json.dumps(
        {"status": "error", "message": "workload trace: x.csv is empty"}))
    return runs


def test_plots_kv_names_what_is_wrong_with_a_run_folder(tmp_path):
    runs = damaged_runs(tmp_path)
    summary, iterations = finished_run(runs["good"])
    assert summary["status"] == "completed" and len(iterations) == summary["n_iterations"]
    size = (runs["good"] / "iterations.parquet").stat().st_size
    expected = {
        "missing": f"{runs['missing']}: no such run folder",
        "no_summary": f"{runs['no_summary']}: not a finished run (no summary.json)",
        "cut_summary": f"{runs['cut_summary']}/summary.json: not a whole JSON object (damaged, "
                       f"or a run interrupted while writing it)",
        "cut_table": f"{runs['cut_table']}: its iterations.parquet has 300 bytes, {size} were "
                     f"written; run it again",
        "no_table": f"{runs['no_table']}: its iterations.parquet is missing; run it again",
        "failed": f"{runs['failed']}: the run failed, nothing to plot (workload trace: x.csv is "
                  f"empty)",
    }
    for name, message in expected.items():
        with pytest.raises(InputError) as caught:
            finished_run(runs[name])
        assert str(caught.value) == message


def test_plots_kv_on_a_damaged_folder_is_one_line(tmp_path, capsys, monkeypatch):
    runs = damaged_runs(tmp_path)
    code, err = exits(capsys, lambda: run_or_exit(plots.main), "kv", str(runs["good"]),
                      str(runs["cut_table"]), "--out", str(tmp_path / "kv.png"),
                      monkeypatch=monkeypatch)
    assert code == 2 and err.startswith(f"error: {runs['cut_table']}: its iterations.parquet "
                                        f"has 300 bytes") and err.count("\n") == 1, err
    assert not (tmp_path / "kv.png").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["c3", "--results", ".", "--report", "."], "--report, --results: only used by the target "
                                                "`report`, which is not asked for"),
])
def test_reproduce_refuses_options_it_would_ignore(capsys, monkeypatch, argv, message):
    code, err = exits(capsys, reproduce.main, *argv, monkeypatch=monkeypatch)
    assert (code, err) == (2, f"error: {message}\n")


@pytest.mark.parametrize(("argv", "n"), [([], 1000), (["--quick"], 60), (["--n", "7"], 7),
                                          (["--quick", "--n", "7"], 7)])
def test_crosscheck_n_is_the_requests_per_case(argv, n):
    setup, *_ = parse_arguments(argv)
    assert setup.n == n and f"workload.n={n}" in setup.overrides("lmsys", 5.0, "vllm")


def test_a_crosscheck_set_value_meets_the_config_rules_before_any_run(tmp_path):
    # It reached the run unchecked: numpy's 'negative dimensions' traceback.
    setup, *_ = parse_arguments(["--quick", "--set", "workload.n=-1"])
    with pytest.raises(ConfigError, match="workload.n=-1 is not allowed"):
        crosscheck(setup, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_write_the_disk_refuses_is_one_line(capsys):
    def full_disk():
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out/t.parquet")

    with pytest.raises(SystemExit) as caught:
        run_or_exit(full_disk)
    assert caught.value.code == 2
    assert capsys.readouterr().err == ("error: cannot write /data/out/t.parquet (No space left "
                                       "on device, ENOSPC; free space or choose another "
                                       "folder)\n")

    def a_bug():
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(OSError, match="Bad file descriptor"):
        run_or_exit(a_bug)


def test_an_output_error_crosses_a_process_boundary_whole():
    """A sweep worker's full disk reaches the sweep's process by pickling."""
    import pickle

    error = OutputError("/data/out", "No space left on device, ENOSPC")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.path) == (OutputError, str(error), "/data/out")


INTERRUPTED = """
from replay.config.cli import run_or_exit

def work():
    raise KeyboardInterrupt

run_or_exit(run_or_exit, work)
"""


CUT_HALF_WAY = """
import contextlib, sys
from replay.config.cli import run_or_exit

@contextlib.contextmanager
def flag():  # as omegaconf's flag_override, which CI's interrupted traces.stats left open
    try:
        yield
    finally:
        import json  # fails while Python shuts down: "sys.meta_path is None"

def work():
    global left_open
    left_open = flag()
    left_open.__enter__()  # the interrupt came before its __exit__
    raise KeyboardInterrupt

run_or_exit(work)
"""


CLEANUP_FAILS = """
from replay.config.cli import run_or_exit

def work():
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        try:  # as omegaconf's cleanup on the config the interrupt left half-built
            None._invalidate_flags_cache()
        except AttributeError as exc:
            raise ValueError("full_key: defaults") from exc  # wrapped as omegaconf does

run_or_exit(work)
"""


@pytest.mark.parametrize("script", [INTERRUPTED, CUT_HALF_WAY, CLEANUP_FAILS],
                         ids=["plain", "cut-half-way", "cleanup-fails"])
def test_ctrl_c_is_one_line_and_an_interrupted_exit(script):
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, text=True,
                          capture_output=True, timeout=120, check=False)
    # Killed by SIGINT, as Python ends an interrupted program: a shell reports status 130.
    assert done.returncode == -signal.SIGINT
    assert done.stderr == "interrupted (Ctrl-C)\n"


def test_ctrl_c_while_a_command_imports_is_one_line(monkeypatch, capsys):
    """Before a command's ``main`` runs (pandas and numba take a second or more to import),
    no ``run_or_exit`` catches Ctrl-C: the hook its package installs prints the line."""
    from replay import errors
    from replay.errors import report_interrupt, when_run_as_a_command

    monkeypatch.setattr(errors, "_said", False)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])  # imported as a library
    when_run_as_a_command()
    assert sys.excepthook is sys.__excepthook__
    monkeypatch.setattr(sys, "argv", ["-m", "workload=lmsys"])  # by `python -m traces.stats`
    when_run_as_a_command()
    assert sys.excepthook is report_interrupt
    report_interrupt(KeyboardInterrupt, KeyboardInterrupt(), None)
    report_interrupt(KeyboardInterrupt, KeyboardInterrupt(), None)  # passing the hook again
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"
    assert sys.unraisablehook is errors._ignore  # nothing more once the line is out
    try:
        raise ValueError("a bug")
    except ValueError as exc:
        report_interrupt(ValueError, exc, exc.__traceback__)
    assert "Traceback" in capsys.readouterr().err  # a bug keeps its traceback


LOST_IN_A_CALLBACK = """
import ctypes, sys, time
{installed}


def callback():  # as llvmlite's, while numba compiles, when Ctrl-C lands in it
    raise KeyboardInterrupt

ctypes.CFUNCTYPE(None)(callback)()
time.sleep(30)
print("not interrupted")
"""


AFTER_THE_WORK = """
import atexit, os, signal, sys, time
sys.argv = ["-m"]  # as Python imports a package for `python -m`
from replay.errors import when_run_as_a_command
when_run_as_a_command()

def closing():  # as tqdm's monitor thread's atexit callback, where CI's Ctrl-C landed
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)

atexit.register(closing)
"""


def test_ctrl_c_while_a_finished_command_ends_is_one_line_too():
    # Found by interrupting replay.engine_check just as it finished: the interrupt landed in
    # an atexit callback, was sent again and killed the process without a word.
    done = subprocess.run([sys.executable, "-c", AFTER_THE_WORK], cwd=REPO, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGINT
    assert done.stderr == "interrupted (Ctrl-C)\n"


#: How a process gets its hooks: a command's own, on import; a sweep's worker (joblib's,
#: say, whose ``sys.argv`` is not ``-m``), from the job it runs (``replay.app.replay_job``).
AS_A_COMMAND = """
sys.argv = ["-m"]  # as Python imports a package for `python -m`
from replay.errors import when_run_as_a_command
when_run_as_a_command()
"""
AS_A_SWEEP_WORKER = """
from replay.errors import resend_interrupts_lost_in_callbacks
resend_interrupts_lost_in_callbacks()
"""


@pytest.mark.parametrize("installed", [AS_A_COMMAND, AS_A_SWEEP_WORKER])
def test_ctrl_c_inside_a_c_callback_still_stops_the_process(installed):
    # Found by interrupting a sweep while numba compiled: Python printed the callback's
    # traceback as "Exception ignored" and the interrupt was lost. CI found it again in a
    # sweep's worker process, which had no hook.
    started = time.monotonic()
    script = LOST_IN_A_CALLBACK.format(installed=installed)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGINT, done.stdout
    assert time.monotonic() - started < 20  # at once, not after the 30 s the script sleeps
    assert "Exception ignored" not in done.stderr
    if installed is AS_A_COMMAND:  # a worker ends as its launcher has it; the sweep says the line
        assert done.stderr == "interrupted (Ctrl-C)\n"


#: Commands whose entry is not this project's one error path: ``replay`` (its app catches
#: the same errors itself), the LP worker (a child process, silent by design) and the
#: crosscheck's Vidur process (a child whose last stderr line the crosscheck reports as its
#: own one-line error; it stays clear of Hydra so that Vidur's whole process is not
#: charged for kvsched's imports).
ENTRY_EXCEPTIONS = {"replay/__main__.py", "replay/bounds/lp_worker.py",
                    "replay/crosscheck_vidur.py"}


def test_every_command_enters_through_the_one_error_path():
    for path in sorted([*REPO.glob("replay/**/*.py"), *REPO.glob("traces/*.py")]):
        relative = path.relative_to(REPO).as_posix()
        text = path.read_text()
        if 'if __name__ == "__main__":' not in text or relative in ENTRY_EXCEPTIONS:
            continue
        entry = text.split('if __name__ == "__main__":', 1)[1]
        assert "run_or_exit(main)" in entry, f"{relative}: its __main__ block bypasses run_or_exit"


# ------------------------------------------------------------------- issue 45 item 7
SMALL = ["workload=synthetic", "workload.n=6", "arrivals=all_at_once", "timing=unit",
         "kv.tokens=200", "engine.fast_forward=false"]

USER_POLICIES = '''
from dataclasses import dataclass

from replay.engine.policy import Batch, OverflowRule


@dataclass
class ReturnsNone:
    overflow: OverflowRule

    def decide(self, view):
        return None


@dataclass
class ReturnsText:
    overflow: OverflowRule

    def decide(self, view):
        return "start all"


@dataclass
class Raises:
    overflow: OverflowRule

    def decide(self, view):
        if view.iteration >= 2:
            raise ValueError(f"my bug at iteration {view.iteration}")
        return Batch(start=view.waiting[:1])
'''


@pytest.fixture
def user_policies(tmp_path, monkeypatch) -> Path:
    """A folder holding ``user_policies.py`` (three broken policies), on ``sys.path``."""
    (tmp_path / "user_policies.py").write_text(USER_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("name", "returned"), [("ReturnsNone", "NoneType None"),
                                                ("ReturnsText", "str 'start all'")])
def test_a_decision_that_is_not_a_batch_names_the_policy_and_what_it_returned(
        user_policies, name, returned):
    from replay.engine.rules import DecisionError

    cfg = compose_config([*SMALL, "policy=fcfs", f"policy._target_=user_policies.{name}"])
    with pytest.raises(DecisionError) as caught:
        run(cfg, user_policies / "run")
    assert str(caught.value) == (f"{name}.decide returned {returned}, not a "
                                 f"replay.engine.policy.Batch")
    assert not (user_policies / "run" / "summary.json").exists()


def test_a_failed_sweep_job_leaves_its_summary_and_one_line(user_policies, capsys):
    from replay.app import _failed_job

    cfg = compose_config([*SMALL, "policy=fcfs", "policy._target_=user_policies.Raises"])
    job = user_policies / "job"
    job.mkdir()
    with pytest.raises(ValueError) as caught:
        run(cfg, job)
    summary = _failed_job(cfg, job, caught.value)
    assert json.loads((job / "summary.json").read_text()) == summary
    assert (summary["status"], summary["message"], summary["partial"]) == (
        "failed", "ValueError: my bug at iteration 2 (traceback in app.log)", True)
    assert summary["config"]["policy"]["_target_"] == "user_policies.Raises"
    out, err = capsys.readouterr()
    assert err == f"error: {job}: the job failed: ValueError: my bug at iteration 2 (traceback " \
                  f"in its app.log)\n"
    assert json.loads(out) == summary  # stdout: the job's summary, as every job prints


def test_the_sweep_table_counts_a_failed_job(tmp_path, capsys):
    from omegaconf import OmegaConf

    from replay.app import SweepReport

    for name, status in (("a", "completed"), ("b", "failed"), ("c", "error")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"status": status}))
    config = OmegaConf.create({"output": {"fail_on": []}, "hydra": {"sweep": {"dir": str(
        tmp_path)}}})
    with pytest.raises(SystemExit) as caught:
        SweepReport().on_multirun_end(config)
    err = capsys.readouterr().err
    assert caught.value.code == 1 and err.startswith(f"3 jobs in {tmp_path}:\n")
    assert err.splitlines()[-1] == (f'error: 2 of 3 jobs in {tmp_path} failed ({{"error": 1, '
                                    f'"failed": 1}}); their summary.json says why')


@pytest.mark.slow
def test_a_sweep_records_a_job_whose_policy_raised_and_still_prints_its_table(user_policies):
    import os

    sweep = user_policies / "sweep"
    command = [sys.executable, "-m", "replay", "-m", *SMALL, "policy=fcfs",
               "policy._target_=user_policies.Raises,policies.fcfs.FCFSLookahead",
               f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(user_policies), os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):  # and a resume runs the failed job again, reusing the other
        done = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=300, check=False)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        failed = next(sweep.glob("*Raises*"))
        assert json.loads((failed / "summary.json").read_text())["status"] == "failed"
        assert "Traceback (most recent call last)" in (failed / "app.log").read_text()
        assert (f"error: {failed}: the job failed: ValueError: my bug at iteration 2 "
                f"(traceback in its app.log)") in done.stderr
        assert f"2 jobs in {sweep}:" in done.stderr
        assert done.stderr.splitlines()[-1] == (f'error: 1 of 2 jobs in {sweep} failed '
                                                f'({{"failed": 1}}); their summary.json says why')
    assert "finished run with the same config" in done.stderr
