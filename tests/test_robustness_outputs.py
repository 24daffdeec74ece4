"""Issue 32: write failures are one ``error:`` line, resumes verify their tables, records
agree with results (classes 2, 3 and 6).

The disk-full and read-only cases mount a small tmpfs; where the platform does not allow
that (not root, no mount), they are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from replay.errors import InputError, OutputError
from replay.storage.outputs import (
    atomic_write,
    atomic_write_text,
    ensure_writable_dir,
    summary_json,
    verify,
)
from tests.test_cli import last_json, run_cli
from tests.test_resume_integrity import csv_run, finished_run, module


@contextlib.contextmanager
def tmpfs(where: Path, *options: str):
    """A 64 KiB tmpfs mounted at ``where`` (``ro`` among ``options`` for a read-only one)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a full or read-only disk) needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(["size=64k", *options]),
                           "tmpfs", str(where)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def one_error_line(done: subprocess.CompletedProcess, fragment: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], done.stderr


# ------------------------------------------------------------ atomic_write contract
def test_atomic_write_records_size_and_hash_and_verify_checks_them(tmp_path):
    path = tmp_path / "a" / "b.txt"
    record = atomic_write_text(path, "hello\n")
    assert record["bytes"] == 6 and len(record["sha256"]) == 64
    assert record["path"] == str(path.resolve())
    assert verify(path, record)
    path.write_text("hellO\n")  # same size, other bytes
    assert not verify(path, record)
    path.write_text("hel")
    assert not verify(path, record)
    path.unlink()
    assert not verify(path, record)


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_a_file_in_the_way_is_an_output_error_and_leaves_nothing(tmp_path, where):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    target = blocker if where == "file" else blocker / "sub" / "t.txt"
    with pytest.raises(OutputError) as caught:
        atomic_write_text(target / "t.txt" if where == "file" else target, "data")
    assert isinstance(caught.value, InputError) and isinstance(caught.value, OSError)
    assert str(caught.value).startswith("cannot write ")
    assert f"a file is in the way: {blocker}" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    with pytest.raises(OutputError):
        ensure_writable_dir(blocker / "run")


def test_a_failing_writer_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "t.txt"
    atomic_write_text(path, "old")

    def full(tmp):
        tmp.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device, ENOSPC"):
        atomic_write(path, full)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path):
    with tmpfs(tmp_path / "full") as full:
        done = run_cli("workload.n=2000", "arrivals=all_at_once", "timing=unit",
                       f"hydra.run.dir={full}/run")
        one_error_line(done, "No space left on device")
        assert f"cannot write {full}/run/" in done.stderr
        left = sorted(p.name for p in (full / "run").iterdir())
        assert not [name for name in left if name.endswith(".tmp")], left
        assert "summary.json" not in left


@pytest.mark.slow
def test_a_reproduction_onto_a_full_disk_is_one_line(tmp_path):
    """Issue 45 item 5: the sweep's worker and the reproduction's own records both met the
    full disk with a traceback."""
    with tmpfs(tmp_path / "full") as full:
        done = module("replay.reproduce", "c3", "--outputs", str(full / "out"))
        one_error_line(done, "(No space left on device, ENOSPC; free space or choose another "
                             "folder)")
        assert f"cannot write {full}/out" in done.stderr


@pytest.mark.slow
def test_a_read_only_folder_is_one_line(tmp_path):
    _, out = finished_run(tmp_path)
    with tmpfs(tmp_path / "ro", "ro") as ro:
        one_error_line(run_cli("workload.n=20", f"hydra.run.dir={ro}/run"),
                       f"cannot write {ro}/run (Read-only file system")
        one_error_line(module("replay.results", "collect", str(out),
                              "--out", str(ro / "t.parquet")), "Read-only file system")


@pytest.mark.parametrize("run_dir", ["{afile}", "{afile}/run", "/proc/kvsched/run"])
def test_an_unwritable_run_folder_is_one_line_before_hydra_writes(tmp_path, run_dir):
    afile = tmp_path / "afile"
    afile.write_text("x")
    path = run_dir.format(afile=afile)
    one_error_line(run_cli("workload.n=20", f"hydra.run.dir={path}"), f"cannot write {path}")
    one_error_line(run_cli("-m", "workload.n=20", f"hydra.sweep.dir={path}"),
                   f"cannot write {path}")
    assert afile.read_text() == "x"


@pytest.mark.slow
def test_results_collect_out_under_a_file_is_one_line(tmp_path):
    trace, out = finished_run(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_error_line(module("replay.results", "collect", str(out), "--out",
                          str(afile / "t.parquet")), f"a file is in the way: {afile}")


# ----------------------------------------------------------- class 2: verified resume
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "same_size"])
def test_a_damaged_table_is_recomputed_not_reused(tmp_path, damage):
    trace, out = finished_run(tmp_path)
    table = out / "requests.parquet"
    good = table.read_bytes()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["output_files"]["requests.parquet"]["bytes"] == len(good)
    if damage == "truncate":
        table.write_bytes(good[:100])
    else:
        table.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    again = csv_run(trace, out)
    assert again.returncode == 0, again.stderr
    log = again.stderr + again.stdout
    assert "recomputing" in log and "requests.parquet" in log
    assert table.read_bytes() == good


@pytest.mark.slow
def test_an_intact_run_is_still_reused(tmp_path):
    trace, out = finished_run(tmp_path)
    again = csv_run(trace, out)
    assert again.returncode == 0, again.stderr
    assert "skipping" in again.stderr + again.stdout


@pytest.mark.slow
def test_a_sweep_resume_recomputes_a_truncated_table(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "workload.n=20", "seed=0,1", f"hydra.sweep.dir={sweep}",
            "hydra.launcher.n_jobs=1"]
    assert run_cli(*args).returncode == 0
    table = sweep / "seed=0,workload.n=20" / "requests.parquet"
    good = table.read_bytes()
    table.write_bytes(good[:100])
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert table.read_bytes() == good


# ------------------------------------------------------- class 6: records agree
def test_a_refused_run_leaves_the_folder_records_alone(tmp_path):
    trace, out = finished_run(tmp_path)
    before = {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()}
    log = (out / "app.log").read_bytes()
    refused = csv_run(trace, out, "policy=mcsf")
    one_error_line(refused, "holds a run of another config")
    assert {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()} == before
    assert (out / "app.log").read_bytes() == log


def test_summary_json_has_no_infinity_and_says_what_was_not_finite():
    text = summary_json({"a": 1.5, "fluid": {"boundary": float("inf"), "r": [1.0, float("nan")]}})
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["fluid"] == {"boundary": None, "r": [1.0, None]}
    assert data["non_finite"] == {"fluid.boundary": "inf", "fluid.r[1]": "nan"}
    same = {"x": [1, 2.5], "y": "z", "n": None}
    assert summary_json(same) == json.dumps(same, indent=1, default=str)


@pytest.mark.slow
def test_an_infinite_stability_boundary_is_null_in_summary_json(tmp_path):
    out = tmp_path / "run"
    done = run_cli("policy=wait", "workload=typed", "arrivals=trace", "timing=unit",
                   "workload.time_unit=rounds", "workload.duration_s=5",
                   "workload.types=[{prompt_len:2,output_len:3,rate:1}]",
                   f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr
    text = (out / "summary.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    summary = json.loads(text)
    assert summary["fluid"]["rate_scale_at_boundary"] is None
    assert summary["non_finite"]["fluid.rate_scale_at_boundary"] == "inf"
    assert last_json(done.stdout)["status"] == "completed"
