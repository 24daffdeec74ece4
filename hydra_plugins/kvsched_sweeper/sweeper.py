"""Hydra's basic sweeper with a cheaper check, before any job runs, that the jobs compose.

The basic sweeper composes every job's config in the launching process before it starts
any (and the launcher composes each again where the job runs). A composition takes about
a tenth of a second, so a sweep of 800 short replays spent over a minute of one core
composing configs before the first job started. Whether a job's config composes depends
on which config of each group it chooses (a group's config decides which keys exist) and
on each value it gives a key, not on which other values the job combines them with. So
one job per distinct choice of groups, plus a job for each override not yet seen, checks
every config the sweep selects and every value it sets, as early as before. Each distinct
choice of groups is composed once (0.1 s); a job's values are then applied to a copy of
that config exactly as Hydra applies them when it composes the job (a hundredth of a
second), so a sweep of a thousand seeds no longer spends a minute and a half checking
before its first job.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper


def representatives(batch: Sequence[Sequence[str]],
                    group_of: Callable[[str], str | None]) -> list[Sequence[str]]:
    """The jobs of ``batch`` (each a list of ``key=value`` overrides) to compose: the first
    job of each distinct choice of config groups, and any job with an override no job
    chosen so far has. ``group_of(override)`` names the config group an override chooses
    from (``None``: it sets a value)."""
    chosen, choices_seen, overrides_seen = [], set(), set()
    for job in batch:
        choices = tuple(o for o in job if group_of(o) is not None)
        if choices not in choices_seen or not overrides_seen.issuperset(job):
            chosen.append(job)
            choices_seen.add(choices)
            overrides_seen.update(job)
    return chosen


class KvschedSweeper(Sweeper):
    """Hydra's ``BasicSweeper`` (the cartesian product of the sweep's values, ``range(...)``
    included, in batches of ``max_batch_size``), whose early composition check covers the
    :func:`representatives` of each batch instead of every job.

    It wraps a ``BasicSweeper`` rather than subclassing it: Hydra's plugin scan executes
    the module of ``BasicSweeper`` again, and a subclass made before the scan would no
    longer be one of the class that module then holds."""

    def __init__(self, max_batch_size: int | None = None,
                 params: dict[str, str] | None = None) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

        super().__init__()
        self.basic = BasicSweeper(max_batch_size=max_batch_size, params=params)
        self.basic.validate_batch_is_legal = self.validate_batch_is_legal
        self.hydra_context = None
        self.config = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from replay.config.compose_once import compose_once

        compose_once(hydra_context.config_loader)  # every job's composition, here and in workers
        self.hydra_context, self.config = hydra_context, config
        self.basic.setup(hydra_context=hydra_context, task_function=task_function,
                         config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.basic.sweep(arguments)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        loader = self.hydra_context.config_loader
        parser = OverridesParser.create(config_loader=loader)
        groups: dict[str, str | None] = {}   # override -> the group it chooses from, if any
        is_group: dict[str, bool] = {}   # by key: each lookup of a group scans the configs

        def group_of(override: str) -> str | None:
            if override not in groups:
                key = parser.parse_override(override).key_or_group
                if key not in is_group:
                    is_group[key] = bool(loader.get_group_options(key))
                groups[override] = key if is_group[key] else None
            return groups[override]

        composed: dict[tuple[str, ...], Any] = {}   # choice of groups -> its config
        for job in representatives(batch, group_of):
            choices = tuple(o for o in job if group_of(o) is not None)
            if choices not in composed:
                composed[choices] = loader.load_sweep_config(self.config, list(choices))
            values = parser.parse_overrides([o for o in job if group_of(o) is None])
            config = composed[choices]
            # Setting a value leaves the keys and their types as they were, so the next job
            # may set its own on the same config; adding or deleting a key would not.
            if any(o.is_add() or o.is_force_add() or o.is_delete() for o in values):
                config = copy.deepcopy(config)
            ConfigLoaderImpl._apply_overrides_to_config(values, config)
