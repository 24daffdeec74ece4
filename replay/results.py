"""One results table: ``python -m replay.results collect DIR... [--out FILE]`` and
``python -m replay.results query "SQL" [--table FILE]``.

``collect`` gathers every run's ``summary.json`` under the given folders into one
Parquet file, a row per run: its folder (``run_dir``), status, the scalar metrics
(``mean_latency``, ``tel``, ...), the policy's and predictor's records flattened
(``policy_info.lp_grid``, ``prediction.mean_relative_error``, ...), the resolved
config flattened (``config.policy._target_``, ``config.workload.n``, ...; lists as
JSON text) and the code and package versions. Study summaries (many trials
each, no ``config``) are not runs; their ``trials.csv`` are tables already.

The reproduction targets keep such a table beside their runs (``runs/results.parquet``)
and draw their figures from it (:func:`runs_under`).

``query`` runs DuckDB SQL over that file, exposed as the view ``runs``, e.g.::

    python -m replay.results query "SELECT policy, avg(mean_latency) FROM runs
        WHERE status = 'completed' GROUP BY 1"

``policy`` is the policy's label (``MC-SF``, ``alpha-protection (0.25)``); the class path
is ``config.policy._target_``. Runs with ``metrics.slo`` set have ``slo_attainment``,
``goodput_requests_per_s`` and the objectives (``slo.ttft_ms``, ``slo.tpot_ms``), e.g.::

    python -m replay.results query "SELECT \"config.arrivals.rate\", slo_attainment,
        goodput_requests_per_s FROM runs ORDER BY 1"
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from policies.labels import policy_label
from replay.config.cli import CommandParser, fail, run_or_exit
from replay.errors import InputError
from replay.storage.outputs import atomic_write, read_summary

DEFAULT_TABLE = Path("outputs/results.parquet")
#: Nested summary records flattened into columns (the rest stay out of the table).
FLATTENED = ("policy_info", "prediction", "timing", "packages", "kv", "fluid", "dropped_rows",
             "slo", "engine_path", "prefix_cache")
#: The name of a results table kept beside the runs it holds.
TABLE_NAME = "results.parquet"


def _flatten(record: dict, prefix: str) -> dict:
    flat = {}
    for key, value in record.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def run_row(summary_path: Path) -> dict | None:
    """The table row of one run (``None`` for a study summary: an object without a run's
    ``config``)."""
    non_finite = []
    try:
        summary = json.loads(summary_path.read_text(),
                             parse_constant=lambda name: non_finite.append(name) or float(name))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{summary_path}: not a readable summary ({exc})") from None
    if not isinstance(summary, dict) or not summary:
        raise InputError(f"{summary_path}: not a summary (a run's or a study's is a JSON object "
                         f"with its results), got {json.dumps(summary)[:40]}")
    if "config" not in summary:
        return None
    if non_finite:  # a run writes strict JSON: null, named under non_finite
        raise InputError(f"{summary_path}: holds {non_finite[0]}, which a run's summary never "
                         f"does (it was edited or damaged)")
    row = {"run_dir": str(summary_path.parent.resolve())}
    policy = summary["config"].get("policy") if isinstance(summary["config"], dict) else None
    # What a person reads for the policy (``config.policy._target_`` keeps the class path).
    row["policy"] = policy_label(policy) if isinstance(policy, dict) and "_target_" in policy \
        else None
    for key, value in summary.items():
        if key == "config":
            row.update(_flatten(value, "config"))
        elif key in FLATTENED and isinstance(value, dict):
            row.update(_flatten(value, key))
        elif value is None or isinstance(value, bool | int | float | str):
            row[key] = value
    row["code_version"] = summary.get("packages", {}).get("kvsched")
    return row


def table_of(folders: list[Path]) -> tuple[pd.DataFrame, int]:
    """Every run under ``folders`` as one table (rows in path order), and how many study
    summaries were left out."""
    rows, skipped = [], 0
    for folder in folders:
        if not folder.is_dir():
            raise InputError(f"{folder}: not a folder")
        for path in sorted(folder.rglob("summary.json")):
            row = run_row(path)
            if row is None:
                skipped += 1
            else:
                rows.append(row)
    if not rows:
        raise InputError(f"no run summaries under {', '.join(map(str, folders))}")
    table = pd.DataFrame(rows)
    # A metric (a column outside the config) keeps its type: a run whose value is of another
    # kind (text where the others have numbers) is left out with a warning, not turned into
    # text for every run. Mixed-type config columns (a value that is a number in one run,
    # text in another) become text, so that Parquet has one type per column.
    refused = set()
    for column in table.columns:
        if column.startswith("config.") or column in ("run_dir", "status", "message"):
            continue
        values = table[column].dropna()
        numeric = values.map(lambda v: isinstance(v, int | float) and not isinstance(v, bool))
        if numeric.any() and not numeric.all():
            for i in values.index[~numeric]:
                print(f"warning: {table.at[i, 'run_dir']}/summary.json: {column} = "
                      f"{table.at[i, column]!r} is not a number; run left out of the table",
                      file=sys.stderr)
                refused.add(i)
    if refused:
        table = table.drop(index=sorted(refused)).reset_index(drop=True).infer_objects()
    if table.empty:
        raise InputError(f"no usable run summaries under {', '.join(map(str, folders))}")
    for column in table.columns:
        kinds = set(table[column].dropna().map(type))
        if len(kinds) > 1 and kinds != {int, float}:
            table[column] = table[column].map(lambda v: None if v is None else str(v))
    return table, skipped


def collect(folders: list[Path], out: Path, quiet: bool = False) -> pd.DataFrame:
    """Every run under ``folders`` into one Parquet file at ``out``; returns the table."""
    table, skipped = table_of(folders)
    atomic_write(out, lambda tmp: table.to_parquet(tmp, index=False))
    if not quiet:
        print(f"{len(table)} runs, {len(table.columns)} columns -> {out}"
              + (f" ({skipped} study summaries left out)" if skipped else ""))
    return table


def runs_under(folder: Path) -> pd.DataFrame:
    """The rows of the runs under ``folder``, read from the results table kept in it or in
    its parent (as the reproduction targets keep one), else gathered from the summaries.

    A kept table is used only if no summary under ``folder`` is newer than it.
    """
    folder = folder.resolve()
    for kept in (folder / TABLE_NAME, folder.parent / TABLE_NAME):
        if kept.is_file() and all(p.stat().st_mtime <= kept.stat().st_mtime
                                  for p in folder.rglob("summary.json")):
            table = pd.read_parquet(kept)
            inside = table["run_dir"].map(lambda d: Path(d).is_relative_to(folder))
            return table[inside].dropna(axis=1, how="all").reset_index(drop=True)
    return table_of([folder])[0]


def nested(row: pd.Series, prefix: str) -> dict:
    """The record flattened under ``prefix`` in a table row, nested again (missing values
    left out): ``nested(row, "config.policy")`` is that run's policy config."""
    record: dict = {}
    start = f"{prefix}."
    for column, value in row.items():
        if column.startswith(start) and not pd.isna(value):
            *parents, leaf = column[len(start):].split(".")
            place = record
            for key in parents:
                place = place.setdefault(key, {})
            place[leaf] = value
    return record


