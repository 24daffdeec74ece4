"""The one rule every command follows: bad input is one ``error:`` line and exit status 2,
and Ctrl-C is one line and exit status 130.

A traceback means a bug. Commands compose their Hydra config (:func:`compose_or_exit`) and
call their work through :func:`run_or_exit` so that a wrong override, a missing data file,
a rejected value, a full disk or an interrupt reads the same everywhere.
"""

from __future__ import annotations

import argparse
import errno
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

from replay.errors import (
    ConfigError,
    InputError,
    report_interrupt,
    say_interrupted,
    surfacing_interrupts,
)

T = TypeVar("T")


def fail(message: object) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, held to the commands' rule: a bad argument is one ``error:`` line
    that names it and where the usage is, and exit status 2 (argparse prints its usage
    block first, then a line in its own form). Sub-commands' parsers are of this class too
    (argparse makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)")


def _whole_number(text: str, least: int, words: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {words}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argument that counts something (``--n``, ``--repeat``, ``--jobs``): a whole
    number >= 1."""
    return _whole_number(text, 1, "at least 1")


def seed_int(text: str) -> int:
    """A ``--seed``: a whole number >= 0 (numpy's generators take no negative seed)."""
    return _whole_number(text, 0, "0 or more")


def interrupted(exc: KeyboardInterrupt, hint: str = "") -> NoReturn:
    """End on Ctrl-C with one line instead of Python's traceback (:func:`say_interrupted`).

    The interrupt is raised on, so the program still ends as an interrupted program
    should: killed by SIGINT (status 130 in a shell), which also stops a shell loop or
    script that runs it."""
    say_interrupted(hint)
    sys.excepthook = report_interrupt
    raise exc


#: Errors by which the disk, not the program, refuses a write (a full disk, a quota, a
#: read-only file system, a file too large); another ``OSError`` is a bug and keeps its
#: traceback.
WRITE_REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def refused_write(exc: BaseException, where: object = None) -> str | None:
    """The ``cannot write PATH (reason)`` line for a write the disk refused (``None``: ``exc``
    is not one). ``where`` names the folder when the error does not name its file."""
    if not isinstance(exc, OSError) or exc.errno not in WRITE_REFUSED:
        return None
    from replay.storage.outputs import output_error

    return str(output_error(exc.filename or where or "a result file", exc))


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


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuse an override that would compose without error but not as meant: a list of a
    config group's options (``policy=[fcfs,mcsf]``), which Hydra merges into one config
    (the last option wins key by key), so one policy runs where two were asked for."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from replay.config import CONFIG_DIR

    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException:
            continue  # composition names it (config_error_line)
        group = override.key_or_group
        if (isinstance(override.value(), list) and not override.is_sweep_override()
                and (CONFIG_DIR / group).is_dir()):
            choices = ",".join(str(v) for v in override.value())
            raise ConfigError(
                f"{text}: a list of {group} options merges them into one config (the last "
                f"wins key by key), so only one would run; to run each, sweep them: "
                f"python -m replay -m {group}={choices}")


def compose(overrides: Sequence[str]) -> DictConfig:
    """The config ``python -m replay OVERRIDES`` would run (not yet validated); one that does
    not compose, or would not compose as meant (:func:`check_overrides`), is a
    :class:`~replay.errors.ConfigError` whose message is the line ``replay`` prints for it.
    The one composition path of every command that takes overrides."""
    from replay.config import compose_config

    check_overrides(overrides)
    try:
        return compose_config(overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(config_error_line(exc, overrides)) from None


def compose_or_exit(overrides: Sequence[str]) -> DictConfig:
    """The validated config of ``overrides`` (:func:`compose`), or exit 2 naming what is
    wrong."""
    from replay.config.validate import validate_config

    cfg = run_or_exit(compose, overrides)
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
    and a write the disk refuses become one ``error:`` line and exit status 2, Ctrl-C one
    line and status 130 (:func:`interrupted`). Anything else keeps its traceback."""
    try:
        return surfacing_interrupts(work, *args, **kwargs)
    except CONFIG_ERRORS as exc:
        fail(config_error_line(exc))
    except (InputError, InstantiationException) as exc:
        if not is_input_error(exc):
            raise
        fail(exc.__cause__ if isinstance(exc, InstantiationException) else exc)
    except OSError as exc:
        line = refused_write(exc)
        if line is None:
            raise
        fail(line)
    except KeyboardInterrupt as exc:
        interrupted(exc)


def error_summary(cfg: DictConfig, message: str, status: str = "error") -> dict:
    """The summary a sweep job leaves when it produced no result: its input was rejected
    (status ``error``) or it raised (``failed``); ``message`` says why."""
    from omegaconf import OmegaConf

    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:
        config = OmegaConf.to_container(cfg, resolve=False)
    return {"status": status, "message": message, "partial": True, "config": config}
