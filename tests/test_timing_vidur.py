"""The vidur timing backend: offline build, lookup tables vs Vidur, ranges, 7B attention, CLIs."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from replay.engine.timing import BatchShape, TimingBackend
from replay.errors import ConfigError
from replay.storage.data import MissingDataError
from replay.timing import LinearTiming, aiconfigurator, attention_7b, profiles_fetch
from replay.timing.fit_linear import batch_mix, fit, grid_errors, region_table
from replay.timing.shapes import compose_timing, shape_table, standard_shapes
from replay.timing.vidur import VidurRangeError, VidurTiming
from replay.timing.vidur_build import vidur_batch
from tests.conftest import DATA_DIR
from traces.fetch import fetch

PROFILES = DATA_DIR / "vidur" / "profiling"
ATTENTION_70B = PROFILES / "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv"
needs_profiles = pytest.mark.skipif(not ATTENTION_70B.is_file(),
                                    reason=f"Vidur profiles not in {PROFILES}")
# A grid that trains in seconds; the tables must match whatever Vidur trained.
CHEAP = ["timing.random_forest_grid={num_estimators:[8],max_depth:[8],min_samples_split:[2]}",
         "timing.k_fold_cv_splits=2"]
CHEAP_LINEAR = ["timing.predictor=linear_regression",
                "timing.linear_regression_grid={polynomial_degree:[1,2],polynomial_include_bias:[true],"
                "polynomial_interaction_only:[false],fit_intercept:[true]}",
                "timing.k_fold_cv_splits=2"]
SETUPS = {"70b": ("llama2_70b", "a100x2", CHEAP), "7b": ("llama2_7b", "a100x1", CHEAP),
          "70b_linear": ("llama2_70b", "a100x2", CHEAP_LINEAR)}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    # One per session, shared by pytest-xdist workers (the backend locks while building).
    session_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session_dir = session_dir.parent
    path = session_dir / "vidur_cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def timings(cache_dir):
    """Cheap builds through the real config, with HuggingFace downloads made to fail."""
    if not ATTENTION_70B.is_file():
        pytest.skip(f"Vidur profiles not in {PROFILES}")

    def no_network(*args, **kwargs):
        raise AssertionError("vidur tried to download from HuggingFace")

    built = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("vidur.execution_time_predictor.sklearn_execution_time_predictor."
                      "snapshot_download", no_network)
        for name, (model, hardware, overrides) in SETUPS.items():
            built[name] = compose_timing(model, hardware, [f"data_dir={DATA_DIR}",
                                                           f"timing.cache_dir={cache_dir}",
                                                           *overrides])
    return built


def shape(new_tokens, context) -> BatchShape:
    new_tokens = np.asarray(new_tokens, dtype=np.int64)
    return BatchShape(new_tokens, np.asarray(context, dtype=np.int64), new_tokens > 1)


def random_batches(rng, n):
    """In-range batches mixing prefill chunks (some with cached context) and decodes."""
    batches = []
    for _ in range(n):
        size = int(rng.integers(1, 129))
        prefill = rng.random(size) < rng.choice([0.0, 0.05, 0.3])
        new_tokens = np.where(prefill, rng.integers(2, 700, size), 1)
        keep = np.cumsum(new_tokens) <= 4096
        new_tokens = new_tokens[keep]
        context = np.minimum(rng.integers(0, 4096, new_tokens.size), 4096 - new_tokens)
        batches.append(shape(new_tokens, context))
    return batches


@pytest.mark.slow
@needs_profiles
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_tables_reproduce_vidur_get_execution_time(timings, setup):
    timing = timings[setup]
    assert isinstance(timing, TimingBackend) and timing.time_unit == "seconds"
    predictor = timing.vidur_predictor()
    for batch in random_batches(np.random.default_rng(1), 150):
        expected = predictor.get_execution_time(
            vidur_batch(batch.new_tokens, batch.context), 0).total_time
        assert timing.duration(batch) == pytest.approx(expected, rel=1e-6)
    assert sum(timing.out_of_range_batches.values()) == 0


@pytest.mark.slow
@needs_profiles
def test_context_is_cached_tokens_and_lookups_follow_vidur_rounding(timings):
    timing = timings["70b"]
    tables, ms_to_s = timing.tables, timing.tables.num_layers * 1e-3
    # One decode at 576 cached tokens: tokens rounded up to 8, context on the 32-grid.
    assert timing.duration(shape([1], [576])) == pytest.approx(
        (tables.token_ms[8] + tables.decode_ms[1, 576 // 32]) * ms_to_s)
    # 577 cached tokens round up to 608; a mean of 576.5 floors to 576 first (Vidur's int()).
    assert timing.duration(shape([1], [577])) == pytest.approx(
        (tables.token_ms[8] + tables.decode_ms[1, 608 // 32]) * ms_to_s)
    assert timing.duration(shape([1, 1], [576, 577])) == pytest.approx(
        (tables.token_ms[8] + tables.decode_ms[2, 576 // 32]) * ms_to_s)
    # A 500-token chunk after 100 cached tokens: kv 100 -> 128, chunk 500 -> 512.
    assert timing.duration(shape([500], [100])) == pytest.approx(
        (tables.token_ms[504] + tables.prefill_ms[128 // 32, 512 // 32]) * ms_to_s)
    # More cached tokens cost more attention time than the same chunk from scratch.
    assert timing.duration(shape([512], [2048])) > timing.duration(shape([512], [0]))


@pytest.mark.slow
@needs_profiles
def test_second_instance_loads_tables_without_training(timings, monkeypatch):
    timing = timings["70b"]

    def no_training(*args, **kwargs):
        raise AssertionError("rebuilt although the tables are cached")

    monkeypatch.setattr("replay.timing.vidur_build.build_predictor", no_training)
    again = VidurTiming(str(PROFILES), "meta-llama/Llama-2-70b-hf", "a100", 2,
                        random_forest_grid=dict(timing.spec.grid), k_fold_cv_splits=2,
                        cache_dir=str(timing.cache_dir), out_of_range="error")
    assert again.cache_path == timing.cache_path
    np.testing.assert_array_equal(again.tables.prefill_ms, timing.tables.prefill_ms)
    # Any setting that changes predictions changes the cache key.
    with pytest.raises(AssertionError, match="rebuilt"):
        VidurTiming(str(PROFILES), "meta-llama/Llama-2-70b-hf", "a100", 2,
                    random_forest_grid=dict(timing.spec.grid), k_fold_cv_splits=2,
                    cache_dir=str(timing.cache_dir), limits={"kv_granularity": 64})


@pytest.mark.slow
@needs_profiles
def test_out_of_range_error_names_the_limits(timings):
    strict = VidurTiming(str(PROFILES), "meta-llama/Llama-2-70b-hf", "a100", 2,
                         random_forest_grid=dict(timings["70b"].spec.grid), k_fold_cv_splits=2,
                         cache_dir=str(timings["70b"].cache_dir), out_of_range="error")
    with pytest.raises(VidurRangeError, match=r"\(tokens\).*5000 new tokens"):
        strict.duration(shape([2500, 2500], [0, 0]))
    with pytest.raises(VidurRangeError, match=r"decode_batch.*129 decodes"):
        strict.duration(shape([1] * 129, [100] * 129))
    with pytest.raises(VidurRangeError, match=r"context.*max context 4160"):
        strict.duration(shape([1], [4160]))
    assert strict.duration(shape([1] * 128, [4000] * 128)) > 0   # the edge is inside


@pytest.mark.slow
@needs_profiles
def test_extrapolation_scales_from_the_profile_edge_and_is_logged(timings, caplog):
    timing = timings["70b"]
    tables, ms_to_s = timing.tables, timing.tables.num_layers * 1e-3
    before = dict(timing.out_of_range_batches)
    with caplog.at_level(logging.WARNING, logger="replay.timing.vidur"):
        # 256 decodes: twice the largest profiled decode batch.
        assert timing.duration(shape([1] * 256, [576] * 256)) == pytest.approx(
            (tables.token_ms[256] + 2 * tables.decode_ms[128, 576 // 32]) * ms_to_s)
        # 8192 prefill tokens: per-token ops double the 4096-token value; attention per request.
        assert timing.duration(shape([4096, 4096], [0, 0])) == pytest.approx(
            (2 * tables.token_ms[4096] + 2 * tables.prefill_ms[0, 128]) * ms_to_s)
        # Context beyond the table: decode attention linear in context.
        assert timing.duration(shape([1], [4160])) == pytest.approx(
            (tables.token_ms[8] + tables.decode_ms[1, 128] * 4160 / 4096) * ms_to_s)
        # Chunk past the context limit: attention FLOPs ratio from the largest fitting point.
        flops = 512 * (4096 + 256) / (512 * (3584 + 256))
        assert timing.duration(shape([512], [4096])) == pytest.approx(
            (tables.token_ms[512] + tables.prefill_ms[3584 // 32, 512 // 32] * flops) * ms_to_s)
    assert "extrapolating beyond the profile (decode_batch)" in caplog.text
    counts = timing.describe()["out_of_range_batches"]
    assert counts["decode_batch"] == before["decode_batch"] + 1
    assert counts["tokens"] == before["tokens"] + 1
    assert counts["context"] == before["context"] + 2


@pytest.mark.slow
@needs_profiles
def test_extrapolation_agrees_with_the_tables_inside_the_range(timings):
    timing = timings["7b"]
    for batch in random_batches(np.random.default_rng(2), 50):
        # the edge-scaled parts (what out_of_range=extrapolate prices) are the lookups inside
        assert sum(timing.parts(batch).values()) == pytest.approx(timing.duration(batch),
                                                                  rel=1e-12)


@pytest.mark.slow
@needs_profiles
def test_7b_attention_is_derived_and_its_provenance_reported(timings):
    info = timings["7b"].describe()
    provenance = info["attention"]
    assert "derived from the measured Llama-2-70B TP2" in provenance["what"]
    assert provenance["constants"]["decode_bandwidth_GBps"] < 2039
    recorded = {f["path"] for f in info["files"]}
    assert str(ATTENTION_70B.resolve()) in recorded
    assert provenance["table_file"]["path"] in recorded
    source, derived = pd.read_csv(ATTENTION_70B), pd.read_csv(provenance["table_file"]["path"])
    assert len(derived) == len(source)
    assert set(derived["n_kv_head"]) == {32} and set(derived["num_tensor_parallel_workers"]) == {1}
    prefill = derived["is_prefill"]
    column = "time_stats.attn_prefill.median"
    # Prefill: the 70B time x the measured 32/4 KV-head ratio at the equal-FLOPs length.
    lengths, ratios = aiconfigurator.prefill_kv_head_ratio()
    scale = attention_7b.prefill_scale(source.loc[prefill, "prefill_chunk_size"].to_numpy(float),
                                       source.loc[prefill, "kv_cache_size"].to_numpy(float),
                                       lengths, ratios)
    np.testing.assert_allclose(derived.loc[prefill, column], source.loc[prefill, column] * scale,
                               rtol=1e-9)
    assert scale.min() > 1.0 and scale.max() < 1.25
    kernels = provenance["kernel_tables"]
    assert kernels["package"] == "aiconfigurator-core" and len(kernels["files"]) == 6
    assert all(len(f["sha256"]) == 64 for f in kernels["files"].values())
    decode = ~prefill
    extra = (derived.loc[decode, "time_stats.attn_decode.median"]
             - source.loc[decode, "time_stats.attn_decode.median"])
    bytes_moved = (source.loc[decode, "batch_size"] * source.loc[decode, "kv_cache_size"]
                   * (16384 - 2048))
    bandwidth = provenance["constants"]["decode_bandwidth_GBps"] * 1e9 / 1e3   # bytes per ms
    np.testing.assert_allclose(extra, bytes_moved / bandwidth, rtol=1e-5)
    assert timings["70b"].describe()["attention"]["source"] == "measured Vidur profile"


def test_derivation_rejects_data_that_is_not_70b_decode():
    frame = pd.DataFrame({"n_embd": [4096], "n_q_head": [32], "n_kv_head": [32],
                          "num_tensor_parallel_workers": [1], "is_prefill": [False]})
    with pytest.raises(ValueError, match="no Llama-2-70B TP 2 prefill and decode rows"):
        attention_7b.derive(frame, (np.array([16, 4096]), np.array([1.0, 1.0])))


def test_missing_profile_says_where_to_get_it(tmp_path):
    with pytest.raises(MissingDataError) as error:
        VidurTiming(str(tmp_path), "meta-llama/Llama-2-7b-hf", "a100", 1,
                    cache_dir=str(tmp_path / "cache"))
    message = str(error.value)
    assert "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv" in message
    assert "raw.githubusercontent.com/microsoft/vidur/" in message
    assert "python -m traces.fetch" in message


@needs_profiles
def test_missing_70b_attention_is_an_error_not_a_substitution(tmp_path):
    for relative in ("compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
                     "network/a100_pairwise_nvlink/all_reduce.csv"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).symlink_to(PROFILES / relative)
    with pytest.raises(MissingDataError,
                       match="e2d00e9.*file not found: .*Llama-2-70b-hf/attention.csv"):
        VidurTiming(str(tmp_path), "meta-llama/Llama-2-70b-hf", "a100", 2,
                    cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="derived attention table exists only for"):
        VidurTiming(str(tmp_path), "meta-llama/Llama-2-70b-hf", "a100", 2, attention="derived",
                    cache_dir=str(tmp_path / "cache"))


def test_bad_settings_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="predictor: must be one of"):
        VidurTiming(str(tmp_path), "m", "a100", 1, predictor="xgboost")
    with pytest.raises(ValueError, match="out_of_range: must be one of"):
        VidurTiming(str(tmp_path), "m", "a100", 1, out_of_range="clip")
    with pytest.raises(ValueError, match="multiple of kv_granularity"):
        VidurTiming(str(tmp_path), "m", "a100", 1, limits={"kv_granularity": 48})
    with pytest.raises(ValueError, match="unknown keys"):
        VidurTiming(str(tmp_path), "m", "a100", 1,
                    random_forest_grid={"polynomial_degree": [1]})


def test_profile_urls_mirror_vidurs_tree():
    llama70, llama7 = "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf"
    assert profiles_fetch.source_url("mlp", llama7, "a100") == (
        "https://raw.githubusercontent.com/microsoft/vidur/bee57dafa1eb2dc422dcaec46a66975599a6a242/"
        "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
    assert profiles_fetch.source_url("attention", llama7, "a100") == (
        "https://media.githubusercontent.com/media/microsoft/vidur/main/data/profiling/"
        "compute/a100/meta-llama/Llama-2-7b-hf/attention.csv")
    assert profiles_fetch.source_url("attention", llama70, "a100").endswith(
        "/e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a/data/profiling/a100/attention.csv")
    assert profiles_fetch.source_url("all_reduce", llama70, "a100", "a100_pairwise_nvlink") == (
        "https://raw.githubusercontent.com/microsoft/vidur/5555bb810209639fed7a774a0b40b77cfca5ee33/"
        "data/profiling/network/a100_pairwise_nvlink/all_reduce.csv")
    with pytest.raises(ValueError, match="needs a network device"):
        profiles_fetch.source_url("send_recv", llama70, "a100")
    assert "download by hand" in profiles_fetch.fetch_hint("attention", llama7, "a100")
    # Llama-3-8B's MLP profile is a plain file at a pinned commit, not Git LFS.
    llama3 = "meta-llama/Meta-Llama-3-8B"
    hint = profiles_fetch.fetch_hint("mlp", llama3, "a100")
    assert "41ab8ab15cd6217284b025750fc6b81364d359e6" in hint and "traces.fetch" in hint
    assert "Git LFS" not in hint


@needs_profiles
def test_fetch_puts_each_download_where_the_backend_reads_it(tmp_path):
    """Serve Vidur's tree from the shared copy: URL -> file must round-trip with hashes."""
    github = "https://raw.githubusercontent.com/microsoft/vidur/"

    def downloader(url, output_file, pooch):
        assert url.startswith(github), url
        commit, _, repo_path = url.removeprefix(github).partition("/")
        assert len(commit) == 40, url
        if repo_path == "data/profiling/a100/attention.csv":   # the 70B copy's old location
            source = ATTENTION_70B
        else:
            source = PROFILES / repo_path.removeprefix("data/profiling/")
        shutil.copyfile(source, output_file)

    fetched = fetch(profiles_fetch.PROFILE_FILES, tmp_path, downloader=downloader)
    assert len(fetched) == 8 and all(path.is_file() for path in fetched)
    local = tmp_path / "vidur" / "profiling"
    for model in ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf",
                  "meta-llama/Meta-Llama-3-8B"):
        paths = profiles_fetch.profile_paths(local, model, "a100", "a100_pairwise_nvlink")
        assert paths["mlp"] in fetched and paths["all_reduce"] in fetched
    assert (local / "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv") in fetched


