"""Reproduce the papers' figures: ``python -m replay.reproduce TARGET... [--quick] [--force]``.

Each target runs its experiment config through ``python -m replay`` (a Hydra multirun
where it sweeps), then draws its figures (PNG plus the CSV of the numbers behind
them) into ``outputs/reproduce/<target>/``, from the target's results table
(``runs/results.parquet``, :mod:`replay.results`), and records what it wrote in
``outputs.json`` (size and SHA-256 of every output, the hashes of the run summaries and
configs it was drawn from, the commit, config and date). A target is skipped as up to
date only if that record still holds (:func:`stale_reason`): same configs, no run redone
since, every run still what its summary records (the rule of a run's own resume check:
same kvsched version, input files unchanged, every table of the recorded size and
SHA-256), and every output as written. Inside a target, finished runs are reused by the
runs' own resume check, so an interrupted target continues where it stopped, and a run
whose table was damaged is run again.

``--quick`` runs a scaled-down version (seconds) into
``outputs/reproduce/<target>-quick/``; ``all`` runs every target; ``--set KEY=VALUE`` adds
an override to every run of every target (recorded with the target's config). Each target shows one
progress bar per sweep (runs finished, reused, failed; the runs' summaries stay in
their folders), and the command ends with a table of what ran, was reused or failed
per target. ``report`` (alone or after targets) builds the HTML report of whatever
targets have outputs (:mod:`replay.experiments.report`) into ``outputs/report/``
(``report-quick`` with ``--quick``; ``--report DIR`` elsewhere) and, for full-size
targets, the Markdown results pages of the documentation site (``docs/results/`` of
the checkout; ``--results DIR`` elsewhere, also with ``--quick``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from replay.config import CONFIG_DIR
from replay.config.cli import CommandParser, fail, interrupted, run_or_exit
from replay.engine.jit import count_references_plainly
from replay.errors import ConfigError
from replay.experiments.report import build_report, write_results_pages
from replay.experiments.targets import MANIFEST, TARGETS, Target, TargetFailed
from replay.experiments.time_spent import run_sums
from replay.results import TABLE_NAME, collect
from replay.storage.data import sha256_of
from replay.storage.outputs import (
    NO_RESULT_STATUSES,
    atomic_write_text,
    changed_inputs,
    ensure_writable_dir,
    git_describe,
    read_summary,
    run_problem,
)

REPO = Path(__file__).resolve().parent.parent


def file_digest(path: Path) -> dict:
    """``{"bytes", "sha256"}`` of a file, as an output manifest records it."""
    return {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def target_config(target: Target, quick: bool) -> dict:
    """What a target runs, as recorded in its manifest and stamped on its results: its
    overrides and sweeps (with the placeholders ``{outputs}``, ``{suffix}`` unfilled, so no
    path of this machine is recorded)."""
    sweeps = target.quick_sweeps if quick and target.quick_sweeps else target.sweeps
    return {"overrides": [*target.overrides, *(target.quick if quick else ())],
            "sweeps": {k: list(v) for k, v in (sweeps or {}).items()}}


def config_sha256(target: Target, quick: bool) -> str:
    """A hash of the target's config and of every config file's content: an edit of any
    config file (not merely a newer file time) makes the target run again, and the runs'
    own check then decides which runs change."""
    digest = hashlib.sha256(json.dumps(target_config(target, quick), sort_keys=True).encode())
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        digest.update(path.relative_to(CONFIG_DIR).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def run_summaries(runs_dir: Path) -> dict[str, str]:
    """SHA-256 of every run summary under a target's ``runs/``, by path relative to it."""
    return {p.relative_to(runs_dir).as_posix(): file_digest(p)["sha256"]
            for p in sorted(runs_dir.rglob("summary.json"))}


def time_breakdown(runs_dir: Path, runs_s: float, figures_s: float) -> dict[str, float]:
    """Where a target's time went: the runs phase (replay commands, parallel jobs and
    studies included) and the figures phase, wall-clock; and sums over the runs'
    summaries (:func:`replay.experiments.time_spent.run_sums`; a sum over parallel jobs can
    exceed the phase)."""
    return {"runs_s": runs_s, "figures_s": figures_s, **run_sums(runs_dir)}


def with_settings(target: Target, settings: tuple[str, ...]) -> Target:
    """``target`` with ``--set`` overrides after its own (so that they win), e.g.
    ``timing.beyond_profile=flat``: they are part of its config, so its manifest, stale
    check and results stamps name them."""
    if not settings:
        return target
    return dataclasses.replace(target, overrides=(*target.overrides, *settings))


