"""Train Vidur's sklearn execution-time predictor from local profile CSVs, offline.

``vidur==0.0.26`` downloads its profiles and pre-computed predictions from
HuggingFace in ``SklearnExecutionTimePredictor.__init__``. The subclasses here
override exactly those two steps (``_get_input_files`` returns local CSVs in
Vidur's format; ``_load_predictions_from_hf`` refuses), so the rest is Vidur's
own code: its feature layout, its ``GridSearchCV`` over the configured
hyper-parameter grid with its MAPE scorer, its prediction grids, and its
``get_execution_time``. Two further deliberate changes:

* the random forest gets a fixed ``random_state`` (Vidur leaves it unset), so
  that a rebuild reproduces the same predictor;
* ``LinearRegressionExecutionTimePredictor`` is abstract in 0.0.26 (it lacks
  ``_get_kv_parallel_communication_time``); it is supplied as in Vidur's random
  forest class (KV parallelism is 1 here, so it is never called).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from sklearn.ensemble import RandomForestRegressor
from vidur.config import (
    CacheConfig,
    LinearRegressionExecutionTimePredictorConfig,
    RandomForrestExecutionTimePredictorConfig,
    ReplicaConfig,
)
from vidur.entities import Batch
from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (
    LinearRegressionExecutionTimePredictor,
)
from vidur.execution_time_predictor.random_forrest_execution_time_predictor import (
    RandomForrestExecutionTimePredictor,
)
from vidur.execution_time_predictor.sklearn_execution_time_predictor import (
    SklearnExecutionTimePredictor,
)

from replay.storage.data import file_record
from replay.timing.vidur_spec import PredictorSpec, ProfileFiles, check_profile

PREDICTOR_CONFIGS = {"random_forest": RandomForrestExecutionTimePredictorConfig,
                     "linear_regression": LinearRegressionExecutionTimePredictorConfig}


class _LocalProfiles:
    """Mixin: read the given CSVs instead of downloading from HuggingFace."""

    _local_files: ProfileFiles

    def _get_input_files(self) -> tuple[str, str, str, str]:
        files = self._local_files
        # send_recv is only read with pipeline parallelism, which is never used here.
        return (str(files.mlp), str(files.attention),
                str(files.all_reduce) if files.all_reduce else "", "")

    def _load_predictions_from_hf(self):
        raise _OfflineBuild

    # Vidur keys its trained models by a hash of these configs, whose "profiling_datasource"
    # is the profile's path: a cache folder copied to another machine, or data moved to
    # another folder, retrained every model (about 15 minutes). The file's content stands in
    # for its path.
    def _get_compute_model_config(self) -> dict:
        return {**super()._get_compute_model_config(),
                "profiling_datasource": _by_content(self._local_files.mlp)}

    def _get_network_model_config(self) -> dict:
        return {**super()._get_network_model_config(),
                "profiling_datasource": _by_content(self._local_files.all_reduce)}


def _by_content(path: Path | None) -> str:
    """A profile file named by its content (``sha256:...``), or ``none``."""
    return f"sha256:{file_record(path)['sha256']}" if path is not None else "none"


class _OfflineBuild(Exception):
    """Raised instead of downloading predictions; Vidur then trains its models."""


class OfflineRandomForestPredictor(_LocalProfiles, RandomForrestExecutionTimePredictor):
    def __init__(self, files: ProfileFiles, random_state: int, **kwargs) -> None:
        self._local_files = files
        self._random_state = random_state
        super().__init__(**kwargs)

    def _get_estimator(self):
        return RandomForestRegressor(random_state=self._random_state)


class OfflineLinearRegressionPredictor(_LocalProfiles, LinearRegressionExecutionTimePredictor):
    def __init__(self, files: ProfileFiles, **kwargs) -> None:
        self._local_files = files
        super().__init__(**kwargs)

    def _get_kv_parallel_communication_time(self, batch: Batch) -> float:
        return SklearnExecutionTimePredictor._get_kv_parallel_communication_time(self, batch)


class _DropOfflineNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to load predictions from HF")


@contextmanager
def _quiet_vidur_logs():
    """Vidur logs every trained model at INFO on stdout; keep warnings only."""
    vidur_logger = logging.getLogger("vidur")
    level, notice = vidur_logger.level, _DropOfflineNotice()
    vidur_logger.setLevel(logging.WARNING)
    for handler in vidur_logger.handlers:
        handler.addFilter(notice)
    try:
        yield
    finally:
        vidur_logger.setLevel(level)
        for handler in vidur_logger.handlers:
            handler.removeFilter(notice)


# The HuggingFace id (the profile folder, the model config's hf_id) where vidur 0.0.26's
# model registry spells the model differently (Llama38BModelConfig.get_name()).
VIDUR_MODEL_NAMES = {"meta-llama/Meta-Llama-3-8B": "meta-llama/Llama-3-8B"}


def replica_config(spec: PredictorSpec) -> ReplicaConfig:
    """Vidur's replica (model, one pipeline stage, tensor parallelism, devices) for ``spec``."""
    return ReplicaConfig(model_name=VIDUR_MODEL_NAMES.get(spec.model_name, spec.model_name),
                         num_pipeline_stages=1, tensor_parallel_size=spec.tensor_parallel,
                         device=spec.device, network_device=spec.network_device)


