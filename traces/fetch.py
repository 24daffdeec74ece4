"""``python -m traces.fetch --data-dir DIR``: download the data files from their public origins.

Trace files go to ``DIR/traces/``; the Vidur A100 profiles listed in
:mod:`replay.timing.profiles_fetch` go to ``DIR/vidur/profiling/`` (``--only``
picks one of the two).

Each file is fetched with pooch from a commit-pinned GitHub raw URL and checked against the
SHA-256 of the copy the project was developed with; a file already present with the right hash
is left alone. Needs internet access.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pooch

from replay.config.cli import CommandParser, run_or_exit
from replay.errors import InputError

# The trace list lives with the data directory's reader, which checks each file against it.
from replay.storage.data import TRACE_FILES, RemoteFile
from replay.storage.outputs import ensure_writable_dir

__all__ = ["TRACE_FILES", "FetchError", "fetch", "main"]


class FetchError(InputError, RuntimeError):
    """A download failed or did not match the expected file (reported as bad input: the
    network or the origin, not this code)."""



#: ``downloader(url, output_file, pooch)``, as :func:`pooch.retrieve` calls it; ``None`` is
#: pooch's own HTTP downloader.
Downloader = Callable[[str, str, object], None]


def fetch(files: Iterable[RemoteFile], data_dir: Path,
          downloader: Downloader | None = None) -> list[Path]:
    """Download ``files`` into ``data_dir`` with :func:`pooch.retrieve`; return their paths.

    A file already there with the expected SHA-256 is left alone (pooch does not
    download it again); otherwise pooch downloads to a temporary name in the same
    folder and moves it into place only once its hash matches, so an interrupted or
    wrong download never looks like the real file. A hash that does not match is an
    error naming the file.
    """
    paths = []
    for remote in files:
        target = Path(data_dir).expanduser() / remote.relpath
        paths.append(target)
        ensure_writable_dir(target.parent)  # a folder we cannot write is not a download error
        try:
            pooch.retrieve(remote.url, known_hash=f"sha256:{remote.sha256}",
                           fname=target.name, path=target.parent, downloader=downloader,
                           progressbar=False)
        except ValueError as exc:  # pooch's hash mismatch
            raise FetchError(f"{remote.url}: the download does not match the expected "
                             f"SHA-256 {remote.sha256} for {remote.relpath} ({exc}); the "
                             f"origin has changed, see 'The data directory' in "
                             f"docs/workloads.md") from exc
        except OSError as exc:  # requests' errors are OSErrors too
            raise FetchError(f"{remote.url}: download failed ({exc})") from exc
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(
        prog="python -m traces.fetch",
        description="Download the data files from their public origins: the traces into "
                    "DATA_DIR/traces/, the Vidur A100 profiles into DATA_DIR/vidur/profiling/. "
                    "Each file comes from a commit-pinned GitHub URL and is checked against "
                    "its SHA-256; a file already there with the right hash is left alone. "
                    "Needs internet access.")
    parser.add_argument("--data-dir", default=os.environ.get("KVSCHED_DATA_DIR"),
                        help="data directory (default: $KVSCHED_DATA_DIR)")
    parser.add_argument("--only", choices=("traces", "profiles"),
                        help="fetch only the traces or only the Vidur profiles")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("give --data-dir or set KVSCHED_DATA_DIR")
    # Imported here: the profile list lives with the timing backend, which imports this module.
    from replay.timing.profiles_fetch import PROFILE_FILES

    files = {"traces": TRACE_FILES, "profiles": PROFILE_FILES}
    chosen = [files[args.only]] if args.only else list(files.values())
    for path in fetch([f for group in chosen for f in group], Path(args.data_dir)):
        print(path)


if __name__ == "__main__":
    run_or_exit(main)
