"""``python -m replay.engine_check LOG_DIR [--timing layer_profile|aiconfigurator]
[--profile-dir DIR] [--hardware NAME] [--set KEY=VALUE ...] [--out DIR]``: replay a real vLLM
run and compare.

``LOG_DIR`` is a run folder in the layout of LLMServingSim's benchmark examples
(casys-kaist/LLMServingSim, ``bench/examples/<hardware>/<model>/``): ``vllm/requests.jsonl``
(one JSON object per request: ``input_toks``, ``output_toks``, ``arrival_time``,
``queued_ts``, ``first_token_ts``, ``last_token_ts``, ``scheduled_ts``), ``vllm/meta.json``
(the engine's arguments, and where recorded its KV cache and GPU) and optionally
``vllm/timeseries.csv`` (requests running and waiting and KV use per second) and
``config.json`` (the peer's cluster config, which names the GPU).

The check replays exactly the run's arrivals and lengths with ``policy=vllm_v1`` and the
engine's ``max_num_seqs``, ``max_num_batched_tokens`` and tensor parallelism, on the model
meta.json names and the GPU it records, with the KV cache vLLM reported
(``kv_cache.num_gpu_blocks`` x ``block_size``) or, where meta.json has none, ``kv=vllm_profile``
at the run's ``gpu_memory_utilization`` (0.9 when unrecorded), and the prefix cache on
(``kv.prefix_cache=block_hash``: a preempted request finds its own blocks) unless
``kv_cache.enable_prefix_caching`` records it off (vLLM 0.19 turns it on by default). The
step time comes only from the timing source: the per-layer profile measured on that GPU
(``layer_profile``, ``--profile-dir`` for another folder) or aiconfigurator's kernel tables
(``aiconfigurator``).
Nothing is fitted to the log.

TTFT, TPOT and end-to-end latency are computed on both sides as LLMServingSim's
``validation/summary.txt`` computes them (``bench/core/validate.py`` and ``plots.py`` of the
release the logs come from): TTFT = first token - arrival, TPOT = (last token - first
token) / (output tokens - 1) over requests with more than one output token, latency = last
token - arrival, in ms; percentiles interpolate linearly between order statistics. The
arrival is ``arrival_time`` where it is on the same clock as the token times, else
``queued_ts`` (vLLM records ``arrival_time`` on the wall clock and the rest on the engine's
monotonic clock); the replay's arrivals are the same times, from the first one.

Prints the table of summary.txt (metric, vLLM, kvsched, difference in %), a line on
preemptions (kvsched's count, and the lower bound the log implies: requests back in the
waiting queue after having been scheduled, from timeseries.csv) and, as the last line, one
JSON object with a key per row (``ttft_mean`` ... ``latency_p99``), each ``{"vllm": ms,
"kvsched": ms, "diff_pct": %}``. Writes under ``--out`` (default
``outputs/engine_check/<hardware>-<model>-<timing>``): ``comparison.csv``, ``requests.csv``
(per request, both sides), ``timeseries.csv`` and ``timeseries.png`` (running, waiting and KV
use per second, vLLM's and kvsched's), and ``summary.json`` (the table, the preemptions, the
replay's summary and the input files with their hashes).
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from replay.config import CONFIG_DIR, compose_config
from replay.config.cli import CommandParser, run_or_exit
from replay.engine.loop import Engine, RunResult
from replay.engine.metrics import summarize
from replay.engine.requests import Requests
from replay.errors import InputError
from replay.storage.data import file_record
from replay.storage.outputs import (
    atomic_write,
    atomic_write_text,
    ensure_writable_dir,
    summary_json,
)

TIMINGS = ("layer_profile", "aiconfigurator")
#: Rows of the table: (key prefix, label), then the statistics (key suffix, label).
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("latency", "Latency"))
STATISTICS = (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p95", "P95"),
              ("p99", "P99"))
PERCENTILE = {"median": 50, "p90": 90, "p95": 95, "p99": 99}
#: Two timestamps more than this many seconds apart are on different clocks (LLMServingSim's
#: rule: a request lasts seconds, not a day).
SAME_CLOCK_S = 100_000
REQUEST_FIELDS = ("input_toks", "output_toks", "first_token_ts", "last_token_ts")
#: The offsets tried when aligning timeseries.csv's clock with the requests' (seconds).
ALIGNMENT_RANGE_S, ALIGNMENT_STEP_S = 2.0, 0.01


# --------------------------------------------------------------------------- the log
@dataclass
class LoggedRun:
    """A real run as its folder records it (times in seconds from the first arrival)."""

    folder: Path
    requests: pd.DataFrame   # input_toks, output_toks, arrival, scheduled, first_token, last_token
    anchor: str              # which field the arrivals are: arrival_time or queued_ts
    model: str
    tensor_parallel: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int | None
    block_size: int | None
    gpu_memory_utilization: float | None
    prefix_caching: bool     # kv_cache.enable_prefix_caching, else vLLM 0.19's default (on)
    gpu: str | None          # the GPU's name as recorded (meta.json, else config.json)
    timeseries: pd.DataFrame | None
    files: list


def _switch(record: dict, key: str, where: str, default: bool) -> bool:
    """``record[key]`` as a true/false switch (``default`` where unrecorded), or an
    InputError naming ``where`` and the field."""
    value = record.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{where}: field {key!r} must be true or false, got {value!r}")
    return value


def _field(record: dict, key: str, where: str, kind=int, minimum=None):
    """``record[key]`` as ``kind``, or an InputError naming ``where`` and the field."""
    if key not in record or record[key] is None:
        raise InputError(f"{where}: missing field {key!r}")
    value = record[key]
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
            value)
    if not ok or (minimum is not None and value < minimum):
        wanted = "a whole number" if kind is int else "a finite number"
        bound = f" >= {minimum}" if minimum is not None else ""
        raise InputError(f"{where}: field {key!r} must be {wanted}{bound}, got {value!r}")
    return value


def _read_json(path: Path):
    if not path.is_file():
        raise InputError(f"{path}: file not found (LOG_DIR must hold vllm/requests.jsonl and "
                         f"vllm/meta.json)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def _read_requests(path: Path) -> tuple[pd.DataFrame, str]:
    if not path.is_file():
        raise InputError(f"{path}: file not found (LOG_DIR must hold vllm/requests.jsonl and "
                         f"vllm/meta.json)")
    rows = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{where}: expected a JSON object")
            row = {key: _field(record, key, where, int if key.endswith("toks") else float,
                               1 if key.endswith("toks") else None) for key in REQUEST_FIELDS}
            for key in ("arrival_time", "queued_ts", "scheduled_ts"):
                row[key] = (_field(record, key, where, float) if record.get(key) is not None
                            else None)
            if row["last_token_ts"] < row["first_token_ts"]:
                raise InputError(f"{where}: last_token_ts is before first_token_ts")
            row["line"] = number
            rows.append(row)
    if not rows:
        raise InputError(f"{path}: no requests")
    frame = pd.DataFrame(rows)
    # The arrival on the token times' clock, as LLMServingSim's summary takes it.
    arrival = frame["arrival_time"]
    same_clock = arrival.notna() & ((arrival - frame["first_token_ts"]).abs() < SAME_CLOCK_S)
    if same_clock.all():
        anchor = "arrival_time"
    else:
        anchor = "queued_ts"
        missing = frame[frame["queued_ts"].isna()]
        if len(missing):
            raise InputError(f"{path}: line {int(missing['line'].iloc[0])}: missing field "
                             f"'queued_ts' (arrival_time is not on the token times' clock)")
    start = frame[anchor].min()
    out = pd.DataFrame({
        "input_toks": frame["input_toks"].astype(np.int64),
        "output_toks": frame["output_toks"].astype(np.int64),
        "arrival": frame[anchor] - start,
        "scheduled": (frame["scheduled_ts"] - start) if frame["scheduled_ts"].notna().all()
        else np.nan,
        "first_token": frame["first_token_ts"] - start,
        "last_token": frame["last_token_ts"] - start,
    })
    late = out.index[out["first_token"] < out["arrival"]]
    if len(late):
        raise InputError(f"{path}: line {int(frame['line'].iloc[late[0]])}: first_token_ts is "
                         f"before the request's arrival ({anchor})")
    return out, anchor


def _read_timeseries(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from None
    missing = [c for c in ("t", "running", "waiting") if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
    for column in ("t", "running", "waiting", "kv_cache_pct"):
        if column in frame.columns and not np.isfinite(
                pd.to_numeric(frame[column], errors="coerce")).all():
            bad = int(np.flatnonzero(~np.isfinite(pd.to_numeric(frame[column],
                                                                 errors="coerce")))[0])
            raise InputError(f"{path}: line {bad + 2}: column {column!r} is not a number")
    return frame


def read_run(folder: Path) -> LoggedRun:
    """The run recorded in ``folder`` (see the module docstring), checked field by field."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (LOG_DIR: a run folder holding vllm/)")
    requests_path, meta_path = folder / "vllm" / "requests.jsonl", folder / "vllm" / "meta.json"
    requests, anchor = _read_requests(requests_path)
    meta = _read_json(meta_path)
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a JSON object")
    engine = meta.get("engine_kwargs")
    if not isinstance(engine, dict):
        raise InputError(f"{meta_path}: missing field 'engine_kwargs'")
    where = f"{meta_path}: engine_kwargs"
    model = meta.get("model") or engine.get("model")
    if not isinstance(model, str) or not model:
        raise InputError(f"{meta_path}: missing field 'model'")
    kv = meta.get("kv_cache") or {}
    hardware = meta.get("hardware") or {}
    gpu = hardware.get("device_name")
    cluster_path = folder / "config.json"
    files = [file_record(requests_path), file_record(meta_path)]
    if gpu is None and cluster_path.is_file():
        cluster = _read_json(cluster_path)
        try:
            gpu = cluster["nodes"][0]["instances"][0]["hardware"]
        except (KeyError, IndexError, TypeError):
            gpu = None
        files.append(file_record(cluster_path))
    series_path = folder / "vllm" / "timeseries.csv"
    timeseries = _read_timeseries(series_path)
    if timeseries is not None:
        files.append(file_record(series_path))
    kv_where = f"{meta_path}: kv_cache"
    return LoggedRun(
        folder=folder, requests=requests, anchor=anchor, model=model,
        tensor_parallel=_field(engine, "tensor_parallel_size", where, minimum=1),
        max_num_seqs=_field(engine, "max_num_seqs", where, minimum=1),
        max_num_batched_tokens=_field(engine, "max_num_batched_tokens", where, minimum=1),
        kv_blocks=_field(kv, "num_gpu_blocks", kv_where, minimum=2) if kv else None,
        block_size=_field(kv, "block_size", kv_where, minimum=1) if kv else None,
        gpu_memory_utilization=(_field(kv, "gpu_memory_utilization", kv_where, float)
                                if kv.get("gpu_memory_utilization") is not None else None),
        prefix_caching=_switch(kv, "enable_prefix_caching", kv_where, default=True),
        gpu=gpu, timeseries=timeseries, files=files)


