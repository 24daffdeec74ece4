"""Compose each distinct choice of config files once per process, for sweeps.

Hydra composes every job of a multirun from scratch, in the launching process (the
sweeper's early check) and again where the job runs: it builds the defaults list (which
file of each group), loads and merges those files, then applies the job's values
(``key=value``) to the result. Jobs of one sweep mostly differ in values only (seeds,
rates) over a few choices of files, and merging the same files gives the same config. The
loader here keeps the merged config of each distinct list of files (and config sources)
and hands every later job a deep copy, which costs a fraction of the merge; the defaults
list, the values, Hydra's own node, the errors and everything written to a job's folder are
Hydra's, unchanged. The cache is per process (each sweep worker fills its own) and holds
the configs of at most :data:`MAX_COMPOSITIONS` choices.

The config files are taken not to change while a sweep runs (as Hydra itself assumes: it
composes every job's config before the first runs).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

from hydra._internal.config_loader_impl import ConfigLoaderImpl

#: Distinct choices of config files kept per process (a merged config is a few hundred KB).
MAX_COMPOSITIONS = 64

_composed: OrderedDict = OrderedDict()


class ComposeOnceLoader(ConfigLoaderImpl):
    """Hydra's config loader, merging each distinct defaults list once per process."""

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