#: The sweep table's measures: column name, summary key and whether it is a time (shown in
#: ms, or in rounds under unit time) or a rate (per second, or per round).
SWEEP_MEASURES = (("TTFT mean", "mean_ttft", "time"), ("TTFT p99", "p99_ttft", "time"),
                  ("TPOT mean", "mean_tpot", "time"), ("TPOT p99", "p99_tpot", "time"),
                  ("latency mean", "mean_latency", "time"),
                  ("latency p99", "p99_latency", "time"),
                  ("throughput", "throughput_requests_per_s", "rate"))
#: The 95 % intervals over seeds in the per-configuration table.
LEVEL = 0.95


@dataclass(frozen=True)
class SweepJob:
    """One job of a multirun: its summary and its configuration, the job's overrides
    without ``seed`` (jobs that differ only by seed share it)."""

    summary: dict
    configuration: str


def sweep_jobs(sweep: Path) -> dict[str, SweepJob]:
    """The jobs under a multirun's folder, by folder name, in name order."""
    jobs = {}
    for path in sorted(sweep.glob("*/summary.json")):
        folder = path.parent
        overrides = folder / ".hydra" / "overrides.yaml"
        try:
            given = [str(o) for o in yaml.safe_load(overrides.read_text()) or []]
        except (OSError, yaml.YAMLError):
            given = folder.name.split(",")  # a job folder is named after its overrides
        kept = [o for o in given if o.split("=", 1)[0].lstrip("+~") != "seed"]
        jobs[folder.name] = SweepJob(read_summary(path) or {}, ",".join(kept) or "(defaults)")
    return jobs


def _units(summaries: list[dict]) -> tuple[str, str]:
    """The sweep table's time and rate units: ms and /s, or rounds and /round when every
    job ran under unit time."""
    if summaries and all(s.get("time_unit") == "rounds" for s in summaries):
        return "rounds", "req/round"
    return "ms", "req/s"


def _measure(summary: dict, key: str, kind: str) -> float | None:
    value = summary.get(key)
    if value is None:
        return None
    return value * 1e3 if kind == "time" and summary.get("time_unit") != "rounds" else value


