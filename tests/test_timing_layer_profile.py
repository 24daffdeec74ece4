"""timing=layer_profile: step prices from a per-layer profile (replay/timing/layer_profile.py).

A toy profile whose times are multilinear in every axis makes each price checkable by
hand (the interpolation is exact on it); the shared profiles of the RTX 4090 and the RTX
PRO 6000 are priced against a plain transcription of LLMServingSim's lookup rules.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from replay.engine.timing import BatchShape
from replay.errors import ConfigError, InputError
from replay.timing.layer_profile import ARCHITECTURES, PER_SEQUENCE, LayerProfileTiming
from tests.conftest import DATA_DIR

LAYERS = 4
HIDDEN = 64
DENSE = sorted(set(ARCHITECTURES["llama"]["per_step"] + ARCHITECTURES["llama"]["per_layer"]))
SKEW_AXES = {"n_bins": [0, 2, 4, 1000], "n_labels": ["n<=2", "n<=4", "n>4"],
             "skew_rate_bins": [-0.01, 0.05, 0.4, 0.7, 1.01],
             "skew_rate_labels": ["sr<=5%", "sr<=40%", "sr<=70%", "sr>70%"],
             "kv_big_bins": [0, 1024, 10 ** 9], "kv_big_labels": ["kvB<=1k", "kvB>1k"],
             "kp_bins": [-1, 0, 10 ** 9], "kp_labels": ["kp=0", "kp>0"]}


def attention_us(pc, kp, nd, kd):
    """Multilinear, so the backend's per-axis interpolation reproduces it exactly."""
    return 2 + 0.5 * pc / 16 + 0.25 * kp / 64 + nd * (1 + kd / 16)


def attention_rows(drop=()):
    rows = []
    for pc in (0, 16):
        for nd in (0, 1, 2):
            if (pc, nd) == (0, 0) or (pc, nd) in drop:
                continue
            for kp in ((0, 64) if pc else (0,)):
                for kd in ((16, 48) if nd else (0,)):
                    rows.append((pc, kp, nd, kd, attention_us(pc, kp, nd, kd)))
    return pd.DataFrame(rows, columns=["prefill_chunk", "kv_prefill", "n_decode", "kv_decode",
                                       "time_us"])


def write_profile(root: Path, tps=(1,), skew: float | None = None, drop=(),
                  dense_rows=None) -> Path:
    """A toy profile: every token-wise layer 1 us at 1 token + 0.01 us per further token,
    LM head and sampler 9 us + 1 us per sequence, attention :func:`attention_us`."""
    folder = root / "Toy" / "test" / "Tiny"
    variant = folder / "bf16"
    meta = {"architecture": "llama", "model": "test/Tiny", "vllm_version": "0.19.0"}
    if skew is not None:
        meta["skew_fit"] = {"enabled": True, "bucket_axes": SKEW_AXES,
                            "per_tp": {tp: {"alpha_default": 0.0,
                                            "bucket_table": f"tp{tp}/skew_fit.csv"}
                                       for tp in tps}}
    for tp in tps:
        out = variant / f"tp{tp}"
        out.mkdir(parents=True)
        dense = dense_rows if dense_rows is not None else [
            (name, t, 1 + 0.01 * (t - 1)) for name in DENSE for t in (1, 101)]
        pd.DataFrame(dense, columns=["layer", "tokens", "time_us"]).to_csv(
            out / "dense.csv", index=False)
        pd.DataFrame([(name, n, 9 + n) for name in PER_SEQUENCE for n in (1, 9)],
                     columns=["layer", "sequences", "time_us"]).to_csv(
            out / "per_sequence.csv", index=False)
        attention_rows(drop).to_csv(out / "attention.csv", index=False)
        if skew is not None:
            pd.DataFrame([(0, "n<=2", "sr<=70%", "kvB<=1k", "kp=0", skew, 4)],
                         columns=["pc", "n_label", "skew_rate_label", "kv_big_label",
                                  "kp_label", "alpha", "n_samples"]).to_csv(
                out / "skew_fit.csv", index=False)
    (variant / "meta.yaml").write_text(yaml.safe_dump(meta))
    return folder


