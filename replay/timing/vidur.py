"""The ``vidur`` timing backend: Vidur's profiled A100 execution-time predictor.

Build once, replay fast. The first use of a (vidur version, profile file
hashes, model, tensor parallelism, predictor settings) combination trains
Vidur's sklearn predictor on the local profile CSVs (``vidur_build``), exports
its prediction grids to numpy tables (``vidur_tables``) and stores them under
``cache_dir/<key>/``; later runs only load the tables. ``duration()`` is a
handful of numpy operations per iteration and never calls sklearn.

The batch is described to Vidur per request: the new tokens of this iteration
(the prefill chunk, or 1) and the tokens already in its KV cache
(``BatchShape.context``; not cached + new). That is what the profiles'
``kv_cache_size`` measures (prefill rows satisfy ``kv_cache_size + chunk <= 4096``)
and Vidur's ``num_processed_tokens`` for a decode. (The schedulers bundled with
vidur 0.0.26 pass cached + new as ``num_kv_tokens``, which would look a prefill
chunk up as if its own tokens were already cached; that is not followed here.)
Requests with exactly one new token are decodes, as in Vidur (a one-token
prompt costs a decode).

Outside the profiled range (``limits``: tokens per iteration, decode batch
size, per-request context, prefill chunk) Vidur's own predictor has no answer
(its tables end there; its random forests would return the edge value). The
backend then either raises :class:`VidurRangeError` (``out_of_range=error``) or
extrapolates explicitly from the edge of the profile (``out_of_range=extrapolate``),
logging the first batch of each kind and counting them all in ``describe()``:

* per-token operations beyond ``max_tokens_per_request`` new tokens scale
  linearly from the last profiled size (linear layers and all-reduces are
  compute- or bandwidth-bound there);
* decode attention for more than ``max_batch_size`` requests follows
  ``beyond_profile`` (below); a mean context beyond ``max_tokens_per_request``
  scales linearly in the context (the kernel streams ``B * context`` cached tokens);
* prefill attention of a request whose context + chunk exceeds
  ``max_tokens_per_request`` (or whose chunk exceeds ``max_prefill_chunk_size``)
  scales with attention FLOPs ``chunk * (context + chunk / 2)`` from the largest
  profiled point with the same chunk (or the largest chunk).

``beyond_profile`` chooses how decode attention grows past the largest profiled
decode batch (``limits.max_batch_size``, 128 in Vidur's A100 profiles; everything
else is unaffected):

* ``linear`` (default): in proportion to the batch size, from the edge's value;
* ``flat``: the edge's value, whatever the batch size. This is what Vidur's own
  random forests return outside their training range, and so what a simulator
  calling Vidur directly (e.g. the WAIT authors') prices;
* ``measured``: by the measured growth of A100 decode-attention kernels with the
  batch size at the same cached length, from ``aiconfigurator-core``'s tables for the
  model's KV heads per GPU (:func:`replay.timing.aiconfigurator.decode_batch_scaling`),
  interpolated in log batch size and log context. Kernels batch better than linearly
  at short contexts (launch and occupancy costs are shared), about linearly at long ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import fasteners
import numpy as np
import pandas as pd

from replay.engine.rules import CompiledTiming, counters_of
from replay.engine.state import TimingState, new_timing_state
from replay.engine.timing import BatchShape
from replay.errors import ConfigError, InputError
from replay.storage import data
from replay.storage.data import file_record, require_file
from replay.timing import aiconfigurator, attention_7b, vidur_pricing
from replay.timing.profiles_fetch import fetch_hint, profile_paths
from replay.timing.vidur_pricing import BEYOND_PROFILE_MODES, OUT_OF_RANGE_KINDS
from replay.timing.vidur_spec import PredictionLimits, PredictorSpec, ProfileFiles
from replay.timing.vidur_tables import VidurTables, export_tables

log = logging.getLogger(__name__)

TABLES_FORMAT = 1
OUT_OF_RANGE_MODES = ("error", "extrapolate")
ATTENTION_SOURCES = ("auto", "profile", "derived")


class VidurRangeError(InputError, ValueError):
    """A batch lies outside the range the Vidur profiles cover (``out_of_range=error``)."""


def _sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _cached_json(path: Path) -> dict:
    """A JSON record of the build cache; one that cannot be read (edited, emptied, removed
    beside its table) is an error saying how to rebuild it. The cache writes its files
    whole (``VidurTables.save``), so only an outside change damages one."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InputError(f"timing.vidur: the cached {path.name} in {path.parent} cannot be read "
                         f"({reason}); remove that folder to rebuild it") from None


