"""Issue 32 class 7: compressed traces are read again (the raw-header sniff decompresses);
issue 45 item 4: a trace that is cut short, not UTF-8, not CSV or damaged is one error
naming the file (and line), and so are impossible mixed counts."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import tarfile
import zipfile

import pandas as pd
import pytest

from replay.config import compose_config
from replay.config.validate import validate_config
from replay.engine.requests import RequestError
from replay.errors import ConfigError, InputError, LimitError
from replay.run import guard_requests
from replay.storage.data import TRACE_FILES, known_file, require_file
from replay.workloads.arrivals import AllAtOnce
from replay.workloads.composite import Mixed
from replay.workloads.files import _read_length_columns

COLUMNS = {"prompt_len": "prompt", "output_len": "output"}


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
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


# ------------------------------------------------------------ issue 45 item 4
def trace_error(path) -> str:
    with pytest.raises(InputError) as caught:
        _read_length_columns(path, COLUMNS)
    return str(caught.value)


def test_a_row_cut_short_at_the_end_is_refused_naming_its_line(tmp_path):
    path = write(tmp_path / "t.csv", "prompt,output,note\n3,4,a\n3737,16")
    assert trace_error(path) == (f"workload trace: {path} line 3: 2 field(s) where the header "
                                 f"has 3; the row is cut short (an interrupted copy or "
                                 f"download?)")


def test_an_empty_last_field_is_not_a_short_row(tmp_path):
    frame, _ = _read_length_columns(write(tmp_path / "t.csv", "prompt,output,note\n3,4,\n"),
                                    COLUMNS)
    assert frame["prompt_len"].tolist() == [3]


def test_a_comma_inside_quotes_is_not_a_field(tmp_path):
    path = write(tmp_path / "t.csv", 'prompt,output,note\n3,4,"a, b"\n5,6\n')
    assert "line 3: 2 field(s) where the header has 3" in trace_error(path)


def test_a_latin1_byte_names_its_line_and_field(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes("prompt,output,note\n1,2,ok\n3,4,caf\xe9\n".encode("latin-1"))
    assert trace_error(path) == (f"workload trace: {path} line 3: field 'note': byte b'\\xe9' "
                                 f"is not UTF-8 text (Latin-1 or another encoding?); save the "
                                 f"file as UTF-8, e.g. with `iconv -f latin1 -t utf-8`")


def test_a_truncated_csv_gz_is_one_error(tmp_path):
    whole = gzip.compress(("prompt,output\n" + "".join(f"{i},{i}\n" for i in range(1, 20_000))
                           ).encode())
    path = tmp_path / "t.csv.gz"
    path.write_bytes(whole[: len(whole) // 2])
    assert trace_error(path) == (f"workload trace: {path} cannot be decompressed (Compressed "
                                 f"file ended before the end-of-stream marker was reached); it "
                                 f"is cut short or damaged")


@pytest.mark.parametrize("name", ["t.parquet", "t.csv"])
def test_a_parquet_file_is_told_it_is_not_csv(tmp_path, name):
    path = tmp_path / name
    pd.DataFrame({"prompt": [1, 2], "output": [3, 4]}).to_parquet(path)
    assert trace_error(path) == (f"workload trace: {path} is a Parquet file, not CSV text; "
                                 f"convert it first, e.g. with pandas: pd.read_parquet(PATH)"
                                 f".to_csv(NEW_PATH, index=False)")


def archive(path, members: dict[str, bytes]):
    """A ZIP or TAR archive (by ``path``'s ending) holding ``members``."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as zipped:
            for name, data in members.items():
                zipped.writestr(name, data)
    else:
        with tarfile.open(path, "w:gz" if path.suffix == ".gz" else "w") as tarred:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tarred.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(("name", "members", "listed"), [
    ("t.csv.zip", ["a.csv", "b.csv"], "an archive of 2 files (a.csv, b.csv)"),
    ("t.csv.zip", [], "an archive of 0 files"),
    ("t.csv.tar.gz", ["a.csv", "b.csv", "c.csv", "d.csv"],
     "an archive of 4 files (a.csv, b.csv, c.csv, ...)"),
])
def test_an_archive_of_other_than_one_file_is_one_error(tmp_path, name, members, listed):
    path = archive(tmp_path / name, dict.fromkeys(members, b"prompt,output\n3,4\n"))
    assert trace_error(path) == (f"workload trace: {path} is {listed}; a table is read from an "
                                 f"archive holding exactly one file")


def test_an_archive_of_one_file_is_read_and_a_cut_one_refused(tmp_path):
    path = archive(tmp_path / "t.csv.tar", {"a.csv": b"prompt,output\n3,4\n"})
    frame, _ = _read_length_columns(path, COLUMNS)
    assert frame["prompt_len"].tolist() == [3]
    cut = tmp_path / "cut.csv.tar"
    cut.write_bytes(path.read_bytes()[:100])
    assert trace_error(cut).startswith(f"workload trace: {cut} cannot be decompressed (file "
                                       f"could not be opened successfully:")
    assert trace_error(cut).endswith("it is cut short or damaged")


def test_a_tgz_which_pandas_does_not_decompress_is_binary(tmp_path):
    path = tmp_path / "t.tgz"
    path.write_bytes(gzip.compress(b"prompt,output\n3,4\n"))
    assert trace_error(path) == f"workload trace: {path} is binary data, not CSV text"


@pytest.mark.skipif(importlib.util.find_spec("zstandard") is not None,
                    reason="zstandard is installed: a .zst trace is read")
def test_a_zst_trace_without_its_decompressor_is_one_error(tmp_path):
    path = write(tmp_path / "t.csv.zst", "prompt,output\n3,4\n")
    assert trace_error(path) == (f"workload trace: {path} cannot be decompressed without "
                                 f"zstandard, which is not installed; decompress it first (or "
                                 f"pip install zstandard)")


def test_a_known_trace_cut_mid_row_is_refused_by_its_hash(tmp_path):
    """``3737,16`` from ``3737,165``: a valid row, so only the recorded hash can tell."""
    lmsys = next(f for f in TRACE_FILES if "lmsys" in f.relpath)
    path = write(tmp_path / lmsys.relpath, "question_length,answer_length\n11,201\n3737,16")
    message = trace_error(path)
    assert message == (f"workload trace: {path} is not the file traces.fetch downloads as "
                       f"{lmsys.relpath} (44 bytes where the validated copy has 4,028,459): it "
                       f"was cut short or changed; download it again, or give an edited copy "
                       f"another name")


def test_the_shared_traces_are_the_validated_copies(data_dir):
    for remote in TRACE_FILES:
        assert known_file(data_dir / remote.relpath) == remote
        require_file(data_dir / remote.relpath, "trace")


@pytest.mark.parametrize(("counts", "message"), [
    ("{lmsys:-5,arxiv:400}", "workload.counts={'lmsys': -5, 'arxiv': 400} is not allowed: it "
                             "must be a mapping to whole numbers or null (>= 0)"),
    ("{lmsys:abc,arxiv:400}", "workload.counts={'lmsys': 'abc', 'arxiv': 400} is not allowed"),
])
def test_a_negative_or_non_numeric_mixed_count_is_a_config_error(counts, message):
    with pytest.raises(ConfigError) as caught:
        validate_config(compose_config(["workload=mixed", f"workload.counts={counts}"]))
    assert str(caught.value).startswith(message)


def test_mixed_counts_are_bounded_before_any_part_is_drawn():
    workload = Mixed(parts={}, counts={"a": 5_000_000_000, "b": 1})
    with pytest.raises(LimitError, match=r"~5e\+09 requests .* it follows from workload.counts"):
        guard_requests(workload, AllAtOnce())
