"""What every many-trial study shares: resumable ``trials.csv`` in a run folder, and
trials run in worker processes.

A study's parameters are stored in ``study.json``; a rerun with other parameters
in the same folder is refused rather than mixed in (only ``trials`` may differ, so
a study can be extended in place). Rows are appended whole as trials finish, and a
partial last row left by an interruption is dropped.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

from replay.errors import InputError, end_worker_quietly_on_ctrl_c
from replay.storage.outputs import atomic_write_text, drop_partial_last_row, read_summary

log = logging.getLogger(__name__)


def finished_trials(out_dir: Path, params: dict) -> pd.DataFrame | None:
    """The trials already in ``out_dir`` that this study counts (``None`` if none).

    A folder extended to more trials than ``params["trials"]`` keeps them on disk, but the
    study reports only trials ``0 .. trials - 1`` (:func:`counted`), so ``study.json``, the
    log and the summary all say the same number."""
    study_file, trials_file = out_dir / "study.json", out_dir / "trials.csv"
    previous = read_summary(study_file) if study_file.is_file() else None

    def without_trials(p: dict) -> dict:
        return {k: v for k, v in p.items() if k != "trials"}

    if previous is not None and without_trials(previous) != without_trials(params):
        raise InputError(f"{study_file}: this directory holds a study with other parameters "
                         f"({previous}); use a new output directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(study_file, json.dumps(params, indent=1) + "\n")
    if drop_partial_last_row(trials_file):
        log.warning("%s: dropped a partial last row left by an interrupted run", trials_file)
    if trials_file.is_file() and trials_file.stat().st_size:
        done = counted(pd.read_csv(trials_file), params)
        return done if len(done) else None
    return None


def counted(table: pd.DataFrame, params: dict) -> pd.DataFrame:
    """The rows of ``table`` that belong to a study of ``params["trials"]`` trials."""
    return table[table["trial"] < params["trials"]] if "trial" in table else table


def run_parallel(function: Callable, arguments: Iterable[tuple], workers: int) -> Iterator:
    """``function(*args)`` for each, in completion order, in ``workers`` processes.

    Workers are spawned, not forked: ortools and highspy cannot share a process, so
    each worker starts clean."""
    arguments = list(arguments)
    if workers <= 1:
        for args in arguments:
            yield function(*args)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context,
                               initializer=end_worker_quietly_on_ctrl_c)
    try:
        futures = [pool.submit(function, *args) for args in arguments]
        for future in as_completed(futures):
            yield future.result()
    except BaseException:
        # Ctrl-C, a failed trial or a consumer that stops early. Leaving by ``with`` would
        # wait for every queued trial: a reproduction interrupted at once went on computing
        # for 20 minutes. Cancel the queue, so each worker ends after the trial it is
        # running (at once on Ctrl-C: end_worker_quietly_on_ctrl_c).
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