# ----------------------------------------------------------------- the replay's setup
def _option_files(group: str) -> dict[str, dict]:
    return {path.stem: yaml.safe_load(path.read_text())
            for path in sorted((CONFIG_DIR / group).glob("*.yaml"))}


def _normalised(name: str) -> str:
    name = re.sub(r"NVIDIA|GEFORCE", "", name.upper())
    return re.sub(r"[^A-Z0-9]", "", name)


def model_option(model: str) -> str:
    """The ``model=`` option whose ``hf_id`` is ``model``."""
    options = _option_files("model")
    for option, config in options.items():
        if config.get("hf_id") == model:
            return option
    known = ", ".join(f"{c['hf_id']} ({o})" for o, c in options.items() if c.get("hf_id"))
    raise InputError(f"meta.json names model {model!r}, which no model config has; configs "
                     f"exist for {known}")


def hardware_option(gpu: str | None, tensor_parallel: int, given: str | None) -> str:
    """The ``hardware=`` option for ``gpu`` (a recorded device or profile name) with
    ``tensor_parallel`` GPUs; ``given`` (``--hardware``) wins."""
    options = _option_files("hardware")
    if given is not None:
        if given not in options:
            raise InputError(f"--hardware {given}: no such option in configs/hardware; choose "
                             f"one of: {', '.join(options)}")
        return given
    if gpu is None:
        raise InputError("the run records no GPU (meta.json has no hardware.device_name and "
                         "the folder no config.json naming one); give --hardware NAME")
    wanted = _normalised(gpu)
    matches = [o for o, c in options.items() if c.get("profile_name")
               and wanted.startswith(_normalised(c["profile_name"]))
               and c.get("num_gpus") == tensor_parallel]
    if not matches:
        raise InputError(f"no hardware config for GPU {gpu!r} with {tensor_parallel} GPU(s) "
                         f"(tensor_parallel_size); give --hardware NAME")
    return matches[0]


