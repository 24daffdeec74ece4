"""The reproduction report: ``python -m replay.reproduce report [--quick]`` writes one static
HTML page (``outputs/report/index.html``; ``report-quick`` for the scaled-down targets).

Every target's figures are copied beside the page (with the CSVs behind them), so the
folder reads offline and can be moved as a whole. Each target shows what the papers
report or claim for it, with our verdict and what was measured (:mod:`replay.experiments.claims`),
how long it took and when it ran. The page ends with the D1 table, the data files the
runs read (path and SHA-256) with their caveats, and the code version.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd

from replay.experiments.claims import CLAIMS, PAPERS
from replay.results import TABLE_NAME

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
    "attention table is derived from the 70B profile (README, Vidur timing).",
    "Absolute latencies of the A series run about 0.5-0.7x the paper's Table 1; the papers "
    "give no Vidur configuration or batch cap (target a4_timescale tests the explanations).",
    "The Sorted-F paper's Table 4 cannot come from the setup it states; C1 reports both and "
    "offers the one-start-per-round diagnostic (README, C1).",
)

STYLE = """body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:2em}
img{max-width:min(100%,900px);border:1px solid #eee}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;
padding:2px 6px;text-align:left}.agrees{background:#dfd}.differs{background:#fdd}
.partly{background:#ffd}.muted{color:#777}figure{margin:1em 0}"""


def code_version() -> str:
    """The installed kvsched version and, in a git checkout, its commit (``+dirty`` if the
    work tree has uncommitted changes)."""
    from importlib.metadata import version

    text = f"kvsched {version('kvsched')}"
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, text=True,
                               capture_output=True, check=True).stdout.strip()
        text += f", commit {commit}{' +dirty' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        pass
    return text


def _table(frame: pd.DataFrame) -> str:
    table = frame.to_html(index=False, escape=True, float_format=lambda v: f"{v:.4g}",
                          na_rep="", border=0)
    return f"<div style='overflow-x:auto'>{table}</div>"


def _claims_html(name: str, out_dir: Path) -> str:
    rows = []
    for claim in CLAIMS.get(name, []):
        verdict, measured = claim.judge(out_dir)
        rows.append(f"<tr><td>{html.escape(PAPERS[claim.paper])}, {html.escape(claim.section)}"
                    f"</td><td>{html.escape(claim.statement)}</td><td class='{verdict.split()[0]}'>"
                    f"{verdict}</td><td>{html.escape(measured)}</td></tr>")
    if not rows:
        return "<p class='muted'>Beyond the papers: no paper value to compare with.</p>"
    return ("<table><tr><th>paper, section</th><th>what the paper reports</th><th>verdict</th>"
            "<th>measured here</th></tr>" + "".join(rows) + "</table>")


def _input_files(out_dirs: list[Path]) -> pd.DataFrame:
    files = {}
    for out_dir in out_dirs:
        for summary in out_dir.rglob("summary.json"):
            for entry in json.loads(summary.read_text()).get("input_files") or []:
                files[entry["path"]] = entry
    return pd.DataFrame(sorted(files.values(), key=lambda e: e["path"]),
                        columns=["path", "sha256", "bytes"])


def build_report(targets: dict, outputs_root: Path, report_dir: Path, quick: bool) -> Path:
    """Write ``report_dir/index.html`` from the targets' outputs under ``outputs_root``."""
    started = time.perf_counter()
    figures_dir = report_dir / "figures"
    shutil.rmtree(figures_dir, ignore_errors=True)
    body, ran_dirs, total_seconds = [], [], 0.0
    for name, target in targets.items():
        out_dir = outputs_root / (f"{name}-quick" if quick else name)
        stamp = out_dir / "outputs.txt"
        body.append(f"<h2 id='{name}'>{html.escape(name)}</h2><p>"
                    f"{html.escape(target.description)}</p>")
        if not stamp.is_file():
            body.append(f"<p class='muted'>Not run yet: <code>python -m replay.reproduce {name}"
                        f"{' --quick' if quick else ''}</code></p>")
            continue
        ran_dirs.append(out_dir)
        elapsed = out_dir / "elapsed.json"
        if elapsed.is_file():
            record = json.loads(elapsed.read_text())
            total_seconds += record["seconds"]
            body.append(f"<p class='muted'>Ran {record['finished']} in {record['seconds']:.0f} s "
                        f"({record['ran']} runs, {record['reused']} reused, {record['failed']} "
                        f"failed).</p>")
        body.append(_claims_html(name, out_dir))
        for png in (Path(line) for line in stamp.read_text().split()):
            copy = figures_dir / name / png.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(png, copy)
            csv = png.with_suffix(".csv")
            link = ""
            if csv.is_file():
                shutil.copy2(csv, copy.with_suffix(".csv"))
                link = f" (<a href='figures/{name}/{csv.name}'>numbers</a>)"
            body.append(f"<figure><img src='figures/{name}/{png.name}' alt='{name}: {png.stem}'>"
                        f"<figcaption>{png.name}{link}</figcaption></figure>")
        if name == "d1":
            body.append(_d1_html(figures_dir / name / "d1_latency.csv"))
    body.append(_crosscheck_html(outputs_root.parent / "crosscheck", figures_dir))
    files = _input_files(ran_dirs)
    scale = ("scaled-down targets (--quick): the verdicts below test the pipeline, not the "
             "papers" if quick else "full-size targets")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>kvsched reproduction"
            f"</title><style>{STYLE}</style></head><body><h1>kvsched: reproduction report</h1>"
            f"<p>{html.escape(code_version())}; {scale}; built "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; the targets' runs took "
            f"{total_seconds / 60:.1f} min in all (their own timings below). Every number "
            f"names its setup in the target's description and run summaries; results tables "
            f"are kept beside the runs (<code>runs/{TABLE_NAME}</code>).</p>"
            f"<p>Targets: {' '.join(f'<a href=#{n}>{n}</a>' for n in [*targets, 'd3'])}</p>"
            + "".join(body)
            + "<h2>Data sources and caveats</h2><ul>"
            + "".join(f"<li>{html.escape(c)}</li>" for c in CAVEATS) + "</ul>"
            + "<p>Files read by the runs in this report (the data directory's README gives "
              "where each comes from and its licence):</p>" + _table(files)
            + f"<p class='muted'>Report built in {time.perf_counter() - started:.1f} s.</p>"
            + "</body></html>")
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / "index.html"
    out.write_text(page)
    return out


