"""The ``aiconfigurator`` timing backend: a step priced from NVIDIA's measured kernel tables.

aiconfigurator-core (Apache-2.0, a dependency) ships per-kernel latencies measured with
vLLM, SGLang and TensorRT-LLM on several GPUs ("systems": ``a100_sxm``, ``h100_sxm``,
``h200_sxm``, ``b200_sxm``, ``l40s``, ``rtx_pro_6000_server``, ...): GEMMs by shape, context
and generation attention by batch, length and heads, all-reduce by message size. Its own
model layer (``sdk/models``) turns a Hugging Face config into a list of operations, and its
compiled engine evaluates an operation at a shape against the tables (interpolating
between measured points; element-wise operations and the embedding, which it does not
measure, from memory bandwidth).

This backend builds the model from kvsched's model config (written as a config.json into
the cache folder), lets aiconfigurator evaluate its operations once, at construction, on
grids (every token count up to ``max_tokens`` for the token-wise operations, every request
count up to ``max_sequences`` for the LM head, geometric grids for the two attention
kernels), and prices a step from these tables with
:func:`replay.timing.aiconfigurator_step.kernel_db_seconds`. The composition follows
aiconfigurator's own mixed-step estimate: the token-wise operations at the step's total
new tokens, plus context attention for the prefilling requests, plus generation attention
for the decoding ones; where it differs, see docs/timing.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import ClassVar

import numpy as np

from replay.engine.timing import BatchShape
from replay.errors import ConfigError
from replay.params import check
from replay.storage import data
from replay.storage.data import file_record
from replay.timing.aiconfigurator_step import kernel_db_seconds

log = logging.getLogger(__name__)

PACKAGE = "aiconfigurator-core"
FRAMEWORKS = ("vllm", "sglang", "trtllm")
#: Version aliases aiconfigurator resolves per system and framework.
ALIASES = ("current", "previous", "next")
#: Architectures of the model configs this backend builds (dense decoders aiconfigurator
#: models with its LLAMA family; Qwen3 adds per-head query/key norms).
ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")
#: The kernel families a dense decoder's step reads.
FAMILIES = ("gemm", "attention", "comm")
#: Bumped when the tables built from the database change meaning (keys the disk cache).
TABLES_FORMAT = 1
TABLE_NAMES = ("token_ms", "logits_ms", "chunk_axis", "prefix_axis", "prefill_ms", "batch_axis",
               "kv_axis", "decode_ms")


def geometric_axis(first: int, last: int, every_below: int = 16, per_doubling: int = 4
                   ) -> np.ndarray:
    """Every whole number from ``first`` up to ``every_below``, then ``per_doubling`` points
    per doubling up to ``last`` (included), as floats."""
    points = set(range(first, min(every_below, last) + 1))
    x = float(max(every_below, first))
    while x < last:
        points.add(int(round(x)))
        x *= 2.0 ** (1.0 / per_doubling)
    points.add(last)
    return np.array(sorted(p for p in points if first <= p <= last), dtype=float)


def systems_root() -> Path:
    return Path(str(resources.files("aiconfigurator_core"))) / "systems"


@lru_cache(maxsize=64)
def _version_slots(system: str, framework: str) -> dict:
    from aiconfigurator_core.sdk.perf_database import get_version_slots

    return get_version_slots(system, framework) or {}


def resolve_version(system: str | None, framework: str, version: str) -> str:
    """The table version ``version`` (an alias or a literal) names, or a ConfigError saying
    which systems, frameworks and versions the installed package has."""
    package = f"{PACKAGE} {metadata.version(PACKAGE)}"
    if system is None or not (systems_root() / f"{system}.yaml").is_file() or not any(
            _version_slots(system, f) for f in FRAMEWORKS):
        from aiconfigurator_core.sdk.perf_database import get_supported_databases

        known = ", ".join(sorted(get_supported_databases()))
        if system is None:
            raise ConfigError(f"timing.system is null: hardware.aiconfigurator_system names no "
                              f"GPU of {package}'s kernel database for this hardware; it has "
                              f"{known}")
        raise ConfigError(f"timing.system={system}: {package} has no kernel tables for this "
                          f"system; it has {known}")
    if framework not in FRAMEWORKS or not _version_slots(system, framework):
        have = [f for f in FRAMEWORKS if _version_slots(system, f)]
        raise ConfigError(f"timing.framework={framework}: {package} has no {framework} tables "
                          f"for {system}; it has {', '.join(have)}")
    slots = _version_slots(system, framework)
    if version in slots:
        return slots[version]
    if version in slots.values():
        return version
    listed = ", ".join(f"{alias}={v}" for alias, v in slots.items())
    raise ConfigError(f"timing.version={version}: {package} has {system}/{framework} tables for "
                      f"{listed} only")


def hf_config(architecture: str, num_layers: int, hidden_size: int, num_q_heads: int,
              num_kv_heads: int, head_dim: int, intermediate_size: int, vocab_size: int,
              max_context: int) -> dict:
    """The Hugging Face config.json aiconfigurator reads for a dense decoder. Weights are
    declared bfloat16 (fp16 runs at the same tensor-core rate; the tables hold bfloat16)."""
    return {"architectures": [architecture],
            "model_type": "qwen3" if architecture == "Qwen3ForCausalLM" else "llama",
            "num_hidden_layers": num_layers, "hidden_size": hidden_size,
            "num_attention_heads": num_q_heads, "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim, "intermediate_size": intermediate_size,
            "vocab_size": vocab_size, "max_position_embeddings": max_context,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _write_atomically(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{_digest([str(path), id(write)])}.tmp")
    write(tmp)
    tmp.replace(path)


def _model_folder(config: dict) -> Path:
    """A folder holding ``config`` as config.json, under kvsched's cache (by content)."""
    text = json.dumps(config, sort_keys=True, indent=1)
    folder = data.cache_dir("aiconfigurator", "models", _digest(config))
    path = folder / "config.json"
    if not (path.is_file() and path.read_text() == text):
        _write_atomically(path, lambda tmp: tmp.write_text(text))
    return folder


