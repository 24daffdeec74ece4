"""Typed, range-checked component parameters, declared once next to each field.

A component (a policy, a workload, an arrival process, a predictor, a timing backend, a
KV mode) is a dataclass or a function. Its annotations say the type (``int`` is a whole
number, ``float`` a *finite* number, ``Literal[...]`` a choice, ``Sequence[int]`` a list
of whole numbers, ``X | None`` allows ``null``), and a field's metadata may add a range::

    alpha: float = field(metadata=check(ge=0, lt=1))
    n: Sequence[int] | None = field(default=None, metadata=check(ge=1))  # each element

:func:`check_params` checks a config node against that declaration before the component
is built (``replay.config.validate.validate_config`` walks every node with a ``_target_``), so
a new component gets the checks by declaring them: unknown keys, wrong types, NaN or
infinity, and out-of-range values are a :class:`~replay.errors.ConfigError` naming the
key, the value and what is allowed. Cross-field rules stay in the component.

One range is declared by name for every component: a parameter named ``*time_limit_s`` is
at most :data:`MAX_TIME_LIMIT_S`, whatever its own range says.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from replay.errors import ConfigError

#: Config keys Hydra reads itself (never parameters).
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_recursive_", "_convert_", "_args_"})

#: The longest time limit (seconds) a parameter named ``*time_limit_s`` may give: a limit
#: ends up as a timeout of the operating system (a solver worker's), whose timers count
#: milliseconds in 32 bits (24.8 days) and fail beyond. A million seconds (11.6 days) is
#: longer than any solve worth waiting for.
MAX_TIME_LIMIT_S = 1e6


@dataclass(frozen=True)
class Range:
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def holds(self, x: float) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def says(self) -> str:
        parts = [f"{op} {bound:g}" for op, bound in ((">=", self.ge), (">", self.gt),
                                                     ("<=", self.le), ("<", self.lt))
                 if bound is not None]
        return " and ".join(parts)


def check(ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None) -> dict:
    """Field metadata: the range a number (or each number of a list) must lie in."""
    return {"range": Range(ge, gt, le, lt)}


# --------------------------------------------------------------------- type hints
def _hints(target) -> dict[str, Any]:
    """The evaluated annotations of ``target`` (a class or function); a name that does not
    evaluate is left out (its value is then not type-checked)."""
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - fall back to one annotation at a time
        pass
    hints = {}
    module = inspect.getmodule(target)
    namespace = dict(vars(module)) if module else {}
    raw = getattr(target, "__annotations__", {}) or getattr(
        getattr(target, "__init__", None), "__annotations__", {})
    for name, annotation in raw.items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:  # noqa: BLE001, S307 - an unknown name: not checked
            continue
    return hints


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable)
_MAPPINGS = (dict, collections.abc.Mapping)


def _conforms(value, hint) -> bool:
    """Whether ``value`` (a resolved config value) has the type ``hint`` says."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if _is_union(hint):
        return any(_conforms(value, arm) for arm in args)
    if hint is type(None) or hint is None:
        return value is None
    if origin is Literal:
        return any(value == choice and type(value) is type(choice) for choice in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value))
    if hint is str:
        return isinstance(value, str)
    if hint in _SEQUENCES or origin in _SEQUENCES:
        if not isinstance(value, list | tuple):
            return False
        element = args[0] if args else Any
        return all(_conforms(v, element) for v in value)
    if hint in _MAPPINGS or origin in _MAPPINGS:
        if not isinstance(value, dict):
            return False
        return all(_conforms(v, args[1]) for v in value.values()) if len(args) == 2 else True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return isinstance(value, dict)  # its fields are checked by _check_record
    if isinstance(hint, type) and hint.__module__ not in ("builtins", "numpy"):
        # A component (an overflow rule, a nested workload): a node Hydra builds.
        return isinstance(value, dict) and isinstance(value.get("_target_"), str)
    return True  # a type the config cannot spell (arrays, callables)