def _d1_html(csv: Path) -> str:
    if not csv.is_file():
        return ""
    table = pd.read_csv(csv)
    shown = ["panel", "model", "kv", "kv_tokens", "workload", "policy", "status",
             "mean_latency", "p50_latency", "p99_latency", "mean_ttft", "mean_tbt", "p99_tbt",
             "throughput_tokens_per_s", "evictions", "decision_time_s", "lp_gap"]
    return ("<p>The D1 table (seconds; throughput in tokens/s; <code>lp_gap</code> only in the "
            "offline unit-time panel):</p>" + _table(table[shown]))


def _crosscheck_html(crosscheck_dir: Path, figures_dir: Path) -> str:
    """D3, from ``python -m replay.crosscheck`` (its ``--out`` beside the targets' folder)."""
    head = ("<h2 id='d3'>d3</h2><p>D3: this harness against Vidur's own simulator on the same "
            "requests (<code>python -m replay.crosscheck</code>; the README's D3 section names "
            "the causes of what differs).</p>")
    if not (crosscheck_dir / "comparison.csv").is_file():
        return head + ("<p class='muted'>Not run yet: <code>python -m replay.crosscheck --out "
                       f"{html.escape(str(crosscheck_dir))}</code></p>")
    (figures_dir / "d3").mkdir(parents=True, exist_ok=True)
    for name in ("distributions.png", "comparison.csv", "speed.csv"):
        shutil.copy2(crosscheck_dir / name, figures_dir / "d3" / name)
    comparison = pd.read_csv(crosscheck_dir / "comparison.csv")
    speed = pd.read_csv(crosscheck_dir / "speed.csv")
    total = speed[["requests", "kvsched_wall_s", "vidur_wall_s"]].sum()
    return (head + f"<p>Simulated requests per wall-second over {int(total['requests'])} "
            f"requests: kvsched {total['requests'] / total['kvsched_wall_s']:,.0f}, Vidur "
            f"{total['requests'] / total['vidur_wall_s']:,.0f} (ratio "
            f"{total['vidur_wall_s'] / total['kvsched_wall_s']:.1f}).</p>"
            + _table(comparison[["workload", "rate", "scheduler", "metric", "kvsched_mean",
                                 "vidur_mean", "diff_mean", "diff_p50", "diff_p99",
                                 "restarts_kvsched", "restarts_vidur"]])
            + _table(speed)
            + "<figure><img src='figures/d3/distributions.png' alt='d3: distributions'>"
              "<figcaption>distributions.png (<a href='figures/d3/comparison.csv'>numbers</a>)"
              "</figcaption></figure>")
