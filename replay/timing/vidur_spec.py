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


#: The median times Vidur 0.0.26 trains its per-token models on (``mlp.csv``); the three
#: normalisation and residual ones may be missing or empty (Vidur takes 0 then).
MLP_TIMES = tuple(f"time_stats.{op}.median" for op in (
    "attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "attn_rope"))
MLP_OPTIONAL_TIMES = tuple(f"time_stats.{op}.median" for op in (
    "input_layernorm", "post_attention_layernorm", "add"))
DECODE_TIME = "time_stats.attn_decode.median"
PREFILL_TIME = "time_stats.attn_prefill.median"


@dataclass(frozen=True)
class ProfileSchema:
    """What Vidur reads of one profile file: ``shape`` columns select the rows of a model and
    parallelism and are features (numbers >= 0 on every row), ``times`` are the medians it
    trains on (milliseconds >= 0 on every row, or on the decode rows (``prefill_chunk_size``
    0) or prefill rows only, as ``rows`` says), ``optional`` times may be missing or empty,
    ``labels`` are text columns it compares."""

    shape: tuple[str, ...]
    times: tuple[str, ...]
    optional: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    rows: dict = field(default_factory=dict)   # time column -> "decode" | "prefill"


PROFILE_SCHEMAS = {
    "mlp": ProfileSchema(shape=("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                                "num_tensor_parallel_workers", "num_tokens"),
                         times=MLP_TIMES, optional=MLP_OPTIONAL_TIMES, labels=("use_gated_mlp",)),
    "attention": ProfileSchema(shape=("n_embd", "n_q_head", "n_kv_head", "block_size",
                                      "num_tensor_parallel_workers", "batch_size",
                                      "prefill_chunk_size", "kv_cache_size"),
                               times=(DECODE_TIME, PREFILL_TIME),
                               optional=("time_stats.attn_kv_cache_save.median",),
                               rows={DECODE_TIME: "decode", PREFILL_TIME: "prefill"}),
    "all_reduce": ProfileSchema(shape=("num_workers", "devices_per_node", "size"),
                                times=("time_stats.all_reduce.median",), labels=("collective",)),
}


def check_profile(path: Path, kind: str, select: dict | None = None) -> None:
    """Refuse a profile Vidur could not train on, or would train on nonsense, before it
    trains: a file that is not CSV text or has a row cut short
    (:func:`replay.storage.data.read_csv`), a column of :data:`PROFILE_SCHEMAS` missing, a value
    that is not a finite number >= 0 (its line and column), or no rows for the model and
    parallelism (``select``: column -> value, the rows Vidur keeps) -- or, for attention, no
    decode or no prefill rows among them. Raises :class:`~replay.errors.InputError`."""
    import numpy as np
    import pandas as pd

    from replay.errors import InputError
    from replay.storage.data import read_csv

    what = f"Vidur {kind} profile"
    schema = PROFILE_SCHEMAS[kind]
    frame = read_csv(path, what, skip_blank_lines=False)
    needed = [*schema.shape, *schema.times, *schema.labels]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise InputError(f"{what}: {path}: missing column(s) {missing} that Vidur reads (the "
                         f"file has {len(frame.columns)} columns: {list(frame.columns)[:6]}...)")
    numbers = {c: pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float)
               for c in (*schema.shape, *schema.times, *schema.optional) if c in frame.columns}
    decode = numbers["prefill_chunk_size"] == 0 if "prefill_chunk_size" in numbers else None
    for column, values in numbers.items():
        applies = np.ones(values.size, dtype=bool)
        if schema.rows.get(column) == "decode":
            applies = decode
        elif schema.rows.get(column) == "prefill":
            applies = ~decode
        given = ~frame[column].isna().to_numpy() if column in schema.optional else applies
        bad = given & ~(np.isfinite(values) & (values >= 0))
        if bad.any():
            i = int(bad.argmax())
            raw = frame[column].iloc[i]
            shown = repr(raw) if isinstance(raw, str) else "empty" if pd.isna(raw) else raw
            raise InputError(f"{what}: {path} line {i + 2}: field {column!r} = {shown} is not "
                             f"a finite number >= 0 ({int(bad.sum())} such row(s)); Vidur "
                             f"would train on it")
    if select:
        kept = np.ones(len(frame), dtype=bool)
        for column, value in select.items():
            kept &= (frame[column] == value).to_numpy()
        wanted = ", ".join(f"{c}={v}" for c, v in select.items())
        if not kept.any():
            raise InputError(f"{what}: {path} has no rows for {wanted}, the model and "
                             f"parallelism asked for; Vidur would have nothing to train on")
        if decode is not None:
            for name, rows in (("decode rows (prefill_chunk_size 0)", decode),
                               ("prefill rows (prefill_chunk_size > 0)", ~decode)):
                if not rows[kept].any():
                    raise InputError(f"{what}: {path} has no {name} for {wanted}; Vidur trains "
                                     f"a model on each")