def _says(hint) -> str:
    """``hint`` in words, for an error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        arms = [a for a in args if a is not type(None)]
        words = " or ".join(_says(a) for a in arms)
        return f"{words} or null" if len(arms) < len(args) else words
    if origin is Literal:
        return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(map(repr, args))
    if hint is bool:
        return "true or false"
    if hint is int:
        return "a whole number"
    if hint is float:
        return "a finite number"
    if hint is str:
        return "text"
    if hint in _SEQUENCES or origin in _SEQUENCES:
        element = args[0] if args else Any
        return "a list" + ("" if element is Any else f" of {_plural(_says(element))}")
    if hint in _MAPPINGS or origin in _MAPPINGS:
        value = args[1] if len(args) == 2 else Any
        return "a mapping" + ("" if value is Any else f" to {_plural(_says(value))}")
    if dataclasses.is_dataclass(hint):
        return f"a record {{{', '.join(f.name for f in dataclasses.fields(hint))}}}"
    if isinstance(hint, type) and hint.__module__ not in ("builtins", "numpy"):
        return f"a {hint.__name__} (a node with _target_)"
    return getattr(hint, "__name__", str(hint))


def _plural(words: str) -> str:
    for one, many in (("a whole number", "whole numbers"), ("a finite number", "finite numbers"),
                      ("a list", "lists"), ("a mapping", "mappings"), ("text", "text")):
        if words.startswith(one):
            return many + words[len(one):]
    return words


def _numbers(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    return []


# --------------------------------------------------------------------- the check
def parameters(target) -> tuple[dict[str, inspect.Parameter], bool]:
    """``target``'s keyword parameters, and whether it also takes ``**kwargs``."""
    signature = inspect.signature(target)
    params = {name: p for name, p in signature.parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    variadic = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return params, variadic


def _ranges(target) -> dict[str, Range]:
    if not (dataclasses.is_dataclass(target) and isinstance(target, type)):
        return {}
    return {f.name: f.metadata["range"] for f in dataclasses.fields(target)
            if "range" in f.metadata}


def _range_of(name: str, declared: Range | None) -> Range | None:
    """The range a parameter's values must lie in: its declared one, and for a time limit
    (``*time_limit_s``) at most :data:`MAX_TIME_LIMIT_S` too."""
    if not name.endswith("time_limit_s"):
        return declared
    declared = declared or Range()
    upper = MAX_TIME_LIMIT_S if declared.le is None else min(declared.le, MAX_TIME_LIMIT_S)
    return dataclasses.replace(declared, le=upper)


def _reject(key: str, value, hint, bounds: Range | None) -> typing.NoReturn:
    says = _says(hint)
    if bounds is not None and bounds.says():
        says += f" ({'each ' if 'list' in says else ''}{bounds.says()})"
    raise ConfigError(f"{key}={value!r} is not allowed: it must be {says}")


def check_value(key: str, value, hint, bounds: Range | None = None) -> None:
    """Check one value against its annotation and range."""
    if not _conforms(value, hint):
        _reject(key, value, hint, bounds)
    if bounds is not None and not all(bounds.holds(x) for x in _numbers(value)):
        _reject(key, value, hint, bounds)
    record = _record_type(hint)
    if record is not None and value is not None:
        for i, item in enumerate(value if isinstance(value, list | tuple) else [value]):
            if isinstance(item, dict) and "_target_" not in item:
                _check_record(record, item, f"{key}[{i}]" if isinstance(value, list | tuple)
                              else key)


def _record_type(hint):
    """The dataclass a value (or each element of a list value) of type ``hint`` must be."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    for arm in typing.get_args(hint):
        found = _record_type(arm)
        if found is not None:
            return found
    return None


def _check_record(record: type, value: dict, key: str) -> None:
    """A plain record (no ``_target_``), e.g. one type of a typed workload."""
    check_params(record, value, key)


def check_params(target, node: dict, key: str) -> None:
    """Check the config ``node`` (resolved, a dict) of the component ``target`` (a class or
    function), named ``key`` in the config (``policy``, ``workload.types[0]``, ...).

    Raises :class:`~replay.errors.ConfigError` for an unknown key, a missing required one,
    a value of the wrong type (NaN and infinity are not finite numbers), or one outside
    the field's declared range. Nested components (values with ``_target_``) are not
    checked here: :func:`replay.config.validate.check_components` visits them too.
    """
    params, variadic = parameters(target)
    name = getattr(target, "__qualname__", str(target))
    where = f"{getattr(target, '__module__', '')}.{name}"
    unknown = [k for k in node if k not in params and k not in HYDRA_KEYS]
    if unknown and not variadic:
        raise ConfigError(f"{key}.{unknown[0]} is not a parameter of {where} (it takes: "
                          f"{', '.join(params) or 'nothing'})")
    missing = [k for k, p in params.items() if p.default is p.empty and k not in node]
    if missing and "_partial_" not in node:
        raise ConfigError(f"{key}.{missing[0]} is required by {where} and has no value "
                          f"(give {key}.{missing[0]}=...)")
    hints, ranges = _hints(target), _ranges(target)
    for k, value in node.items():
        if k in HYDRA_KEYS or k not in params:
            continue
        if isinstance(value, dict) and "_target_" in value:
            continue
        if k in hints:
            check_value(f"{key}.{k}", value, hints[k], _range_of(k, ranges.get(k)))


@dataclass(frozen=True)
class RequestType:
    """One request type of a typed workload (``workload.types[i]``, and the ``types`` a
    policy reads from it): the schema of a plain record, not built by Hydra."""

    prompt_len: int = dataclasses.field(metadata=check(ge=1))
    output_len: int = dataclasses.field(metadata=check(ge=1))
    rate: float = dataclasses.field(metadata=check(gt=0))
