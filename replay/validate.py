"""Check a composed config's types and ranges before anything runs.

Hydra already rejects unknown groups and keys. This adds what it cannot know:
the type and range of each value the engine and the common components read,
and a clear message for a value that does not resolve (a missing mandatory
option, a model without linear-timing coefficients for the chosen hardware).
Component-specific values (a policy's alpha, an arrival rate) are checked by
the components themselves when they are built, with the same kind of message.
Every violation is a :class:`~replay.errors.ConfigError` naming the key, the
value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, MissingMandatoryValue, OmegaConfBaseException

from replay.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    key: str
    kind: type | tuple[type, ...]
    allowed: Callable[[object], bool]
    says: str
    optional: bool = False  # None allowed


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


RULES = (
    Rule("seed", int, lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
    Rule("workload_seed", int, lambda v: _whole(v) and v >= 0, "a whole number >= 0 or null",
         optional=True),
    Rule("engine.livelock_window", int, lambda v: _whole(v) and v >= 1,
         "a whole number >= 1 or null", optional=True),
    Rule("engine.max_steps", int, lambda v: _whole(v) and v >= 1,
         "a whole number >= 1 or null", optional=True),
    Rule("engine.max_running", int, lambda v: _whole(v) and v >= 1,
         "a whole number >= 1 or null", optional=True),
    Rule("engine.max_starts_per_round", int, lambda v: _whole(v) and v >= 1,
         "a whole number >= 1 or null", optional=True),
    Rule("engine.preemption", str, lambda v: v in ("restart", "recompute"),
         "restart or recompute"),
    Rule("engine.requeue", str, lambda v: v in ("front", "back"), "front or back"),
    Rule("engine.validate_decisions", bool, lambda v: isinstance(v, bool), "true or false"),
    Rule("engine.fast_forward", bool, lambda v: isinstance(v, bool), "true or false"),
    Rule("kv.block_size", int, lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    Rule("kv.tokens", int, lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    Rule("workload.n", int, lambda v: _whole(v) and v >= 1, "a whole number >= 1 or null",
         optional=True),
    Rule("batch_limit", (int, float), lambda v: not isinstance(v, bool) and v > 0,
         "a number > 0"),
)


def _resolve(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise ConfigError(f"{exc.full_key} is required here and has no value (give "
                          f"{exc.full_key}=...)") from None
    except InterpolationKeyError as exc:
        key = str(exc).split("'")[1] if "'" in str(exc) else str(exc)
        if key.startswith("model.linear_timing."):
            model = cfg.model.get("name", "?")
            known = list((cfg.model.get("linear_timing") or {}).keys())
            if not known:  # a model whose coefficients were never fitted (llama3_8b)
                raise ConfigError(
                    f"{exc.full_key}: model {model} has no linear timing coefficients "
                    f"(model.linear_timing.{cfg.hardware.name} is missing from "
                    f"configs/model/{model}.yaml); fit them with python -m "
                    f"replay.timing.fit_linear, or choose timing=unit or timing=vidur") from None
            raise ConfigError(f"{exc.full_key}: model {model} has no linear timing "
                              f"coefficients for hardware {cfg.hardware.name} (it has "
                              f"{known}); choose hardware={' or hardware='.join(known)} or add "
                              f"them to configs/model/{model}.yaml") from None
        raise ConfigError(f"{exc.full_key}: {exc}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{getattr(exc, 'full_key', '') or 'config'}: {exc}") from None


def _lookup(resolved: dict, dotted: str):
    node = resolved
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


_ABSENT = object()


RULE_BY_KEY = {rule.key: rule for rule in RULES}


def check_value(key: str, value) -> None:
    """Check one value against its rule (also used by components built without a config,
    e.g. the engine's own options)."""
    rule = RULE_BY_KEY[key]
    if value is None and rule.optional:
        return
    if not isinstance(value, rule.kind) or not rule.allowed(value):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be {rule.says}")


def validate_config(cfg: DictConfig) -> dict:
    """The resolved config, after checking every rule; raises ConfigError otherwise."""
    resolved = _resolve(cfg)
    for rule in RULES:
        value = _lookup(resolved, rule.key)
        if value is not _ABSENT:
            check_value(rule.key, value)
    return resolved