def check_profiles(spec: PredictorSpec, files: ProfileFiles) -> None:
    """Every profile Vidur is about to train on, checked against what it reads
    (:func:`~replay.timing.vidur_spec.check_profile`), with the rows Vidur will select for
    this model, tensor parallelism and block size: a bad file is one error before any
    training, not a traceback minutes into it."""
    model = replica_config(spec).model_config
    tensor_parallel = spec.tensor_parallel
    check_profile(files.mlp, "mlp", {
        "n_head": model.num_q_heads, "n_kv_head": model.num_kv_heads,
        "n_embd": model.embedding_dim, "n_expanded_embd": model.mlp_hidden_dim,
        "use_gated_mlp": model.use_gated_mlp, "vocab_size": model.vocab_size,
        "num_tensor_parallel_workers": tensor_parallel})
    check_profile(files.attention, "attention", {
        "n_embd": model.embedding_dim, "n_q_head": model.num_q_heads,
        "n_kv_head": model.num_kv_heads, "block_size": spec.block_size,
        "num_tensor_parallel_workers": tensor_parallel})
    if tensor_parallel > 1:
        check_profile(files.all_reduce, "all_reduce", {
            "num_workers": tensor_parallel, "devices_per_node": tensor_parallel,
            "collective": "all_reduce"})


def build_predictor(spec: PredictorSpec, files: ProfileFiles,
                    work_dir: Path) -> SklearnExecutionTimePredictor:
    """Train (or load from Vidur's own cache in ``work_dir``) Vidur's predictor for ``spec`` on
    profiles that passed :func:`check_profiles` (``VidurTiming`` checks them before it makes
    its cache folder; a cached build was checked when it was made, and its key holds the
    files' hashes)."""
    limits = spec.limits
    predictor_config = PREDICTOR_CONFIGS[spec.predictor](
        model_profiling_dataset=f"local:{files.mlp}",
        network_profiling_dataset=f"local:{files.all_reduce}",
        kv_cache_prediction_granularity=limits.kv_granularity,
        prediction_max_prefill_chunk_size=limits.max_prefill_chunk_size,
        prediction_max_batch_size=limits.max_batch_size,
        prediction_max_tokens_per_request=limits.max_tokens_per_request,
        attention_decode_batching_overhead_fraction=(
            spec.attention_decode_batching_overhead_fraction),
        nccl_cpu_launch_overhead_ms=spec.nccl_cpu_launch_overhead_ms,
        nccl_cpu_skew_overhead_per_device_ms=spec.nccl_cpu_skew_overhead_per_device_ms,
        k_fold_cv_splits=spec.k_fold_cv_splits,
        cache_dir=str(work_dir),
        upload_predictions=False,
        use_native_execution_time_predictor=False,
        **spec.search_grid(),
    )
    arguments = {"files": files, "predictor_config": predictor_config,
                 "replica_config": replica_config(spec),
                 "cache_config": CacheConfig(block_size=spec.block_size)}
    with _quiet_vidur_logs():
        if spec.predictor == "random_forest":
            return OfflineRandomForestPredictor(random_state=spec.random_state, **arguments)
        return OfflineLinearRegressionPredictor(**arguments)


def vidur_batch(new_tokens, context) -> Batch:
    """A Vidur ``Batch`` with one entry per request: new tokens and already-cached tokens."""
    return Batch(replica_id=0, requests=[None] * len(new_tokens),
                 num_q_tokens=[int(t) for t in new_tokens],
                 num_kv_tokens=[int(c) for c in context])