def toy(tmp_path, tp=1, **options) -> LayerProfileTiming:
    folder = write_profile(tmp_path, tps=(1, 2) if tp > 1 else (1,), **options)
    return LayerProfileTiming(str(folder), num_layers=LAYERS, hidden_size=HIDDEN, tp=tp,
                              model="test/Tiny", allreduce_bandwidth_gbps=1.0,
                              allreduce_latency_us=1.0)


def shape(new_tokens, context) -> BatchShape:
    new_tokens = np.asarray(new_tokens, dtype=np.int64)
    return BatchShape(new_tokens, np.asarray(context, dtype=np.int64), new_tokens > 1)


#: Token-wise layers a step runs: embedding and final norm once, 8 per decoder layer.
DENSE_RUNS = 2 + 8 * LAYERS


def test_one_decode_by_hand(tmp_path):
    # 34 token-wise layers at 1 token (1 us), LM head + sampler at 1 sequence (10 us each),
    # attention at one decode of 32 cached tokens: 2 + 1 * (1 + 32/16) = 5 us per layer.
    expected_ns = DENSE_RUNS * 1000 + 2 * 10_000 + LAYERS * 5000
    assert toy(tmp_path).duration(shape([1], [32])) == pytest.approx(expected_ns * 1e-9, abs=0)


def test_one_prefill_by_hand(tmp_path):
    # 16 tokens: 1.15 us per token-wise layer; attention 2 + 0.5 = 2.5 us per layer.
    expected_ns = DENSE_RUNS * 1150 + 2 * 10_000 + LAYERS * 2500
    assert toy(tmp_path).duration(shape([16], [0])) == pytest.approx(expected_ns * 1e-9, abs=0)


def test_a_mixed_batch_by_hand(tmp_path):
    # A 16-token chunk on 64 cached tokens and two decodes of 16 and 48: 18 tokens (1.17 us),
    # 3 sequences (12 us), attention at mean decode context 32:
    # 2 + 0.5 + 0.25 + 2 * (1 + 2) = 8.75 us per layer (no skew fit in this profile).
    expected_ns = DENSE_RUNS * 1170 + 2 * 12_000 + LAYERS * 8750
    price = toy(tmp_path).duration(shape([16, 1, 1], [64, 16, 48]))
    assert price == pytest.approx(expected_ns * 1e-9, abs=0)


def test_tensor_parallel_adds_two_ring_all_reduces_per_layer(tmp_path):
    # 1 token x 64 hidden x 2 bytes over 2 GPUs: each of the 2 (p - 1) = 2 ring steps takes
    # 1 us + 128 / (2 * 1e9) s; two all-reduces per layer.
    step = 1e-6 + 128 / (2 * 1e9)
    single = toy(tmp_path / "a").duration(shape([1], [32]))
    parallel = toy(tmp_path / "b", tp=2).duration(shape([1], [32]))
    assert parallel - single == pytest.approx(2 * LAYERS * 2 * step, rel=1e-12)


def test_skew_fit_blends_toward_the_longest_decode(tmp_path):
    # Decodes of 16 and 48: mean 32 (8 us per layer for 2 decodes), longest 48 (10 us);
    # skew rate (32 - 16) / 32 = 0.5 falls in sr<=70%, where the fit's alpha is 0.5.
    base = DENSE_RUNS * 1010 + 2 * 11_000
    without = toy(tmp_path / "a").duration(shape([1, 1], [16, 48]))
    with_skew = toy(tmp_path / "b", skew=0.5).duration(shape([1, 1], [16, 48]))
    assert without == pytest.approx((base + LAYERS * 8000) * 1e-9, abs=0)
    assert with_skew == pytest.approx((base + LAYERS * 9000) * 1e-9, abs=0)
    # Equal contexts have no skew to correct.
    equal = toy(tmp_path / "c", skew=0.5).duration(shape([1, 1], [32, 32]))
    assert equal == pytest.approx((base + LAYERS * 8000) * 1e-9, abs=0)


def test_a_missing_slice_takes_the_nearest_measured_one(tmp_path):
    # No slice at (chunk 16, 2 decodes): the corner falls back to (16, 1), the nearest one.
    timing = toy(tmp_path, drop={(16, 2)})
    price = timing.duration(shape([16, 1, 1], [64, 16, 48]))
    expected_ns = DENSE_RUNS * 1170 + 2 * 12_000 + LAYERS * int(attention_us(16, 64, 1, 32) * 1000)
    assert price == pytest.approx(expected_ns * 1e-9, abs=0)


