"""The one rule every command follows: bad input is one ``error:`` line and exit status 2.

A traceback means a bug. Commands compose their Hydra config and call their work
through these helpers so that a wrong override, a missing data file or a
rejected value reads the same everywhere.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from replay.errors import InputError

T = TypeVar("T")


def fail(message: object) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


#: What Hydra raises for a config that does not compose: an unknown option or key, or an
#: override it cannot parse.
CONFIG_ERRORS = (ConfigCompositionException, MissingConfigException, OverrideParseException,
                 OmegaConfBaseException)


def config_error_line(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """One line for a config that does not compose, naming what is wrong and what is allowed.

    Hydra's own messages span many lines (the search path, a hint about HYDRA_FULL_ERROR);
    this keeps what a user needs: the bad option with the group's choices, the unknown key
    with the keys beside it, or the override that is not valid syntax.
    """
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, choice = exc.missing_cfg_file.rpartition("/")
        return (f"{group}={choice}: no such option in config group '{group}'; choose one of: "
                f"{', '.join(sorted(exc.options))}")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    if isinstance(exc, OverrideParseException):
        bad = _unparsable(overrides)
        return (f"override {bad!r} is not valid Hydra override syntax ({first})" if bad
                else f"an override is not valid Hydra override syntax ({first})")
    unknown = re.match(r"Could not override '([^']+)'", first)
    if isinstance(exc, ConfigCompositionException) and unknown:
        key = unknown.group(1)
        known = _keys_beside(key, overrides)
        beside = f"; the keys there are: {', '.join(known)}" if known else ""
        return f"{key}: no such config key{beside} (to add a new key, write +{key}=...)"
    return first


def _unparsable(overrides: Sequence[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException:
            return override
    return None


def _keys_beside(key: str, overrides: Sequence[str]) -> list[str]:
    """The keys of the node that ``key`` would belong to, composed without the override
    that named it (empty if that does not compose either)."""
    from omegaconf import OmegaConf

    from replay.config import compose_config

    parent, _, _ = key.rpartition(".")
    rest = [o for o in overrides if not o.lstrip("+~").startswith(f"{key}=")]
    try:
        cfg = compose_config([o for o in rest if not o.startswith("-")])
        node = OmegaConf.select(cfg, parent) if parent else cfg
    except (HydraException, OmegaConfBaseException):
        return []
    return sorted(str(k) for k in node) if isinstance(node, DictConfig) else []


def compose_or_exit(overrides: Sequence[str]) -> DictConfig:
    """The config ``python -m replay OVERRIDES`` would run, or exit 2 naming what is wrong."""
    from replay.config import compose_config
    from replay.validate import validate_config

    try:
        cfg = compose_config(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        fail(config_error_line(exc, overrides))
    run_or_exit(validate_config, cfg)
    return cfg


def is_input_error(exc: BaseException) -> bool:
    """Bad input: an InputError, or a component that rejected its config with one."""
    return isinstance(exc, InputError) or (
        isinstance(exc, InstantiationException) and isinstance(exc.__cause__, InputError))


def input_error_message(exc: BaseException) -> str:
    """One line for bad input: a component's rejection names the config node it came from
    instead of Hydra's multi-line "Error in call to target" wrapper."""
    if isinstance(exc, InstantiationException) and isinstance(exc.__cause__, InputError):
        node = re.search(r"full_key: (\S+)", str(exc))
        return f"{exc.__cause__}" + (f" (config node {node.group(1)})" if node else "")
    return " ".join(str(exc).split("\n"))


def run_or_exit(work: Callable[..., T], *args, **kwargs) -> T:
    """Call ``work``; bad input (a rejected file or value, a config that does not compose)
    becomes one ``error:`` line and exit status 2. Anything else keeps its traceback."""
    try:
        return work(*args, **kwargs)
    except CONFIG_ERRORS as exc:
        fail(config_error_line(exc))
    except (InputError, InstantiationException) as exc:
        if not is_input_error(exc):
            raise
        fail(exc.__cause__ if isinstance(exc, InstantiationException) else exc)


def error_summary(cfg: DictConfig, exc: BaseException) -> dict:
    """The summary a sweep job leaves when its input was rejected."""
    from omegaconf import OmegaConf

    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:
        config = OmegaConf.to_container(cfg, resolve=False)
    return {"status": "error", "message": input_error_message(exc), "partial": True,
            "config": config}
