"""docs/reproducing/harness.md D3: ``python -m replay.crosscheck [--n N] [--quick] [--out DIR]``
``[--whole-process]``.

Runs Vidur's own event-driven simulator (the ``vidur`` package, offline: the data
directory's profiles, no wandb, no downloads) and this harness on the same requests
(lengths and Poisson arrival times drawn once, by the harness), model, tensor
parallelism, predictor, KV capacity in blocks, block size, batch cap, watermark and
chunk size: Vidur's ``vllm`` and ``sarathi`` replica schedulers against ``policy=vllm``
and ``policy=sarathi``, on LMSYS and arXiv at a low and a high rate. Writes, under
``--out`` (default ``outputs/crosscheck``):

* ``requests.csv``: every request of every case in both simulators (latency, TTFT,
  mean time between tokens, restarts);
* ``comparison.csv``: per case and metric, mean/p50/p99 in each and their differences;
* ``speed.csv``: each simulator's wall time of the simulation loop and of the
  in-process call (the fastest of ``--repeat`` runs of each, default 3), with
  ``--whole-process`` of one whole process per case, requests per wall-second, and the
  ratios (also printed);
* ``distributions.png``: the per-request distributions side by side (CDFs).

Both simulators price a batch with the same trained Vidur predictor (this harness
through its exported tables, :mod:`replay.timing.vidur`). What still differs, by name
(docs/reproducing/harness.md D3 gives the measured effect of each):

* **Prefill KV accounting.** Vidur's schedulers pass ``num_processed_tokens + chunk``
  as a prefill's KV size (``vidur/scheduler/replica_scheduler/vllm_replica_scheduler.py``,
  ``next_num_kv_tokens = request.num_processed_tokens + next_num_q_tokens``), so a
  prompt's attention is priced as if its own tokens were already cached; the harness
  passes the cached tokens only (docs/model.md). Vidur's prefills cost more.
* **Restart after preemption.** ``Request.restart`` in ``vidur/entities/request.py``
  does not reset ``_num_stage_processed_tokens`` or ``_is_prefill_stage_complete``,
  so the first restarted request trips the assertion in ``on_batch_stage_end``
  (``assert self._num_stage_processed_tokens <= self.total_tokens``). Vidur cannot
  finish a run with a preemption; :class:`RestartableRequest` resets both, which is
  what its restart evidently means (the request re-prefills everything processed).
* **Prompt KV reservation.** Vidur reserves ``ceil(prompt / block)`` blocks at
  admission and the first output token's slot later; the harness reserves
  ``prompt + 1`` tokens (at most one block more per admitted request). Vidur's
  sarathi reserves the whole prompt when it admits the first chunk; the
  Sarathi-like policy does so only with ``reserve_prompt=true`` (the crosscheck's
  default; ``--no-reserve-prompt`` shows the effect of chunk-by-chunk reservation,
  which admits more prompts and preempts under memory pressure).
* **Batch cap.** Vidur counts every request holding blocks (``len(_allocation_map)``)
  against ``batch_size_cap``; the harness counts running requests. The cap is 128
  here, because Vidur's predictor has no decode entry past its profiled 128 requests
  (``sklearn_execution_time_predictor.py``, ``_get_attention_decode_execution_time``
  raises ``KeyError``); the harness extrapolates there (``timing.out_of_range``).

The speed comparison times, on the same requests, the simulation loops (Vidur's
``Simulator.run`` with its traces and metrics off; the harness's step loop,
``loop_time_s``) and the in-process call a user waits for (the harness: composing the
config, building and running the replay and writing its folder; Vidur: building its
simulator and requests, running it and collecting the metrics). Vidur's predictor is
loaded once per model and shared (training it is left out of both). ``--set KEY=VALUE``
adds an override to every harness run, as ``reproduce`` does.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from replay.config import compose_config
from replay.config.cli import CommandParser, positive_int, run_or_exit
from replay.config.validate import validate_config
from replay.crosscheck_vidur import run_vidur
from replay.engine.jit import count_references_plainly, reference_counts
from replay.errors import InputError
from replay.experiments.plots.common import plt, save_figure
from replay.experiments.report import CROSSCHECK_PROVENANCE as PROVENANCE
from replay.run import package_versions, run
from replay.storage.outputs import (
    atomic_write,
    atomic_write_text,
    ensure_writable_dir,
    git_describe,
)

#: Cases: workload -> (low rate, high rate) in requests/s, around the capacity of
#: Llama-2-70B TP2 with 1,030 blocks of 16 tokens (D1's trial runs).
RATES = {"lmsys": (5.0, 20.0), "arxiv": (0.1, 0.3)}
SCHEDULERS = ("vllm", "sarathi")
METRICS = ("latency", "ttft", "tbt_mean")
QUICK_GRID = ("timing.random_forest_grid={num_estimators:[8],max_depth:[8],"
              "min_samples_split:[2]}", "timing.k_fold_cv_splits=2")


@dataclass(frozen=True)
class Setup:
    """What both simulators share (the harness's names; Vidur's in the comments)."""

    n: int = 1000
    seed: int = 0
    kv_blocks: int = 1030            # CacheConfig.num_blocks (16,480 tokens, the papers' M)
    block_size: int = 16             # CacheConfig.block_size
    #: batch_size_cap. Vidur's predictor has decode tables up to its profiled 128 requests
    #: and raises KeyError beyond (the harness extrapolates): both stay within it.
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 4096   # VllmSchedulerConfig.max_tokens_in_batch
    watermark: float = 0.01          # CacheConfig.watermark_blocks_fraction
    chunk_size: int = 512            # SarathiSchedulerConfig.chunk_size
    #: Sarathi-like reserves the whole prompt's blocks at admission, as Vidur's sarathi does
    #: (the policy's default, false, reserves chunk by chunk: --no-reserve-prompt).
    reserve_prompt: bool = True
    quick: bool = False
    #: ``--set KEY=VALUE`` overrides, added to every harness run after the case's own.
    extra: tuple[str, ...] = ()

    def overrides(self, workload: str, rate: float, scheduler: str) -> list[str]:
        policy = {"vllm": [f"policy.max_num_batched_tokens={self.max_num_batched_tokens}"],
                  "sarathi": [f"policy.chunk_size={self.chunk_size}",
                              f"policy.reserve_prompt={self.reserve_prompt}"]}[scheduler]
        return ["model=llama2_70b", "hardware=a100x2", "timing=vidur", "kv=explicit",
                f"kv.tokens={self.kv_blocks * self.block_size}",
                f"workload={workload}", f"workload.n={self.n}", "arrivals=poisson",
                f"arrivals.rate={rate}", f"policy={scheduler}", f"seed={self.seed}",
                "output.overwrite=true",  # the crosscheck's folders are its own
                "output.skip_existing=false",  # its speed comparison must time a fresh run
                f"policy.max_num_seqs={self.max_num_seqs}", f"policy.watermark={self.watermark}",
                f"policy.block_size={self.block_size}", *policy,
                *(QUICK_GRID if self.quick else ()), *self.extra]


def run_harness(overrides: list[str], out_dir: Path
                ) -> tuple[pd.DataFrame, float, float, object]:
    """This harness on one case: its request table, its step loop's wall seconds, the wall
    seconds of the whole call a user makes in a running process (composing the config,
    building and running the replay, writing its folder), and the config."""
    started = time.perf_counter()
    cfg = compose_config(overrides)
    summary = run(cfg, out_dir)
    call = time.perf_counter() - started
    if summary["status"] != "completed":
        raise InputError(f"{out_dir}: the harness run ended '{summary['status']}' "
                         f"({summary['message']}); the crosscheck compares complete runs only")
    return pd.read_parquet(out_dir / "requests.parquet"), summary["loop_time_s"], call, cfg


def time_process(command: list[str], what: str) -> float:
    """Wall seconds of ``command`` as a process of its own, from its start to its exit."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError(f"{what}: the whole-process run exited {done.returncode}: {last}")
    return seconds