def overrides_for(run: LoggedRun, timing: str, profile_dir: str | None = None,
                  hardware: str | None = None, extra=()) -> list[str]:
    """The config overrides that replay ``run`` (see the module docstring)."""
    if timing not in TIMINGS:
        raise InputError(f"--timing {timing}: choose one of {', '.join(TIMINGS)}")
    overrides = [f"model={model_option(run.model)}",
                 f"hardware={hardware_option(run.gpu, run.tensor_parallel, hardware)}",
                 "policy=vllm_v1", f"timing={timing}",
                 f"policy.max_num_seqs={run.max_num_seqs}",
                 f"policy.max_num_batched_tokens={run.max_num_batched_tokens}"]
    if run.kv_blocks is not None:
        overrides += ["kv=explicit", f"kv.tokens={run.kv_blocks * run.block_size}",
                      f"policy.block_size={run.block_size}"]
    else:
        overrides += ["kv=vllm_profile"]
        if run.gpu_memory_utilization is not None:
            overrides.append(f"kv.gpu_memory_utilization={run.gpu_memory_utilization}")
    if run.prefix_caching:  # a preempted request finds its own blocks while they stay cached
        overrides.append("kv.prefix_cache=block_hash")
    if profile_dir is not None:
        if timing != "layer_profile":
            raise InputError("--profile-dir is a layer_profile option (--timing layer_profile)")
        overrides.append(f"timing.profile_dir={Path(profile_dir).expanduser().resolve()}")
    return overrides + list(extra)


