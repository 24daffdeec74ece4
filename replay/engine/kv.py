"""KV-cache capacity ``M`` in token slots: the three modes of docs/model.md and vLLM's sizing.

Each mode is a function instantiated by Hydra from ``configs/kv/*.yaml``;
all return a :class:`KVCapacity` that records how ``M`` was obtained, so every
run summary can say which mode produced it. ``GB = 1e9`` bytes throughout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from replay.errors import ConfigError

#: The MC-SF and Sorted-F papers' M for Llama-2-70B on 2 x A100-80GB (observed, not computed).
PAPERS_LLAMA2_70B_2XA100_TOKENS = 16_492


#: ``kv.prefix_cache``: off, or full blocks kept by content hash (replay.engine.prefix_cache).
PREFIX_CACHES = ("none", "block_hash")
#: ``kv.cache_eviction``: which free cached block is reclaimed first.
CACHE_EVICTIONS = ("lru", "fifo")


@dataclass(frozen=True)
class KVCapacity:
    tokens: int
    mode: str
    block_size: int = 1
    detail: dict = field(default_factory=dict)
    prefix_cache: str = "none"
    cache_eviction: str = "lru"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ConfigError(f"kv: capacity must be >= 1 token slot, got {self.tokens} "
                             f"({self.mode}, {self.detail})")
        if self.block_size < 1:
            raise ConfigError(f"kv.block_size must be >= 1, got {self.block_size}")
        if self.prefix_cache not in PREFIX_CACHES:
            raise ConfigError(f"kv.prefix_cache={self.prefix_cache!r} is not allowed: choose "
                              f"one of {', '.join(PREFIX_CACHES)}")
        if self.cache_eviction not in CACHE_EVICTIONS:
            raise ConfigError(f"kv.cache_eviction={self.cache_eviction!r} is not allowed: "
                              f"choose one of {', '.join(CACHE_EVICTIONS)}")
        if self.prefix_cache != "none" and self.block_size < 2:
            raise ConfigError("kv.prefix_cache=block_hash keeps whole blocks: it needs "
                              "kv.block_size >= 2 (16 is vLLM's)")

    def describe(self) -> dict:
        return asdict(self)


def _blocked(tokens: int, block_size: int) -> int:
    """Round down to whole blocks: paged attention cannot use a partial block."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"kv.block_size={block_size!r} is not allowed: it must be a whole "
                          f"number >= 1")
    return tokens // block_size * block_size


def explicit(tokens: int = PAPERS_LLAMA2_70B_2XA100_TOKENS, block_size: int = 1,
             prefix_cache: str = "none", cache_eviction: str = "lru") -> KVCapacity:
    return KVCapacity(_blocked(int(tokens), block_size), "explicit", block_size,
                      {"given_tokens": int(tokens)}, prefix_cache, cache_eviction)