def test_prices_grow_with_context_tokens_and_requests(tmp_path):
    """From the smallest profiled chunk up (below it the chunk-0 corner is the nearest
    measured slice, a decode's, as in LLMServingSim)."""
    timing = toy(tmp_path)
    by_context = [timing.duration(shape([1], [c])) for c in (16, 20, 32, 48, 100)]
    by_tokens = [timing.duration(shape([t], [0])) for t in (16, 50, 101, 300)]
    by_requests = [timing.duration(shape([1] * n, [32] * n)) for n in (1, 2, 3, 5)]
    for series in (by_context, by_tokens, by_requests):
        assert all(a < b for a, b in zip(series, series[1:], strict=False)), series


def test_an_empty_batch_costs_nothing(tmp_path):
    assert toy(tmp_path).duration(shape([], [])) == 0.0


# --------------------------------------------------------------------------- bad input
def test_missing_folder_tp_or_model_are_config_errors(tmp_path):
    folder = write_profile(tmp_path)
    with pytest.raises(ConfigError, match="no profile folder"):
        LayerProfileTiming(str(tmp_path / "nowhere"), num_layers=2, hidden_size=8)
    with pytest.raises(ConfigError, match="has no tp2 folder .it has tp1"):
        LayerProfileTiming(str(folder), num_layers=2, hidden_size=8, tp=2,
                           allreduce_bandwidth_gbps=1.0)
    with pytest.raises(ConfigError, match="is of 'test/Tiny', not 'meta-llama/Llama-3.1-8B'"):
        LayerProfileTiming(str(folder), num_layers=2, hidden_size=8,
                           model="meta-llama/Llama-3.1-8B")
    with pytest.raises(ConfigError, match="allreduce_bandwidth_gbps is required"):
        LayerProfileTiming(str(write_profile(tmp_path / "two", tps=(1, 2))), num_layers=2,
                           hidden_size=8, tp=2)


