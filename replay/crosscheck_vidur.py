"""Vidur's simulator on the harness's requests: the other side of the D3 cross-check.

:func:`run_vidur` runs it in the calling process with a predictor already loaded (the
cross-check's loop and in-process timings). ``python -m replay.crosscheck_vidur JOB`` is
the same call as a process of its own, which ``python -m replay.crosscheck
--whole-process`` times whole: the interpreter's start, the imports, loading Vidur's
trained predictor from its model cache, the simulation and its metrics. ``JOB`` is a JSON
file naming the requests (Parquet: ``request_id``, ``arrival``, ``prompt_len``,
``output_len``), the scheduler, the shared settings and the predictor (a pickle of the
timing backend's spec, profile files and Vidur cache folder, written by the cross-check).

The process loads the predictor through kvsched's builder (:mod:`replay.timing.vidur_build`),
so it imports kvsched's timing package, numba included, which a run of Vidur's own command
would not: that import counts against Vidur.
"""

from __future__ import annotations

import json
import pickle
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd


def _restartable_request_class():
    from vidur.entities import Request

    class RestartableRequest(Request):
        """Vidur's request, with the stage counters its ``restart`` forgets reset."""

        def restart(self) -> None:
            super().restart()
            self._num_stage_processed_tokens = 0
            self._is_prefill_stage_complete = False

    return RestartableRequest


def run_vidur(requests: pd.DataFrame, setup, scheduler: str, predictor,
              model_name: str, tensor_parallel: int) -> tuple[pd.DataFrame, float, float]:
    """Vidur's simulator on the harness's requests (same arrivals and lengths) with the
    already-trained ``predictor`` and the settings both simulators share (``setup``: a
    ``replay.crosscheck.Setup``, or any object with its fields); per-request metrics, the
    loop's wall seconds and those of the whole call (building the simulator and its
    requests, the loop, the metrics)."""
    call_started = time.perf_counter()
    import vidur.scheduler.global_scheduler.base_global_scheduler as global_scheduler
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        MetricsConfig,
        ReplicaConfig,
        SarathiSchedulerConfig,
        SimulationConfig,
        SyntheticRequestGeneratorConfig,
        VllmSchedulerConfig,
    )
    from vidur.entities import Replica
    from vidur.events import RequestArrivalEvent
    from vidur.simulator import Simulator

    class SharedPredictor:
        """Hands Vidur's replicas the predictor trained once (and used by the harness)."""

        @staticmethod
        def get(*args, **kwargs):
            return predictor

    replica_scheduler = (
        VllmSchedulerConfig(batch_size_cap=setup.max_num_seqs,
                            max_tokens_in_batch=setup.max_num_batched_tokens)
        if scheduler == "vllm" else
        SarathiSchedulerConfig(batch_size_cap=setup.max_num_seqs, chunk_size=setup.chunk_size))
    with tempfile.TemporaryDirectory() as scratch:
        config = SimulationConfig(
            log_level="warning",
            cluster_config=ClusterConfig(
                replica_config=ReplicaConfig(model_name=model_name, num_pipeline_stages=1,
                                             tensor_parallel_size=tensor_parallel,
                                             device="a100",
                                             network_device="a100_pairwise_nvlink"),
                cache_config=CacheConfig(block_size=setup.block_size,
                                         num_blocks=setup.kv_blocks,
                                         watermark_blocks_fraction=setup.watermark),
                replica_scheduler_config=replica_scheduler),
            request_generator_config=SyntheticRequestGeneratorConfig(num_requests=1),
            metrics_config=MetricsConfig(write_metrics=False, write_json_trace=False,
                                         enable_chrome_trace=False, store_plots=False,
                                         wandb_project=None, output_dir=scratch))
        registry = global_scheduler.ExecutionTimePredictorRegistry
        global_scheduler.ExecutionTimePredictorRegistry = SharedPredictor
        # Vidur numbers replicas with a class-level counter, while its global scheduler
        # routes to ReplicaId(0): a second Simulator in one process needs the count reset.
        Replica._id = -1
        try:
            simulator = Simulator(config)
        finally:
            global_scheduler.ExecutionTimePredictorRegistry = registry
        request_class = _restartable_request_class()
        ours = [request_class(float(a), int(s), int(o)) for a, s, o in
                zip(requests["arrival"], requests["prompt_len"], requests["output_len"],
                    strict=True)]
        simulator._event_queue = []  # replace the generator's requests with the harness's
        for request in ours:
            simulator._add_event(RequestArrivalEvent(request.arrived_at, request))
        started = time.perf_counter()
        simulator.run()
        wall = time.perf_counter() - started
    completed = np.array([r.completed_at for r in ours])
    first = np.array([r.prefill_completed_at for r in ours])
    arrival = requests["arrival"].to_numpy()
    gaps = np.maximum(requests["output_len"].to_numpy() - 1, 1)
    frame = pd.DataFrame({
        "request_id": requests["request_id"], "arrival": arrival,
        "prompt_len": requests["prompt_len"], "output_len": requests["output_len"],
        "latency": completed - arrival, "ttft": first - arrival,
        "tbt_mean": np.where(requests["output_len"] > 1, (completed - first) / gaps, np.nan),
        "restarts": [r._num_restarts for r in ours]})
    return frame, wall, time.perf_counter() - call_started


def whole_process(job_file: Path) -> None:
    """The body of ``python -m replay.crosscheck_vidur JOB`` (see the module docstring)."""
    job = json.loads(job_file.read_text())
    with open(job["predictor"], "rb") as stream:
        spec, files, work_dir = pickle.load(stream)  # written by this cross-check
    from replay.timing.vidur_build import build_predictor

    predictor = build_predictor(spec, files, Path(work_dir))
    run_vidur(pd.read_parquet(job["requests"]), SimpleNamespace(**job["setup"]),
              job["scheduler"], predictor, spec.model_name, spec.tensor_parallel)


if __name__ == "__main__":
    whole_process(Path(sys.argv[1]))
