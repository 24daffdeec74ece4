"""The one rule every command follows: bad input is one ``error:`` line and exit status 2.

A traceback means a bug. Commands compose their Hydra config and call their work
through these helpers so that a wrong override, a missing data file or a
rejected value reads the same everywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from replay.errors import InputError

T = TypeVar("T")


def fail(message: object) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def compose_or_exit(overrides: Sequence[str]) -> DictConfig:
    """The config ``python -m replay OVERRIDES`` would run, or exit 2 naming what is wrong."""
    from replay.run import compose_config

    try:
        return compose_config(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        fail(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))


def is_input_error(exc: BaseException) -> bool:
    """Bad input: an InputError, or a component that rejected its config with one."""
    return isinstance(exc, InputError) or (
        isinstance(exc, InstantiationException) and isinstance(exc.__cause__, InputError))


def run_or_exit(work: Callable[..., T], *args, **kwargs) -> T:
    try:
        return work(*args, **kwargs)
    except (InputError, InstantiationException) as exc:
        if not is_input_error(exc):
            raise
        fail(exc)
