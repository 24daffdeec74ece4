"""The data directory: where traces and Vidur profiles are read from, and how they are read.

Resolved from the ``data_dir`` config option, which defaults to the environment
variable ``KVSCHED_DATA_DIR``. Files are never copied into the repository; on a
machine with internet access ``python -m traces.fetch`` downloads them there.

Every data file is opened through :func:`require_file`: a file ``traces.fetch`` downloads
(:data:`TRACE_FILES`, the Vidur profiles of :mod:`replay.timing.profiles_fetch`) must
still have the SHA-256 it was validated with, so a file cut short or edited is refused
before anything reads it. Tables are parsed through :func:`read_csv`, which turns every
way a file can fail to be CSV text into one error naming the file (and the line).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import lzma
import os
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
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
    "`python -m traces.fetch --data-dir /path/to/data` (needs internet; see "
    "docs/workloads.md, 'The data directory')."
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
    """Return ``path`` if it exists and can be read, else fail saying where the file comes
    from; a file ``traces.fetch`` knows must also have its recorded size and SHA-256
    (:func:`check_known_file`)."""
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
    check_known_file(p, what)
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


_VIDUR = "microsoft/vidur"
#: The trace files ``python -m traces.fetch`` downloads (below the data directory).
TRACE_FILES: tuple[RemoteFile, ...] = (
    RemoteFile("traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", _VIDUR,
               "6d98aa8f71696520acc603d87439e77cc78160a7",
               "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
               "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932),
    RemoteFile("traces/splitwise_conv.csv", _VIDUR, "8e54dd5c137a9b5aa0b6ff512ace6cc7caf8a377",
               "data/processed_traces/splitwise_conv.csv",
               "439e4138b7e384f316de614c071f7162be05b8af0cef866f82faacd1b0472249", 382_729),
    RemoteFile("traces/splitwise_code.csv", _VIDUR, "4f9167b6e76099943b2a8195cb1fcac7d693ead9",
               "data/processed_traces/splitwise_code.csv",
               "f266b907d109d471c61283ab69771c17ad79a18b33ff6e96aa546346f52767a6", 166_195),
    RemoteFile("traces/lmsys_chat_1m_words_in_lt257_out_lt257.csv", "Luoxiaogan/vidur_or",
               "aa5e1571214b75a08a040638bda43bf83402cd03",
               "lmsys_chat_1m_dataset/output_trace/input<257_output<257.csv",
               "626612facf53f4d67b5aecb9b27da7cb1245bb0a8df67a2abcd0fc4c658f1444", 4_028_459),
    # Mooncake FAST'25 traces (Apache-2.0), pinned to commits of the origin that hold them.
    RemoteFile("traces/mooncake/conversation_trace.jsonl", "kvcache-ai/Mooncake",
               "a2a4b18ac537fd798d50e6e9f57031ce86419a37",
               "FAST25-release/traces/conversation_trace.jsonl",
               "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533),
    RemoteFile("traces/mooncake/synthetic_trace.jsonl", "kvcache-ai/Mooncake",
               "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb",
               "FAST25-release/traces/synthetic_trace.jsonl",
               "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313),
    # The commit and path of this one could not be confirmed offline: the hash check decides.
    RemoteFile("traces/sharegpt_val_10k_llama2.csv", "AKafakA/vidur_opt_scheduler", "main",
               "data/trace_data/sharegpt/sharegpt_val_10k_llama2.csv",
               "e8eb6769b07f47a44fcb8caecf78dfc247103d65f84c4053bd9ae593caa01c63", 278_423),
)

#: The files ``traces.fetch`` knows, by the tail of their path that identifies them
#: wherever their folder is (:func:`know`).
_KNOWN: dict[str, RemoteFile] = {}


def know(files: Iterable[RemoteFile], root: str) -> None:
    """Record ``files`` (each ``relpath`` below ``root`` of the data directory) as files whose
    content is known: :func:`require_file` checks a file whose path ends in the part of a
    ``relpath`` below ``root`` (``traces/x.csv`` -> ``.../x.csv``) against it, so the check
    holds in any folder the data is read from (``data_dir``, ``timing.profile_dir``)."""
    for remote in files:
        _KNOWN[remote.relpath.removeprefix(f"{root}/")] = remote


know(TRACE_FILES, "traces")


def known_file(path: str | Path) -> RemoteFile | None:
    """The file ``traces.fetch`` downloads to ``path``'s place (``None``: not one it knows),
    by the path as given or as its links resolve."""
    names = {Path(os.path.abspath(path)).as_posix(), Path(path).resolve().as_posix()}
    return next((remote for tail, remote in _KNOWN.items()
                 if any(name.endswith(f"/{tail}") for name in names)), None)


def check_known_file(path: str | Path, what: str) -> None:
    """Refuse a file ``traces.fetch`` knows whose size or SHA-256 is not the recorded one (cut
    short, edited, or another file under its name)."""
    remote = known_file(path)
    if remote is None:
        return
    record = file_record(path)
    if record["bytes"] == remote.size and record["sha256"] == remote.sha256:
        return
    differs = (f"{record['bytes']:,} bytes where the validated copy has {remote.size:,}"
               if record["bytes"] != remote.size else
               f"SHA-256 {record['sha256'][:16]}... where the validated copy has "
               f"{remote.sha256[:16]}...")
    raise InputError(f"{what}: {path} is not the file traces.fetch downloads as {remote.relpath}"
                     f" ({differs}): it was cut short or changed; download it again, or give "
                     f"an edited copy another name")


#: File name endings pandas decompresses (``compression="infer"``; ``.tar.gz`` and the
#: like are archives too).
COMPRESSED = (".gz", ".bz2", ".zip", ".xz", ".zst", ".tar")
#: What a damaged or cut-short compressed file raises while it is read.
_DECOMPRESSION_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, zipfile.BadZipFile,
                         lzma.LZMAError, tarfile.TarError)


def _archive_members(path: Path) -> list[str] | None:
    """The names in ``path`` if pandas reads it as a ZIP or TAR archive (``None``: it does not,
    or the archive is damaged, which the read itself then reports)."""
    name = path.name.lower()
    try:
        if name.endswith(".zip") and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return archive.namelist()
        if name.endswith((".tar", ".tar.gz", ".tar.bz2", ".tar.xz")) and tarfile.is_tarfile(path):
            with tarfile.open(path) as archive:
                return archive.getnames()
    except _DECOMPRESSION_ERRORS:
        return None
    return None


def _not_text(path: Path) -> str | None:
    """Why ``path`` is not CSV text, from its first bytes or its archive listing (``None``:
    it may be)."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.startswith(b"PAR1"):
        return ("a Parquet file, not CSV text; convert it first, e.g. with pandas: "
                "pd.read_parquet(PATH).to_csv(NEW_PATH, index=False)")
    if not path.name.lower().endswith(COMPRESSED) and b"\0" in head:
        return "binary data, not CSV text"
    members = _archive_members(path)
    if members is not None and len(members) != 1:
        listed = f" ({', '.join(members[:3])}{', ...' if len(members) > 3 else ''})"
        return (f"an archive of {len(members)} files{listed if members else ''}; a table is "
                f"read from an archive holding exactly one file")
    return None