def replay(run: LoggedRun, cfg: DictConfig, policy=None, timing=None) -> tuple[RunResult, dict]:
    """``run``'s requests replayed under ``cfg``'s policy, timing and KV (or the ``policy``
    and ``timing`` given, built from it), and the timing backend's record."""
    kv = instantiate(cfg.kv)
    timing = instantiate(cfg.timing) if timing is None else timing
    policy = instantiate(cfg.policy) if policy is None else policy
    r = run.requests
    requests = Requests(r["input_toks"].to_numpy(), r["output_toks"].to_numpy(),
                        arrival=r["arrival"].to_numpy(float))
    result = Engine(requests, policy, timing, kv, seed=cfg.seed,
                    **OmegaConf.to_container(cfg.engine, resolve=True)).run()
    return result, timing.describe()


# ------------------------------------------------------------------ the comparison
def statistic(values: np.ndarray, which: str) -> float:
    if values.size == 0:
        return math.nan
    return float(values.mean()) if which == "mean" else float(
        np.percentile(values, PERCENTILE[which]))


def latencies_ms(arrival, first_token, last_token, output_toks) -> dict[str, np.ndarray]:
    """TTFT, TPOT (requests with more than one output token) and latency, in ms."""
    arrival, first, last = (np.asarray(x, dtype=float) for x in (arrival, first_token,
                                                                  last_token))
    tokens = np.asarray(output_toks)
    many = tokens > 1
    return {"ttft": (first - arrival) * 1e3,
            "tpot": (last[many] - first[many]) / (tokens[many] - 1) * 1e3,
            "latency": (last - arrival) * 1e3}


def comparison(reference: dict, replayed: dict) -> pd.DataFrame:
    """One row per metric and statistic: vLLM's, kvsched's and the difference in %."""
    rows = []
    for metric, label in METRICS:
        for stat, stat_label in STATISTICS:
            v, k = statistic(reference[metric], stat), statistic(replayed[metric], stat)
            rows.append({"key": f"{metric}_{stat}", "metric": f"{label} {stat_label}",
                         "vllm": v, "kvsched": k,
                         "diff_pct": (k - v) / v * 100 if v else math.nan})
    return pd.DataFrame(rows)


def format_table(table: pd.DataFrame) -> str:
    """The table as LLMServingSim's summary.txt lays it out, kvsched in the Sim column."""
    header = f"{'Metric':<25}{'vLLM':>12}{'kvsched':>12}{'Diff%':>10}"
    lines = [header, "-" * len(header)]
    for i, row in enumerate(table.itertuples()):
        lines.append(f"{row.metric:<25}{row.vllm:>12.1f}{row.kvsched:>12.1f}"
                     f"{row.diff_pct:>+9.1f}%")
        if i % len(STATISTICS) == len(STATISTICS) - 1:
            lines.append("")
    return "\n".join(lines).rstrip("\n")