def stale_reason(name: str, out_dir: Path, quick: bool,
                 settings: tuple[str, ...] = ()) -> str | None:
    """Why the target in ``out_dir`` must run again (``None``: it is up to date).

    Up to date means: its manifest (``outputs.json``) exists and was written for the same
    config files and overrides; every run it was drawn from is still there, unchanged,
    and still what its summary records (:func:`replay.storage.outputs.run_problem`, as a run's own
    resume check requires: the same kvsched version, input files of the same SHA-256, every
    table of the recorded size and SHA-256; a study's summary records its input files
    only); and every output it lists has the size and SHA-256 it was written with.
    """
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return f"no readable {MANIFEST} (never finished here)"
    if manifest.get("config_sha256") != config_sha256(with_settings(TARGETS[name], settings),
                                                       quick):
        return "its configs or overrides changed"
    runs_dir = out_dir / "runs"
    if run_summaries(runs_dir) != manifest.get("runs"):
        return "its runs changed since the figures were drawn"
    for summary in sorted(runs_dir.rglob("summary.json")):
        run = summary.parent.relative_to(out_dir).as_posix()
        record = read_summary(summary)
        if record is None:
            return f"run {run}: its summary.json is unreadable"
        if "output_files" in record:  # a replay's run: the tables it wrote are recorded
            problem = run_problem(summary.parent, record)
            if problem:
                return f"run {run}: {problem}"
            continue
        changed = changed_inputs(record.get("input_files") or [])
        if changed:
            return f"run {run}: input files changed: {'; '.join(changed)}"
    for output in manifest.get("outputs", []):
        path = out_dir / output["path"]
        if not path.is_file():
            return f"{output['path']} is gone"
        if file_digest(path) != {"bytes": output["bytes"], "sha256": output["sha256"]}:
            return f"{output['path']} changed since it was written"
    return None


#: The opening of a run summary line (``python -m replay`` prints ``json.dumps(summary)``).
SUMMARY_START = re.compile(r'\{"status": "(\w+)"')


@dataclass
class Tally:
    """What a target's runs did: ran, reused (a finished run with the same config), failed."""

    ran: int = 0
    reused: int = 0
    failed: int = 0
    up_to_date: bool = False  # the target's manifest still held: nothing ran