def _operation_count(evaluate) -> int:
    """How many operations the compiled list holds (the engine reports an index past its
    end as a ValueError; it has no other count)."""
    count = 0
    while True:
        try:
            evaluate([count], batch_size=1, s=1)
        except ValueError:
            return count
        count += 1


@dataclass(eq=False)
class AIConfiguratorTiming:
    """Step time from aiconfigurator-core's kernel tables for ``system`` (a GPU of its
    database), ``framework`` (vllm, sglang or trtllm) and ``version`` (a literal version the
    package has for both, or current / previous / next), for a dense Llama-3.x or Qwen3
    model of the given shape on ``tensor_parallel`` GPUs. See the module docstring."""

    time_unit: ClassVar[str] = "seconds"

    system: str | None
    architecture: str
    num_layers: int = field(metadata=check(ge=1))
    hidden_size: int = field(metadata=check(ge=1))
    num_q_heads: int = field(metadata=check(ge=1))
    num_kv_heads: int = field(metadata=check(ge=1))
    head_dim: int = field(metadata=check(ge=1))
    intermediate_size: int = field(metadata=check(ge=1))
    vocab_size: int = field(metadata=check(ge=1))
    max_context: int = field(metadata=check(ge=2))
    framework: str = "vllm"
    version: str = "current"
    tensor_parallel: int = field(default=1, metadata=check(ge=1))
    max_tokens: int = field(default=16384, metadata=check(ge=2, le=1 << 20))
    max_sequences: int = field(default=1024, metadata=check(ge=2, le=1 << 16))
    max_decode_batch: int = field(default=1024, metadata=check(ge=2, le=1 << 16))

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"timing.architecture={self.architecture}: timing=aiconfigurator "
                              f"builds {', '.join(ARCHITECTURES)} models")
        for key, value in (("num_q_heads", self.num_q_heads),
                           ("num_kv_heads", self.num_kv_heads)):
            if value % self.tensor_parallel:
                raise ConfigError(f"timing.{key}={value} does not split over tensor_parallel="
                                  f"{self.tensor_parallel} GPUs")
        self.resolved_version = resolve_version(self.system, self.framework, self.version)
        config = hf_config(self.architecture, self.num_layers, self.hidden_size,
                           self.num_q_heads, self.num_kv_heads, self.head_dim,
                           self.intermediate_size, self.vocab_size, self.max_context)
        key = {"format": TABLES_FORMAT, "package": metadata.version(PACKAGE),
               "system": self.system, "framework": self.framework,
               "version": self.resolved_version, "model": config, "tp": self.tensor_parallel,
               "grids": [self.max_tokens, self.max_sequences, self.max_decode_batch],
               "files": sorted(record["sha256"] for record in self.table_files())}
        self.cache_path = data.cache_dir("aiconfigurator", "tables", f"{_digest(key)}.npz")
        try:
            self._load_or_build(config)
        except (ValueError, RuntimeError, OSError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"timing=aiconfigurator: {PACKAGE} cannot price this model on "
                              f"{self.system}/{self.framework} {self.resolved_version} at tensor "
                              f"parallel {self.tensor_parallel} ({first})") from None
        self.tables = tuple(getattr(self, name) for name in TABLE_NAMES)

    def _load_or_build(self, config: dict) -> None:
        """The tables from the cache folder, or built from the database (a few seconds) and
        stored there: the key holds the package and table-file hashes, the model and grids."""
        if self.cache_path.is_file():
            with np.load(self.cache_path, allow_pickle=False) as stored:
                for name in TABLE_NAMES:
                    setattr(self, name, stored[name])
                self.sources = json.loads(str(stored["sources"]))
            return
        from aiconfigurator_core.sdk.engine import EngineHandle

        self._engine = EngineHandle.compile(
            str(_model_folder(config)), self.system, self.framework,
            backend_version=self.resolved_version, tp_size=self.tensor_parallel)
        self._build_tables()
        arrays = {name: getattr(self, name) for name in TABLE_NAMES}

        def save(tmp: Path) -> None:
            with tmp.open("wb") as fh:
                np.savez(fh, sources=json.dumps(self.sources), **arrays)

        _write_atomically(self.cache_path, save)

    def _build_tables(self) -> None:
        engine = self._engine
        names = [name for name, *_ in engine.evaluate_context_ops(
            list(range(_operation_count(engine.evaluate_context_ops))), batch_size=1, s=1)]
        attention = [i for i, n in enumerate(names) if n.endswith("attention")]
        logits = [i for i, n in enumerate(names) if n.endswith("logits_gemm")]
        token_ops = [i for i in range(len(names)) if i not in attention + logits]
        generation = [name for name, *_ in engine.evaluate_generation_ops(
            list(range(_operation_count(engine.evaluate_generation_ops))), batch_size=1, s=2)]
        decode = [i for i, n in enumerate(generation) if n.endswith("attention")]
        if len(attention) != 1 or len(logits) != 1 or len(decode) != 1:
            raise ValueError(f"unexpected operation lists {names} / {generation}")

        def total(ops, evaluate, **shape) -> float:
            return sum(value for _, value, *_ in evaluate(ops, **shape))

        self.token_ms = np.zeros(self.max_tokens + 1)
        for t in range(1, self.max_tokens + 1):
            self.token_ms[t] = total(token_ops, engine.evaluate_context_ops, batch_size=1, s=t)
        self.logits_ms = np.zeros(self.max_sequences + 1)
        for n in range(1, self.max_sequences + 1):
            # The LM head runs once per request (aiconfigurator's rule for this GEMM: batch).
            self.logits_ms[n] = total(logits, engine.evaluate_context_ops, batch_size=n, s=1)
        self.chunk_axis = geometric_axis(2, self.max_tokens)
        self.prefix_axis = np.concatenate(([0.0], geometric_axis(1, self.max_context)))
        self.prefill_ms = np.array([[total(attention, engine.evaluate_context_ops, batch_size=1,
                                           s=int(c), prefix=int(p)) for p in self.prefix_axis]
                                    for c in self.chunk_axis])
        self.batch_axis = geometric_axis(1, self.max_decode_batch)
        self.kv_axis = geometric_axis(1, self.max_context + 1)
        self.decode_ms = np.array([[total(decode, engine.evaluate_generation_ops,
                                          batch_size=int(b), s=int(k)) for k in self.kv_axis]
                                   for b in self.batch_axis])
        self.sources = {name: source for name, _, _, source in engine.evaluate_context_ops(
            list(range(len(names))), batch_size=1, s=512)}
        self.sources.update({name: source for name, _, _, source in engine.evaluate_generation_ops(
            decode, batch_size=8, s=1024)})
        for name, table in (("token", self.token_ms), ("logits", self.logits_ms),
                            ("prefill attention", self.prefill_ms),
                            ("decode attention", self.decode_ms)):
            if not np.all(np.isfinite(table)) or (table < 0).any():
                raise ValueError(f"the {name} table has a negative or non-finite time")

    def duration(self, batch: BatchShape) -> float:
        return float(kernel_db_seconds(batch.new_tokens, batch.context, batch.is_prefill,
                                       batch.size, *self.tables))

    def table_files(self) -> list[dict]:
        """The database files a step of this system and framework may read, with their
        hashes: the system spec, the GEMM, attention and all-reduce tables of every version of
        the framework (aiconfigurator fills a shape a version lacks from an older one) and
        NCCL's."""
        root = systems_root()
        folder = root / "data" / self.system
        paths = [root / f"{self.system}.yaml"]
        for family in FAMILIES:
            paths += sorted((folder / family / self.framework).glob("*/*.parquet"))
        paths += sorted((folder / "comm" / "nccl").glob("*/*.parquet"))
        return [file_record(path) for path in paths]

    def describe(self) -> dict:
        return {"backend": "aiconfigurator", "package": PACKAGE,
                "package_version": metadata.version(PACKAGE), "system": self.system,
                "framework": self.framework, "version": self.version,
                "resolved_version": self.resolved_version,
                "tensor_parallel": self.tensor_parallel,
                "model": {"architecture": self.architecture, "num_layers": self.num_layers,
                          "hidden_size": self.hidden_size, "num_q_heads": self.num_q_heads,
                          "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                          "intermediate_size": self.intermediate_size,
                          "vocab_size": self.vocab_size, "max_context": self.max_context},
                "grids": {"max_tokens": self.max_tokens, "max_sequences": self.max_sequences,
                          "prefill": [self.chunk_axis.size, self.prefix_axis.size],
                          "decode": [self.batch_axis.size, self.kv_axis.size]},
                "operation_sources": self.sources, "files": self.table_files(),
                "composition": "token-wise operations at the step's new tokens + LM head per "
                               "request + context attention per prefilling request + "
                               "generation attention at the decode count and mean context"}
