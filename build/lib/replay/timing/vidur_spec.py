"""What a Vidur predictor build depends on (kept free of heavy imports: vidur, sklearn)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from replay.errors import ConfigError

# Vidur's default random-forest grid (RandomForrestExecutionTimePredictorConfig).
RANDOM_FOREST_GRID = {"num_estimators": [250, 500, 750], "max_depth": [8, 16, 32],
                      "min_samples_split": [2, 5, 10]}
# Vidur's default linear-regression grid (LinearRegressionExecutionTimePredictorConfig).
LINEAR_REGRESSION_GRID = {"polynomial_degree": [1, 2, 3, 4, 5],
                          "polynomial_include_bias": [True, False],
                          "polynomial_interaction_only": [True, False],
                          "fit_intercept": [True, False]}
PREDICTORS = ("random_forest", "linear_regression")


@dataclass(frozen=True)
class PredictionLimits:
    """The grids Vidur precomputes predictions on (its ``prediction_*`` settings).

    Defaults are the range the A100 profiles cover: linear layers and
    collectives up to 4096 tokens per iteration, decode attention for 1..128
    requests, prefill chunks up to 4096 tokens, KV cache up to 4096 tokens per
    request (Llama-2's context). Vidur's own default of 2M tokens per request
    would tabulate the random forests far outside the data, where they are
    flat. ``kv_granularity`` is the rounding step of KV-cache sizes for
    attention (Vidur's default is 256); 32 is the step of the profile's
    ``kv_cache_size`` axis, so every decode lookup lands on a profiled size
    and a context is never rounded up by more than 31 tokens.
    """

    max_tokens_per_request: int = 4096
    max_batch_size: int = 128
    max_prefill_chunk_size: int = 4096
    kv_granularity: int = 32

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if int(value) != value or value < 1:
                raise ConfigError(f"timing.limits.{name}: must be a positive integer, "
                                 f"got {value!r}")
        if self.max_tokens_per_request % self.kv_granularity:
            raise ConfigError(f"timing.limits: max_tokens_per_request "
                             f"({self.max_tokens_per_request}) must be a multiple of "
                             f"kv_granularity ({self.kv_granularity})")
        if self.max_prefill_chunk_size % 32 or self.max_tokens_per_request % 8:
            raise ConfigError("timing.limits: max_prefill_chunk_size must be a multiple of "
                             "32 and max_tokens_per_request of 8 (Vidur's rounding steps)")


@dataclass(frozen=True)
class PredictorSpec:
    """Everything the trained predictor depends on, besides the profile files."""

    model_name: str                 # Vidur / HuggingFace model id, e.g. meta-llama/Llama-2-7b-hf
    device: str                     # Vidur device SKU, e.g. a100
    network_device: str             # Vidur node SKU for collectives, e.g. a100_pairwise_nvlink
    tensor_parallel: int
    predictor: str = "random_forest"
    grid: dict = field(default_factory=dict)   # overrides of the predictor's search grid
    k_fold_cv_splits: int = 10
    random_state: int = 0           # random forest seed (Vidur leaves it unset)
    limits: PredictionLimits = field(default_factory=PredictionLimits)
    # Vidur's defaults, recorded because they change predictions.
    attention_decode_batching_overhead_fraction: float = 0.1
    nccl_cpu_launch_overhead_ms: float = 0.02
    nccl_cpu_skew_overhead_per_device_ms: float = 0.0
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.predictor not in PREDICTORS:
            raise ConfigError(f"timing.predictor: must be one of {PREDICTORS}, "
                             f"got {self.predictor!r}")
        unknown = set(self.grid) - set(self._default_grid())
        if unknown:
            raise ConfigError(f"timing.{self.predictor}_grid: unknown keys {sorted(unknown)} for "
                             f"predictor={self.predictor}; allowed: "
                             f"{sorted(self._default_grid())}")

    def _default_grid(self) -> dict:
        return RANDOM_FOREST_GRID if self.predictor == "random_forest" else LINEAR_REGRESSION_GRID

    def search_grid(self) -> dict:
        return {key: list(self.grid.get(key, default))
                for key, default in self._default_grid().items()}

    def key_fields(self) -> dict:
        fields = asdict(self)
        fields["grid"] = self.search_grid()
        return fields


@dataclass(frozen=True)
class ProfileFiles:
    """Local CSVs in Vidur's format (``all_reduce`` is only read at tensor parallel > 1)."""

    mlp: Path
    attention: Path
    all_reduce: Path | None