def _run_quietly(command: list[str], label: str, tally: Tally) -> tuple[int, list[str]]:
    """Run ``python -m replay COMMAND`` with one progress bar over its finished runs; its
    exit status and the last lines of its other output (to show if it failed).

    Each run prints its summary as one JSON line (full summaries stay in the run
    folders); those are counted, not echoed.
    """
    tail: deque[str] = deque(maxlen=25)
    reused_before = tally.reused
    with subprocess.Popen([sys.executable, "-m", "replay", *command], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc, \
            tqdm(desc=f"  {label}", unit="run", leave=True, file=sys.stdout) as bar:
        for line in proc.stdout:
            # Parallel jobs share the pipe, so two outputs can land on one line: count the
            # summaries' openings rather than parse whole lines.
            statuses = SUMMARY_START.findall(line)
            tally.reused += line.count("finished run with the same config")
            tally.failed += sum(statuses.count(status) for status in NO_RESULT_STATUSES)
            if statuses:
                bar.update(len(statuses))
                bar.set_postfix(reused=tally.reused - reused_before, failed=tally.failed)
            else:
                tail.append(line.rstrip())
    tally.ran += bar.n - (tally.reused - reused_before)
    return proc.returncode, list(tail)


def run_target(name: str, quick: bool = False, force: bool = False,
               outputs_root: Path = REPO / "outputs" / "reproduce",
               tally: Tally | None = None, settings: tuple[str, ...] = ()) -> list[Path]:
    target = with_settings(TARGETS[name], settings)
    started = time.perf_counter()
    tally = Tally() if tally is None else tally
    out_dir = outputs_root / (f"{name}-quick" if quick else name)
    reason = "--force" if force else stale_reason(name, out_dir, quick, settings)
    if reason is None:
        manifest = json.loads((out_dir / MANIFEST).read_text())
        print(f"{name}: up to date ({out_dir / MANIFEST} verifies)")
        tally.up_to_date = True
        return [out_dir / figure for figure in manifest["figures"]]
    runs_dir = out_dir / "runs"
    fill = {"{outputs}": str(outputs_root.resolve()), "{suffix}": "-quick" if quick else ""}
    overrides = [o.replace("{outputs}", fill["{outputs}"]).replace("{suffix}", fill["{suffix}"])
                 for o in (*target.overrides, *(target.quick if quick else ()))]
    sweeps = (target.quick_sweeps if quick and target.quick_sweeps else target.sweeps)
    print(f"{name}: {target.description}", flush=True)
    if out_dir.is_dir():
        print(f"  running again: {reason}", flush=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)  # until the figures are redrawn
    failed_record = out_dir / "failed.json"
    runs_started = time.perf_counter()
    for sweep, extra in (sweeps or {None: ()}).items():
        where = runs_dir / sweep if sweep else runs_dir
        # The target's folders are its own: a run of an edited config replaces the old one.
        if target.multirun:
            command = ["-m", *overrides, *extra, "output.overwrite=true",
                       f"hydra.sweep.dir={where}"]
        else:
            command = [*overrides, *extra, f"hydra.run.dir={where}"]
        print(f"  python -m replay {' '.join(command)}", flush=True)
        returncode, tail = _run_quietly(command, f"{name}/{sweep}" if sweep else name, tally)
        if returncode != 0:
            # A full or read-only disk fails every target alike: one error line (OutputError)
            # ends the reproduction, instead of a failure per target.
            ensure_writable_dir(out_dir)
            print("\n".join(tail), file=sys.stderr, flush=True)
            atomic_write_text(failed_record, json.dumps({
                "date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": git_describe(),
                "sweep": sweep, "returncode": returncode}))
            raise TargetFailed(f"{name}: `python -m replay {' '.join(command)}` exited with "
                               f"status {returncode} (its last lines above say why)")
    if target.multirun:  # a study keeps its own table (trials.csv) instead
        collect([runs_dir], runs_dir / TABLE_NAME, quiet=True)
    figures_started = time.perf_counter()
    figures = [p for figure in target.figures for p in figure(runs_dir, out_dir)]
    finished = time.perf_counter()
    written = [q for p in figures for q in (p, p.with_suffix(".csv")) if q.is_file()]
    atomic_write_text(out_dir / MANIFEST, json.dumps({
        "target": name, "quick": quick, "commit": git_describe(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "seconds": finished - started,
        "time": time_breakdown(runs_dir, figures_started - runs_started,
                               finished - figures_started),
        "ran": tally.ran, "reused": tally.reused, "failed": tally.failed,
        "config": target_config(target, quick),
        "config_sha256": config_sha256(target, quick),
        "runs": run_summaries(runs_dir),
        "figures": [p.relative_to(out_dir).as_posix() for p in figures],
        "outputs": [{"path": p.relative_to(out_dir).as_posix(), **file_digest(p)}
                    for p in written]}, indent=1) + "\n")
    failed_record.unlink(missing_ok=True)
    for path in figures:
        print(f"  wrote {path} (+ .csv)")
    return figures


def check_settings(settings: tuple[str, ...]) -> None:
    """``--set`` overrides must be ``KEY=VALUE`` and compose with the base config."""
    from replay.config import compose_config
    from replay.config.validate import validate_config

    for setting in settings:
        if "=" not in setting or setting.startswith("="):
            raise ConfigError(f"--set {setting!r}: expected KEY=VALUE")
    validate_config(compose_config(settings))


def results_folder(args: argparse.Namespace) -> Path | None:
    """Where ``report`` writes the results pages: ``--results``, else the checkout's
    ``docs/results/`` for full-size targets (``None``: no pages, as with ``--quick``)."""
    if args.results is not None:
        return args.results
    if not args.quick and (REPO / "docs" / "results").is_dir():
        return REPO / "docs" / "results"
    return None


def target_list(outputs: Path, quick: bool) -> str:
    """Every target, one per line: its name, whether it needs the data directory, how long
    its last run under ``outputs`` took and when (from its manifest), and its purpose."""
    lines = [f"{'target':<26}{'data':<6}{'last run':<27}purpose"]
    for name, target in TARGETS.items():
        manifest = read_summary(outputs / f"{name}{'-quick' if quick else ''}" / MANIFEST)
        last = (f"{manifest['seconds']:,.0f} s ({manifest.get('date', '?')})"
                if manifest and isinstance(manifest.get("seconds"), int | float) else "never")
        lines.append(f"{name:<26}{'yes' if target.needs_data else 'no':<6}{last:<27}"
                     f"{target.description}")
    return "\n".join(lines)


def targets_markdown() -> str:
    """The table of targets on docs/reproducing/index.md (a test holds the page to it)."""
    rows = [f"| `{name}` | {'data' if t.needs_data else ''} | {t.description} |"
            for name, t in TARGETS.items()]
    return "\n".join(["| target | needs | what |", "|---|---|---|", *rows])


def check_arguments(args: argparse.Namespace) -> None:
    """Options that would be ignored are refused before anything runs: the report's
    folders without ``report``; no target, or one that does not exist."""
    if not args.targets:
        raise ConfigError("name one or more targets, `all` or `report` (`python -m "
                          "replay.reproduce --list` lists the targets)")
    unknown = [t for t in args.targets if t not in (*TARGETS, "all", "report")]
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: no such target; `python -m "
                          f"replay.reproduce --list` lists them")
    if "report" not in args.targets:
        given = [f"--{name}" for name in ("report", "results")
                 if getattr(args, name) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only used by the target `report`, which "
                              f"is not asked for")


#: What Ctrl-C leaves of a reproduction (each run folder is finished or empty).
RESUME_HINT = "finished runs are kept, and the same command resumes from them"


def main() -> None:
    parser = CommandParser(
        prog="python -m replay.reproduce",
        description="Reproduce the papers' figures: run each target's experiment, draw its "
                    "figures (PNG + CSV) into --outputs/<target>/, and optionally build the "
                    "HTML report. `--list` lists the targets.",
        epilog="Targets and what they need: docs/reproducing/index.md#targets.")
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="targets to run (`--list` lists them); `all` runs every one, "
                             "`report` builds the report of whatever has outputs")
    parser.add_argument("--list", action="store_true",
                        help="list the targets: purpose, whether they need the data "
                             "directory, and the time of their last run under --outputs")
    parser.add_argument("--markdown", action="store_true",
                        help="with --list: the Markdown table of docs/reproducing/index.md")
    parser.add_argument("--quick", action="store_true", help="scaled-down version")
    parser.add_argument("--force", action="store_true", help="redraw even if up to date")
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs" / "reproduce",
                        help="where target folders go")
    parser.add_argument("--report", type=Path, default=None,
                        help="report folder (default: report[-quick] beside --outputs)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="a config override for every target's runs, after the target's "
                             "own (repeatable), e.g. --set timing.beyond_profile=flat; use "
                             "another --outputs for such runs")
    parser.add_argument("--results", type=Path, default=None,
                        help="folder of the Markdown results pages of the docs site (default: "
                             "docs/results/ of the checkout, and none with --quick: quick "
                             "results are not results)")
    args = parser.parse_args()
    if args.list:
        print(targets_markdown() if args.markdown else target_list(args.outputs, args.quick))
        return
    run_or_exit(check_arguments, args)
    run_or_exit(count_references_plainly)  # before any run compiles or loads compiled code
    names = list(TARGETS) if "all" in args.targets else [t for t in args.targets
                                                          if t != "report"]
    failed, rows = [], []
    settings = tuple(args.settings)
    if names:  # a folder that cannot be written is one error line, before any target runs
        run_or_exit(ensure_writable_dir, args.outputs)
    if settings:  # a bad key or value is one error line too, not a failure per target
        run_or_exit(check_settings, settings)
    for name in names:
        tally, started = Tally(), time.perf_counter()
        try:
            outputs = run_target(name, args.quick, args.force, args.outputs.resolve(), tally,
                                 settings)
            state = "up to date" if tally.up_to_date else "done"
        except TargetFailed as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
            outputs, state = [], "FAILED"
        except KeyboardInterrupt as exc:
            interrupted(exc, RESUME_HINT)
        rows.append((name, state, tally.ran, tally.reused, tally.failed, len(outputs),
                     time.perf_counter() - started))
    if rows:
        print(f"\n{'target':<28}{'state':<12}{'ran':>6}{'reused':>8}{'failed':>8}{'figures':>9}"
              f"{'time':>9}")
    for name, state, ran, reused, bad, figures, seconds in rows:
        print(f"{name:<28}{state:<12}{ran:>6}{reused:>8}{bad:>8}{figures:>9}{seconds:>8.0f}s")
    if "report" in args.targets:
        outputs_root = args.outputs.resolve()
        if not outputs_root.is_dir():
            # Most likely a mistyped folder; a report of nothing would also blank the
            # committed results pages.
            fail(f"{outputs_root}: no reproduction outputs to report on (python -m "
                 f"replay.reproduce TARGET...{' --quick' if args.quick else ''} runs them)")
        report_dir = args.report or outputs_root.parent / ("report-quick" if args.quick
                                                           else "report")
        run_or_exit(ensure_writable_dir, report_dir)
        print(f"wrote {run_or_exit(build_report, TARGETS, outputs_root, report_dir, args.quick)}")
        results_dir = results_folder(args)
        if results_dir is not None:
            run_or_exit(ensure_writable_dir, results_dir)
            for page in run_or_exit(write_results_pages, TARGETS, outputs_root, results_dir,
                                    args.quick):
                print(f"wrote {page}")
    if failed:
        fail(f"{len(failed)} of {len(names)} targets failed: {', '.join(failed)}")


if __name__ == "__main__":
    run_or_exit(main)