def time_whole_processes(setup: Setup, overrides: list[str], requests: pd.DataFrame,
                         scheduler: str, timing, case_dir: Path) -> tuple[float, float]:
    """Each simulator's whole process on one case (``--whole-process``): ``python -m replay``
    with the case's overrides, and ``python -m replay.crosscheck_vidur`` on the requests
    the harness drew, with Vidur's predictor from its model cache."""
    work = case_dir / "whole_process"
    work.mkdir(parents=True, exist_ok=True)
    ours = time_process([sys.executable, "-m", "replay", *overrides,
                         f"hydra.run.dir={work / 'kvsched'}"], f"{case_dir}: kvsched")
    requests[["request_id", "arrival", "prompt_len", "output_len"]].to_parquet(
        work / "requests.parquet")
    with open(work / "predictor.pkl", "wb") as stream:
        pickle.dump((timing.spec, timing.files, timing.cache_path / "vidur"), stream)
    job = {"requests": str(work / "requests.parquet"), "scheduler": scheduler,
           "setup": {k: v for k, v in asdict(setup).items() if k != "extra"},
           "predictor": str(work / "predictor.pkl")}
    atomic_write_text(work / "vidur_job.json", json.dumps(job, indent=1))
    theirs = time_process([sys.executable, "-m", "replay.crosscheck_vidur",
                           str(work / "vidur_job.json")], f"{case_dir}: Vidur")
    return ours, theirs


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and metric: mean, p50, p99 in each simulator and the relative differences."""
    rows = []
    for (workload, rate, scheduler), case in frame.groupby(["workload", "rate", "scheduler"]):
        for metric in METRICS:
            row = {"workload": workload, "rate": rate, "scheduler": scheduler, "metric": metric}
            for simulator, part in case.groupby("simulator"):
                values = part[metric].dropna()
                row.update({f"{simulator}_mean": values.mean(),
                            f"{simulator}_p50": values.quantile(0.5),
                            f"{simulator}_p99": values.quantile(0.99)})
            for stat in ("mean", "p50", "p99"):
                row[f"diff_{stat}"] = row[f"kvsched_{stat}"] / row[f"vidur_{stat}"] - 1
            row["restarts_kvsched"] = case.loc[case["simulator"] == "kvsched", "restarts"].sum()
            row["restarts_vidur"] = case.loc[case["simulator"] == "vidur", "restarts"].sum()
            rows.append(row)
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, out: Path) -> Path:
    cases = list(frame.groupby(["workload", "rate", "scheduler"]).groups)
    fig, axes = plt.subplots(len(cases), len(METRICS), figsize=(12, 2.4 * len(cases)),
                             squeeze=False)
    for row, (workload, rate, scheduler) in enumerate(cases):
        case = frame[(frame["workload"] == workload) & (frame["rate"] == rate)
                     & (frame["scheduler"] == scheduler)]
        for col, metric in enumerate(METRICS):
            ax = axes[row, col]
            for simulator, part in case.groupby("simulator"):
                values = np.sort(part[metric].dropna().to_numpy())
                ax.plot(values, np.arange(1, values.size + 1) / values.size, label=simulator)
            ax.set_xlabel(f"{metric} (s)")
            ax.set_title(f"{workload} at {rate:g}/s, {scheduler}", fontsize=8)
            if col == 0:
                ax.set_ylabel("fraction of requests")
                ax.legend(fontsize=7)
    return save_figure(fig, out, frame)


def crosscheck(setup: Setup, out_dir: Path,
               cases: dict[str, tuple[float, ...]] = RATES, repeat: int = 1,
               whole_process: bool = False) -> pd.DataFrame:
    """Every case in both simulators; writes the tables and figure, returns the speeds.
    Each simulator runs each case ``repeat`` times and its fastest run is timed (the same
    rule for both: a run of a few milliseconds is at the mercy of the machine). With
    ``whole_process``, each also runs each case once more as a process of its own, timed
    whole (:func:`time_whole_processes`)."""
    # Every case's config passes the config rules before minutes of simulation: a --set
    # value (workload.n=-1) would otherwise reach the run unchecked.
    for workload, rates in cases.items():
        for rate in rates:
            for scheduler in SCHEDULERS:
                validate_config(compose_config(setup.overrides(workload, rate, scheduler)))
    frames, speeds = [], []
    predictors = {}  # Vidur's predictor of each model, loaded once (hundreds of MB)
    for workload, rates in cases.items():
        for rate in rates:
            for scheduler in SCHEDULERS:
                case_dir = out_dir / "runs" / f"{workload}_rate{rate:g}_{scheduler}"
                our_walls, their_walls, our_calls, their_calls = [], [], [], []
                for _ in range(repeat):
                    ours, wall, call, cfg = run_harness(
                        setup.overrides(workload, rate, scheduler), case_dir)
                    our_walls.append(wall)
                    our_calls.append(call)
                timing = instantiate(cfg.timing)
                if timing.cache_path not in predictors:  # the folder is keyed by the model
                    predictors[timing.cache_path] = timing.vidur_predictor()
                for _ in range(repeat):
                    theirs, wall, call = run_vidur(
                        ours, setup, scheduler, predictors[timing.cache_path],
                        timing.spec.model_name, timing.spec.tensor_parallel)
                    their_walls.append(wall)
                    their_calls.append(call)
                our_wall, their_wall = min(our_walls), min(their_walls)
                our_process = their_process = float("nan")
                if whole_process:
                    our_process, their_process = time_whole_processes(
                        setup, setup.overrides(workload, rate, scheduler), ours, scheduler,
                        timing, case_dir)
                ours = ours.assign(restarts=ours["evictions"])
                for name, part in (("kvsched", ours), ("vidur", theirs)):
                    frames.append(part[["request_id", "arrival", "prompt_len", "output_len",
                                        *METRICS, "restarts"]].assign(
                        simulator=name, workload=workload, rate=rate, scheduler=scheduler))
                speeds.append({"workload": workload, "rate": rate, "scheduler": scheduler,
                               "requests": len(ours), "kvsched_wall_s": our_wall,
                               "vidur_wall_s": their_wall, "kvsched_call_s": min(our_calls),
                               "vidur_call_s": min(their_calls),
                               "kvsched_process_s": our_process,
                               "vidur_process_s": their_process, "runs_each": repeat})
                print(f"{workload} at {rate:g}/s, {scheduler}: loop kvsched {our_wall:.3f} s, "
                      f"Vidur {their_wall:.3f} s; in-process call kvsched "
                      f"{min(our_calls):.3f} s, Vidur {min(their_calls):.3f} s", flush=True)
    frame = pd.concat(frames, ignore_index=True)
    ensure_writable_dir(out_dir)
    atomic_write(out_dir / "requests.csv", lambda tmp: frame.to_csv(tmp, index=False))
    atomic_write(out_dir / "comparison.csv",
                 lambda tmp: compare(frame).to_csv(tmp, index=False))
    plot(frame, out_dir / "distributions.png")
    speed = pd.DataFrame(speeds)
    speed["kvsched_requests_per_s"] = speed["requests"] / speed["kvsched_wall_s"]
    speed["vidur_requests_per_s"] = speed["requests"] / speed["vidur_wall_s"]
    speed["speedup"] = speed["vidur_wall_s"] / speed["kvsched_wall_s"]
    speed["call_speedup"] = speed["vidur_call_s"] / speed["kvsched_call_s"]
    speed["process_speedup"] = speed["vidur_process_s"] / speed["kvsched_process_s"]
    atomic_write(out_dir / "speed.csv", lambda tmp: speed.to_csv(tmp, index=False))
    atomic_write_text(out_dir / "setup.json", json.dumps(setup.__dict__, indent=1))
    # What produced these numbers, for the report's stamp beside them.
    atomic_write_text(out_dir / PROVENANCE, json.dumps({
        "commit": git_describe(), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "packages": package_versions(),
        "reference_counts": reference_counts()}, indent=1))
    return speed


def parse_arguments(argv: list[str] | None = None) -> tuple[Setup, Path, int, bool]:
    """The command line as the setup both simulators share, the output folder, the number
    of runs per case (``--n`` counts with and without ``--quick``) and whether each case is
    also timed as whole processes."""
    parser = CommandParser(prog="python -m replay.crosscheck",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, default=None,
                        help="requests per case (default 1000, or 60 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="60 requests per case and a small predictor grid (seconds)")
    parser.add_argument("--out", type=Path, default=Path("outputs/crosscheck"))
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="runs per case and simulator; the fastest of each is timed")
    parser.add_argument("--no-reserve-prompt", dest="reserve_prompt", action="store_false",
                        help="Sarathi-like reserves prompt KV chunk by chunk (its default)")
    parser.add_argument("--set", dest="extra", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="a config override for every harness run, after the case's own "
                             "(repeatable), as in reproduce")
    parser.add_argument("--whole-process", action="store_true",
                        help="also time each case once as a whole process of each simulator "
                             "(python -m replay; Vidur's run in a fresh interpreter)")
    args = parser.parse_args(argv)
    n = args.n if args.n is not None else (60 if args.quick else 1000)
    return (Setup(n=n, quick=args.quick, reserve_prompt=args.reserve_prompt,
                  extra=tuple(args.extra)), args.out, args.repeat, args.whole_process)


def main() -> None:
    setup, out, repeat, whole_process = parse_arguments()
    run_or_exit(count_references_plainly)  # before any run compiles or loads compiled code
    run_or_exit(ensure_writable_dir, out)  # before minutes of simulation, not after
    speed = run_or_exit(crosscheck, setup, out, repeat=repeat, whole_process=whole_process)
    total = speed.sum(numeric_only=True)
    print(f"Vidur's time over kvsched's, the same {int(total['requests'])} requests "
          f"({out / 'speed.csv'}):")
    for label, column in (("step loops only (kvsched's loop, Vidur's Simulator.run)", "wall"),
                          ("in-process call (kvsched: compose, build, run, write; Vidur: "
                           "build the simulator, run, collect metrics)", "call"),
                          *((("whole process (kvsched: python -m replay; Vidur: a fresh "
                              "interpreter loading its predictor from the model cache)",
                              "process"),) if whole_process else ())):
        ours, theirs = total[f"kvsched_{column}_s"], total[f"vidur_{column}_s"]
        print(f"  {label}: {theirs / ours:.1f}x ({theirs:.2f} s against {ours:.2f} s)")


if __name__ == "__main__":
    run_or_exit(main)
