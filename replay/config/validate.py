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

from replay import params
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


#: How a run can end besides ``completed`` (``RunResult.status``), and ``error`` (its input
#: was rejected): the statuses ``output.fail_on`` may name.
FAILURE_STATUSES = ("livelock", "stalled", "step_limit", "error")


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
    Rule("limits.max_requests", int, lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    Rule("batch_limit", (int, float), lambda v: not isinstance(v, bool) and v > 0,
         "a number > 0"),
    *(Rule(f"output.{switch}", bool, lambda v: isinstance(v, bool), "true or false")
      for switch in ("progress", "request_table", "iteration_table", "skip_existing",
                     "overwrite")),
    Rule("output.fail_on", list, lambda v: all(s in FAILURE_STATUSES for s in v),
         f"a list of run statuses, each one of {', '.join(FAILURE_STATUSES)} (e.g. "
         f"[livelock, stalled])"),
    Rule("output.percentiles", list, lambda v: len(v) > 0 and all(
        isinstance(q, int | float) and not isinstance(q, bool) and 0 <= q <= 100 for q in v),
        "a list of percentiles, numbers from 0 to 100 (e.g. [50, 90, 99])"),
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


#: The config nodes that name a component (``_target_``), checked against its declaration.
COMPONENTS = ("kv", "timing", "workload", "arrivals", "prediction", "policy")


def _import(dotted: str):
    """The object a ``_target_`` names (``package.module.Name`` or ``module.Class.method``)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(f"no module in {dotted!r}")


def _target(key: str, node: dict):
    try:
        return _import(node["_target_"])
    except Exception as exc:  # noqa: BLE001 - any import failure is a wrong _target_
        raise ConfigError(f"{key}._target_={node['_target_']!r} cannot be imported "
                          f"({type(exc).__name__}: {exc})") from None


def check_components(resolved: dict, keys=COMPONENTS) -> None:
    """Check every component node (and every node with a ``_target_`` inside one) against
    the parameters its class or function declares (:func:`replay.params.check_params`):
    unknown keys, types, finiteness and ranges, before anything is built."""

    def visit(key: str, node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("_target_"), str):
                params.check_params(_target(key, node), node, key)
            for k, v in node.items():
                visit(f"{key}.{k}", v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(f"{key}[{i}]", v)

    for key in keys:
        node = resolved.get(key)
        if isinstance(node, dict) and "_target_" in node:
            visit(key, node)


def check_block_size(cfg: DictConfig, resolved: dict) -> None:
    """``kv.block_size`` must leave at least one whole block of KV (else the capacity
    rounds down to 0 and the error would not name the block size)."""
    block = _lookup(resolved, "kv.block_size")
    if not isinstance(block, int) or block <= 1 or "_target_" not in resolved.get("kv", {}):
        return
    try:
        args = {k: cfg.kv[k] for k in cfg.kv if k not in params.HYDRA_KEYS}
        tokens = _import(resolved["kv"]["_target_"])(**{**args, "block_size": 1}).tokens
    except Exception:  # noqa: BLE001 - the build reports its own error later
        return
    if block > tokens:
        raise ConfigError(f"kv.block_size={block} is larger than the KV capacity ({tokens} token "
                          f"slots): not one block fits; use a smaller block size (policy."
                          f"block_size sets it for vllm and sarathi)")


def validate_config(cfg: DictConfig) -> dict:
    """The resolved config, after checking every rule and every component's declared
    parameters; raises ConfigError otherwise."""
    resolved = _resolve(cfg)
    for rule in RULES:
        value = _lookup(resolved, rule.key)
        if value is not _ABSENT:
            check_value(rule.key, value)
    check_components(resolved)
    check_block_size(cfg, resolved)
    return resolved
