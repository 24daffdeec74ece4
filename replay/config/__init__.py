"""Where the Hydra config tree is and how a command composes it.

Every command (``python -m replay`` and the tools beside it) composes the same tree
with the same resolvers, so an override means the same thing everywhere.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from replay.storage.data import cache_dir


def _config_dir() -> Path:
    """``configs/`` of a source checkout, else the installed ``kvsched_configs`` package."""
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if (checkout / "config.yaml").is_file():
        return checkout
    import kvsched_configs

    return Path(kvsched_configs.__file__).resolve().parent


#: The Hydra config tree of the project (``configs/`` at the repository root).
CONFIG_DIR = _config_dir()


def compose_config(overrides=()) -> DictConfig:
    """The config ``python -m replay OVERRIDES`` would run, for scripts and tests
    (and for studies, inside a running Hydra app, which has Hydra initialised)."""
    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


#: File names are limited to 255 bytes on common file systems.
MAX_DIRNAME_BYTES = 255


def job_dirname(override_dirname: str) -> str:
    """A sweep job's folder name from its overrides, kept inside the sweep folder.

    Path-valued overrides (``workload.path=../x.csv``) would otherwise put ``/`` and
    ``..`` into the name: each ``/`` becomes ``%2F`` and a name that is only dots is
    prefixed, so every job folder is a direct child of ``hydra.sweep.dir``. A name
    longer than a file name may be (many overrides, or a dict-valued one) keeps its
    first bytes and ends with a hash of the whole, so it stays unique and the same
    on a rerun (the resume finds it).
    """
    name = override_dirname.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    name = f"_{name}" if set(name) <= {"."} else name
    encoded = name.encode()
    if len(encoded) > MAX_DIRNAME_BYTES:
        digest = hashlib.sha256(encoded).hexdigest()[:16]
        kept = encoded[: MAX_DIRNAME_BYTES - len(digest) - 1].decode(errors="ignore")
        name = f"{kept}~{digest}"
    return name


def register_resolvers() -> None:
    """``job_dirname`` (sweep job folders) and ``kvsched_cache`` (the per-user cache folder,
    e.g. ``${kvsched_cache:vidur}``) for the config tree."""
    if not OmegaConf.has_resolver("job_dirname"):
        OmegaConf.register_new_resolver("job_dirname", job_dirname)
    if not OmegaConf.has_resolver("kvsched_cache"):
        OmegaConf.register_new_resolver("kvsched_cache", lambda *parts: str(cache_dir(*parts)))