def test_a_missing_layer_names_the_file_and_the_layer(tmp_path):
    rows = [(name, t, 1.0) for name in DENSE if name != "act_fn" for t in (1, 2)]
    folder = write_profile(tmp_path, dense_rows=rows)
    with pytest.raises(InputError, match=r"tp1/dense.csv: no rows for layer 'act_fn'"):
        LayerProfileTiming(str(folder), num_layers=2, hidden_size=8)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda text: text.replace(",4.0\n", ",abc\n", 1),
     r"line 2, column time_us: 'abc' is not a finite"),
    (lambda text: text.replace("n_decode", "decodes"), "line 1: missing column.s. n_decode"),
    (lambda text: text.replace("\n16,", "\n-16,", 1),
     r"column prefill_chunk: '-16' is not a whole"),
    (lambda text: text.replace("\n16,", "\n16.5,", 1),
     r"column prefill_chunk: '16.5' is not a whole"),
])
def test_a_malformed_attention_csv_names_file_line_and_column(tmp_path, edit, message):
    folder = write_profile(tmp_path)
    path = folder / "bf16" / "tp1" / "attention.csv"
    path.write_text(edit(path.read_text()))
    with pytest.raises(InputError, match=message) as caught:
        LayerProfileTiming(str(folder), num_layers=2, hidden_size=8)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_cli_reports_a_missing_profile_on_one_line(tmp_path):
    from tests.test_cli import run_cli

    proc = run_cli("model=llama3_1_8b", "hardware=h100x1", "timing=layer_profile",
                   "workload.n=5", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: timing.profile_dir: no profile folder"), last
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------- the shared profiles, LLMServingSim's rules
class Reference:
    """LLMServingSim's lookups (serving/core/trace_generator.py: ``_lookup_1d``,
    ``_axis_bracket``, ``_attn_slice_lookup``, ``_lookup_attention``,
    ``_lookup_attention_with_skew``, ``_skew_alpha``) transcribed over plain dicts."""

    def __init__(self, variant: Path, tp: int, layers: int):
        folder = variant / f"tp{tp}"
        self.layers = layers
        ns = lambda us: max(1, int(round(us * 1000)))  # noqa: E731
        self.ops = {}
        for file, key in (("dense.csv", "tokens"), ("per_sequence.csv", "sequences")):
            for row in pd.read_csv(folder / file).itertuples():
                self.ops.setdefault(row.layer, {})[getattr(row, key)] = ns(row.time_us)
        self.slices = {}
        for r in pd.read_csv(folder / "attention.csv").itertuples():
            self.slices.setdefault((r.prefill_chunk, r.n_decode), {}).setdefault(
                r.kv_prefill, {})[r.kv_decode] = ns(r.time_us)
        self.pcs = sorted({p for p, _ in self.slices})
        self.nds = sorted({n for _, n in self.slices})
        meta = yaml.safe_load((variant / "meta.yaml").read_text())
        fit = meta.get("skew_fit") or {}
        self.alphas, self.default = {}, 0.0
        if fit.get("enabled"):
            self.axes = fit["bucket_axes"]
            self.default = fit["per_tp"][tp]["alpha_default"]
            for r in pd.read_csv(folder / "skew_fit.csv").itertuples():
                key = f"pc={r.pc}|{r.n_label}|{r.skew_rate_label}|{r.kv_big_label}|{r.kp_label}"
                self.alphas[key] = r.alpha

    @staticmethod
    def bracket(values, query):
        if len(values) == 1 or query <= values[0]:
            return 0, 0, 0.0
        idx = bisect.bisect_right(values, query)
        lo, hi = (len(values) - 2, len(values) - 1) if idx >= len(values) else (idx - 1, idx)
        return lo, hi, (query - values[lo]) / (values[hi] - values[lo])

    def line(self, table, query):
        keys = sorted(table)
        lo, hi, t = self.bracket(keys, query)
        return table[keys[lo]] + t * (table[keys[hi]] - table[keys[lo]])

    def slice_value(self, pc, nd, kp, kd):
        rows = self.slices[(pc, nd)]
        kps = sorted(rows)
        lo, hi, t = self.bracket(kps, kp)
        low = self.line(rows[kps[lo]], kd) if len(rows[kps[lo]]) > 1 else \
            next(iter(rows[kps[lo]].values()))
        if lo == hi:
            return low
        high = self.line(rows[kps[hi]], kd) if len(rows[kps[hi]]) > 1 else \
            next(iter(rows[kps[hi]].values()))
        return low + t * (high - low)

    def attention(self, pc, kp, nd, kd):
        p0, p1, tp = self.bracket(self.pcs, pc)
        n0, n1, tn = self.bracket(self.nds, nd)

        def corner(p, n):
            if (p, n) not in self.slices:
                p, n = min(sorted(self.slices), key=lambda k: (k[0] - p) ** 2 + (k[1] - n) ** 2)
            return self.slice_value(p, n, kp, kd)

        c00, c01 = corner(self.pcs[p0], self.nds[n0]), corner(self.pcs[p0], self.nds[n1])
        c10, c11 = corner(self.pcs[p1], self.nds[n0]), corner(self.pcs[p1], self.nds[n1])
        v0, v1 = c00 + tn * (c01 - c00), c10 + tn * (c11 - c10)
        return max(1, int(v0 + tp * (v1 - v0)))

    def label(self, axis, value):
        bins, labels = self.axes[f"{axis}_bins"], self.axes[f"{axis}_labels"]
        return next((lab for i, lab in enumerate(labels) if value <= bins[i + 1]), labels[-1])

    def seconds(self, batch: BatchShape) -> float:
        prefill = batch.new_tokens > 1
        pc, kp = int(batch.new_tokens[prefill].sum()), int(batch.context[prefill].sum())
        decodes = [int(c) for c in batch.context[~prefill]]
        nd = len(decodes)
        mean = sum(decodes) // nd if nd else 0
        tokens, m = int(batch.new_tokens.sum()), batch.size
        per_layer = ARCHITECTURES["llama"]["per_layer"]
        total = sum(max(1, int(self.line(self.ops[name], tokens))) for name in
                    ARCHITECTURES["llama"]["per_step"])
        total += self.layers * sum(max(1, int(self.line(self.ops[n], tokens))) for n in per_layer)
        total += sum(max(1, int(self.line(self.ops[name], m))) for name in PER_SEQUENCE)
        t_mean = self.attention(pc, kp, nd, mean)
        attention = t_mean
        if self.alphas and nd > 1 and max(decodes) != mean:
            gap = max(decodes) - min(decodes)
            rate = min(max((mean - min(decodes)) / gap if gap else 0.5, 0.0), 1.0)
            key = (f"pc={pc}|{self.label('n', nd)}|{self.label('skew_rate', rate)}"
                   f"|{self.label('kv_big', max(decodes))}|{self.label('kp', kp)}")
            alpha = self.alphas.get(key, self.default)
            t_max = self.attention(pc, kp, nd, max(decodes))
            if alpha != 0.0 and t_max > t_mean:
                attention = max(1, int(round(t_mean + alpha * (t_max - t_mean))))
        return (total + self.layers * attention) * 1e-9


def random_batches(rng, count):
    for _ in range(count):
        decodes = int(rng.integers(0, 300))
        chunks = int(rng.integers(0, 3)) if decodes else int(rng.integers(1, 3))
        new = np.concatenate((rng.integers(2, 1500, chunks), np.ones(decodes, dtype=np.int64)))
        context = np.concatenate((rng.integers(0, 6000, chunks) * rng.integers(0, 2, chunks),
                                  rng.integers(1, 20000, decodes)))
        yield BatchShape(new.astype(np.int64), context.astype(np.int64), new > 1)


@pytest.mark.parametrize("gpu", ["RTX4090", "RTXPRO6000"])
def test_shared_profiles_price_as_llmservingsim_does(gpu):
    folder = DATA_DIR / "llmservingsim_perf" / gpu / "meta-llama" / "Llama-3.1-8B"
    if not folder.is_dir():
        pytest.skip(f"no per-layer profile at {folder}")
    timing = LayerProfileTiming(str(folder), num_layers=32, hidden_size=4096,
                                model="meta-llama/Llama-3.1-8B")
    reference = Reference(folder / "bf16", 1, 32)
    assert timing.describe()["skew"]["enabled"] is bool(reference.alphas)
    for batch in random_batches(np.random.default_rng(7), 300):
        assert timing.duration(batch) == pytest.approx(reference.seconds(batch), abs=0), batch


def test_shared_profile_composes_from_model_and_hardware(data_dir):
    from hydra.utils import instantiate

    from replay.config import compose_config

    cfg = compose_config([f"data_dir={data_dir}", "model=llama3_1_8b", "hardware=rtxpro6000x2",
                          "timing=layer_profile"])
    timing = instantiate(cfg.timing)
    info = timing.describe()
    assert (timing.tp, info["architecture"]) == (2, "llama")
    assert info["allreduce"]["bandwidth_gbps"] == 64
    assert all(len(f["sha256"]) == 64 for f in info["files"])
    # The same step on two GPUs: a half-size layer each plus all-reduces.
    single = instantiate(compose_config([f"data_dir={data_dir}", "model=llama3_1_8b",
                                         "hardware=rtxpro6000x1", "timing=layer_profile"]).timing)
    decode = shape([1] * 64, [1000] * 64)
    assert 0 < timing.duration(decode) < single.duration(decode)


def test_the_step_price_runs_inside_compiled_code(tmp_path):
    """The compiled engine calls the step price from its own nopython loop."""
    from numba import njit

    from replay.timing.layer_profile_step import layer_profile_seconds

    @njit
    def two_steps(new_tokens, context, is_prefill, tables):
        return (layer_profile_seconds(new_tokens, context, is_prefill, 1, *tables)
                + layer_profile_seconds(new_tokens, context, is_prefill, 3, *tables))

    timing = toy(tmp_path)
    batch = shape([16, 1, 1], [64, 16, 48])
    compiled = two_steps(batch.new_tokens, batch.context, batch.is_prefill,
                         timing.tables.arguments())
    first = BatchShape(batch.new_tokens[:1], batch.context[:1], batch.is_prefill[:1])
    assert compiled == timing.duration(first) + timing.duration(batch)
