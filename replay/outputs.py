"""Result files that can be trusted after crashes and edits.

Every result file is written atomically (a temporary file in the same folder,
then an atomic rename), the run summary last, so a folder either holds a
finished run or no summary at all. A finished run is reused only if its
resolved config, the hashes of its input files and its tables still match
(:func:`stale_reason`); otherwise it is recomputed and the log says why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from replay.data import file_record

#: The files a replay writes, besides the summary.
TABLES = ("requests.parquet", "iterations.parquet")


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary)`` and rename the result onto ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        with open(temporary, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


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
    if summary.get("status") == "error":
        return "it failed before (status error)"
    if result_config(summary.get("config") or {}) != result_config(resolved):
        raise ValueError(f"{out_dir} holds a run of another config")
    changed = changed_inputs(summary.get("input_files", []))
    if changed:
        return "input files changed: " + "; ".join(changed)
    missing = [name for name in tables if not (out_dir / name).is_file()]
    if missing:
        return f"its {', '.join(missing)} is missing"
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
