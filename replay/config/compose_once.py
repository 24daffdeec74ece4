"""Compose each distinct choice of config files once per process, for sweeps.

Hydra composes every job of a multirun from scratch, in the launching process (the
sweeper's early check) and again where the job runs: it reads and parses every config file
the job's defaults list names, builds that list (which file of each group), merges those
files, then applies the job's values (``key=value``) to the result. Jobs of one sweep
mostly differ in values only (seeds, rates) over a few choices of files, and merging the
same files gives the same config. The loader here

* reads and parses each config file once per process (Hydra's own per-composition file
  cache, kept for the loader's life instead of one composition's: a file the defaults list
  names is parsed once, not once per job), and
* keeps the merged config of each distinct list of files (and config sources) and hands
  every later job a deep copy, which costs a fraction of the merge.

The defaults list, the values, Hydra's own node, the errors and everything written to a
job's folder are Hydra's, unchanged. The caches are per process (each sweep worker fills
its own); the merged configs of at most :data:`MAX_COMPOSITIONS` choices are kept.

The config files are taken not to change while a sweep runs (as Hydra itself assumes: it
composes every job's config before the first runs).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository
from hydra.core.override_parser.overrides_parser import OverridesParser

#: Distinct choices of config files kept per process (a merged config is a few hundred KB).
MAX_COMPOSITIONS = 64

_composed: OrderedDict = OrderedDict()
#: Per config sources, primary config and search path override: its config files, each
#: loaded once. Keyed by content, not by loader: a sweep worker receives a new copy of the
#: loader with every job.
_repositories: dict = {}


class ComposeOnceLoader(ConfigLoaderImpl):
    """Hydra's config loader, reading each config file and merging each distinct defaults
    list once per process."""

    def _parse_overrides_and_create_caching_repo(self, config_name, overrides):
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
        searchpath = tuple(o.input_line for o in parsed
                           if o.get_key_element() == "hydra.searchpath")
        key = (tuple((type(s).__name__, s.provider, s.path)
                     for s in self.repository.get_sources()), config_name, searchpath)
        if key not in _repositories:
            repo = CachingConfigRepository(self.repository)
            self._process_config_searchpath(config_name, parsed, repo)
            _repositories[key] = repo
        return parsed, _repositories[key]

    def _compose_config_from_defaults_list(self, defaults, repo):
        key = (tuple((d.config_path, d.parent, d.package, d.is_self, d.primary)
                     for d in defaults),
               tuple((s.provider, s.path) for s in repo.get_sources()))
        if key not in _composed:
            _composed[key] = super()._compose_config_from_defaults_list(defaults, repo)
            if len(_composed) > MAX_COMPOSITIONS:
                _composed.popitem(last=False)
        _composed.move_to_end(key)
        return copy.deepcopy(_composed[key])


def compose_once(loader) -> None:
    """Make Hydra's ``loader`` (a ``ConfigLoaderImpl``) merge each choice of files once per
    process; the class travels with it to sweep workers (pickled by reference)."""
    if type(loader) is ConfigLoaderImpl:
        loader.__class__ = ComposeOnceLoader
