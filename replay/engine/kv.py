"""KV-cache capacity ``M`` in token slots, in the three modes of MODEL.md §2.

Each mode is a function instantiated by Hydra from ``configs/kv/*.yaml``;
all return a :class:`KVCapacity` that records how ``M`` was obtained, so every
run summary can say which mode produced it. ``GB = 1e9`` bytes throughout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from replay.errors import ConfigError

#: The MC-SF and Sorted-F papers' M for Llama-2-70B on 2 x A100-80GB (observed, not computed).
PAPERS_LLAMA2_70B_2XA100_TOKENS = 16_492


@dataclass(frozen=True)
class KVCapacity:
    tokens: int
    mode: str
    block_size: int = 1
    detail: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ConfigError(f"kv: capacity must be >= 1 token slot, got {self.tokens} "
                             f"({self.mode}, {self.detail})")
        if self.block_size < 1:
            raise ConfigError(f"kv.block_size must be >= 1, got {self.block_size}")

    def describe(self) -> dict:
        return asdict(self)


def _blocked(tokens: int, block_size: int) -> int:
    """Round down to whole blocks: paged attention cannot use a partial block."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"kv.block_size={block_size!r} is not allowed: it must be a whole "
                          f"number >= 1")
    return tokens // block_size * block_size


def explicit(tokens: int = PAPERS_LLAMA2_70B_2XA100_TOKENS, block_size: int = 1) -> KVCapacity:
    return KVCapacity(_blocked(int(tokens), block_size), "explicit", block_size,
                      {"given_tokens": int(tokens)})


def _from_bytes_per_token(mode: str, bytes_per_token: float, model, hardware, block_size: int,
                          activation_reserve: float) -> KVCapacity:
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
    return KVCapacity(_blocked(tokens, block_size), mode, block_size, detail)


def mha_formula(model, hardware, block_size: int = 1,
                activation_reserve: float = 0.0) -> KVCapacity:
    """``2 * layers * hidden * dtype_bytes`` per token: the papers' formula (ignores GQA).

    ``activation_reserve`` is a fraction of total GPU memory kept for activations.
    """
    per_token = 2 * model.num_layers * model.hidden_size * model.dtype_bytes
    return _from_bytes_per_token("mha_formula", per_token, model, hardware, block_size,
                                 activation_reserve)


def gqa_formula(model, hardware, block_size: int = 1,
                activation_reserve: float = 0.0) -> KVCapacity:
    """``2 * layers * kv_heads * head_dim * dtype_bytes`` per token: the true GQA footprint."""
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes
    return _from_bytes_per_token("gqa_formula", per_token, model, hardware, block_size,
                                 activation_reserve)
