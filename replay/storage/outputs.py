"""Result files that can be trusted after crashes and edits.

Every result file is written atomically (a temporary file in the same folder,
then an atomic rename), the run summary last, so a folder either holds a
finished run or no summary at all. A finished run is reused only if its
summary is as written (its own digest), by this version of kvsched, and its
resolved config, the hashes of its input files and its tables still match
(:func:`stale_reason`); otherwise it is recomputed and the log says why.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import math
import os
import subprocess
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from replay.errors import OutputError
from replay.storage.data import file_record, sha256_of

#: The files a replay writes, besides the summary.
TABLES = ("requests.parquet", "iterations.parquet")


def _in_the_way(path: Path) -> Path | None:
    """The first ancestor of ``path`` (or ``path``) that exists and is not a folder."""
    for part in [*reversed(path.parents), path]:
        if part.exists() and not part.is_dir():
            return part
        if not part.exists():
            return None
    return None


def _reason(path: Path, exc: OSError) -> str:
    """Why ``path`` cannot be written, in words, from the ``OSError`` that said so."""
    code = errno.errorcode.get(exc.errno or 0, "")
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = _in_the_way(path)
        if blocker is not None:
            return f"a file is in the way: {blocker}"
    words = exc.strerror or str(exc)
    hints = {errno.ENOSPC: "; free space or choose another folder",
             errno.EDQUOT: "; free space or choose another folder",
             errno.EROFS: "; choose a writable folder",
             errno.EACCES: "; choose a folder you can write to",
             errno.EPERM: "; choose a folder you can write to"}
    return f"{words}{f', {code}' if code else ''}{hints.get(exc.errno, '')}"


def output_error(path: Path | str, exc: OSError) -> OutputError:
    """The :class:`~replay.errors.OutputError` for ``exc``, raised writing ``path``."""
    return OutputError(path, _reason(Path(path), exc))


def _make_folder(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created (outermost first)."""
    missing = [p for p in [*reversed(folder.parents), folder] if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_folders(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break


def ensure_writable_dir(folder: Path | str) -> Path:
    """Create ``folder`` if needed and check that a file can be written in it.

    Raises :class:`~replay.errors.OutputError` (``cannot write FOLDER (reason)``) and
    leaves no folder or probe file behind when it cannot.
    """
    folder = Path(folder).expanduser()
    created: list[Path] = []
    probe = folder / f".kvsched-probe.{os.getpid()}"
    try:
        created = _make_folder(folder)
        with open(probe, "wb") as fh:
            fh.write(b"probe")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        _remove_folders(created)
        raise output_error(folder, exc) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return folder



def atomic_write(path: Path, write: Callable[[Path], None]) -> dict:
    """Call ``write(temporary)`` and rename the result onto ``path`` atomically.

    Returns the record of what was written, ``{"path", "bytes", "sha256"}`` (taken from
    the temporary file just before the rename; :func:`verify` checks a file against
    it). A failure to write (a file in the way, a read-only or full disk) is an
    :class:`~replay.errors.OutputError` naming ``path``; neither the temporary file nor
    folders created for it are left behind, and an older ``path`` stays as it was.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    created: list[Path] = []
    try:
        created = _make_folder(path.parent)
        write(temporary)
        with open(temporary, "rb") as fh:
            os.fsync(fh.fileno())
        record = {"path": str(path.resolve()), "bytes": temporary.stat().st_size,
                  "sha256": sha256_of(temporary)}
        os.replace(temporary, path)
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        _remove_folders(created)
        raise output_error(path, exc) from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return record


def atomic_write_text(path: Path, text: str) -> dict:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def verify(path: Path | str, record: dict) -> bool:
    """Whether the file at ``path`` is still what ``record`` (from :func:`atomic_write`)
    says was written: same size (checked first: cheap, and catches truncation), then same
    SHA-256 (cached by path, modification time and size)."""
    return mismatch(path, record) is None


def mismatch(path: Path | str, record: dict) -> str | None:
    """Why the file at ``path`` does not match ``record`` (``None``: it does)."""
    path = Path(path)
    if not path.is_file():
        return "is missing"
    size = path.stat().st_size
    if record.get("bytes") != size:
        return f"has {size} bytes, {record.get('bytes')} were written"
    if file_record(path)["sha256"] != record.get("sha256"):
        return "changed since it was written (sha256 differs)"
    return None


def summary_json(summary: dict, **dumps) -> str:
    """``summary`` as strict JSON: a non-finite number (``inf``, ``nan``) becomes ``null``,
    and the summary's ``non_finite`` record says which key held what (``"inf"``), so
    strict parsers (DuckDB, JavaScript) read every summary."""
    found: dict[str, str] = {}

    def clean(value, key: str):
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            found[key] = str(value)
            return None
        return value

    cleaned = clean(summary, "")
    if found:
        cleaned["non_finite"] = {**cleaned.get("non_finite", {}), **found}
    return json.dumps(cleaned, allow_nan=False, **{"indent": 1, "default": str, **dumps})


#: The statuses of a job that produced no result: its input was rejected (``error``) or it
#: raised (``failed``, a bug). Its summary holds the message and the config, nothing to reuse.
NO_RESULT_STATUSES = ("error", "failed")

#: The summary's key for the SHA-256 of the rest of its content (:func:`write_summary`).
DIGEST_KEY = "summary_sha256"


def summary_digest(summary: dict) -> str:
    """The SHA-256 of a summary's content as JSON (keys sorted, no spacing, its own digest
    left out): the same for the dict written and the dict read back."""
    content = {k: v for k, v in summary.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"),
                                     allow_nan=False).encode()).hexdigest()


def write_summary(path: Path, summary: dict) -> dict:
    """Write a run's summary atomically (:func:`summary_json`) with the digest of its own
    content, so that a resume can tell an edited summary from the one a run wrote; returns
    the summary as written (non-finite numbers as ``null``)."""
    written = json.loads(summary_json(summary))
    written[DIGEST_KEY] = summary_digest(written)
    atomic_write_text(path, json.dumps(written, indent=1, allow_nan=False) + "\n")
    return written


@functools.cache
def code_version() -> str:
    """The version of kvsched that runs (recorded in every summary as ``packages.kvsched``)."""
    try:
        return metadata.version("kvsched")
    except metadata.PackageNotFoundError:
        return "not installed"


def git_describe() -> str:
    """``git describe`` of the checkout this code runs from (``-dirty`` if it has
    uncommitted changes), or ``unknown`` when it is not a git checkout: the commit stamped
    on result pages, cross-check tables and fitted timing files."""
    root = Path(__file__).resolve().parent.parent.parent
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=root,
                              text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read_summary(path: Path) -> dict | None:
    """The summary at ``path``, or ``None`` if it is missing or not a whole JSON object."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def changed_inputs(files: Sequence[dict]) -> list[str]:
    """The recorded input files that are gone or whose SHA-256 differs now."""
    changed = []
    for record in files:
        path = Path(record["path"])
        if not path.is_file():
            changed.append(f"{path} is gone")
        elif file_record(path)["sha256"] != record.get("sha256"):
            changed.append(f"{path} changed (sha256 {record.get('sha256', '?')[:12]}... -> "
                           f"{file_record(path)['sha256'][:12]}...)")
    return changed


#: Output options that change how a run is done or shown, not what it produces.
NOT_RESULT_KEYS = ("progress", "overwrite", "skip_existing", "fail_on")


def result_config(config: dict) -> dict:
    """``config`` without the output options that do not change a result."""
    output = {k: v for k, v in config.get("output", {}).items() if k not in NOT_RESULT_KEYS}
    return {**config, "output": output}


def stale_reason(out_dir: Path, resolved: dict, tables: Sequence[str]) -> str | None:
    """Why the run in ``out_dir`` cannot be reused for ``resolved`` (``None``: it can).

    Raises ``ValueError`` when the folder holds a finished run of another config.
    """
    summary_path = out_dir / "summary.json"
    if not summary_path.exists():
        return "no finished run here"
    summary = read_summary(summary_path)
    if summary is None:
        return "its summary.json is unreadable (a run interrupted while writing?)"
    if summary.get("status") in NO_RESULT_STATUSES:
        return f"it failed before (status {summary['status']})"
    if result_config(summary.get("config") or {}) != result_config(resolved):
        raise ValueError(f"{out_dir} holds a run of another config")
    if DIGEST_KEY not in summary:
        return ("its summary.json records no digest of its own content (written by an older "
                "version), so it cannot be verified")
    if summary_digest(summary) != summary[DIGEST_KEY]:
        return "its summary.json was changed after the run wrote it (its digest differs)"
    return run_problem(out_dir, summary, tables)


def run_problem(out_dir: Path, summary: dict, tables: Sequence[str] | None = None) -> str | None:
    """Why the finished run in ``out_dir`` no longer is what its ``summary`` records
    (``None``: it still is): written by another version of kvsched, an input file gone or
    changed, or a table missing or not of the recorded size and SHA-256 (``tables``: those
    to check; by default every table the summary records). The part of a run's resume
    check (:func:`stale_reason`) that a reproduction's up-to-date check repeats for every
    run it drew figures from."""
    written_by = (summary.get("packages") or {}).get("kvsched")
    if written_by != code_version():
        return f"it was written by kvsched {written_by}, and this is kvsched {code_version()}"
    changed = changed_inputs(summary.get("input_files", []))
    if changed:
        return "input files changed: " + "; ".join(changed)
    return table_problem(out_dir, summary, tables)


def table_problem(out_dir: Path, summary: dict, tables: Sequence[str] | None = None
                  ) -> str | None:
    """Why a table of the run in ``out_dir`` is not what its ``summary`` records: missing,
    or not of the recorded size and SHA-256 (``tables``: those to check; by default every
    table the summary records). ``None``: every one is as written."""
    records = summary.get("output_files")
    if not isinstance(records, dict):
        return ("its summary.json records no sizes and hashes of its tables (written by an "
                "older version), so they cannot be verified")
    for name in records if tables is None else tables:
        if name not in records:
            return f"its {name} was not written"
        wrong = mismatch(out_dir / name, records[name])
        if wrong:
            return f"its {name} {wrong}"
    return None


def drop_partial_last_row(path: Path) -> bool:
    """Cut a last line that lacks its newline (left by an interrupted writer); True if cut."""
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as fh:
        fh.truncate(data.rfind(b"\n") + 1)
    return True


def append_row(path: Path, row: dict, columns: Sequence[str]) -> None:
    """Append one CSV row in a single write, header first if the file is new, then flush to disk.

    A row is formatted whole before it is written, so an interruption leaves at
    most one partial last line, which :func:`drop_partial_last_row` removes.
    """
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    new = not path.is_file() or path.stat().st_size == 0
    if new:
        writer.writeheader()
    writer.writerow(row)
    with open(path, "a", newline="") as fh:
        fh.write(buffer.getvalue())
        fh.flush()
        os.fsync(fh.fileno())