@pytest.mark.slow
@needs_profiles
def test_standard_shapes_table(timings):
    shapes = standard_shapes()
    assert len(shapes) == 20
    table = shape_table(timings["70b"], "llama2_70b", "a100x2").set_index("shape")
    assert list(table[table["extrapolated"]].index) == ["decode 1@4160"]
    decode_ms = [table.loc[f"decode {b}@576", "milliseconds"] for b in (1, 8, 64, 128)]
    assert decode_ms == sorted(decode_ms)
    assert table.loc["prefill 1x4096", "milliseconds"] > 4 * table.loc["prefill 1x512",
                                                                      "milliseconds"]


def test_fit_linear_recovers_known_coefficients():
    truth = LinearTiming(d0=0.02, d1=3e-7, d2=1.5e-4, d3=5e-5, d4=2e-4)
    result = fit(truth, batch_mix(np.random.default_rng(0), 300))
    for name in ("d0", "d1", "d2", "d3", "d4"):
        assert result[name] == pytest.approx(getattr(truth, name), rel=1e-6)
    assert result["max_relative_error"] < 1e-6


def test_batch_mix_covers_what_policies_produce():
    mix = batch_mix(np.random.default_rng(3), 1500)
    kinds = pd.Series([kind for kind, _ in mix]).value_counts(normalize=True)
    assert kinds["decode"] == pytest.approx(0.6, abs=0.05)
    batches = [b for _, b in mix]
    decodes = np.array([int((~b.is_prefill).sum()) for b in batches])
    prompts = np.array([int(b.is_prefill.sum()) for b in batches])
    assert decodes.max() > 512 and decodes.max() <= 1024      # past Vidur's 128 on purpose
    assert prompts.max() > 30                                  # many short prompts at once
    assert all(int(b.new_tokens[b.is_prefill].sum()) <= 4096 for b in batches)
    assert all((b.context + b.new_tokens).max() <= 4096 for b in batches)
    # Per-batch context scales: large decode batches at short and at long mean contexts.
    means = [b.context[~b.is_prefill].mean() for b, d in zip(batches, decodes, strict=True)
             if d >= 256 and not b.is_prefill.any()]
    assert min(means) < 100 and max(means) > 2000