def row_json(table: pd.DataFrame) -> str:
    return json.dumps({row.key: {"vllm": round(row.vllm, 3), "kvsched": round(row.kvsched, 3),
                                 "diff_pct": round(row.diff_pct, 3)}
                       for row in table.itertuples()})


# -------------------------------------------------------------- time series, preemptions
def replay_series(result: RunResult, arrivals: np.ndarray, ticks: np.ndarray,
                  usable_tokens: int) -> pd.DataFrame:
    """kvsched's requests running and waiting, KV use (tokens held over the
    ``usable_tokens``, %) and requests waiting after a preemption, after the last step ending at or
    before each tick (seconds from the first arrival), as vLLM's stat logger samples them.

    Requests waiting after a preemption are counted exactly from the step log: the policy's
    waiting queue is in arrival order with preempted requests at its front (see
    policies/vllm_v1.py), so a step's admissions readmit them first."""
    it = result.iterations
    it = it[~it["failed"]] if len(it) else it
    end = (it["start_time"] + it["duration"]).to_numpy()
    started = it["n_started"].to_numpy()
    evicted = it["n_evicted"].to_numpy()
    completed = it["n_completed"].to_numpy()
    running = np.cumsum(started - completed - evicted)
    preempted = np.zeros(len(it), dtype=np.int64)
    waiting_again = 0
    for k in range(len(it)):
        waiting_again += evicted[k]
        waiting_again -= min(started[k], waiting_again)
        preempted[k] = waiting_again
    done = np.cumsum(completed)
    arrivals = np.sort(arrivals)
    rows = []
    for tick in ticks:
        k = int(np.searchsorted(end, tick, side="right")) - 1
        arrived = int(np.searchsorted(arrivals, tick, side="right"))
        if k < 0:
            rows.append((tick, 0, arrived, 0.0, 0))
            continue
        rows.append((tick, int(running[k]), arrived - int(done[k]) - int(running[k]),
                     100.0 * float(it["kv_after"].iloc[k]) / usable_tokens, int(preempted[k])))
    return pd.DataFrame(rows, columns=["t", "running", "waiting", "kv_pct", "preempted_waiting"])


def clock_offset(run: LoggedRun) -> float:
    """The offset (s) of timeseries.csv's clock from the requests' clock: the one under
    which the waiting requests it reports best match the requests that had arrived and
    were not yet scheduled (preempted requests, which it also counts as waiting, are few).
    Only the log's own two files are aligned: nothing of the replay enters."""
    r, series = run.requests, run.timeseries
    if series is None or r["scheduled"].isna().any():
        return 0.0
    arrival, scheduled = r["arrival"].to_numpy(), r["scheduled"].to_numpy()
    ticks, waiting = series["t"].to_numpy(float), series["waiting"].to_numpy(float)
    offsets = np.arange(-ALIGNMENT_RANGE_S, ALIGNMENT_RANGE_S + 1e-9, ALIGNMENT_STEP_S)
    errors = [np.abs(waiting - _unscheduled(arrival, scheduled, ticks - d)).sum()
              for d in offsets]
    return float(offsets[int(np.argmin(errors))])


def _unscheduled(arrival, scheduled, times) -> np.ndarray:
    """Requests arrived and not yet scheduled for the first time, at each of ``times``."""
    arrived = np.searchsorted(np.sort(arrival), times, side="right")
    first = np.searchsorted(np.sort(scheduled), times, side="right")
    return arrived - first


