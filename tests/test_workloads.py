"""Workloads: every config samples, sampling is seeded, filters are counted, bad rows are named."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from scipy.stats import norm

from replay.config import CONFIG_DIR, compose_config
from replay.engine.requests import RequestError
from replay.run import make_requests, run
from replay.storage.data import MissingDataError
from replay.workloads.arrivals import (
    AllAtOnce,
    ArrivalError,
    PiecewisePoisson,
    Poisson,
    TraceTimestamps,
)
from replay.workloads.composite import Mixed, apportion
from replay.workloads.files import CsvTrace
from replay.workloads.synthetic import (
    FittedLognormal,
    Synthetic,
    discretised_lognormal_mean,
    fit_lognormal_lengths,
)
from tests.conftest import DATA_DIR

TRACE_WORKLOADS = ["lmsys", "arxiv", "sharegpt", "splitwise_conv", "splitwise_code", "mixed"]
GENERATED_WORKLOADS = ["synthetic", "lmsys_synthetic", "lmsys_words_synthetic", "fixed",
                       "typed", "python_stream"]
LMSYS_FILE = "lmsys_chat_1m_words_in_lt257_out_lt257.csv"


def compose_with(*overrides: str):
    return compose_config([f"data_dir={DATA_DIR}", *overrides])


def workload(*overrides: str):
    return instantiate(compose_with(*overrides).workload)


def needs_data(name: str, request) -> None:
    """Skip (via the ``data_dir`` fixture) when workload ``name`` reads files that are absent."""
    if name not in GENERATED_WORKLOADS:
        request.getfixturevalue("data_dir")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def write_csv(tmp_path, text: str, name: str = "trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_workload_config_is_covered():
    names = {p.stem for p in (CONFIG_DIR / "workload").glob("*.yaml")}
    # The workloads with prompt-content ids are tested in tests/test_prefix_workloads.py.
    prefix = {"mooncake", "mooncake_synthetic", "shared_prefix", "sessions"}
    assert names == set(TRACE_WORKLOADS) | set(GENERATED_WORKLOADS) | {"csv"} | prefix


@pytest.mark.parametrize("name", TRACE_WORKLOADS)
def test_trace_workload_samples_valid_requests(name, data_dir):
    requests = workload(f"workload={name}").sample(rng())
    assert len(requests) > 0
    assert requests.prompt_len.dtype == np.int64 and requests.output_len.dtype == np.int64
    requests.validate(kv_capacity=16492)  # every kept row is servable at the papers' M
    assert all(len(f["sha256"]) == 64 for f in requests.files)
    assert requests.source_row is not None and requests.source_row.min() >= 2


@pytest.mark.parametrize("name", GENERATED_WORKLOADS)
def test_generated_workload_samples_without_data(name):
    requests = workload(f"workload={name}", "data_dir=/nonexistent").sample(rng())
    assert len(requests) > 0 and requests.files == ()
    requests.validate(kv_capacity=16492)


@pytest.mark.parametrize("name", ["lmsys", "mixed", "lmsys_synthetic", "synthetic"])
def test_sampling_is_a_function_of_the_seed(name, request):
    needs_data(name, request)
    w = workload(f"workload={name}")
    a, b, c = w.sample(rng(1)), w.sample(rng(1)), w.sample(rng(2))
    assert np.array_equal(a.prompt_len, b.prompt_len)
    assert np.array_equal(a.output_len, b.output_len)
    assert np.array_equal(a.source_row, b.source_row)
    assert not np.array_equal(a.prompt_len, c.prompt_len)


def test_lmsys_counts_words_and_drops_zero_rows(data_dir):
    w = workload("workload=lmsys", "workload.n=null")
    started = time.perf_counter()
    pool = w.sample(rng())
    assert time.perf_counter() - started < 3.0  # 662,534 rows
    raw = pd.read_csv(data_dir / "traces" / LMSYS_FILE)
    zero = (raw.question_length <= 0) | (raw.answer_length <= 0)
    assert pool.length_unit == "words"
    assert pool.dropped == {"nonpositive_length": int(zero.sum())} == {"nonpositive_length": 1198}
    assert len(pool) == len(raw) - 1198
    assert pool.prompt_len.min() >= 1 and pool.output_len.min() >= 1
    # source_row is the file line: line k holds data row k - 2
    k = pool.source_row[:50] - 2
    assert np.array_equal(pool.prompt_len[:50], raw.question_length.to_numpy()[k])


def test_arxiv_first_400_rows_match_the_published_statistics(data_dir):
    pool = workload("workload=arxiv", "workload.first_rows=400").sample(rng())
    assert len(pool) == 400
    assert pool.prompt_len.mean() == pytest.approx(2546.39, abs=0.005)
    assert np.median(pool.prompt_len) == 2667.5
    assert pool.output_len.mean() == pytest.approx(296.08, abs=0.005)
    assert np.median(pool.output_len) == 161


def test_splitwise_rows_over_the_context_are_dropped_and_counted(data_dir):
    pool = workload("workload=splitwise_code").sample(rng())
    raw = pd.read_csv(data_dir / "traces" / "splitwise_code.csv")
    over = int((raw.num_prefill_tokens + raw.num_decode_tokens > 4096).sum())
    assert pool.dropped == {"total_len>4096": over}
    assert len(pool) == len(raw) - over
    assert (pool.prompt_len + pool.output_len).max() <= 4096


def test_mixed_default_is_1600_lmsys_and_400_first_arxiv_rows_shuffled(data_dir):
    requests = workload("workload=mixed").sample(rng())
    assert len(requests) == 2000
    assert requests.length_unit == "lmsys:words,arxiv:tokens"
    assert requests.dropped == {"lmsys:nonpositive_length": 1198}
    names = [f["path"].rsplit("/", 1)[1] for f in requests.files]
    assert names == [LMSYS_FILE, "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"]
    arxiv = pd.read_csv(data_dir / "traces" / names[1], nrows=400)
    # LMSYS words are < 257, arXiv prompts are longer: tells the parts apart
    from_arxiv = requests.prompt_len > 256
    assert from_arxiv.sum() == (arxiv.num_prefill_tokens > 256).sum()
    assert sorted(requests.prompt_len[from_arxiv]) == sorted(
        arxiv.num_prefill_tokens[arxiv.num_prefill_tokens > 256])
    assert 0 < np.flatnonzero(from_arxiv)[0] < 50  # shuffled, not concatenated


# --- CsvTrace on hand-made files -----------------------------------------------------------

ROWS = "s,o\n10,5\n0,3\n4000,50\n20,600\n3000,1500\n7,7\n"


def test_caps_drop_rows_and_count_each_under_its_first_reason(tmp_path):
    trace = CsvTrace(str(write_csv(tmp_path, ROWS)), "s", "o", drop_nonpositive=True,
                     max_prompt_len=3500, max_output_len=1000, max_total_len=4096)
    pool = trace.sample(rng())
    assert pool.dropped == {"nonpositive_length": 1, "prompt_len>3500": 1,
                            "output_len>1000": 1}
    assert pool.prompt_len.tolist() == [10, 20, 7]
    assert pool.source_row.tolist() == [2, 5, 7]


def test_caps_clip_instead_of_dropping(tmp_path):
    trace = CsvTrace(str(write_csv(tmp_path, ROWS)), "s", "o", drop_nonpositive=True,
                     max_output_len=500, max_total_len=3400, over_cap="clip")
    pool = trace.sample(rng())
    assert pool.dropped == {"nonpositive_length": 1,
                            "prompt_len>=3400(no room for output)": 1,
                            "clipped:output_len>500": 2, "clipped:total_len>3400": 1}
    assert pool.prompt_len.tolist() == [10, 20, 3000, 7]
    assert pool.output_len.tolist() == [5, 500, 400, 7]


def test_first_rows_then_filters_then_sampling(tmp_path):
    path = str(write_csv(tmp_path, ROWS))
    pool = CsvTrace(path, "s", "o", first_rows=3, drop_nonpositive=True).sample(rng())
    assert pool.prompt_len.tolist() == [10, 4000] and pool.dropped == {"nonpositive_length": 1}
    with pytest.raises(RequestError, match="n=3 requests without replacement.*only 2"):
        CsvTrace(path, "s", "o", first_rows=3, drop_nonpositive=True, n=3).sample(rng())
    drawn = CsvTrace(path, "s", "o", first_rows=3, drop_nonpositive=True, n=50,
                     replace=True).sample(rng())
    assert set(drawn.prompt_len.tolist()) == {10, 4000}


def test_without_drop_a_zero_row_fails_validation_naming_the_line(tmp_path):
    requests = CsvTrace(str(write_csv(tmp_path, ROWS)), "s", "o").sample(rng())
    with pytest.raises(RequestError, match=r"trace.csv row 3: field 's' \(prompt_len\) = 0"):
        requests.validate(kv_capacity=10_000)


@pytest.mark.parametrize(("text", "message"), [
    ("s,o\n1,2\n3,x\n", r"trace.csv line 3: field 'o' = 'x' is not an integer"),
    ("s,o\n1,2\n3.5,4\n", r"trace.csv line 3: field 's' = '3.5' is not an integer"),
    ("s,o\n1,2\n5\n", r"trace.csv line 3: 1 field\(s\) where the header has 2; the row"),
    ("s,o\n1,2\n\n3,4\n", r"trace.csv line 3: field 's' = '' is not an integer"),
    ("s,o\n1,2\n3,NA\n", r"trace.csv line 3: field 'o' = 'NA' is not an integer"),
    ("s,o\n1,2\n3,4,5\n", r"trace.csv: malformed CSV .*line 3"),
    ("q,o\n1,2\n", r"trace.csv: missing column\(s\) \['s'\]"),
])
def test_malformed_rows_name_file_line_and_field(tmp_path, text, message):
    trace = CsvTrace(str(write_csv(tmp_path, text)), "s", "o")
    with pytest.raises(RequestError, match=message):
        trace.sample(rng())


def test_bad_timestamp_names_the_line(tmp_path):
    trace = CsvTrace(str(write_csv(tmp_path, "t,s,o\n0.5,1,2\nsoon,1,2\n")), "s", "o",
                     arrival_column="t")
    with pytest.raises(RequestError, match=r"line 3: field 't' = 'soon' is not a number"):
        trace.sample(rng())


def test_missing_file_says_how_to_fetch_it():
    with pytest.raises(MissingDataError, match=r"(?s)/nonexistent/traces/.*traces.fetch"):
        workload("workload=lmsys", "data_dir=/nonexistent").sample(rng())


# --- synthetic generators ------------------------------------------------------------------

def test_uniform_keeps_its_draws():
    requests = Synthetic(n=20).sample(rng(5))
    expected = rng(5)
    assert requests.prompt_len.tolist() == expected.integers(1, 51, size=20).tolist()
    assert requests.output_len.tolist() == expected.integers(1, 51, size=20).tolist()


def test_a1_outputs_fit_the_memory():
    requests = Synthetic(n=5000, distribution="a1", prompt_max=5, kv_tokens=40).sample(rng())
    assert requests.prompt_len.max() == 5 and requests.prompt_len.min() == 1
    assert (requests.prompt_len + requests.output_len).max() <= 40


@pytest.mark.parametrize(("distribution", "mean"), [
    ("uniform", 25.5),
    ("binomial", 25.5),
    # E[min(ceil X, 50)] = sum_{j<50} P(X > j)
    ("exponential", sum(np.exp(-j / 5) for j in range(50))),
    ("normal", sum(norm.sf(j, 25, 8.33) for j in range(50))),
])
def test_c1_distributions_have_the_expected_mean(distribution, mean):
    requests = Synthetic(n=200_000, distribution=distribution).sample(rng())
    for lengths in (requests.prompt_len, requests.output_len):
        assert lengths.min() >= 1 and lengths.max() <= 50
        assert lengths.mean() == pytest.approx(mean, abs=0.1)


def test_c1_mixed_inputs_have_the_long_tail_of_the_lognormal_part():
    requests = Synthetic(n=200_000, distribution="mixed").sample(rng())
    s, o = requests.prompt_len, requests.output_len
    assert s.min() >= 1 and s.max() <= 50
    # P(s > 40) = 0.2 * P(LogNormal(ln 40, .25) > 40) + 0.8 * P(Exp(10) > 40); draws over 50
    # are redrawn from U(40, 50), so they stay above 40.
    assert (s > 40).mean() == pytest.approx(0.2 * 0.5 + 0.8 * np.exp(-4), abs=0.004)
    assert o.mean() == pytest.approx(sum(np.exp(-j / 5) for j in range(50)), abs=0.1)
    assert abs(np.corrcoef(s, o)[0, 1]) < 0.01  # drawn independently


def test_unknown_distribution_lists_the_known_ones():
    with pytest.raises(RequestError, match="unknown distribution 'zipf'; known: uniform, normal"):
        Synthetic(n=3, distribution="zipf").sample(rng())


def test_discretised_lognormal_mean_is_exact():
    mu, sigma, cap = 1.0, 0.8, 6
    edges = norm.cdf((np.log(np.arange(1, cap)) - mu) / sigma)  # P(X <= k), k = 1..cap-1
    pmf = np.diff(np.concatenate([[0.0], edges, [1.0]]))  # P(min(ceil X, cap) = k), k=1..cap
    assert discretised_lognormal_mean(mu, sigma, cap) == pytest.approx(
        float(np.dot(np.arange(1, cap + 1), pmf)))


@pytest.mark.parametrize(("median", "mean"), [(12, 41.84), (43, 85.35)])
def test_lognormal_fit_matches_the_published_median_and_mean(median, mean):
    mu, sigma = fit_lognormal_lengths(median, mean, 2048)
    assert discretised_lognormal_mean(mu, sigma, 2048) == pytest.approx(mean, rel=1e-9)
    below = norm.cdf((np.log(median - 1) - mu) / sigma)  # P(ceil X <= median - 1)
    at = norm.cdf((np.log(median) - mu) / sigma)  # P(ceil X <= median)
    assert below < 0.5 < at


def test_lmsys_synthetic_samples_close_to_the_published_numbers():
    w = workload("workload=lmsys_synthetic")
    assert isinstance(w, FittedLognormal)
    requests = w.sample(rng(), n=200_000)
    assert np.median(requests.prompt_len) == 12 and np.median(requests.output_len) == 43
    assert requests.prompt_len.mean() == pytest.approx(41.84, rel=0.03)
    assert requests.output_len.mean() == pytest.approx(85.35, rel=0.03)
    assert (requests.prompt_len + requests.output_len).max() <= 4096


def test_lognormal_fit_rejects_impossible_targets():
    with pytest.raises(RequestError, match="1 < median < mean < cap"):
        fit_lognormal_lengths(50, 40, 2048)
    # a mean no sigma reaches: even sigma = 10 leaves the capped mean near 549
    with pytest.raises(RequestError, match=r"no sigma in \[0.001, 10.0\] gives mean=1500"):
        fit_lognormal_lengths(2, 1500, 2048)


# --- Mixed ---------------------------------------------------------------------------------

SHORT = Synthetic(prompt_min=1, prompt_max=10)
LONG = Synthetic(prompt_min=100, prompt_max=200)


def test_mixed_draws_the_counts_and_shuffles():
    requests = Mixed(parts={"short": SHORT, "long": LONG},
                     counts={"short": 30, "long": 10}).sample(rng())
    is_long = requests.prompt_len >= 100
    assert len(requests) == 40 and is_long.sum() == 10
    assert not (is_long[:10].all() or is_long[-10:].all())


def test_mixed_smaller_n_is_a_prefix_of_the_shuffled_pool():
    mixed = Mixed(parts={"short": SHORT, "long": LONG}, counts={"short": 30, "long": 10})
    whole, part = mixed.sample(rng(3)), mixed.sample(rng(3), n=15)
    assert np.array_equal(part.prompt_len, whole.prompt_len[:15])
    with pytest.raises(RequestError, match="n=41 but the parts give 40"):
        mixed.sample(rng(), n=41)


def test_mixed_ratio_apportions_n():
    mixed = Mixed(parts={"short": SHORT, "long": LONG}, ratio={"short": 4, "long": 1}, n=11)
    assert ((mixed.sample(rng()).prompt_len >= 100).sum()) == 2  # 8.8 + 2.2 -> 9 + 2
    assert apportion(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}


@pytest.mark.parametrize(("options", "message"), [
    ({"counts": {"short": 1}, "ratio": {"short": 1}}, "exactly one of counts or ratio"),
    ({"counts": {"short": 1, "other": 2}}, "the parts are"),
    ({"ratio": {"short": 1, "long": 1}}, "with ratio, set workload.n"),
])
def test_mixed_rejects_inconsistent_options(options, message):
    with pytest.raises(RequestError, match=message):
        Mixed(parts={"short": SHORT, "long": LONG}, **options).sample(rng())


# --- arrivals x workloads ------------------------------------------------------------------

def test_splitwise_timestamps_follow_their_rows(data_dir):
    w = workload("workload=splitwise_conv", "workload.n=500")
    requests = make_requests(w, TraceTimestamps(speedup=2.0), seed=0, time_unit="seconds")
    raw = pd.read_csv(data_dir / "traces" / "splitwise_conv.csv")
    t = raw.arrived_at.to_numpy()[requests.source_row - 2]
    assert np.allclose(requests.arrival, (t - t.min()) / 2.0)
    assert np.array_equal(requests.prompt_len, raw.num_prefill_tokens.to_numpy()[
        requests.source_row - 2])


@pytest.mark.parametrize("arrivals", [AllAtOnce(), Poisson(rate=10.0),
                                      PiecewisePoisson(rates=[10, 50], boundaries=[5.0])])
@pytest.mark.slow
@pytest.mark.parametrize("name", ["lmsys", "mixed", "lmsys_synthetic", "splitwise_code"])
def test_any_arrival_process_combines_with_any_workload(name, arrivals, request):
    needs_data(name, request)
    requests = make_requests(workload(f"workload={name}"), arrivals, seed=0, time_unit="seconds")
    assert len(requests.arrival) == len(requests)
    assert np.all(np.diff(requests.arrival) >= 0) and requests.arrival.min() >= 0


def test_trace_timestamps_need_a_timestamped_workload():
    with pytest.raises(ArrivalError, match="needs a workload with an arrival column"):
        make_requests(workload("workload=lmsys_synthetic"), TraceTimestamps(), seed=0,
                      time_unit="seconds")


def test_run_summary_reports_dropped_rows_and_the_unit(data_dir, tmp_path):
    cfg = compose_with("workload=splitwise_code", "workload.first_rows=200", "arrivals=trace",
                       "output.request_table=false", "output.iteration_table=false")
    summary = run(cfg, tmp_path)
    raw = pd.read_csv(data_dir / "traces" / "splitwise_code.csv", nrows=200)
    over = int((raw.num_prefill_tokens + raw.num_decode_tokens > 4096).sum())
    assert over > 0
    assert summary["dropped_rows"] == {"total_len>4096": over}
    assert summary["n_requests"] == 200 - over and summary["length_unit"] == "tokens"
    assert summary["input_files"][0]["path"].endswith("splitwise_code.csv")