def sweep_tables(jobs: dict[str, SweepJob]) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The tables printed after a multirun: one row per job (status, policy, completions,
    TTFT, TPOT, latency and throughput in the units of the column names; SLO attainment and
    goodput where objectives were set) and, when some configuration ran with several seeds,
    one row per configuration with the mean and the 95 % t-interval over its seeds
    (``mean ± half-width``); ``None`` otherwise."""
    time_unit, rate_unit = _units([job.summary for job in jobs.values()])

    def header(name: str, kind: str) -> str:
        return f"{name} ({time_unit if kind == 'time' else rate_unit})"

    rows = []
    for folder, job in jobs.items():
        s = job.summary
        policy = (s.get("config") or {}).get("policy") or {}
        rows.append({
            "job": folder, "status": s.get("status", "?"),
            "policy": policy_label(policy) if "_target_" in policy else "-",
            "completed": f"{s.get('n_completed', 0)}/{s.get('n_requests', 0)}",
            **{header(name, kind): _measure(s, key, kind) for name, key, kind in SWEEP_MEASURES},
            # with metrics.slo set: the share of requests meeting it, and goodput
            **({"SLO attainment": s["slo_attainment"],
                f"goodput ({rate_unit})": s.get("goodput_requests_per_s")}
               if "slo_attainment" in s else {}),
        })
    per_job = pd.DataFrame(rows)
    measures = [header(name, kind) for name, _, kind in SWEEP_MEASURES]
    per_job["configuration"] = [job.configuration for job in jobs.values()]
    groups = per_job.groupby("configuration", sort=False)
    per_job = per_job.drop(columns="configuration")
    if groups.size().max() < 2:
        return per_job, None
    summary_rows = []
    for configuration, part in groups:
        row = {"configuration": configuration, "policy": part["policy"].iloc[0],
               "seeds": len(part)}
        for column in measures:
            row[column] = _mean_interval(part[column].dropna().astype(float).to_numpy())
        summary_rows.append(row)
    return per_job, pd.DataFrame(summary_rows)


def _mean_interval(values: np.ndarray) -> str:
    """``mean ± half-width`` of the 95 % t-interval (the mean alone for one value)."""
    if values.size == 0:
        return "-"
    mean = float(values.mean())
    if values.size < 2:
        return f"{mean:,.2f}"
    from scipy import stats  # only at the end of a multirun: scipy takes a while to import

    # t quantile times the standard error (scipy's t.interval gives nan for equal values).
    half = float(stats.t.ppf((1 + LEVEL) / 2, values.size - 1) * stats.sem(values))
    return f"{mean:,.2f} ± {half:,.2f}"


def sweep_text(jobs: dict[str, SweepJob]) -> str:
    """The tables of :func:`sweep_tables` as text, numbers to two decimals."""
    per_job, per_configuration = sweep_tables(jobs)
    text = per_job.to_string(index=False, float_format=lambda v: f"{v:,.2f}", na_rep="-")
    if per_configuration is not None:
        text += ("\nmean ± 95 % interval over seeds, per configuration:\n"
                 + per_configuration.to_string(index=False))
    return text


def query(sql: str, table: Path) -> pd.DataFrame:
    import duckdb

    if not table.is_file():
        raise InputError(f"{table}: no results table; run `python -m replay.results collect "
                         f"DIR...` first")
    if not sql.strip():
        raise InputError('query: the SQL is empty; e.g. "SELECT count(*) FROM runs"')
    with duckdb.connect() as con:
        try:
            con.read_parquet(str(table)).create_view("runs")
        except duckdb.Error as exc:
            reason = " ".join(str(exc).split())
            raise InputError(f"{table}: not a readable results table ({reason}); rebuild it "
                             f"with `python -m replay.results collect`") from None
        try:
            result = con.execute(sql)
            if result.description is None:
                raise InputError("query returned no result set (a statement, not a query?)")
            return result.df()
        except duckdb.Error as exc:
            raise InputError(f"query failed: {exc}".replace("\n", " ")) from None


def main() -> None:
    parser = CommandParser(
        prog="python -m replay.results",
        description="One results table of many runs: `collect` gathers the summary.json of "
                    "every run under the given folders into one Parquet file, a row per run; "
                    "`query` runs DuckDB SQL over it (the view `runs`). Columns: "
                    "docs/results-table.md.")
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="gather run summaries into one Parquet file")
    gather.add_argument("folders", nargs="+", type=Path)
    gather.add_argument("--out", type=Path, default=DEFAULT_TABLE)
    ask = commands.add_parser("query", help="DuckDB SQL over the table (view `runs`)")
    ask.add_argument("sql")
    ask.add_argument("--table", type=Path, default=DEFAULT_TABLE)
    ask.add_argument("--csv", action="store_true", help="print CSV instead of a text table")
    args = parser.parse_args()
    if args.command == "collect":
        run_or_exit(collect, args.folders, args.out)
        return
    frame = run_or_exit(query, args.sql, args.table)
    if frame is None:
        fail("query returned nothing")
    print(frame.to_csv(index=False) if args.csv else frame.to_string(index=False))


if __name__ == "__main__":
    run_or_exit(main)