@pytest.mark.slow
@needs_profiles
def test_fit_meets_its_target_on_the_quick_predictor(timings):
    """Decode batches 1..512 x contexts 16..4096: median relative error <= 5 %, max <= 20 %
    (the cheap random forests; the published fit uses the default grid)."""
    for setup in ("7b", "70b"):
        timing = timings[setup]
        result = fit(timing, batch_mix(np.random.default_rng(0), 600))
        model = LinearTiming(**{k: result[k] for k in ("d0", "d1", "d2", "d3", "d4")})
        table = region_table(grid_errors(timing, model)).set_index("cell")
        target = table.iloc[0]
        assert target["n"] == 204
        assert target["median_abs"] <= 0.05 and target["max_abs"] <= 0.20, (setup, target)
        assert result["d3"] > 0 and result["d4"] > 0


@pytest.mark.slow
@needs_profiles
@pytest.mark.parametrize("setup", ["70b", "7b"])
def test_beyond_profile_changes_only_batches_past_the_profile(timings, cache_dir, setup):
    model, hardware, overrides = SETUPS[setup]
    modes = {mode: compose_timing(model, hardware, [f"data_dir={DATA_DIR}",
                                                    f"timing.cache_dir={cache_dir}", *overrides,
                                                    f"timing.beyond_profile={mode}"])
             for mode in ("linear", "flat", "measured")}
    assert timings[setup].describe()["beyond_profile"]["mode"] == "linear"  # the default
    for mode, timing in modes.items():
        info = timing.describe()["beyond_profile"]
        assert info["mode"] == mode and info["edge_decode_batch"] == 128
    assert "tables" in modes["measured"].describe()["beyond_profile"]
    inside = random_batches(np.random.default_rng(4), 60) + [
        shape([1] * 128, [c] * 128) for c in (16, 576, 4000)] + [shape([1], [4160])]
    for batch in inside:
        prices = {mode: t.duration(batch) for mode, t in modes.items()}
        assert prices["flat"] == prices["linear"] == prices["measured"]
    tables = modes["flat"].tables
    ms_to_s = tables.num_layers * 1e-3
    changed = set()
    for size, context in ((129, 576), (256, 16), (512, 2048), (1024, 100)):
        batch = shape([1] * size, [context] * size)
        prices = {mode: t.duration(batch) for mode, t in modes.items()}
        column = -(-context // 32)
        token = tables.token_ms[-(-size // 8) * 8]
        assert prices["flat"] == pytest.approx((token + tables.decode_ms[128, column]) * ms_to_s)
        assert prices["linear"] == pytest.approx(
            (token + tables.decode_ms[128, column] * size / 128) * ms_to_s)
        assert prices["flat"] < prices["measured"] <= prices["linear"] * 1.1
        changed |= {m for m in prices if prices[m] != prices["linear"]}
    assert changed == {"flat", "measured"}


def test_beyond_profile_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="beyond_profile"):
        VidurTiming(profile_dir=str(tmp_path), model="meta-llama/Llama-2-70b-hf",
                    device="a100", tensor_parallel=2, beyond_profile="bogus")


@needs_profiles
def test_attention_sources_compares_shared_shapes(tmp_path, capsys):
    from replay.tools import attention_sources

    assert attention_sources.main(["--out", str(tmp_path), f"data_dir={DATA_DIR}"]) == 0
    decode = pd.read_csv(tmp_path / "decode.csv")
    prefill = pd.read_csv(tmp_path / "prefill.csv")
    assert set(decode["collection"]) == set(aiconfigurator.COLLECTIONS)
    # vLLM's decode table has no 32-KV-head kernel; the other two have one for every shape.
    vllm = decode["collection"] == "vllm/0.14.0"
    assert decode.loc[vllm, "kernel_kv32"].isna().all()
    assert decode.loc[~vllm, "kernel_kv32"].notna().all()
    np.testing.assert_allclose(decode["kv4_over_vidur"],
                               decode["kernel_kv4"] / decode["vidur_70b"])
    # The derived 7B decode costs more than the 70B shape it comes from; prefill barely more.
    assert (decode["derived_7b"] >= decode["vidur_70b"]).all()
    assert ((prefill["derived_7b"] / prefill["vidur_70b"]).between(1.0, 1.25)).all()
    assert (prefill["batch_size"] == 1).all() and len(prefill) >= 3 * 6
    assert "derived_over_kv32 median" in capsys.readouterr().out


def test_missing_kernel_tables_package_is_a_clear_error(monkeypatch):
    def not_installed(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(aiconfigurator.resources, "files", not_installed)
    with pytest.raises(ConfigError, match=r"pip install 'aiconfigurator-core>=0.12'"):
        aiconfigurator.prefill_kv_head_ratio()


@pytest.mark.slow
@needs_profiles
@pytest.mark.parametrize("setup", ["70b", "7b"])
def test_explain_splits_the_typical_iteration_into_parts_that_sum_to_its_price(timings, setup):
    from replay.timing.shapes import typical_iteration, vidur_decomposition

    shape_, info = typical_iteration("b1_wait_low")
    assert (info["prompts"], info["decodes"], info["thresholds"]) == (34, 476, [17, 17])
    timing = timings[setup]
    parts = vidur_decomposition(timing, shape_)
    assert sum(parts.values()) == pytest.approx(timing.duration(shape_), rel=1e-9)
    assert ("all-reduce x 2 (tensor parallel)" in parts) == (setup == "70b")
    assert parts["prefill attention (per prompt)"] > 0 and parts["decode attention"] > 0
    for batch in random_batches(np.random.default_rng(5), 20):
        assert sum(timing.parts(batch).values()) == pytest.approx(timing.duration(batch),
                                                                  rel=1e-12)


def test_vidur_keys_its_trained_models_by_the_profiles_content_not_their_path(tmp_path):
    """Issue 44: Vidur's model cache key held the profile's path, so moved data or a copied
    cache retrained every model (about 15 minutes)."""
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import ModelType

    from replay.timing.vidur_build import PREDICTOR_CONFIGS, OfflineRandomForestPredictor
    from replay.timing.vidur_spec import ProfileFiles

    def model_hashes(folder, mlp_text):
        folder.mkdir()
        (folder / "mlp.csv").write_text(mlp_text)
        (folder / "all_reduce.csv").write_text("size,time\n1,2\n")
        files = ProfileFiles(mlp=folder / "mlp.csv", attention=folder / "mlp.csv",
                             all_reduce=folder / "all_reduce.csv")
        predictor = object.__new__(OfflineRandomForestPredictor)  # the keys, not a training
        predictor._local_files = files
        predictor._config = PREDICTOR_CONFIGS["random_forest"](
            model_profiling_dataset=f"local:{files.mlp}",
            network_profiling_dataset=f"local:{files.all_reduce}")
        predictor._replica_config = type("Replica", (), {"tensor_parallel_size": 2})()
        predictor._block_size, predictor._max_tokens, predictor._is_multi_node = 16, 4096, False
        return (predictor._get_hash(ModelType.COMPUTE), predictor._get_hash(ModelType.NETWORK))

    here = model_hashes(tmp_path / "here", "a,b\n1,2\n")
    assert model_hashes(tmp_path / "moved", "a,b\n1,2\n") == here
    changed = model_hashes(tmp_path / "changed", "a,b\n1,3\n")
    assert changed[0] != here[0] and changed[1] == here[1]
