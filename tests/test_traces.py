"""The traces package: builder (on an in-memory dataset), fetch (offline), stats."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replay.engine.requests import Requests
from replay.errors import InputError
from replay.storage.data import RemoteFile, sha256_of
from replay.workloads.files import CsvTrace
from tests.conftest import REPO
from traces import stats
from traces.build import build, main, word_count
from traces.fetch import TRACE_FILES, FetchError, fetch

LMSYS_RECORDS = [
    {"conversation": [{"role": "user", "content": "What is KV cache?"},
                      {"role": "assistant", "content": "A cache of keys and values."},
                      {"role": "user", "content": "Thanks, and more words here"},
                      {"role": "assistant", "content": "ok"}]},
    {"conversation": [{"role": "user", "content": "hello"}]},
    {"conversation": [{"role": "user", "content": ""},
                      {"role": "assistant", "content": "  spaced   out  "}]},
]


def test_lmsys_builder_takes_the_first_turns_and_counts_words(tmp_path):
    frame, skipped = build(LMSYS_RECORDS, "lmsys", word_count)
    assert frame.to_dict("list") == {"question_length": [4, 0], "answer_length": [6, 2]}
    assert skipped == {"no_assistant_reply": 1}
    path = tmp_path / "lmsys.csv"
    frame.to_csv(path, index=False)
    # the same schema as the shared LMSYS file: the workload reads it, dropping the zero row
    pool = CsvTrace(str(path), "question_length", "answer_length", drop_nonpositive=True,
                    length_unit="words").sample(np.random.default_rng(0))
    assert pool.prompt_len.tolist() == [4] and pool.dropped == {"nonpositive_length": 1}


def test_build_command_reads_a_saved_huggingface_dataset(tmp_path):
    # The whole loading path of `python -m traces.build` (datasets' own reader), offline:
    # an in-memory datasets.Dataset saved to disk stands in for the Hub's copy.
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(LMSYS_RECORDS)}).save_to_disk(
        str(tmp_path / "lmsys"))
    out = tmp_path / "lmsys.csv"
    main(["lmsys", "--from-disk", str(tmp_path / "lmsys"), "--length-unit", "words",
          "--out", str(out)])
    frame = pd.read_csv(out)
    assert frame.to_dict("list") == {"question_length": [4, 0], "answer_length": [6, 2]}
    with pytest.raises(InputError, match="no split 'test'"):
        main(["lmsys", "--from-disk", str(tmp_path / "lmsys"), "--split", "test",
              "--length-unit", "words", "--out", str(out)])


def test_arxiv_builder_writes_vidurs_columns_with_any_counter():
    records = [{"article": "a b c d e f", "abstract": "x y", "section_names": "intro"}]
    frame, skipped = build(records, "arxiv", count=len)  # characters stand in for tokens
    assert list(frame.columns) == ["num_prefill_tokens", "num_decode_tokens",
                                   "num_total_tokens", "pd_ratio"]
    assert frame.iloc[0].tolist() == [11, 3, 14, pytest.approx(11 / 3)]
    assert not skipped


def test_every_trace_workload_file_has_a_download():
    relpaths = {f.relpath for f in TRACE_FILES}
    for config in (REPO / "configs" / "workload").glob("*.yaml"):
        for name in re.findall(r"\$\{data_dir\}/(traces/[^\s]+)", config.read_text()):
            assert name in relpaths, f"{config.name} reads {name}, which traces.fetch lacks"


def test_urls_are_raw_github_files_with_special_characters_quoted():
    lmsys = next(f for f in TRACE_FILES if "lmsys" in f.relpath)
    assert lmsys.url == (
        "https://raw.githubusercontent.com/Luoxiaogan/vidur_or/"
        "aa5e1571214b75a08a040638bda43bf83402cd03/"
        "lmsys_chat_1m_dataset/output_trace/input%3C257_output%3C257.csv")


def test_recorded_hashes_and_sizes_match_the_shared_copies(data_dir):
    for remote in TRACE_FILES:
        local = data_dir / remote.relpath
        assert local.stat().st_size == remote.size, remote.relpath
        assert sha256_of(local) == remote.sha256, remote.relpath


def fake_remote(content: bytes, name: str = "traces/t.csv") -> RemoteFile:
    return RemoteFile(name, "owner/repo", "0" * 40, name, hashlib.sha256(content).hexdigest(),
                      len(content))


def serving(content: bytes, served: list | None = None):
    """A pooch downloader that writes ``content`` (offline), recording each URL asked for."""
    def downloader(url, output_file, pooch):
        if served is not None:
            served.append(url)
        Path(output_file).write_bytes(content)
    return downloader


def test_fetch_downloads_verifies_and_skips_files_already_there(tmp_path):
    content = b"s,o\n1,2\n"
    remote = fake_remote(content)
    opened = []
    (path,) = fetch([remote], tmp_path, downloader=serving(content, opened))
    assert path == tmp_path / "traces" / "t.csv" and path.read_bytes() == content
    assert opened == ["https://raw.githubusercontent.com/owner/repo/" + "0" * 40 + "/traces/t.csv"]
    fetch([remote], tmp_path, downloader=serving(content, opened))
    assert len(opened) == 1
    # A file there with another hash is downloaded again.
    path.write_bytes(b"stale")
    fetch([remote], tmp_path, downloader=serving(content, opened))
    assert len(opened) == 2 and path.read_bytes() == content


def test_fetch_rejects_a_changed_origin_and_leaves_nothing(tmp_path):
    remote = fake_remote(b"expected")
    with pytest.raises(FetchError, match="does not match the expected.*traces/t.csv"):
        fetch([remote], tmp_path, downloader=serving(b"something else"))
    assert list((tmp_path / "traces").iterdir()) == []


def test_fetch_reports_network_failures(tmp_path):
    def offline(url, output_file, pooch):
        raise OSError("no route to host")

    with pytest.raises(FetchError, match="download failed.*no route to host"):
        fetch([fake_remote(b"x")], tmp_path, downloader=offline)


def test_length_stats_by_hand():
    requests = Requests(prompt_len=np.array([1, 2, 3, 4]), output_len=np.array([10, 10, 10, 50]))
    frame = stats.length_stats(requests)
    assert frame.loc["prompt_len"].tolist() == [4, 2.5, 2.5, pytest.approx(3.7),
                                                pytest.approx(3.97), 4]
    assert frame.loc["output_len", "mean"] == 20 and frame.loc["output_len", "median"] == 10


def test_stats_command_prints_the_table_for_a_workload(capsys):
    stats.main(["workload=synthetic", "workload.n=200", "--markdown"])
    out = capsys.readouterr().out
    assert "workload: synthetic" in out and "length unit: tokens" in out
    assert "| length | count | mean | median | p90 | p99 | max |" in out
    assert re.search(r"\| prompt_len \| 200 \| [\d.]+ \|", out)


def test_stats_of_the_lmsys_file(capsys, data_dir):
    stats.main(["workload=lmsys", "workload.n=null", f"data_dir={data_dir}"])
    out = capsys.readouterr().out
    assert "length unit: words" in out and "{'nonpositive_length': 1198}" in out
    assert re.search(r"prompt_len\s+661336\s+42\.80\s+18\.00", out)


def test_cache_dir_is_the_platform_user_cache_unless_the_environment_says(monkeypatch, tmp_path):
    import platformdirs

    from replay.storage.data import cache_dir

    monkeypatch.delenv("KVSCHED_CACHE_DIR", raising=False)
    assert cache_dir("vidur") == Path(platformdirs.user_cache_dir("kvsched", appauthor=False),
                                      "vidur")
    monkeypatch.setenv("KVSCHED_CACHE_DIR", str(tmp_path))
    assert cache_dir("vidur", "x") == tmp_path / "vidur" / "x"


def test_fetch_into_a_folder_it_cannot_write_is_one_error_line(tmp_path):
    """A file where the data folder should be: `cannot write`, exit 2, before any download."""
    (tmp_path / "data").write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "traces.fetch", "--data-dir",
                           str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot write") and "Traceback" not in done.stderr