class VidurTiming(CompiledTiming):
    """Iteration time from Vidur's predictor for ``model`` on ``tensor_parallel`` x ``device``;
    the price itself is :mod:`replay.timing.vidur_pricing`."""

    time_unit = "seconds"
    price_batch = vidur_pricing.price_batch
    price_decodes = vidur_pricing.price_decodes

    def __init__(self, profile_dir: str, model: str, device: str, tensor_parallel: int,
                 network_device: str = "a100_pairwise_nvlink", predictor: str = "random_forest",
                 random_forest_grid: dict | None = None,
                 linear_regression_grid: dict | None = None,
                 k_fold_cv_splits: int = 10, random_state: int = 0,
                 limits: dict | None = None, out_of_range: str = "extrapolate",
                 attention: str = "auto", cache_dir: str | None = None,
                 beyond_profile: str = "linear", num_kv_heads: int | None = None) -> None:
        if beyond_profile not in BEYOND_PROFILE_MODES:
            raise ConfigError(f"timing.beyond_profile: must be one of {BEYOND_PROFILE_MODES}, "
                              f"got {beyond_profile!r}")
        if out_of_range not in OUT_OF_RANGE_MODES:
            raise ConfigError(f"timing.out_of_range: must be one of {OUT_OF_RANGE_MODES}, "
                             f"got {out_of_range!r}")
        if attention not in ATTENTION_SOURCES:
            raise ConfigError(f"timing.attention: must be one of {ATTENTION_SOURCES}, "
                             f"got {attention!r}")
        self.spec = PredictorSpec(model_name=model, device=device, network_device=network_device,
                                  tensor_parallel=int(tensor_parallel), predictor=predictor,
                                  grid=dict((random_forest_grid if predictor == "random_forest"
                                             else linear_regression_grid) or {}),
                                  k_fold_cv_splits=int(k_fold_cv_splits),
                                  random_state=int(random_state),
                                  limits=PredictionLimits(**dict(limits or {})))
        if self.spec.limits.max_prefill_chunk_size > self.spec.limits.max_tokens_per_request:
            raise ConfigError("timing.limits: max_prefill_chunk_size cannot exceed "
                             "max_tokens_per_request")
        self.out_of_range = out_of_range
        self.beyond_profile = beyond_profile
        self.num_kv_heads = num_kv_heads
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else data.cache_dir("vidur")
        self.files, self.attention_provenance = self._resolve_files(Path(profile_dir).expanduser(),
                                                                    attention)
        self.key_fields = {
            "tables_format": TABLES_FORMAT,
            "vidur": metadata.version("vidur"),
            "scikit-learn": metadata.version("scikit-learn"),
            "spec": self.spec.key_fields(),
            "files": {name: file_record(path)["sha256"]
                      for name, path in asdict(self.files).items() if path is not None},
        }
        slug = f"{model.split('/')[-1]}_tp{tensor_parallel}_{predictor}"
        self.cache_path = self.cache_dir / f"{slug}_{_sha256_json(self.key_fields)[:16]}"
        self.tables, self.build_info = self._load_or_build()
        self._bind_tables(self.tables)
        self.out_of_range_batches = {"tokens": 0, "decode_batch": 0, "context": 0}

    # -- profiles ---------------------------------------------------------------------------

    def _resolve_files(self, profile_dir: Path, attention: str) -> tuple[ProfileFiles, dict]:
        spec = self.spec
        paths = profile_paths(profile_dir, spec.model_name, spec.device, spec.network_device)
        mlp = require_file(paths["mlp"], fetch_hint("mlp", spec.model_name, spec.device))
        all_reduce = None
        if spec.tensor_parallel > 1:
            all_reduce = require_file(paths["all_reduce"],
                                      fetch_hint("all_reduce", spec.model_name, spec.device,
                                                 spec.network_device))
        measured = paths["attention"]
        target = attention_7b.target_shape(spec.model_name)
        derivable = target is not None and target["tensor_parallel"] == spec.tensor_parallel
        if attention == "profile" or (attention == "auto"
                                      and (measured.is_file() or not derivable)):
            files = ProfileFiles(mlp, require_file(
                measured, fetch_hint("attention", spec.model_name, spec.device)), all_reduce)
            return files, {"source": "measured Vidur profile", "file": file_record(measured)}
        if not derivable:
            known = ", ".join(f"{m} (TP {t['tensor_parallel']})"
                              for m, t in attention_7b.TARGET_SHAPES.items())
            raise ConfigError(f"timing.attention=derived: a derived attention table exists "
                             f"only for {known}, not {spec.model_name} at TP "
                             f"{spec.tensor_parallel}")
        source_model = attention_7b.SOURCE_SHAPE["model"]
        name = spec.model_name.split("/")[-1]
        source = require_file(profile_paths(profile_dir, source_model, spec.device)["attention"],
                              fetch_hint("attention", source_model, spec.device)
                              + f" (needed to derive the {name} attention table)")
        derived, provenance = self._derive_attention(source, target)
        log.warning("timing.vidur: no measured attention profile at %s; using the %s table "
                    "derived from %s (%s)", measured, name, source, provenance["method"])
        return ProfileFiles(mlp, derived, all_reduce), provenance

    def _derive_attention(self, source: Path, target: dict) -> tuple[Path, dict]:
        source_record = file_record(source)
        kernel_tables = aiconfigurator.provenance()
        key = [attention_7b.METHOD_VERSION, source_record["sha256"],
               sorted(f["sha256"] for f in kernel_tables["files"].values())]
        if target == attention_7b.TARGET_SHAPE:
            folder = "attention_7b"        # where the 7B tables have always been cached
        else:
            folder = f"attention_{target['model'].split('/')[-1]}"
            key.append(target)
        out_dir = self.cache_dir / folder / _sha256_json(key)[:16]
        table = out_dir / "attention.csv"
        constants_file = out_dir / "constants.json"
        out_dir.mkdir(parents=True, exist_ok=True)
        with fasteners.InterProcessLock(str(out_dir / ".lock")):
            if not (table.is_file() and constants_file.is_file()):
                kv_heads = target["n_kv_head"] // target["tensor_parallel"]
                rows, constants = attention_7b.derive(
                    pd.read_csv(source), aiconfigurator.prefill_kv_head_ratio(kv_heads), target)
                tmp = out_dir / ".attention.csv.tmp"
                rows.to_csv(tmp, index=False)
                tmp.replace(table)
                constants_file.write_text(json.dumps(constants, indent=1))
        constants = _cached_json(constants_file)
        return table, attention_7b.provenance(constants, source_record, file_record(table),
                                              kernel_tables)

    # -- build / cache ----------------------------------------------------------------------

    def vidur_predictor(self):
        """Vidur's own predictor (trained, or reloaded from Vidur's cache in ``cache_path``)."""
        from replay.timing.vidur_build import build_predictor  # vidur + sklearn: import on build

        return build_predictor(self.spec, self.files, self.cache_path / "vidur")

    def _load_or_build(self) -> tuple[VidurTables, dict]:
        tables_file = self.cache_path / "tables.npz"
        info_file = self.cache_path / "build.json"
        if not tables_file.is_file():
            from replay.timing.vidur_build import check_profiles  # vidur: import on build

            # A bad profile is one error before a build is announced or its folder made.
            check_profiles(self.spec, self.files)
            self.cache_path.mkdir(parents=True, exist_ok=True)
            with fasteners.InterProcessLock(str(self.cache_path / ".lock")):
                if not tables_file.is_file():
                    log.warning("timing.vidur: building the %s predictor for %s (TP %d) in %s; "
                                "this trains Vidur's models once and can take a long time",
                                self.spec.predictor, self.spec.model_name,
                                self.spec.tensor_parallel, self.cache_path)
                    started = time.perf_counter()
                    tables = export_tables(self.vidur_predictor())
                    info = {"build_seconds": round(time.perf_counter() - started, 1),
                            "key": self.key_fields}
                    info_file.write_text(json.dumps(info, indent=1))
                    tables.save(tables_file)
                    log.info("timing.vidur: built in %.0f s", info["build_seconds"])
        return VidurTables.load(tables_file), _cached_json(info_file)

    def _bind_tables(self, tables: VidurTables) -> None:
        self._max_tokens, self._max_batch = tables.max_tokens, tables.max_batch_size
        self._max_chunk = tables.max_prefill_chunk
        measured = None
        if self.beyond_profile == "measured":
            if not self.num_kv_heads:
                raise ConfigError("timing.beyond_profile=measured needs timing.num_kv_heads "
                                  "(the model's KV heads)")
            per_gpu = int(self.num_kv_heads) // self.spec.tensor_parallel
            lengths, sizes, ratio = aiconfigurator.decode_batch_scaling(per_gpu, self._max_batch)
            measured = (np.log(lengths), np.log(sizes), ratio, float(sizes[-1]))
        self._record = dict(
            ints=[tables.kv_granularity, tables.max_tokens, tables.max_batch_size,
                  tables.max_prefill_chunk, tables.max_prefill_chunk < tables.max_tokens,
                  self.out_of_range == "error", BEYOND_PROFILE_MODES.index(self.beyond_profile)],
            floats=[tables.num_layers * 1e-3, measured[3] if measured else 0.0],
            table=tables.token_ms, grid=tables.decode_ms, grid2=tables.prefill_ms,
            table2=measured[0] if measured else (), table3=measured[1] if measured else (),
            grid3=np.ascontiguousarray(measured[2]) if measured else None)

    # -- timing -----------------------------------------------------------------------------

    def timing_state(self) -> TimingState:
        return new_timing_state(**self._record, counters=np.zeros(3, dtype=np.int64))

    def finish(self, record: TimingState) -> None:
        """Count the run's (or the shape's) batches beyond the profile, saying so the first
        time a kind is met."""
        for kind, count in zip(OUT_OF_RANGE_KINDS, counters_of(record).tolist(), strict=True):
            if count and self.out_of_range_batches[kind] == 0:
                log.warning("timing.vidur: extrapolating beyond the profile (%s) in %d batches",
                            kind, count)
            self.out_of_range_batches[kind] += count

    def price_error(self, batch: BatchShape, record: TimingState) -> Exception:
        kinds = [kind for kind, count in zip(OUT_OF_RANGE_KINDS, counters_of(record).tolist(),
                                             strict=True) if count]
        new_tokens, context = batch.new_tokens, batch.context
        n_decode = int(np.count_nonzero(new_tokens == 1))
        detail = (f"{new_tokens.shape[0]} requests, {int(new_tokens.sum())} new tokens, "
                  f"{n_decode} decodes, max context {int(context.max())}, max chunk "
                  f"{int(new_tokens.max())}; profiled limits: {self._max_tokens} tokens per "
                  f"iteration and per request, {self._max_batch} decodes, chunks up to "
                  f"{self._max_chunk}")
        return VidurRangeError(
            f"timing.vidur: batch outside the profiled range ({', '.join(kinds)}): {detail}. "
            f"Cap the batch in the policy, or set timing.out_of_range=extrapolate to scale "
            f"from the edge of the profile (see replay/timing/vidur.py)")

    def parts(self, batch: BatchShape) -> dict[str, float]:
        """The price split into Vidur's three summed parts, in seconds: the token-wise
        operations at the batch's new tokens, decode attention, prefill attention (per
        prompt). Inside the profile their sum is :meth:`duration`; outside it, what
        ``out_of_range=extrapolate`` prices (without counting the batch)."""
        new_tokens = np.ascontiguousarray(batch.new_tokens, dtype=np.int64)
        context = np.ascontiguousarray(batch.context, dtype=np.int64)
        record = self.timing_state()
        parts = vidur_pricing.parts_ms(new_tokens, context, new_tokens.size,
                                       int(new_tokens.sum()),
                                       int(np.count_nonzero(new_tokens == 1)), record,
                                       np.empty(max(new_tokens.size, 1)))
        scale = self._record["floats"][0]
        return dict(zip(("token_ops", "decode_attention", "prefill_attention"),
                        (float(p) * scale for p in parts), strict=True))

    def _beyond_profile_provenance(self) -> dict:
        what = {"linear": "decode attention past the largest profiled decode batch scales "
                          "in proportion to the batch size",
                "flat": "decode attention past the largest profiled decode batch stays at the "
                        "edge's value (Vidur's random forests outside their training range)",
                "measured": "decode attention past the largest profiled decode batch scales as "
                            "measured A100 kernels do (aiconfigurator-core decode tables, median "
                            "over collections)"}
        info = {"mode": self.beyond_profile, "what": what[self.beyond_profile],
                "edge_decode_batch": self._max_batch}
        if self.beyond_profile == "measured":
            info["kv_heads_per_gpu"] = int(self.num_kv_heads) // self.spec.tensor_parallel
            info["tables"] = aiconfigurator.provenance()
        return info

    def describe(self) -> dict:
        info = {
            "backend": "vidur",
            "model": self.spec.model_name,
            "device": self.spec.device,
            "tensor_parallel": self.spec.tensor_parallel,
            "network_device": self.spec.network_device,
            "predictor": self.spec.predictor,
            "grid": self.spec.search_grid(),
            "k_fold_cv_splits": self.spec.k_fold_cv_splits,
            "limits": asdict(self.spec.limits),
            "out_of_range": self.out_of_range,
            "beyond_profile": self._beyond_profile_provenance(),
            "out_of_range_batches": dict(self.out_of_range_batches),
            "attention": self.attention_provenance,
            "vidur_version": self.key_fields["vidur"],
            "cache": str(self.cache_path),
            "build_seconds": self.build_info["build_seconds"],
            "files": [file_record(path) for path in asdict(self.files).values()
                      if path is not None],
        }
        if "source_file" in self.attention_provenance:
            info["files"].append(self.attention_provenance["source_file"])
        return info
