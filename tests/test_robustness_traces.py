"""Issue 32 class 7: compressed traces are read again (the raw-header sniff decompresses)."""

from __future__ import annotations

import bz2
import gzip
import zipfile

import pytest

from replay.engine.requests import RequestError
from replay.workloads.files import _read_length_columns

COLUMNS = {"prompt_len": "prompt", "output_len": "output"}


def write(path, text: str):
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    elif path.suffix == ".bz2":
        path.write_bytes(bz2.compress(text.encode()))
    elif path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("trace.csv", text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.csv.bz2", "t.csv.zip"])
def test_plain_and_compressed_traces_read_the_same(tmp_path, name):
    frame, record = _read_length_columns(write(tmp_path / name, "prompt,output\n3,4\n5,2\n"),
                                         COLUMNS)
    assert frame["prompt_len"].tolist() == [3, 5] and frame["output_len"].tolist() == [4, 2]
    assert record["bytes"] == (tmp_path / name).stat().st_size


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz"])
def test_a_repeated_column_is_refused_in_compressed_traces_too(tmp_path, name):
    with pytest.raises(RequestError, match="more than once"):
        _read_length_columns(write(tmp_path / name, "prompt,output,prompt\n3,4,5\n"), COLUMNS)
