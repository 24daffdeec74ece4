"""The ``layer_profile`` timing backend: a step priced from a measured per-layer profile.

The profile is a folder in the layout of LLMServingSim's profiler (casys-kaist/LLMServingSim,
``profiler/perf/<hardware>/<org>/<model>/<variant>/``): ``meta.yaml`` (how it was measured,
the architecture, the skew fit) and per tensor-parallel degree ``tp<N>/`` holding

* ``dense.csv`` (``layer, tokens, time_us``): each token-wise layer of one decoder layer
  (and the embedding and final norm) against the step's new tokens;
* ``per_sequence.csv`` (``layer, sequences, time_us``): LM head and sampler against the
  number of requests in the step;
* ``attention.csv`` (``prefill_chunk, kv_prefill, n_decode, kv_decode, time_us``): the
  attention of one decoder layer on a grid of batch compositions;
* ``skew_fit.csv`` (``pc, n_label, skew_rate_label, kv_big_label, kp_label, alpha``): the
  fitted correction for decodes of unequal context (used only when ``meta.yaml`` enables
  ``skew_fit``, as LLMServingSim does); ``skew.csv`` holds the raw shots it was fitted to
  and is not read.

Everything is read and checked here, once: a missing folder, a missing layer, a column
that is absent, a value that is not a finite non-negative number is one
:class:`~replay.errors.InputError` naming the file, line and column. The step price is
:func:`replay.timing.layer_profile_step.layer_profile_seconds`; docs/timing.md says where
it composes a step as LLMServingSim does and where not.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import yaml

from replay.engine.timing import BatchShape
from replay.errors import ConfigError, InputError
from replay.params import check
from replay.storage.data import file_record
from replay.timing.layer_profile_step import (
    F_ALLREDUCE_BYTES_PER_TOKEN,
    F_LINK_BYTES_PER_S,
    F_LINK_LATENCY_S,
    F_SKEW_DEFAULT,
    I_LAYERS,
    I_SKEW_ENABLED,
    I_TP,
    layer_profile_seconds,
)

log = logging.getLogger(__name__)

#: The layers a step runs, per architecture of ``meta.yaml``, in the order of
#: LLMServingSim's architecture files (``profiler/models/{llama,qwen3}.yaml``): once per
#: step, once per decoder layer (a layer named twice runs twice), and per sequence.
ARCHITECTURES = {
    "llama": {"per_step": ("embedding", "final_layernorm"),
              "per_layer": ("layernorm", "qkv_proj", "rotary_emb", "o_proj", "layernorm",
                            "gate_up_proj", "act_fn", "down_proj")},
    "qwen3": {"per_step": ("embedding", "final_layernorm"),
              "per_layer": ("layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj",
                            "layernorm", "gate_up_proj", "act_fn", "down_proj")},
}
PER_SEQUENCE = ("lm_head", "sampler")
#: Skew buckets when ``meta.yaml`` names none (LLMServingSim's ``_DEFAULT_SKEW_AXES``).
DEFAULT_SKEW_AXES = {
    "n_bins": [0, 2, 4, 8, 16, 32, 64, 128, 1_000_000],
    "n_labels": ["n<=2", "n<=4", "n<=8", "n<=16", "n<=32", "n<=64", "n<=128", "n>128"],
    "skew_rate_bins": [-0.01, 0.05, 0.15, 0.40, 0.70, 1.01],
    "skew_rate_labels": ["sr<=5%", "sr<=15%", "sr<=40%", "sr<=70%", "sr>70%"],
    "kv_big_bins": [0, 1024, 4096, 16384, 1_000_000_000],
    "kv_big_labels": ["kvB<=1k", "kvB<=4k", "kvB<=16k", "kvB>16k"],
    "kp_bins": [-1, 0, 2048, 1_000_000_000],
    "kp_labels": ["kp=0", "kp<=2k", "kp>2k"],
}
#: (bins, labels, skew_fit.csv column) of the four bucket axes, in table order.
SKEW_AXES = (("n_bins", "n_labels", "n_label"),
             ("skew_rate_bins", "skew_rate_labels", "skew_rate_label"),
             ("kv_big_bins", "kv_big_labels", "kv_big_label"),
             ("kp_bins", "kp_labels", "kp_label"))

LABEL, COUNT, NUMBER, SIGNED = "label", "count", "number", "signed"
TABLES = {
    "dense.csv": {"layer": LABEL, "tokens": COUNT, "time_us": NUMBER},
    "per_sequence.csv": {"layer": LABEL, "sequences": COUNT, "time_us": NUMBER},
    "attention.csv": {"prefill_chunk": COUNT, "kv_prefill": COUNT, "n_decode": COUNT,
                      "kv_decode": COUNT, "time_us": NUMBER},
    "skew_fit.csv": {"pc": COUNT, "n_label": LABEL, "skew_rate_label": LABEL,
                     "kv_big_label": LABEL, "kp_label": LABEL, "alpha": SIGNED},
}


def read_table(path: Path) -> pd.DataFrame:
    """A profile CSV with its columns checked: labels are text, counts whole numbers >= 0,
    times finite and >= 0, a skew alpha finite (the fit has negative ones). The first bad
    cell is an InputError naming file, line and column."""
    columns = TABLES[path.name]
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{path}: not a readable CSV ({reason})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: line 1: missing column(s) {', '.join(missing)} "
                         f"(it has {', '.join(frame.columns)})")
    if frame.empty:
        raise InputError(f"{path}: no rows")
    out = {}
    for name, kind in columns.items():
        text = frame[name].str.strip()
        if kind == LABEL:
            bad = text == ""
            values = text
            allowed = "a non-empty label"
        else:
            values = pd.to_numeric(text, errors="coerce").to_numpy(float)
            bad = ~np.isfinite(values)
            allowed = "a finite number"
            if kind != SIGNED:
                bad |= values < 0
                allowed = "a finite number >= 0"
            if kind == COUNT:
                bad |= np.isfinite(values) & (values != np.floor(values))
                allowed = "a whole number >= 0"
        bad = np.asarray(bad)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InputError(f"{path}: line {row + 2}, column {name}: {frame[name].iloc[row]!r} "
                             f"is not {allowed}")
        out[name] = values
    return pd.DataFrame(out)


def nanoseconds(time_us: np.ndarray) -> np.ndarray:
    """Whole nanoseconds, at least 1, as LLMServingSim converts ``time_us`` on load."""
    return np.maximum(np.rint(time_us * 1000.0), 1.0)


@dataclass(frozen=True)
class LayerTables:
    """The arrays :func:`~replay.timing.layer_profile_step.layer_profile_seconds` takes after
    the batch, in its argument order (see that module for what each holds)."""

    op_keys: np.ndarray
    op_ns: np.ndarray
    op_sizes: np.ndarray
    op_counts: np.ndarray
    op_per_sequence: np.ndarray
    pc_axis: np.ndarray
    nd_axis: np.ndarray
    slice_of: np.ndarray
    slice_kp_start: np.ndarray
    slice_kp_size: np.ndarray
    kp_axis: np.ndarray
    row_kd_start: np.ndarray
    row_kd_size: np.ndarray
    kd_axis: np.ndarray
    attention_ns: np.ndarray
    skew_pc: np.ndarray
    skew_n_bins: np.ndarray
    skew_rate_bins: np.ndarray
    skew_kv_bins: np.ndarray
    skew_kp_bins: np.ndarray
    skew_alpha_table: np.ndarray
    ints: np.ndarray
    floats: np.ndarray

    def arguments(self) -> tuple:
        return tuple(getattr(self, f) for f in self.__dataclass_fields__)


def _layer_ops(dense: pd.DataFrame, per_sequence: pd.DataFrame, architecture: str,
               num_layers: int, folder: Path) -> tuple[np.ndarray, ...]:
    spec = ARCHITECTURES[architecture]
    counts = Counter({name: 1 for name in spec["per_step"]})
    for name in spec["per_layer"]:
        counts[name] += num_layers
    ops = [(name, count, False) for name, count in counts.items()]
    ops += [(name, 1, True) for name in PER_SEQUENCE]
    tables = []
    for name, _, by_sequence in ops:
        frame, key, file = ((per_sequence, "sequences", "per_sequence.csv") if by_sequence
                            else (dense, "tokens", "dense.csv"))
        rows = frame[frame["layer"] == name]
        if rows.empty:
            raise InputError(f"{folder / file}: no rows for layer {name!r} (a {architecture} "
                             f"step runs {', '.join(n for n, _, s in ops if s == by_sequence)})")
        # Duplicate keys: the last row wins, as LLMServingSim builds its tables.
        by_key = dict(zip(rows[key].astype(np.int64), nanoseconds(rows["time_us"].to_numpy()),
                          strict=True))
        keys = np.array(sorted(by_key), dtype=float)
        tables.append((keys, np.array([by_key[int(k)] for k in keys])))
    width = max(k.size for k, _ in tables)
    op_keys = np.zeros((len(tables), width))
    op_ns = np.zeros((len(tables), width))
    for i, (keys, values) in enumerate(tables):
        op_keys[i, :keys.size] = keys
        op_ns[i, :keys.size] = values
    return (op_keys, op_ns, np.array([k.size for k, _ in tables], dtype=np.int64),
            np.array([c for _, c, _ in ops], dtype=np.int64),
            np.array([s for _, _, s in ops], dtype=np.bool_))


def _attention_grid(frame: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """The 4-axis grid as slices (chunk, decodes) -> rows (prefill context) -> decode
    contexts, flattened; the last of duplicate rows wins."""
    grid: dict[tuple[int, int], dict[int, dict[int, float]]] = {}
    ns = nanoseconds(frame["time_us"].to_numpy())
    columns = [frame[c].to_numpy(np.int64)
               for c in ("prefill_chunk", "n_decode", "kv_prefill", "kv_decode")]
    for pc, nd, kp, kd, value in zip(*columns, ns, strict=True):
        grid.setdefault((int(pc), int(nd)), {}).setdefault(int(kp), {})[int(kd)] = value
    pc_axis = np.array(sorted({pc for pc, _ in grid}), dtype=float)
    nd_axis = np.array(sorted({nd for _, nd in grid}), dtype=float)
    slice_of = np.full((pc_axis.size, nd_axis.size), -1, dtype=np.int64)
    slice_kp_start, slice_kp_size, kp_axis = [], [], []
    row_kd_start, row_kd_size, kd_axis, values = [], [], [], []
    for s, (pc, nd) in enumerate(sorted(grid)):
        slice_of[np.searchsorted(pc_axis, pc), np.searchsorted(nd_axis, nd)] = s
        rows = grid[(pc, nd)]
        slice_kp_start.append(len(kp_axis))
        slice_kp_size.append(len(rows))
        for kp in sorted(rows):
            kp_axis.append(kp)
            row_kd_start.append(len(kd_axis))
            row_kd_size.append(len(rows[kp]))
            for kd in sorted(rows[kp]):
                kd_axis.append(kd)
                values.append(rows[kp][kd])
    as_int = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return (pc_axis, nd_axis, slice_of, as_int(slice_kp_start), as_int(slice_kp_size),
            np.array(kp_axis, dtype=float), as_int(row_kd_start), as_int(row_kd_size),
            np.array(kd_axis, dtype=float), np.array(values, dtype=float))


def _skew_axes(fit: dict, entry: dict, meta_path: Path) -> dict:
    axes = (entry.get("bucket_axes") if isinstance(entry, dict) else None) \
        or fit.get("bucket_axes") or DEFAULT_SKEW_AXES
    for bins, labels, _ in SKEW_AXES:
        b, lab = axes.get(bins), axes.get(labels)
        if not (isinstance(b, list) and isinstance(lab, list) and len(b) == len(lab) + 1
                and len(lab) >= 1 and all(isinstance(x, int | float) for x in b)):
            raise InputError(f"{meta_path}: skew_fit.bucket_axes.{bins}/{labels} must be a "
                             f"list of numbers one longer than its list of labels")
    return axes


def _skew(meta: dict, tp: int, variant_dir: Path) -> tuple[dict, tuple[np.ndarray, ...]]:
    """The skew correction LLMServingSim applies for ``tp``: none unless ``meta.yaml``
    enables ``skew_fit``; then the bucket table of ``per_tp[tp]`` with its pooled default."""
    meta_path = variant_dir / "meta.yaml"
    fit = meta.get("skew_fit")
    off = (np.zeros(0), *(np.zeros(2) for _ in SKEW_AXES), np.zeros((0, 1, 1, 1, 1)))
    if not isinstance(fit, dict) or not fit.get("enabled"):
        return {"enabled": False, "why": "meta.yaml does not enable skew_fit"}, off
    per_tp = fit.get("per_tp") or {}
    entry = per_tp.get(tp, per_tp.get(str(tp)))
    if not isinstance(entry, dict):
        default = float(fit.get("alpha_default", 0.0))
        return ({"enabled": True, "alpha_default": default,
                 "why": f"meta.yaml has no skew_fit.per_tp entry for tp {tp}: pooled alpha"}, off)
    default = float(entry.get("alpha_default", 0.0))
    info = {"enabled": True, "alpha_default": default}
    table = entry.get("bucket_table")
    path = variant_dir / str(table) if table else None
    if path is None or not path.is_file():
        log.warning("timing.layer_profile: skew_fit table %s missing; every batch takes the "
                    "pooled alpha %s", path, default)
        info["why"] = f"bucket table {path} missing: pooled alpha"
        return info, off
    if path.name != "skew_fit.csv":
        raise InputError(f"{meta_path}: skew_fit.per_tp.{tp}.bucket_table must name a "
                         f"skew_fit.csv, not {table}")
    axes = _skew_axes(fit, entry, meta_path)
    frame = read_table(path)
    pcs = np.array(sorted(set(frame["pc"].astype(np.int64))), dtype=float)
    shape = (pcs.size, *(len(axes[labels]) for _, labels, _ in SKEW_AXES))
    alpha = np.full(shape, np.nan)
    index = [np.searchsorted(pcs, frame["pc"].to_numpy())]
    for _, labels, column in SKEW_AXES:
        position = {label: i for i, label in enumerate(axes[labels])}
        unknown = ~frame[column].isin(position)
        if unknown.any():
            row = int(np.flatnonzero(unknown.to_numpy())[0])
            raise InputError(f"{path}: line {row + 2}, column {column}: {frame[column].iloc[row]!r}"
                             f" is not one of meta.yaml's {labels} {axes[labels]}")
        index.append(frame[column].map(position).to_numpy(np.int64))
    alpha[tuple(index)] = frame["alpha"].to_numpy()  # the last of duplicate buckets wins
    info["file"] = file_record(path)  # also listed in the backend's files
    arrays = (pcs, *(np.asarray(axes[bins], dtype=float) for bins, _, _ in SKEW_AXES), alpha)
    return info, arrays


def load(profile_dir: Path, variant: str, tp: int, num_layers: int, model: str | None,
         ) -> tuple[dict, tuple]:
    """``(record, arrays)``: what :meth:`LayerProfileTiming.describe` records about the
    profile, and the table arrays (without ``ints``/``floats``)."""
    if not profile_dir.is_dir():
        raise ConfigError(f"timing.profile_dir: no profile folder at {profile_dir} (a model's "
                          f"folder <hardware>/<org>/<model> of a per-layer profile)")
    variant_dir = profile_dir / variant
    meta_path = variant_dir / "meta.yaml"
    if not meta_path.is_file():
        variants = sorted(p.name for p in profile_dir.iterdir() if (p / "meta.yaml").is_file())
        raise ConfigError(f"timing.variant={variant}: {profile_dir} has no {variant}/meta.yaml "
                          f"(variants there: {', '.join(variants) or 'none'})")
    try:
        meta = yaml.safe_load(meta_path.read_text())
    except yaml.YAMLError as exc:
        raise InputError(f"{meta_path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a mapping of profile settings")
    architecture = meta.get("architecture")
    if architecture not in ARCHITECTURES:
        raise InputError(f"{meta_path}: architecture {architecture!r} is not one this backend "
                         f"composes ({', '.join(ARCHITECTURES)})")
    if model is not None and meta.get("model") != model:
        raise ConfigError(f"timing.model={model}: the profile at {variant_dir} is of "
                          f"{meta.get('model')!r}, not {model!r}")
    folder = variant_dir / f"tp{tp}"
    if not folder.is_dir():
        have = sorted(p.name for p in variant_dir.glob("tp*") if p.is_dir())
        raise ConfigError(f"timing.tp={tp}: {variant_dir} has no tp{tp} folder (it has "
                          f"{', '.join(have) or 'none'})")
    paths = {name: folder / name for name in ("dense.csv", "per_sequence.csv", "attention.csv")}
    for path in paths.values():
        if not path.is_file():
            raise InputError(f"{path}: file not found (a per-layer profile needs dense.csv, "
                             f"per_sequence.csv and attention.csv in each tp folder)")
    ops = _layer_ops(read_table(paths["dense.csv"]), read_table(paths["per_sequence.csv"]),
                     architecture, num_layers, folder)
    attention = _attention_grid(read_table(paths["attention.csv"]))
    skew_info, skew = _skew(meta, tp, variant_dir)
    skew_files = [skew_info["file"]] if "file" in skew_info else []
    record = {
        "profile_dir": str(profile_dir), "variant": variant, "tp": tp,
        "model": meta.get("model"), "architecture": architecture,
        "measured": {k: meta.get(k) for k in ("hardware", "gpu", "vllm_version",
                                              "cuda_version", "profiled_at", "profiler_version")},
        "engine_effective": meta.get("engine_effective"),
        "files": [file_record(meta_path), *(file_record(p) for p in paths.values()),
                  *skew_files],
        "range": {"tokens": float(ops[0][~ops[4]].max()), "sequences": float(ops[0][ops[4]].max()),
                  "prefill_chunk": float(attention[0][-1]), "n_decode": float(attention[1][-1]),
                  "kv_prefill": float(attention[5].max()), "kv_decode": float(attention[8].max())},
        "skew": skew_info,
    }
    return record, (*ops, *attention, *skew)


@dataclass(eq=False)
class LayerProfileTiming:
    """Step time from a per-layer profile of one model on one GPU (see the module docstring).

    ``num_layers`` multiplies the per-layer rows (the profile measures one decoder layer);
    ``model`` (the Hugging Face id) must match ``meta.yaml`` when given. With ``tp > 1``
    each decoder layer adds two ring all-reduces of ``hidden_size * dtype_bytes`` bytes per
    token over links of ``allreduce_bandwidth_gbps`` (GB/s, 1e9 bytes) and
    ``allreduce_latency_us``; the profile itself has no communication.
    """

    time_unit: ClassVar[str] = "seconds"

    profile_dir: str
    num_layers: int = field(metadata=check(ge=1))
    hidden_size: int = field(metadata=check(ge=1))
    dtype_bytes: int = field(default=2, metadata=check(ge=1))
    tp: int = field(default=1, metadata=check(ge=1))
    variant: str = "bf16"
    model: str | None = None
    allreduce_bandwidth_gbps: float | None = field(default=None, metadata=check(gt=0))
    allreduce_latency_us: float = field(default=0.0, metadata=check(ge=0))

    def __post_init__(self) -> None:
        self.record, arrays = load(Path(self.profile_dir).expanduser(), self.variant,
                                   int(self.tp), int(self.num_layers), self.model)
        if self.tp > 1 and self.allreduce_bandwidth_gbps is None:
            raise ConfigError(f"timing.allreduce_bandwidth_gbps is required with timing.tp="
                              f"{self.tp} (the all-reduces are not in the profile)")
        ints = np.zeros(3, dtype=np.int64)
        ints[I_LAYERS], ints[I_TP] = self.num_layers, self.tp
        ints[I_SKEW_ENABLED] = self.record["skew"]["enabled"]
        floats = np.zeros(4)
        floats[F_SKEW_DEFAULT] = self.record["skew"].get("alpha_default", 0.0)
        floats[F_ALLREDUCE_BYTES_PER_TOKEN] = self.hidden_size * self.dtype_bytes
        floats[F_LINK_BYTES_PER_S] = (self.allreduce_bandwidth_gbps or math.inf) * 1e9
        floats[F_LINK_LATENCY_S] = self.allreduce_latency_us * 1e-6
        self.tables = LayerTables(*arrays, ints, floats)
        self._arguments = self.tables.arguments()

    def duration(self, batch: BatchShape) -> float:
        return float(layer_profile_seconds(batch.new_tokens, batch.context, batch.is_prefill,
                                           batch.size, *self._arguments))

    def describe(self) -> dict:
        allreduce = ({"model": "ring, 2 per decoder layer", "message_bytes_per_token":
                      self.hidden_size * self.dtype_bytes,
                      "bandwidth_gbps": self.allreduce_bandwidth_gbps,
                      "latency_us": self.allreduce_latency_us} if self.tp > 1 else None)
        return {"backend": "layer_profile", **self.record, "num_layers": self.num_layers,
                "allreduce": allreduce,
                "composition": "per-layer rows x layer count + per-step and per-sequence rows,"
                               " in whole ns (LLMServingSim's trace generator); attention at"
                               " summed prefill chunk/context, decode count and mean context"}