def log_series(run: LoggedRun, offset: float) -> pd.DataFrame | None:
    """timeseries.csv on the requests' clock, with the requests waiting after a preemption
    it implies: those it reports waiting beyond the ones not yet scheduled once."""
    series = run.timeseries
    if series is None:
        return None
    r = run.requests
    t = series["t"].to_numpy(float) - offset
    kv = (series["kv_cache_pct"].to_numpy(float) if "kv_cache_pct" in series.columns
          else np.full(len(series), np.nan))
    if not kv.any() and series["running"].to_numpy().any():
        # Zero KV use while requests run: the column was not recorded (older versions of the
        # peer's stat logger wrote 0 throughout).
        kv = np.full(len(series), np.nan)
    out = pd.DataFrame({"t": t, "running": series["running"].to_numpy(),
                        "waiting": series["waiting"].to_numpy(), "kv_pct": kv})
    if not r["scheduled"].isna().any():
        unscheduled = _unscheduled(r["arrival"].to_numpy(), r["scheduled"].to_numpy(), t)
        out["preempted_waiting"] = np.maximum(out["waiting"].to_numpy() - unscheduled, 0)
    return out


def preemption_bound(waiting_again: np.ndarray) -> int:
    """The fewest preemptions that explain a per-second count of requests waiting after a
    preemption: every rise is that many new ones (a request preempted and readmitted
    within one second is not seen)."""
    counts = np.concatenate(([0], np.asarray(waiting_again, dtype=np.int64)))
    return int(np.maximum(np.diff(counts), 0).sum())


def preemptions(result: RunResult, ours: pd.DataFrame, theirs: pd.DataFrame | None) -> dict:
    requests = result.requests
    out = {"kvsched_preemptions": int(requests["evictions"].sum()),
           "kvsched_requests_preempted": int((requests["evictions"] > 0).sum()),
           "kvsched_bound_per_second": preemption_bound(ours["preempted_waiting"]),
           "kvsched_peak_waiting_after_preemption": int(ours["preempted_waiting"].max())}
    if theirs is not None and "preempted_waiting" in theirs.columns:
        out["vllm_bound_per_second"] = preemption_bound(theirs["preempted_waiting"])
        out["vllm_peak_waiting_after_preemption"] = int(theirs["preempted_waiting"].max())
    return out


def preemption_line(counts: dict) -> str:
    line = (f"preemptions: kvsched {counts['kvsched_preemptions']} "
            f"({counts['kvsched_requests_preempted']} requests; at least "
            f"{counts['kvsched_bound_per_second']} seen per second)")
    if "vllm_bound_per_second" in counts:
        line += (f"; the vLLM log implies at least {counts['vllm_bound_per_second']} (per "
                 f"second, up to {counts['vllm_peak_waiting_after_preemption']} requests "
                 f"waiting again at once; kvsched up to "
                 f"{counts['kvsched_peak_waiting_after_preemption']})")
    return line


def plot_series(theirs: pd.DataFrame | None, ours: pd.DataFrame, title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("running", "running"), ("waiting", "waiting"), ("kv_pct", "KV use (%)"),
              ("preempted_waiting", "waiting after\npreemption"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 8), sharex=True)
    for ax, (column, label) in zip(axes, panels, strict=True):
        if theirs is not None and column in theirs.columns and theirs[column].notna().any():
            ax.plot(theirs["t"], theirs[column], color="C0", label="vLLM (log)")
        ax.plot(ours["t"], ours[column], color="C1", ls="--", label="kvsched")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right")
    axes[-1].set_xlabel("seconds from the first arrival")
    fig.suptitle(title)
    fig.tight_layout()
    ensure_writable_dir(out.parent)
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=150, format="png"))
    plt.close(fig)
    return out


