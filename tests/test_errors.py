"""Bad input fails early with an error that names the file, row and field."""

from __future__ import annotations

import numpy as np
import pytest

from policies.fcfs import FCFSLookahead
from replay.engine.overflow import EvictLIFO
from replay.engine.requests import RequestError, Requests
from replay.storage.data import MissingDataError
from replay.workloads.files import CsvTrace
from tests.conftest import replay


def write(tmp_path, text: str):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def load(path, **options):
    trace = CsvTrace(path=str(path), prompt_column="prompt", output_column="output", **options)
    return trace.sample(np.random.default_rng(0))


def test_nonpositive_length_names_row_and_field(tmp_path):
    path = write(tmp_path, "prompt,output\n5,3\n4,0\n")
    requests = load(path)
    with pytest.raises(RequestError, match=r"trace.csv row 3: field 'output' \(output_len\) = 0"):
        requests.validate(100)


def test_nonpositive_rows_can_be_dropped_and_are_counted(tmp_path):
    path = write(tmp_path, "prompt,output\n5,3\n4,0\n0,2\n7,7\n")
    requests = load(path, drop_nonpositive=True)
    assert requests.prompt_len.tolist() == [5, 7]
    assert requests.dropped == {"nonpositive_length": 2}
    assert requests.source_row.tolist() == [2, 5]


def test_malformed_row_names_line_and_column(tmp_path):
    path = write(tmp_path, "prompt,output\n5,3\n4,abc\n")
    with pytest.raises(RequestError, match=r"line 3: field 'output' = 'abc' is not an integer"):
        load(path)


def test_fractional_length_is_malformed(tmp_path):
    path = write(tmp_path, "prompt,output\n5.5,3\n")
    with pytest.raises(RequestError, match=r"line 2: field 'prompt'"):
        load(path)


def test_missing_column_lists_the_columns_present(tmp_path):
    path = write(tmp_path, "question_length,answer_length\n5,3\n")
    with pytest.raises(RequestError, match=r"missing column\(s\) \['prompt', 'output'\]"):
        load(path)


def test_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(MissingDataError, match="KVSCHED_DATA_DIR"):
        load(tmp_path / "absent.csv")


def test_request_that_cannot_fit_even_alone_is_rejected(tmp_path):
    requests = load(write(tmp_path, "prompt,output\n5,3\n60,41\n"))
    with pytest.raises(RequestError, match=r"row 3: prompt_len \+ output_len = 101 exceeds"):
        requests.validate(100)


def test_engine_validates_before_running():
    with pytest.raises(RequestError, match="exceeds the KV capacity M = 10"):
        replay([5], [6], FCFSLookahead(EvictLIFO()), 10)


def test_columns_of_different_length_are_rejected():
    with pytest.raises(RequestError, match="output_len has 1 rows"):
        Requests(np.array([1, 2]), np.array([1]))
