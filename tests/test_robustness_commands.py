"""Issue 32 class 5: secondary commands answer bad input with one ``error:`` line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replay.errors import InputError
from replay.results import collect, query
from tests.test_resume_integrity import finished_run, module


def two_runs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, first = finished_run(tmp_path / "a")
    _, second = finished_run(tmp_path / "b")
    return first, second


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
    ("replay.timing.fit_linear", ["--batches", "0"], "must be 1..1,000,000"),
])
def test_bad_arguments_are_one_line(name, args, fragment):
    done = module(name, *args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and fragment in done.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["experiment=d4_linear_fit", "study.batches=1000000000000"],
     "study.batches=1000000000000 is not allowed"),
    (["experiment=b_capacity", "study.fractions=[-1]"], "study.fractions: -1 is not allowed"),
    (["experiment=b_capacity", "study.horizons=[0,5]"], "two horizons > 0"),
])
def test_study_sizes_are_bounded_before_any_run(tmp_path, args, fragment):
    done = module("replay", *args, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and fragment in done.stderr
