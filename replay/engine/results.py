"""What a replay produces: the per-request and per-iteration tables and the run's outcome."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from replay.engine.histogram import LogHistogram
from replay.engine.kv import KVCapacity

#: The iteration table: one row per step, failed attempts included.
ITERATION_DTYPES = {
    "start_time": np.float64, "duration": np.float64, "batch_size": np.int64,
    "n_started": np.int64, "prefill_tokens": np.int64, "decode_requests": np.int64,
    "kv_peak": np.int64, "kv_after": np.int64, "n_completed": np.int64, "n_evicted": np.int64,
    "failed": bool}
ITERATION_COLUMNS = list(ITERATION_DTYPES)


@dataclass
class RunResult:
    """Everything a replay produced.

    ``status`` is ``"completed"``, ``"livelock"`` (no completion within
    ``livelock_window`` steps while work remained), ``"stalled"`` (the policy
    scheduled nothing although work remained and no arrival was left) or
    ``"step_limit"``. Tables hold the metrics up to the end of the run.
    ``loop_time_s`` is the wall time of the step loop; of it, ``decision_time_s`` was
    spent inside a Python policy's ``decide`` and ``timing_time_s`` inside a Python timing
    backend (both 0 for compiled ones, which run inside the loop). ``compile_time_s`` is
    what compiling the loop and its rules, or loading them from the disk cache, cost this
    process before the loop. ``decisions`` counts the policy's decisions (fewer than the
    steps where steady stretches ran without asking it). ``token_gaps`` is the
    distribution of every time-between-tokens gap the engine executed (see
    :class:`replay.engine.histogram.LogHistogram`).
    """

    status: str
    message: str
    requests: pd.DataFrame
    iterations: pd.DataFrame
    kv: KVCapacity
    livelock_window: int
    decision_time_s: float
    preemption: str
    requeue: str
    token_gaps: LogHistogram
    policy_info: dict | None = None  # what the policy derived (thresholds...), if it says
    fluid: dict | None = None  # the fluid benchmark of a typed workload (replay.run)
    timing_time_s: float = 0.0
    loop_time_s: float = 0.0
    decisions: int = 0
    compile_time_s: float = 0.0
    #: How each rule ran: ``{"policy": "compiled" | "python", "overflow": ..., "timing": ...}``.
    engine_path: dict | None = None
    #: Requests the policy dropped (``Batch.drop``): they never complete.
    dropped: int = 0
    #: The prefix cache's totals (``kv.prefix_cache=block_hash``), else None.
    prefix_cache: dict | None = None


def iteration_frame(times: np.ndarray, ints: np.ndarray, failed: np.ndarray,
                    rows: int) -> pd.DataFrame:
    """The iteration table from the step loop's log arrays (their first ``rows`` rows)."""
    columns = {"start_time": times[0, :rows], "duration": times[1, :rows],
               "failed": failed[:rows]}
    for k, name in enumerate(ITERATION_COLUMNS[2:-1]):
        columns[name] = ints[k, :rows]
    return pd.DataFrame({name: np.array(columns[name], dtype=ITERATION_DTYPES[name])
                         for name in ITERATION_COLUMNS})
