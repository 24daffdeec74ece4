"""One results table: collect run summaries into Parquet, query them with DuckDB."""

from __future__ import annotations

import json

import pytest

from replay.config import compose_config
from replay.errors import InputError
from replay.results import collect, query, run_row
from replay.run import run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for policy in ("fcfs", "mcsf", "sorted_f"):
        out = root / "sweep" / policy
        out.mkdir(parents=True)
        run(compose_config(["experiment=c3_example", f"policy={policy}"]), out)
    (root / "study").mkdir()
    (root / "study" / "summary.json").write_text(json.dumps({"status": "completed",
                                                             "per_distribution": {}}))
    return root


def test_collect_flattens_config_and_metrics_and_leaves_studies_out(runs, tmp_path):
    table = collect([runs], tmp_path / "results.parquet")
    assert len(table) == 3  # the study summary is not a run
    assert {"run_dir", "status", "tel", "config.policy._target_", "config.kv.tokens",
            "policy_info.solver", "prediction.name", "code_version"} <= set(table.columns)


def test_query_answers_sql_over_the_runs(runs, tmp_path):
    collect([runs], tmp_path / "results.parquet")
    answer = query('SELECT policy, "config.policy._target_" AS class, tel FROM runs '
                   'ORDER BY tel, 1', tmp_path / "results.parquet")
    assert answer["tel"].tolist() == [45, 64, 64]
    assert answer["class"].iloc[0] == "policies.sorted_f.SortedF"
    assert answer["policy"].iloc[0] == "Sorted-F (swap)"  # labels, as people read them


def test_bad_queries_and_missing_tables_are_input_errors(runs, tmp_path):
    with pytest.raises(InputError, match="no results table"):
        query("SELECT 1", tmp_path / "missing.parquet")
    collect([runs], tmp_path / "results.parquet")
    with pytest.raises(InputError, match="query failed"):
        query("SELECT nope FROM runs", tmp_path / "results.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no run summaries"):
        collect([tmp_path / "empty"], tmp_path / "x.parquet")


def test_figures_read_the_kept_table_and_ignore_it_once_a_run_is_newer(runs, tmp_path):
    import os

    from replay.experiments.plots.common import sweep_table

    sweep = runs / "sweep"
    gathered = sweep_table(sweep, {"kv": "kv.tokens"}, {"tel": "tel"})
    assert sorted(gathered["tel"]) == [45, 64, 64]
    assert set(gathered["policy"]) == {"FCFS (MC-Benchmark)", "MC-SF", "Sorted-F (swap)"}
    kept = collect([sweep], sweep / "results.parquet")
    # Edit the kept table: the figures must show the table's numbers, not the summaries'.
    kept["tel"] = kept["tel"] + 1000
    kept.to_parquet(sweep / "results.parquet", index=False)
    edited = sweep_table(sweep, {"kv": "kv.tokens"}, {"tel": "tel"})
    assert sorted(edited["tel"]) == [1045, 1064, 1064]
    # A summary newer than the table makes it stale: the summaries are read instead.
    summary = sweep / "fcfs" / "summary.json"
    later = (sweep / "results.parquet").stat().st_mtime + 10
    os.utime(summary, (later, later))
    assert sweep_table(sweep, {"kv": "kv.tokens"}, {"tel": "tel"}).equals(gathered)
    (sweep / "results.parquet").unlink()


@pytest.mark.parametrize(("text", "message"), [
    ("{}", "not a summary (a run's or a study's is a JSON object with its results), got {}"),
    ("[1, 2, 3]", "not a summary (a run's or a study's is a JSON object with its results), "
                  "got [1, 2, 3]"),
    ('{"config": {}, "tel": NaN}', "holds NaN, which a run's summary never does"),
    ("{", "not a readable summary"),
])
def test_a_damaged_summary_is_refused_naming_its_file(tmp_path, text, message):
    # Counted as a study's summary and left out, it went by with only a count.
    path = tmp_path / "summary.json"
    path.write_text(text)
    with pytest.raises(InputError) as refused:
        run_row(path)
    assert str(refused.value).startswith(f"{path}: ") and message in str(refused.value)


def test_a_studys_summary_is_left_out_and_may_hold_nan(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"study": "capacity", "ratio": NaN}')
    assert run_row(path) is None
