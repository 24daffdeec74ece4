"""The reproduction report and the results pages of the documentation site, from the
targets' outputs (``python -m replay.reproduce report``).

* The HTML report: one static page (``outputs/report/index.html``; ``report-quick`` for
  the scaled-down targets) with every target's figures copied beside it (with the CSVs
  behind them), so the folder reads offline and can be moved as a whole. It opens with an
  overview table (each target's state, run time and verdicts; the targets never run in one
  line), then shows for each target what the papers report or claim, with our verdict and
  what was measured (:mod:`replay.experiments.claims`), and its figures. It ends with the
  D1 table, the D3 cross-check, the data files the runs read (SHA-256) with their caveats,
  and the code version.
* The results pages (:func:`write_results_pages`): one Markdown page per paper series
  (A, B, C, D) with the same content, which the documentation site shows under Results.
  Each table and figure is stamped with the commit, the config and the date that produced
  it (from the target's ``outputs.json``), so no measured number is typed by hand.

Both are rendered from Jinja2 templates (``replay/experiments/templates/``). No absolute
path appears in either: outputs are named relative to their target's folder and data files
as ``$KVSCHED_DATA_DIR/...``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pandas as pd

from replay.experiments import time_spent
from replay.experiments.claims import CLAIMS, PAPERS
from replay.experiments.targets import MANIFEST
from replay.experiments.verdicts import (
    DIFFERS,
    MEASURED_CAUSE,
    NOT_MEASURED,
    VERDICTS,
    verdict_word,
)
from replay.results import TABLE_NAME
from replay.storage.data import CACHE_ENV, cache_dir
from replay.storage.outputs import git_describe

#: Known limits of the data and of the timing model that a reader of any number should know.
CAVEATS = (
    "LMSYS-Chat-1M lengths come from the trace file the MC-SF papers used, counted in words "
    "(workload=lmsys); the synthetic LMSYS-like workloads draw token or word lengths from "
    "fitted distributions instead. Arrival times are ours (Poisson), as in the papers.",
    "arXiv summarization lengths are Llama-2 tokenizer counts from the Vidur trace; C2 uses "
    "the file's first 400 rows, as the spec says.",
    "Splitwise traces carry GPT-tokenizer lengths and real arrival times; rows longer than "
    "the model's context are dropped and counted in each run's summary.",
    "GPU time comes from Vidur's A100 profiles through its random-forest (or linear) "
    "predictor: batches beyond the profiled sizes are extrapolated, and the Llama-2-7B "
    "attention table is derived from the 70B profile (see Timing backends).",
    "The papers give no Vidur configuration or batch cap, so absolute latencies of the A "
    "series need not match the paper's Table 1 (target a4_timescale tests explanations).",
    "The Sorted-F paper's Table 4 cannot come from the setup it states; C1 reports both and "
    "offers the one-start-per-round diagnostic (see Reproducing, C: Sorted-F).",
)

#: The paper series: the results page of each (``docs/results/<page>.md``) and its title.
SERIES = {"a": ("mcsf", "A: MC-SF"), "b": ("wait", "B: WAIT and fluid"),
          "c": ("sorted-f", "C: Sorted-F"), "d": ("harness", "D: harness checks"),
          "e": ("engine", "E: a real engine")}

#: What ``python -m replay.crosscheck`` writes beside its tables: commit, date, packages.
CROSSCHECK_PROVENANCE = "provenance.json"

#: A figure's numbers are shown as a table in the results pages up to this size.
SMALL_TABLE = (30, 14)
#: Figures whose numbers are shown whole whatever their size (target, figure): the authors'
#: runs beside ours at every cap both sides have, and the pricing measurement.
FULL_TABLES = {("b1_authors", "b1_authors.png"), ("b1_authors", "pricing.png")}

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("replay.experiments", "templates"),
    autoescape=jinja2.select_autoescape(["html.j2"]), trim_blocks=True, lstrip_blocks=True,
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def code_version() -> str:
    """The installed kvsched version and the commit of the checkout."""
    from importlib.metadata import version

    return f"kvsched {version('kvsched')}, commit {git_describe()}"


def display_path(path: str | Path, data_dirs: tuple[Path, ...] = (),
                 outputs_root: Path | None = None) -> str:
    """``path`` without this machine's folders: ``$KVSCHED_DATA_DIR/...`` under a data
    directory, relative under the outputs folder, ``$KVSCHED_CACHE_DIR/...`` in the cache,
    ``~/...`` under the home folder, else its name only."""
    path = Path(path)
    env_data = os.environ.get("KVSCHED_DATA_DIR")
    roots = [(Path(d).expanduser().resolve(), "$KVSCHED_DATA_DIR/")
             for d in (*data_dirs, *([env_data] if env_data else []))]
    if outputs_root is not None:
        roots.append((outputs_root.resolve(), ""))
    roots += [(cache_dir().resolve(), f"${CACHE_ENV}/"), (Path.home().resolve(), "~/")]
    for root, prefix in roots:
        if path.is_relative_to(root):
            return prefix + path.relative_to(root).as_posix()
    return f".../{path.name}" if path.is_absolute() else path.as_posix()


@dataclass
class Figure:
    name: str               # file name of the PNG
    png: Path               # where it is in the target's folder
    csv: Path | None        # the numbers behind it
    numbers: pd.DataFrame | None = None  # read for the results pages when small


#: Why a figure is not published when the numbers behind it are empty, by file name (the
#: report says so in its place; any other empty figure gets the generic reason).
EMPTY_FIGURE_REASONS = {
    "ratio_hist.png": "no trial was proven optimal within the study's time limit, so there "
                      "is no ratio to draw (the histogram counts proven trials only)",
}


def empty_reason(png: Path, csv: Path | None) -> str | None:
    """Why the figure ``png`` is withheld (its CSV has no rows), or None to publish it."""
    if csv is None:
        return None
    try:
        numbers = pd.read_csv(csv)
    except pd.errors.EmptyDataError:
        numbers = pd.DataFrame()
    if len(numbers) and numbers.notna().any().any():
        return None
    return EMPTY_FIGURE_REASONS.get(png.name, f"the numbers behind it ({csv.name}) are empty")


@dataclass
class TargetView:
    """What the report and the results pages show of one target."""

    name: str
    description: str
    state: str                        # done, failed, never run, outputs missing
    manifest: dict | None = None
    failure: dict | None = None
    claims: list[dict] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    withheld: list[tuple[str, str]] = field(default_factory=list)  # (figure, why not shown)

    @property
    def ran(self) -> bool:
        return self.manifest is not None or self.failure is not None

    @property
    def stamp(self) -> dict | None:
        """Commit, date and config (the target's overrides) that produced the outputs."""
        if self.manifest is None:
            return None
        config = self.manifest["config"]
        text = " ".join(config["overrides"])
        if config.get("sweeps"):
            text += "; sweeps: " + "; ".join(f"{k}: {' '.join(v) or '(no extra overrides)'}"
                                             for k, v in config["sweeps"].items())
        return {"commit": self.manifest["commit"], "date": self.manifest["date"],
                "config": text + (" (--quick)" if self.manifest.get("quick") else "")}

    @property
    def seconds(self) -> float | None:
        return self.manifest["seconds"] if self.manifest else None

    @property
    def time(self) -> dict | None:
        """Where the target's time went (``reproduce.time_breakdown``), if recorded."""
        return self.manifest.get("time") if self.manifest else None

    @property
    def verdicts(self) -> list[str]:
        return [claim["verdict"] for claim in self.claims]


#: The columns of a claim's parts table, as the pages print them.
PART_COLUMNS = ("kind", "quantity", "paper", "tolerance", "min. sample", "measured", "sample",
                "verdict")


def claim_view(claim, out_dir: Path) -> dict:
    """What the pages show of one claim judged on ``out_dir``: its verdict and sentence,
    and its parts table (every part with the paper's number, tolerance and minimum sample,
    and what was measured), and the per-case lines."""
    judged = claim.judge(out_dir)
    parts = pd.DataFrame([(p.kind, p.quantity, p.paper, p.tolerance, p.min_sample, r.measured,
                           r.sample, r.verdict) for p, r in judged["parts"]],
                         columns=list(PART_COLUMNS))
    # The other parts' sentences, where they say more than their row of the table.
    detail = [f"{p.quantity}: {r.sentence}" for p, r in judged["parts"]
              if r.sentence != judged["sentence"] and r.verdict != NOT_MEASURED]
    detail += [line for _, r in judged["parts"] for line in r.detail]
    return {"paper": f"{PAPERS[claim.paper]}, {claim.section}", "statement": claim.statement,
            "verdict": judged["verdict"], "sentence": judged["sentence"],
            "word": verdict_word(judged["verdict"]), "parts": parts, "detail": detail}


def target_views(targets: dict, outputs_root: Path, quick: bool) -> list[TargetView]:
    """Every target's state, claims and figures, from its folder under ``outputs_root``."""
    views = []
    for name, target in targets.items():
        out_dir = outputs_root / (f"{name}-quick" if quick else name)
        view = TargetView(name, target.description, "never run")
        views.append(view)
        if (out_dir / "failed.json").is_file():
            view.failure = json.loads((out_dir / "failed.json").read_text())
            view.state = "failed"
            continue
        if not (out_dir / MANIFEST).is_file():
            continue
        view.manifest = json.loads((out_dir / MANIFEST).read_text())
        view.state = "done"
        view.claims = [claim_view(claim, out_dir) for claim in CLAIMS.get(name, ())]
        for figure in view.manifest["figures"]:
            png = out_dir / figure
            if not png.is_file():
                view.state = "outputs missing"
                continue
            csv = png.with_suffix(".csv")
            csv = csv if csv.is_file() else None
            reason = empty_reason(png, csv)
            if reason is not None:
                view.withheld.append((png.name, reason))
                continue
            view.figures.append(Figure(png.name, png, csv))
    return views


def _html_table(frame: pd.DataFrame) -> str:
    return frame.to_html(index=False, escape=True, float_format=lambda v: f"{v:.4g}",
                         na_rep="", border=0)


def _cell(value):
    """A table cell as the pages print it: a ``|`` in text escaped; a float with four
    significant digits, thousands grouped rather than in exponent form."""
    if isinstance(value, str):
        return value.replace("|", "\\|")
    if isinstance(value, float) and not isinstance(value, bool):
        if value != value:  # NaN
            return ""
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return value


def _markdown_table(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown table (cells as :func:`_cell` prints them)."""
    return frame.map(_cell).to_markdown(index=False, missingval="", disable_numparse=True)


def _input_files(outputs_root: Path, views: list[TargetView], quick: bool) -> pd.DataFrame:
    files = {}
    for view in views:
        if view.manifest is None:
            continue
        out_dir = outputs_root / (f"{view.name}-quick" if quick else view.name)
        for summary_path in out_dir.rglob("summary.json"):
            summary = json.loads(summary_path.read_text())
            data_dir = (summary.get("config") or {}).get("data_dir")
            for entry in summary.get("input_files") or []:
                shown = display_path(entry["path"], (Path(data_dir),) if data_dir else (),
                                     outputs_root)
                files[shown] = {**entry, "path": shown}
    return pd.DataFrame(sorted(files.values(), key=lambda e: e["path"]),
                        columns=["path", "sha256", "bytes"])


def _overview(views: list[TargetView], crosscheck: dict | None) -> dict:
    """The overview table: the targets that ran (with D3 when shown) and the never-run ones."""
    ran = [v for v in views if v.ran]
    never = [v.name for v in views if not v.ran]
    if crosscheck is not None and not crosscheck["ran"]:
        never.append("d3")
    return {"ran": ran, "never_run": never,
            "never_run_targets": [v.name for v in views if not v.ran],
            "total_minutes": sum(v.seconds or 0 for v in ran) / 60}


def _whole_process_summary(speed: pd.DataFrame) -> str:
    """Vidur's time over kvsched's for the step loops, the in-process calls and (when
    ``--whole-process`` ran) the whole processes, side by side."""
    ratios = [f"step loops {speed['vidur_wall_s'].sum() / speed['kvsched_wall_s'].sum():.1f}x"]
    if "kvsched_call_s" in speed:
        ratios.append("in-process calls "
                      f"{speed['vidur_call_s'].sum() / speed['kvsched_call_s'].sum():.1f}x")
    if "kvsched_process_s" in speed and speed["kvsched_process_s"].notna().all():
        ratios.append("whole processes "
                      f"{speed['vidur_process_s'].sum() / speed['kvsched_process_s'].sum():.1f}x")
    return " Vidur's time over kvsched's: " + ", ".join(ratios) + "."


def _crosscheck(crosscheck_dir: Path, outputs_root: Path) -> dict:
    """D3, from ``python -m replay.crosscheck`` (its ``--out`` beside the targets' folder)."""
    found = {"ran": (crosscheck_dir / "comparison.csv").is_file(),
             # From the folder above the outputs (the checkout for outputs/reproduce).
             "command": "python -m replay.crosscheck --out "
                        + display_path(crosscheck_dir, outputs_root=outputs_root.parent.parent)}
    if not found["ran"]:
        return found
    comparison = pd.read_csv(crosscheck_dir / "comparison.csv")
    speed = pd.read_csv(crosscheck_dir / "speed.csv")
    total = speed[["requests", "kvsched_wall_s", "vidur_wall_s"]].sum()
    setup = crosscheck_dir / "setup.json"
    recorded = crosscheck_dir / CROSSCHECK_PROVENANCE
    provenance = json.loads(recorded.read_text()) if recorded.is_file() else {}
    found.update({
        "dir": crosscheck_dir,
        "summary": (f"Simulated requests per wall-second over {int(total['requests'])} "
                    f"requests: kvsched {total['requests'] / total['kvsched_wall_s']:,.0f}, "
                    f"Vidur {total['requests'] / total['vidur_wall_s']:,.0f} (ratio "
                    f"{total['vidur_wall_s'] / total['kvsched_wall_s']:.1f})."
                    + _whole_process_summary(speed)),
        "comparison": comparison[["workload", "rate", "scheduler", "metric", "kvsched_mean",
                                  "vidur_mean", "diff_mean", "diff_p50", "diff_p99",
                                  "restarts_kvsched", "restarts_vidur"]],
        "speed": speed,
        "stamp": {"commit": provenance.get("commit", "unknown (not recorded)"),
                  "date": provenance.get("date") or time.strftime(
                      "%Y-%m-%d %H:%M %Z", time.localtime(
                          (crosscheck_dir / "comparison.csv").stat().st_mtime)),
                  "config": " ".join(f"{k}={v}" for k, v in json.loads(setup.read_text())
                                     .items()) if setup.is_file() else "not recorded"}})
    return found


#: The D1 table's columns shown in the report (seconds; throughput in tokens/s).
D1_COLUMNS = ["panel", "model", "kv", "kv_tokens", "workload", "policy", "status",
              "mean_latency", "p50_latency", "p99_latency", "mean_ttft", "mean_tbt", "p99_tbt",
              "throughput_tokens_per_s", "evictions", "decision_time_s", "lp_gap"]


def build_report(targets: dict, outputs_root: Path, report_dir: Path, quick: bool) -> Path:
    """Write ``report_dir/index.html`` from the targets' outputs under ``outputs_root``."""
    started = time.perf_counter()
    figures_dir = report_dir / "figures"
    shutil.rmtree(figures_dir, ignore_errors=True)
    views = target_views(targets, outputs_root, quick)
    d1_table = None
    for view in views:
        for figure in view.figures:
            copy = figures_dir / view.name / figure.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(figure.png, copy)
            if figure.csv is not None:
                shutil.copy2(figure.csv, copy.with_suffix(".csv"))
            if view.name == "d1" and figure.name == "d1_latency.png" and figure.csv:
                d1_table = _html_table(pd.read_csv(figure.csv)[D1_COLUMNS])
    crosscheck = _crosscheck(outputs_root.parent / "crosscheck", outputs_root)
    if crosscheck["ran"]:
        (figures_dir / "d3").mkdir(parents=True, exist_ok=True)
        for name in ("distributions.png", "comparison.csv", "speed.csv"):
            shutil.copy2(crosscheck["dir"] / name, figures_dir / "d3" / name)
        crosscheck["comparison"] = _html_table(crosscheck["comparison"])
        crosscheck["speed"] = _html_table(crosscheck["speed"])
    page = _TEMPLATES.get_template("report.html.j2").render(
        views=[v for v in views if v.ran], overview=_overview(views, crosscheck),
        quick=quick, code_version=code_version(),
        built=time.strftime("%Y-%m-%d %H:%M:%S %Z"), table_name=TABLE_NAME,
        d1_table=d1_table, crosscheck=crosscheck, caveats=CAVEATS,
        files=_html_table(_input_files(outputs_root, views, quick)), html_table=_html_table,
        build_seconds=time.perf_counter() - started)
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / "index.html"
    out.write_text(page)
    return out


def write_time_page(targets: dict, outputs_root: Path, results_dir: Path, quick: bool,
                    version: str) -> Path:
    """``results_dir/time.md``: where the targets' time went, per target, per series and
    over the whole (:mod:`replay.experiments.time_spent`)."""
    names = {(f"{n}-quick" if quick else n): n for n in targets}
    rows = time_spent.target_times(names, outputs_root)
    if not rows.empty:
        rows["target"] = rows["target"].map(names)
    timed = set(rows["target"]) if not rows.empty else set()
    totals = time_spent.totals(rows)
    text = _TEMPLATES.get_template("time.md.j2").render(
        built=time.strftime("%Y-%m-%d %H:%M %Z"), code_version=version, quick=quick,
        parallel=time_spent.PARALLEL, **totals,
        targets=rows.to_dict("records") if not rows.empty else [],
        never_run=[n for n in targets if n not in timed])
    out = results_dir / "time.md"
    out.write_text(text)
    return out


def write_results_pages(targets: dict, outputs_root: Path, results_dir: Path,
                        quick: bool) -> list[Path]:
    """Write one Markdown page per paper series into ``results_dir`` (the documentation
    site's ``docs/results/``), with every figure and its CSV copied into
    ``results_dir/figures/<target>/``, and the page on time (:func:`write_time_page`). The
    pages show what the outputs hold now: a target's earlier figures there are removed
    first."""
    views = target_views(targets, outputs_root, quick)
    crosscheck = _crosscheck(outputs_root.parent / "crosscheck", outputs_root)
    # Before writing: the pages themselves would make the checkout look edited ("-dirty").
    version = code_version()
    written = []
    counts, differing = [], []
    for letter, (page, title) in SERIES.items():
        series = [v for v in views if v.name.startswith(letter)]
        claims = [(v, c) for v in series for c in v.claims]
        counts.append({"title": title, "page": page, "total": len(claims),
                       "counts": [sum(c["word"] == w for _, c in claims) for w in VERDICTS]})
        differing += [{"target": v.name, "page": page, "paper": c["paper"],
                       "verdict": c["verdict"], "sentence": c["sentence"]}
                      for v, c in claims if c["word"] in (DIFFERS, MEASURED_CAUSE)]
        for view in series:
            shutil.rmtree(results_dir / "figures" / view.name, ignore_errors=True)
            for figure in view.figures:
                copy = results_dir / "figures" / view.name / figure.name
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(figure.png, copy)
                if figure.csv is not None:
                    shutil.copy2(figure.csv, copy.with_suffix(".csv"))
                    numbers = pd.read_csv(figure.csv)
                    if (view.name, figure.name) in FULL_TABLES or (
                            len(numbers) <= SMALL_TABLE[0] and numbers.shape[1] <= SMALL_TABLE[1]):
                        figure.numbers = numbers
        d3 = None
        if letter == "d":
            shutil.rmtree(results_dir / "figures" / "d3", ignore_errors=True)
            if crosscheck["ran"]:
                d3 = dict(crosscheck)
                (results_dir / "figures" / "d3").mkdir(parents=True, exist_ok=True)
                for name in ("distributions.png", "comparison.csv", "speed.csv"):
                    shutil.copy2(crosscheck["dir"] / name, results_dir / "figures" / "d3" / name)
                d3["comparison"] = _markdown_table(crosscheck["comparison"])
                d3["speed"] = _markdown_table(crosscheck["speed"])
        text = _TEMPLATES.get_template("results.md.j2").render(
            title=title, page=page, views=[v for v in series if v.ran],
            overview=_overview(series, crosscheck if letter == "d" else None), quick=quick,
            built=time.strftime("%Y-%m-%d %H:%M %Z"), code_version=version,
            markdown_table=_markdown_table, pd=pd,
            crosscheck=d3 or {"ran": False, "command": crosscheck["command"]})
        results_dir.mkdir(parents=True, exist_ok=True)
        out = results_dir / f"{page}.md"
        out.write_text(text)
        written.append(out)
    written.append(write_time_page(targets, outputs_root, results_dir, quick, version))
    index = results_dir / "index.md"
    index.write_text(_TEMPLATES.get_template("index.md.j2").render(
        built=time.strftime("%Y-%m-%d %H:%M %Z"), code_version=version, quick=quick,
        words=VERDICTS, counts=counts, differing=differing))
    written.append(index)
    return written