def read_csv(path: str | Path, what: str, **options):
    """``pandas.read_csv(path, **options)`` for a data file, failing with one
    :class:`~replay.errors.InputError` naming the file for each way it can be unreadable:
    not CSV text (a Parquet or binary file), a compressed file cut short or damaged, a byte
    that is not UTF-8 (its line and column), a malformed row (pandas names its line), or a
    row with fewer fields than the header (its line: a file cut short mid-row, say)."""
    import pandas as pd

    p = Path(path)
    refused = _not_text(p)
    if refused:
        raise InputError(f"{what}: {p} is {refused}")
    try:
        frame = pd.read_csv(p, **options)
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: {_undecodable(p, exc)}") from None
    except _DECOMPRESSION_ERRORS as exc:
        raise InputError(f"{what}: {p} cannot be decompressed ({exc}); it is cut short or "
                         f"damaged") from None
    except ImportError as exc:  # .zst needs the optional zstandard package
        package = getattr(exc.__cause__, "name", None) or exc.name or "a package"
        raise InputError(f"{what}: {p} cannot be decompressed without {package}, which is not "
                         f"installed; decompress it first (or pip install {package})") from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{what}: {p} is empty (not even a header line)") from None
    except pd.errors.ParserError as exc:
        raise InputError(f"{what}: {p}: malformed CSV ({str(exc).strip()})") from None
    except OSError as exc:  # bz2 and others say "Invalid data stream" as an OSError
        raise InputError(f"{what}: {p} cannot be read ({exc})") from None
    if options.get("nrows") is None and len(frame.columns) and frame.iloc[:, -1].isna().any():
        # A missing last field reads as an empty one: only a line count tells them apart.
        short = short_row(p, len(frame.columns))
        if short is not None:
            line, fields = short
            raise InputError(f"{what}: {p} line {line}: {fields} field(s) where the header has "
                             f"{len(frame.columns)}; the row is cut short (an interrupted copy "
                             f"or download?)")
    return frame


def _undecodable(path: Path, exc: UnicodeDecodeError) -> str:
    """Where in ``path`` the byte that is not UTF-8 lies (line and field), in words: the
    file is read again with undecodable bytes replaced (U+FFFD), and the first field
    holding a replacement is named."""
    import pandas as pd

    byte = exc.object[exc.start:exc.start + 1]
    advice = (f"byte {byte!r} is not UTF-8 text (Latin-1 or another encoding?); save the "
              f"file as UTF-8, e.g. with `iconv -f latin1 -t utf-8`")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False,
                          encoding_errors="replace")
    except (ValueError, OSError, *_DECOMPRESSION_ERRORS):
        return f"{path}: {advice}"
    if any("\ufffd" in str(column) for column in raw.columns):
        return f"{path} line 1: {advice}"
    for column in raw.columns:
        hit = raw[column].str.contains("\ufffd", regex=False).to_numpy()
        if hit.any():
            return f"{path} line {int(hit.argmax()) + 2}: field {column!r}: {advice}"
    return f"{path}: {advice}"


def short_row(path: str | Path, fields: int) -> tuple[int, int] | None:
    """The first line (1-based; the header is line 1) of a CSV file holding fewer than
    ``fields`` comma-separated fields, and how many it holds (``None``: no such line).
    Blank lines are not counted here (a reader reports them as rows without values)."""
    import pandas as pd

    lines = pd.read_csv(path, header=None, names=["line"], sep="\x1f", quoting=csv.QUOTE_NONE,
                        dtype=str, keep_default_na=False, skip_blank_lines=False,
                        encoding_errors="replace")["line"]
    counts = lines.str.count(",").to_numpy() + 1
    quoted = lines.str.contains('"', regex=False).to_numpy()
    for i in quoted.nonzero()[0]:  # a comma inside quotes separates nothing
        counts[i] = len(next(csv.reader([lines.iloc[i]])))
    short = (counts < fields) & (lines.to_numpy() != "")
    if not short.any():
        return None
    i = int(short.argmax())
    return i + 1, int(counts[i])
