"""The data directory: where traces and Vidur profiles are read from.

Resolved from the ``data_dir`` config option, which defaults to the environment
variable ``KVSCHED_DATA_DIR``. Files are never copied into the repository; on a
machine with internet access ``python -m traces.fetch`` downloads them there.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

import platformdirs

from replay.errors import InputError

#: Environment variable that overrides the cache folder (:func:`cache_dir`).
CACHE_ENV = "KVSCHED_CACHE_DIR"

FETCH_HINT = (
    "Set the data directory with the environment variable KVSCHED_DATA_DIR or the "
    "option data_dir=/path/to/data, or download the files there with "
    "`python -m traces.fetch --data-dir /path/to/data` (needs internet; see README, "
    "'Data directory')."
)


def cache_dir(*parts: str) -> Path:
    """The per-user cache folder of kvsched, or a folder ``parts`` inside it (not created).

    ``$KVSCHED_CACHE_DIR`` when set, else the platform's user cache folder
    (:func:`platformdirs.user_cache_dir`: ``~/.cache/kvsched`` on Linux, honouring
    ``$XDG_CACHE_HOME``; ``~/Library/Caches/kvsched`` on macOS).
    """
    root = os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("kvsched", appauthor=False)
    return Path(root).expanduser().joinpath(*parts)


class MissingDataError(InputError, FileNotFoundError):
    """A data file the config names is not in the data directory."""


def require_file(path: str | Path, what: str) -> Path:
    """Return ``path`` if it exists, else fail saying where the file comes from."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{what}: {p} is a directory, not a file")
    if not p.is_file():
        raise MissingDataError(f"{what}: file not found: {p}. {FETCH_HINT}")
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"{what}: {p} cannot be read ({exc.strerror})") from exc
    return p


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=64)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    """:func:`sha256_of`, once per file version (a sweep hashes the same trace per run)."""
    return sha256_of(path)


def file_record(path: str | Path) -> dict:
    """``{"path", "sha256", "bytes"}`` for the provenance section of a summary."""
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "sha256": _sha256(str(p), st.st_mtime_ns, st.st_size),
            "bytes": st.st_size}


@dataclass(frozen=True)
class RemoteFile:
    """A data file: where it goes under the data directory, where it comes from, its hash."""

    relpath: str
    repo: str
    commit: str
    repo_path: str
    sha256: str
    size: int

    @property
    def url(self) -> str:
        return (f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/"
                f"{quote(self.repo_path)}")