# ------------------------------------------------------------------------ the check
def check(log_dir: Path, timing: str = "layer_profile", profile_dir: str | None = None,
          hardware: str | None = None, extra=(), out: Path | None = None,
          components=None) -> dict:
    """Replay the run in ``log_dir`` and compare (see the module docstring). Returns the
    record written to ``summary.json``, with the comparison table under ``table``.
    ``components(cfg) -> (policy, timing)`` replaces the config's policy and timing backend
    (a study that varies how they work)."""
    run = read_run(log_dir)
    overrides = overrides_for(run, timing, profile_dir, hardware, extra)
    cfg = compose_config(overrides)
    policy, backend = components(cfg) if components is not None else (None, None)
    result, timing_record = replay(run, cfg, policy, backend)
    measured_on = (timing_record.get("measured") or {}).get("hardware")
    if measured_on and cfg.hardware.get("profile_name") and _normalised(
            measured_on) != _normalised(cfg.hardware.profile_name):
        print(f"warning: the profile was measured on {measured_on}, the run on "
              f"{cfg.hardware.profile_name}", file=sys.stderr)
    if result.status != "completed":
        raise InputError(f"the replay of {log_dir} did not complete ({result.status}: "
                         f"{result.message})")
    r, q = run.requests, result.requests
    reference = latencies_ms(r["arrival"], r["first_token"], r["last_token"], r["output_toks"])
    replayed = latencies_ms(q["arrival"], q["first_token"], q["completion"], q["output_len"])
    table = comparison(reference, replayed)
    offset = clock_offset(run)
    theirs = log_series(run, offset)
    horizon = max(float(q["completion"].max()), float(r["last_token"].max()))
    usable = result.kv.tokens - result.kv.block_size * int(cfg.policy.get("reserved_blocks", 0))
    ours = replay_series(result, q["arrival"].to_numpy(), np.arange(1.0, math.ceil(horizon) + 1),
                         usable)
    counts = preemptions(result, ours, theirs)
    name = f"{run.folder.parent.name}-{run.folder.name}-{timing}"
    out = Path(out) if out is not None else Path("outputs/engine_check") / name
    ensure_writable_dir(out)
    atomic_write(out / "comparison.csv", lambda tmp: table.to_csv(tmp, index=False))
    per_request = pd.DataFrame({
        "input_toks": r["input_toks"], "output_toks": r["output_toks"], "arrival": r["arrival"],
        "vllm_first_token": r["first_token"], "vllm_last_token": r["last_token"],
        "kvsched_first_token": q["first_token"], "kvsched_last_token": q["completion"],
        "kvsched_preemptions": q["evictions"]})
    atomic_write(out / "requests.csv", lambda tmp: per_request.to_csv(tmp, index=False))
    both = ours.add_prefix("kvsched_").rename(columns={"kvsched_t": "t"})
    if theirs is not None:
        both = pd.concat([both, theirs.add_prefix("vllm_")], axis=1)
    atomic_write(out / "timeseries.csv", lambda tmp: both.to_csv(tmp, index=False))
    title = f"{run.model} on {run.gpu or cfg.hardware.name}: vLLM vs kvsched ({timing})"
    plot_series(theirs, ours, title, out / "timeseries.png")
    summary = summarize(result)
    record = {"log_dir": str(run.folder), "timing": timing, "arrival_field": run.anchor,
              "clock_offset_s": offset, "overrides": overrides,
              "table": table.to_dict(orient="records"), "preemptions": counts,
              "replay": {k: v for k, v in summary.items() if not isinstance(v, dict)},
              "kv": summary["kv"], "timing_backend": timing_record,
              "input_files": run.files, "config": OmegaConf.to_container(cfg, resolve=True)}
    # Strict JSON, as a run's summary (a relative error of 0/0 is null, named under
    # non_finite): results collect refuses a NaN in a summary with a config.
    atomic_write_text(out / "summary.json", summary_json(record))
    record["out"] = str(out)
    return record


def main(argv=None) -> None:
    parser = CommandParser(
        prog="python -m replay.engine_check",
        description="Replay a real vLLM run with policy=vllm_v1 and compare TTFT, TPOT and "
                    "latency with its log (docs/reproducing/engine.md).")
    parser.add_argument("log_dir", type=Path, metavar="LOG_DIR",
                        help="a run folder holding vllm/requests.jsonl and vllm/meta.json")
    parser.add_argument("--timing", default="layer_profile", choices=TIMINGS,
                        help="the timing source (default: layer_profile)")
    parser.add_argument("--profile-dir", default=None, metavar="DIR",
                        help="a model's per-layer profile folder <gpu>/<org>/<model> "
                             "(layer_profile; default: the data directory's for the run's GPU)")
    parser.add_argument("--hardware", default=None, metavar="NAME",
                        help="a configs/hardware option (default: from the GPU the run records)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a further config override (repeatable), e.g. to vary one factor")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the files go (default: outputs/engine_check/"
                             "<gpu>-<model>-<timing>)")
    args = parser.parse_args(argv)
    record = run_or_exit(check, args.log_dir, args.timing, args.profile_dir, args.hardware,
                         args.set, args.out)
    table = pd.DataFrame(record["table"])
    print(format_table(table))
    print()
    print(preemption_line(record["preemptions"]))
    print(f"outputs: {record['out']}")
    print(row_json(table))
    sys.stdout.flush()


if __name__ == "__main__":
    run_or_exit(main)
