"""Reproduce the papers' figures: ``python -m replay.reproduce TARGET... [--quick] [--force]``.

Each target runs its experiment config through ``python -m replay`` (a Hydra multirun
where it sweeps), then draws its figures (PNG plus the CSV of the numbers behind
them) into ``outputs/reproduce/<target>/``, from the target's results table
(``runs/results.parquet``, :mod:`replay.results`). A target whose outputs are newer than
every config file is skipped (make-like); inside a target, finished runs are
reused by the runs' own resume check, so an interrupted target continues where
it stopped. ``--quick`` runs a scaled-down version (seconds) into
``outputs/reproduce/<target>-quick/``; ``all`` runs every target. Each target shows
one progress bar per sweep (runs finished, reused, failed; the runs' summaries stay
in their folders), and the command ends with a table of what ran, was reused or
failed per target. ``report`` (alone or after targets) builds the HTML report of
whatever targets have outputs (:mod:`replay.experiments.report`) into ``outputs/report/``
(``report-quick`` with ``--quick``; ``--report DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from replay.cli import fail
from replay.config import CONFIG_DIR
from replay.experiments.report import build_report
from replay.experiments.targets import TARGETS, TargetFailed
from replay.results import TABLE_NAME, collect

REPO = Path(__file__).resolve().parent.parent


def newest_config_mtime() -> float:
    return max(p.stat().st_mtime for p in CONFIG_DIR.rglob("*.yaml"))


#: The opening of a run summary line (``python -m replay`` prints ``json.dumps(summary)``).
SUMMARY_START = re.compile(r'\{"status": "(\w+)"')


@dataclass
class Tally:
    """What a target's runs did: ran, reused (a finished run with the same config), failed."""

    ran: int = 0
    reused: int = 0
    failed: int = 0
    up_to_date: bool = False  # the target's outputs were newer than its configs: nothing ran


def _run_quietly(command: list[str], label: str, tally: Tally) -> int:
    """Run ``python -m replay COMMAND`` with one progress bar over its finished runs.

    Each run prints its summary as one JSON line (full summaries stay in the run
    folders); those are counted, not echoed. The other output is kept and its last
    lines are shown only if the command fails.
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
            tally.failed += statuses.count("error")
            if statuses:
                bar.update(len(statuses))
                bar.set_postfix(reused=tally.reused - reused_before, failed=tally.failed)
            else:
                tail.append(line.rstrip())
    tally.ran += bar.n - (tally.reused - reused_before)
    if proc.returncode != 0:
        print("\n".join(tail), file=sys.stderr, flush=True)
    return proc.returncode


def run_target(name: str, quick: bool = False, force: bool = False,
               outputs_root: Path = REPO / "outputs" / "reproduce",
               tally: Tally | None = None) -> list[Path]:
    target = TARGETS[name]
    started = time.perf_counter()
    tally = Tally() if tally is None else tally
    out_dir = outputs_root / (f"{name}-quick" if quick else name)
    stamp = out_dir / "outputs.txt"
    if not force and stamp.is_file() and stamp.stat().st_mtime > newest_config_mtime():
        outputs = [Path(line) for line in stamp.read_text().split()]
        if all(p.is_file() for p in outputs):
            print(f"{name}: up to date ({stamp})")
            tally.up_to_date = True
            return outputs
    runs_dir = out_dir / "runs"
    fill = {"{outputs}": str(outputs_root.resolve()), "{suffix}": "-quick" if quick else ""}
    overrides = [o.replace("{outputs}", fill["{outputs}"]).replace("{suffix}", fill["{suffix}"])
                 for o in (*target.overrides, *(target.quick if quick else ()))]
    sweeps = (target.quick_sweeps if quick and target.quick_sweeps else target.sweeps)
    print(f"{name}: {target.description}", flush=True)
    for sweep, extra in (sweeps or {None: ()}).items():
        where = runs_dir / sweep if sweep else runs_dir
        # The target's folders are its own: a run of an edited config replaces the old one.
        if target.multirun:
            command = ["-m", *overrides, *extra, "output.overwrite=true",
                       f"hydra.sweep.dir={where}"]
        else:
            command = [*overrides, *extra, f"hydra.run.dir={where}"]
        print(f"  python -m replay {' '.join(command)}", flush=True)
        returncode = _run_quietly(command, f"{name}/{sweep}" if sweep else name, tally)
        if returncode != 0:
            raise TargetFailed(f"{name}: `python -m replay {' '.join(command)}` exited with "
                               f"status {returncode} (its last lines above say why)")
    if target.multirun:  # a study keeps its own table (trials.csv) instead
        collect([runs_dir], runs_dir / TABLE_NAME, quiet=True)
    outputs = [p for figure in target.figures for p in figure(runs_dir, out_dir)]
    stamp.write_text("\n".join(str(p) for p in outputs) + "\n")
    (out_dir / "elapsed.json").write_text(json.dumps({
        "seconds": time.perf_counter() - started, "finished": time.strftime("%Y-%m-%d %H:%M"),
        "ran": tally.ran, "reused": tally.reused, "failed": tally.failed}))
    for path in outputs:
        print(f"  wrote {path} (+ .csv)")
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m replay.reproduce",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", choices=[*TARGETS, "all", "report"],
                        help="targets to run; `all` runs every one, `report` builds the report")
    parser.add_argument("--quick", action="store_true", help="scaled-down version")
    parser.add_argument("--force", action="store_true", help="redraw even if up to date")
    parser.add_argument("--outputs", type=Path, default=REPO / "outputs" / "reproduce",
                        help="where target folders go")
    parser.add_argument("--report", type=Path, default=None,
                        help="report folder (default: report[-quick] beside --outputs)")
    args = parser.parse_args()
    names = list(TARGETS) if "all" in args.targets else [t for t in args.targets
                                                          if t != "report"]
    failed, rows = [], []
    for name in names:
        tally, started = Tally(), time.perf_counter()
        try:
            outputs = run_target(name, args.quick, args.force, args.outputs.resolve(), tally)
            state = "up to date" if tally.up_to_date else "done"
        except TargetFailed as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
            outputs, state = [], "FAILED"
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
            fail(f"{outputs_root}: no reproduction outputs to report on; run targets first "
                 f"(python -m replay.reproduce TARGET...{' --quick' if args.quick else ''})")
        report_dir = args.report or outputs_root.parent / ("report-quick" if args.quick
                                                           else "report")
        print(f"wrote {build_report(TARGETS, outputs_root, report_dir, args.quick)}")
    if failed:
        fail(f"{len(failed)} of {len(names)} targets failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