def _from_bytes_per_token(mode: str, bytes_per_token: float, model, hardware, block_size: int,
                          activation_reserve: float, prefix_cache: str,
                          cache_eviction: str) -> KVCapacity:
    if not 0.0 <= activation_reserve < 1.0:
        raise ConfigError(f"kv.activation_reserve must be in [0, 1), got {activation_reserve}")
    gpu_bytes = hardware.num_gpus * hardware.gpu_memory_gb * 1e9
    weight_bytes = model.params * model.dtype_bytes
    free = gpu_bytes * (1.0 - activation_reserve) - weight_bytes
    if free <= 0:
        raise ConfigError(f"kv ({mode}): {model.name} weights ({weight_bytes / 1e9:.0f} GB) do not "
                         f"fit in {hardware.name} ({gpu_bytes / 1e9:.0f} GB)")
    tokens = int(free // bytes_per_token)
    detail = {"gpu_bytes": gpu_bytes, "weight_bytes": weight_bytes,
              "activation_reserve": activation_reserve, "kv_bytes_per_token": bytes_per_token,
              "model": model.name, "hardware": hardware.name}
    return KVCapacity(_blocked(tokens, block_size), mode, block_size, detail, prefix_cache,
                      cache_eviction)


def mha_formula(model, hardware, block_size: int = 1, activation_reserve: float = 0.0,
                prefix_cache: str = "none", cache_eviction: str = "lru") -> KVCapacity:
    """``2 * layers * hidden * dtype_bytes`` per token: the papers' formula (ignores GQA).

    ``activation_reserve`` is a fraction of total GPU memory kept for activations.
    """
    per_token = 2 * model.num_layers * model.hidden_size * model.dtype_bytes
    return _from_bytes_per_token("mha_formula", per_token, model, hardware, block_size,
                                 activation_reserve, prefix_cache, cache_eviction)


def gqa_formula(model, hardware, block_size: int = 1, activation_reserve: float = 0.0,
                prefix_cache: str = "none", cache_eviction: str = "lru") -> KVCapacity:
    """``2 * layers * kv_heads * head_dim * dtype_bytes`` per token: the true GQA footprint."""
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    return _from_bytes_per_token("gqa_formula", per_token, model, hardware, block_size,
                                 activation_reserve, prefix_cache, cache_eviction)


#: vLLM pads a vocabulary-parallel embedding (and LM head) to a multiple of this many rows
#: (``DEFAULT_VOCAB_PADDING_SIZE`` in vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64


def _required(model, *keys: str) -> None:
    missing = [k for k in keys if model.get(k) is None]
    if missing:
        raise ConfigError(f"kv=vllm_profile needs model.{', model.'.join(missing)} "
                          f"(model {model.get('name')} does not give it)")


def weight_parameters(model) -> tuple[int, int]:
    """``(sharded, replicated)`` parameter counts of a dense decoder (Llama or Qwen3 layout):
    the matrices that tensor parallelism splits (embedding, attention projections, gated MLP,
    LM head unless tied) and the norms every GPU keeps whole (two per layer, the final one,
    and with ``qk_norm`` the per-head query and key norms)."""
    _required(model, "num_layers", "hidden_size", "num_q_heads", "num_kv_heads", "head_dim",
              "mlp_hidden_size", "vocab_size")
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_q_heads * d, model.num_kv_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * model.mlp_hidden_size
    embeddings = (1 if model.get("tie_word_embeddings", False) else 2) * model.vocab_size * h
    norms_per_layer = 2 * h + (2 * d if model.get("qk_norm", False) else 0)
    return (embeddings + model.num_layers * per_layer,
            model.num_layers * norms_per_layer + h)


def _weight_bytes_per_gpu(model, tensor_parallel: int) -> dict:
    """Bytes of weights one GPU holds under vLLM: each split matrix's share (the vocabulary
    padded to :data:`VOCAB_PADDING` rows first), the norms whole, and the rotary embedding's
    cosine/sine table (``max_context`` positions x ``head_dim`` in the model dtype, one
    table shared by all layers)."""
    sharded, replicated = weight_parameters(model)
    padded_vocab = -(-model.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    sharded += ((1 if model.get("tie_word_embeddings", False) else 2)
                * (padded_vocab - model.vocab_size) * model.hidden_size)
    rotary = model.max_context * model.head_dim * model.dtype_bytes
    per_gpu = (-(-sharded // tensor_parallel) + replicated) * model.dtype_bytes + rotary
    return {"parameters": sharded + replicated, "rotary_table_bytes": rotary,
            "weight_bytes_per_gpu": per_gpu}


def estimated_activation_peak(model, tensor_parallel: int, max_num_batched_tokens: int,
                              max_num_seqs: int) -> dict:
    """An estimate of the activation peak vLLM measures in its profiling run (a forward pass
    over ``max_num_batched_tokens`` tokens, then the sampler over ``min(max_num_seqs,
    max_num_batched_tokens)`` requests): the larger of

    * the forward pass: hidden states and residual (``hidden_size`` each per token) and the
      MLP's gate/up output and activation (``3 * mlp_hidden_size / tp``), in the model dtype;
    * the sampler: per request and vocabulary entry the logits in the model dtype, their
      float32 copy and float32 probabilities, beside the step's hidden states.

    vLLM measures the allocator's peak instead; what this leaves out (workspaces, the
    sampler's further temporaries) is not counted here."""
    tokens = max_num_batched_tokens
    requests = min(max_num_seqs, tokens)
    dtype = model.dtype_bytes
    forward = tokens * (2 * model.hidden_size + 3 * model.mlp_hidden_size // tensor_parallel)
    sampler = requests * model.vocab_size * (dtype + 4 + 4) + tokens * model.hidden_size * dtype
    return {"forward_bytes": forward * dtype, "sampler_bytes": sampler,
            "activation_peak_bytes": max(forward * dtype, sampler)}


def vllm_profile(model, hardware, gpu_memory_utilization: float = 0.9,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 256,
                 block_size: int = 16, activation_peak_bytes: int | None = None,
                 non_torch_bytes: int = 0, cudagraph_bytes: int = 0,
                 prefix_cache: str = "none", cache_eviction: str = "lru") -> KVCapacity:
    """``M`` as vLLM 0.19's V1 engine sizes its KV cache on each GPU:

    ``available = ceil(total * gpu_memory_utilization) - weights - activation peak
    - non-torch memory - CUDA-graph estimate`` (``Worker.determine_available_memory``), and
    ``blocks = available // page_size // layers`` with ``page_size`` the K and V bytes of
    ``block_size`` tokens of one layer's KV heads on one GPU (``get_num_blocks`` in
    vllm/v1/core/kv_cache_utils.py); ``M = blocks * block_size``.

    ``total`` is ``hardware.gpu_memory_bytes`` (else ``gpu_memory_gb * 1e9``). The weights
    are computed from the model's shape (:func:`_weight_bytes_per_gpu`); the activation peak,
    which vLLM measures, is ``activation_peak_bytes`` when given, else
    :func:`estimated_activation_peak`. ``non_torch_bytes`` (memory outside PyTorch's
    allocator that grows during profiling: NCCL, cuBLAS workspaces) and ``cudagraph_bytes``
    (subtracted only when ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is set, which vLLM
    did by default only from v0.21) are not modelled: they are 0 unless given.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"kv.gpu_memory_utilization must be in (0, 1], got "
                          f"{gpu_memory_utilization}")
    for key, value in (("max_num_batched_tokens", max_num_batched_tokens),
                       ("max_num_seqs", max_num_seqs)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"kv.{key}={value!r} is not allowed: it must be a whole number >= 1")
    for key, value in (("activation_peak_bytes", activation_peak_bytes),
                       ("non_torch_bytes", non_torch_bytes), ("cudagraph_bytes", cudagraph_bytes)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"kv.{key}={value!r} is not allowed: it must be a whole number "
                              f">= 0 of bytes")
    if not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"kv.block_size={block_size!r} is not allowed: it must be a whole "
                          f"number >= 1")
    _required(model, "dtype_bytes", "max_context")
    tp = hardware.tensor_parallel
    total = hardware.get("gpu_memory_bytes") or int(hardware.gpu_memory_gb * 1e9)
    requested = math.ceil(total * gpu_memory_utilization)
    weights = _weight_bytes_per_gpu(model, tp)
    activation = estimated_activation_peak(model, tp, max_num_batched_tokens, max_num_seqs)
    if activation_peak_bytes is not None:
        activation = {"activation_peak_bytes": activation_peak_bytes, "given": True}
    available = (requested - weights["weight_bytes_per_gpu"]
                 - activation["activation_peak_bytes"] - non_torch_bytes - cudagraph_bytes)
    kv_heads = max(1, model.num_kv_heads // tp)   # vLLM replicates KV heads when tp > heads
    page_size = 2 * block_size * kv_heads * model.head_dim * model.dtype_bytes
    blocks = available // page_size // model.num_layers if available > 0 else 0
    detail = {"model": model.name, "hardware": hardware.name, "gpu_memory_bytes": total,
              "gpu_memory_utilization": gpu_memory_utilization, "requested_bytes": requested,
              **weights, **activation, "non_torch_bytes": non_torch_bytes,
              "cudagraph_bytes": cudagraph_bytes, "available_kv_bytes": available,
              "page_size_bytes_per_layer": page_size, "num_gpu_blocks": blocks,
              "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs}
    if blocks < 1:
        raise ConfigError(f"kv (vllm_profile): {model.name} leaves no KV cache on {hardware.name}"
                          f" at gpu_memory_utilization={gpu_memory_utilization} ({requested} "
                          f"bytes requested, {weights['weight_bytes_per_gpu']} of weights and "
                          f"{activation['activation_peak_bytes']} of activations per GPU)")
    return KVCapacity(blocks * block_size, "vllm_profile", block_size, detail, prefix_cache,
                      cache_eviction)
