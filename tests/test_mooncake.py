"""The Mooncake FAST'25 trace reader: values, provenance, and every bad line named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay.engine.requests import RequestError
from replay.run import make_requests
from replay.storage.data import sha256_of
from replay.workloads.arrivals import TraceTimestamps
from replay.workloads.mooncake import MooncakeTrace, read_mooncake
from traces import stats
from traces.fetch import TRACE_FILES

LINES = [
    {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 250, "input_length": 512, "output_length": 7, "hash_ids": [0]},
    {"timestamp": 1500.5, "input_length": 1100, "output_length": 9, "hash_ids": [0, 1, 2]},
]


def write(tmp_path, lines, tail: str = "\n"):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines)
                    + tail)
    return path


def test_a_trace_reads_lengths_arrivals_ids_and_provenance(tmp_path):
    path = write(tmp_path, LINES)
    requests = read_mooncake(path)
    assert requests.prompt_len.tolist() == [1000, 512, 1100]
    assert requests.output_len.tolist() == [5, 7, 9]
    assert requests.arrival.tolist() == [0.0, 0.25, 1.5005]  # milliseconds to seconds
    assert [requests.ids_of(i).tolist() for i in range(3)] == [[0, 1], [0], [0, 1, 2]]
    assert requests.block_unit == 512 and requests.source_row.tolist() == [1, 2, 3]
    assert requests.files[0]["sha256"] == sha256_of(path)
    assert requests.length_unit == "tokens"


@pytest.mark.parametrize(("line", "message"), [
    ({"timestamp": 0, "input_length": 10, "output_length": 5},
     "field 'hash_ids' is missing"),
    ({"timestamp": 0, "input_length": -1, "output_length": 5, "hash_ids": []},
     r"field 'input_length' = -1 must be a whole number of tokens in \[0, "),
    ({"timestamp": 0, "input_length": 10, "hash_ids": [1]},
     "field 'output_length' is missing"),
    ({"timestamp": 0, "input_length": 10, "output_length": -5, "hash_ids": [1]},
     "field 'output_length' = -5 must be a whole number"),
    ({"timestamp": 0, "input_length": 10.5, "output_length": 5, "hash_ids": [1]},
     "field 'input_length' = 10.5 must be a whole number"),
    ({"timestamp": 0, "input_length": True, "output_length": 5, "hash_ids": [1]},
     "field 'input_length' = True must be a whole number"),
    ({"input_length": 10, "output_length": 5, "hash_ids": [1]},
     "field 'timestamp' is missing"),
    ({"timestamp": -3, "input_length": 10, "output_length": 5, "hash_ids": [1]},
     "field 'timestamp' = -3 must be a finite number of milliseconds >= 0"),
    ({"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]},
     "field 'hash_ids' has 2 ids, but input_length = 1100 in blocks of 512 tokens needs 3"),
    ({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2, 3]},
     "field 'hash_ids' has 3 ids, but input_length = 1000 in blocks of 512 tokens needs 2"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-1]},
     r"field 'hash_ids' holds -1; ids are whole numbers in \[0, 2\^63\)"),
    ({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "1"},
     "field 'hash_ids' = '1' must be a list of ids"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"timestamp": 0, "input_length": 10,, }', r"not valid JSON \(Expecting"),
    ("", r"empty line \(every line is one JSON record\)"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, [LINES[0], line, LINES[1]])
    with pytest.raises(RequestError, match=f"^{path} line 2: {message}"):
        read_mooncake(path)


def test_a_truncated_file_is_named_as_such(tmp_path):
    cut = json.dumps(LINES[2])[:40]
    path = write(tmp_path, [LINES[0], LINES[1], cut], tail="")
    with pytest.raises(RequestError, match=f"^{path} line 3: the file ends inside a JSON "
                                           r"record \(truncated\?\)"):
        read_mooncake(path)


def test_a_file_that_is_not_text_or_has_no_lines_is_refused(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(json.dumps(LINES[0]).encode() + b'\n{"timestamp": \xff}\n')
    with pytest.raises(RequestError, match=f"^{path} line 2: not UTF-8 text"):
        read_mooncake(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RequestError, match=f"^{empty}: the trace has no requests"):
        read_mooncake(empty)


def test_bad_input_is_one_error_line_and_status_2(tmp_path, capsys):
    path = write(tmp_path, [LINES[0], {"timestamp": 0, "input_length": 10, "output_length": 1}])
    with pytest.raises(SystemExit) as done:
        stats.main(["prefix", str(path)])
    assert done.value.code == 2
    assert capsys.readouterr().err == f"error: {path} line 2: field 'hash_ids' is missing\n"


def test_caps_drop_rows_and_count_them_and_n_samples_the_pool(tmp_path):
    path = write(tmp_path, LINES)
    workload = MooncakeTrace(str(path), max_total_len=1100)
    pool = workload.pool()
    assert pool.prompt_len.tolist() == [1000, 512] and pool.dropped == {"total_len>1100": 1}
    assert [pool.ids_of(i).tolist() for i in range(2)] == [[0, 1], [0]]
    drawn = MooncakeTrace(str(path), n=5, replace=True).sample(np.random.default_rng(0))
    assert len(drawn) == 5 and set(drawn.prompt_len) <= {1000, 512, 1100}
    for i in range(5):  # each drawn row keeps its own ids
        assert len(drawn.ids_of(i)) == -(-int(drawn.prompt_len[i]) // 512)
    with pytest.raises(RequestError, match="asked for n=5 requests without replacement"):
        MooncakeTrace(str(path), n=5).sample(np.random.default_rng(0))
    assert len(MooncakeTrace(str(path), first_rows=2).pool()) == 2


def test_arrivals_trace_replays_the_traces_own_times(tmp_path):
    path = write(tmp_path, LINES[1:])  # starts at 250 ms
    requests = make_requests(MooncakeTrace(str(path)), TraceTimestamps(speedup=2.0), seed=0,
                             time_unit="seconds")
    assert requests.arrival.tolist() == [0.0, (1.5005 - 0.25) / 2]
    assert requests.ids_of(1).tolist() == [0, 1, 2]


def test_the_fetch_list_has_both_published_traces():
    mooncake = {f.relpath: f for f in TRACE_FILES if "mooncake" in f.relpath}
    assert set(mooncake) == {"traces/mooncake/conversation_trace.jsonl",
                             "traces/mooncake/synthetic_trace.jsonl"}
    for remote in mooncake.values():
        assert remote.url.startswith("https://raw.githubusercontent.com/kvcache-ai/Mooncake/")
        assert remote.url.endswith(remote.relpath.replace("traces/mooncake/",
                                                          "FAST25-release/traces/"))


@pytest.mark.parametrize(("name", "rows", "mean_in", "mean_out", "last_s"), [
    ("conversation", 12_031, 12_035, 343, 3536.999),
    ("synthetic", 3_993, 15_325, 149, 1022.025),
])
def test_the_shared_traces_match_their_readme(data_dir, name, rows, mean_in, mean_out, last_s):
    """The row counts and mean lengths the traces' README states, and the last timestamp."""
    requests = read_mooncake(data_dir / "traces" / "mooncake" / f"{name}_trace.jsonl")
    assert len(requests) == rows
    assert round(requests.prompt_len.mean()) == mean_in
    assert round(requests.output_len.mean()) == mean_out
    assert requests.arrival.max() == pytest.approx(last_s)
