"""Issue 45 item 1: a corrupt Vidur profile is one error line before any training.

A file ``traces.fetch`` knows is checked by size and SHA-256 wherever it is read; any
other profile is checked for what Vidur 0.0.26 reads of it (columns, rows cut short,
finite non-negative times, rows for the model and parallelism); the tables exported from
a trained predictor must hold finite non-negative times too.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from replay.errors import InputError
from replay.storage.data import require_file
from replay.timing import profiles_fetch, vidur
from replay.timing.vidur_spec import DECODE_TIME, MLP_TIMES, PREFILL_TIME, check_profile
from replay.timing.vidur_tables import VidurTables
from tests.conftest import DATA_DIR, REPO
from tests.test_cli import run_cli

MLP_7B = "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
ATTENTION_7B = "compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"
#: The rows Vidur keeps of a Llama-2-7B attention profile at TP 1, block size 16.
SELECT = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16,
          "num_tensor_parallel_workers": 1}


def attention_profile(path, rows: int = 4) -> pd.DataFrame:
    """A small attention profile in Vidur's format: ``rows`` decode rows then as many
    prefill rows (a time column is empty on the rows of the other kind, as in Vidur's)."""
    decode = np.arange(2 * rows) < rows
    frame = pd.DataFrame({**{k: v for k, v in SELECT.items()},
                          "batch_size": np.where(decode, 1 + np.arange(2 * rows), 1),
                          "prefill_chunk_size": np.where(decode, 0, 32 * (1 + np.arange(2 * rows))),
                          "kv_cache_size": 32,
                          DECODE_TIME: np.where(decode, 0.01, np.nan),
                          PREFILL_TIME: np.where(decode, np.nan, 0.02),
                          "is_prefill": ~decode, "profile_method": "kineto"})
    frame.to_csv(path, index=False)
    return frame


# ------------------------------------------------------------ files traces.fetch knows
@pytest.mark.parametrize("content", [b"", b"x" * 706_614])
def test_a_known_profile_that_was_cut_or_changed_is_refused_by_its_hash(tmp_path, content):
    path = tmp_path / "profiling" / MLP_7B
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    differs = ("0 bytes where the validated copy has 706,614" if not content else
               "SHA-256 ")
    with pytest.raises(InputError) as caught:
        require_file(path, "Vidur mlp profile")
    assert str(caught.value).startswith(
        f"Vidur mlp profile: {path} is not the file traces.fetch downloads as "
        f"vidur/profiling/{MLP_7B} ({differs}")
    assert str(caught.value).endswith("it was cut short or changed; download it again, or "
                                      "give an edited copy another name")


def test_every_profile_traces_fetch_knows_is_checked_below_any_profile_dir(tmp_path):
    for remote in profiles_fetch.PROFILE_FILES:
        path = tmp_path / "elsewhere" / remote.relpath.removeprefix("vidur/profiling/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("n_head\n1\n")
        with pytest.raises(InputError, match="is not the file traces.fetch downloads as"):
            require_file(path, "profile")


def test_a_profile_traces_fetch_does_not_know_is_not_hash_checked(tmp_path):
    path = tmp_path / "profiling" / ATTENTION_7B   # Git LFS only: placed by hand
    path.parent.mkdir(parents=True)
    path.write_text("anything\n")
    assert require_file(path, "profile") == path


# ------------------------------------------------------------ what Vidur reads
def test_a_well_formed_attention_profile_passes(tmp_path):
    attention_profile(tmp_path / "a.csv")
    check_profile(tmp_path / "a.csv", "attention", SELECT)


@pytest.mark.parametrize(("damage", "message"), [
    ("empty", "Vidur attention profile: {path} is empty (not even a header line)"),
    ("garbage", "Vidur attention profile: {path}: missing column(s) ['n_embd', 'n_q_head', "
                "'n_kv_head', 'block_size', 'num_tensor_parallel_workers', 'batch_size', "
                "'prefill_chunk_size', 'kv_cache_size', 'time_stats.attn_decode.median', "
                "'time_stats.attn_prefill.median'] that Vidur reads (the file has 2 columns: "
                "['garbage', 'more']...)"),
    ("binary", "Vidur attention profile: {path} is binary data, not CSV text"),
    ("cut", "Vidur attention profile: {path} line 9: 4 field(s) where the header has 12; the "
            "row is cut short (an interrupted copy or download?)"),
    ("nan", "Vidur attention profile: {path} line 3: field 'time_stats.attn_decode.median' = "
            "empty is not a finite number >= 0 (1 such row(s)); Vidur would train on it"),
    ("negative", "Vidur attention profile: {path} line 7: field "
                 "'time_stats.attn_prefill.median' = -0.5 is not a finite number >= 0 (1 such "
                 "row(s)); Vidur would train on it"),
    ("text", "Vidur attention profile: {path} line 2: field 'kv_cache_size' = 'many' is not a "
             "finite number >= 0 (1 such row(s)); Vidur would train on it"),
    ("other_model", "Vidur attention profile: {path} has no rows for n_embd=4096, n_q_head=32, "
                    "n_kv_head=32, block_size=16, num_tensor_parallel_workers=1, the model and "
                    "parallelism asked for; Vidur would have nothing to train on"),
    ("decode_only", "Vidur attention profile: {path} has no prefill rows (prefill_chunk_size > "
                    "0) for n_embd=4096, n_q_head=32, n_kv_head=32, block_size=16, "
                    "num_tensor_parallel_workers=1; Vidur trains a model on each"),
])
def test_a_damaged_profile_is_one_error_naming_file_line_and_field(tmp_path, damage, message):
    path = tmp_path / "attention.csv"
    frame = attention_profile(path)
    if damage == "empty":
        path.write_text("")
    elif damage == "garbage":
        path.write_text("garbage,more\n1,2\n")
    elif damage == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    elif damage == "cut":
        path.write_text(path.read_text()[:-30])
    elif damage == "nan":
        frame.loc[1, DECODE_TIME] = np.nan
    elif damage == "negative":
        frame.loc[5, PREFILL_TIME] = -0.5
    elif damage == "text":
        frame["kv_cache_size"] = frame["kv_cache_size"].astype(object)
        frame.loc[0, "kv_cache_size"] = "many"
    elif damage == "other_model":
        frame["n_embd"] = 8192
    elif damage == "decode_only":
        frame = frame[frame["prefill_chunk_size"] == 0]
    if damage in ("nan", "negative", "text", "other_model", "decode_only"):
        frame.to_csv(path, index=False)
    with pytest.raises(InputError) as caught:
        check_profile(path, "attention", SELECT)
    assert str(caught.value) == message.format(path=path)


def test_an_mlp_time_may_be_empty_only_where_vidur_takes_zero(tmp_path):
    columns = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008,
               "vocab_size": 32768, "num_tensor_parallel_workers": 1, "num_tokens": 8,
               "use_gated_mlp": True, **dict.fromkeys(MLP_TIMES, 0.1)}
    path = tmp_path / "mlp.csv"
    pd.DataFrame([{**columns, "time_stats.add.median": np.nan}]).to_csv(path, index=False)
    check_profile(path, "mlp")  # Vidur fills an empty add time with 0
    pd.DataFrame([{**columns, "time_stats.mlp_act.median": np.nan}]).to_csv(path, index=False)
    with pytest.raises(InputError, match="line 2: field 'time_stats.mlp_act.median' = empty"):
        check_profile(path, "mlp")


# ------------------------------------------------------------ the tables Vidur's predictor gives
def tables(**cells) -> dict:
    token, decode, prefill = np.full(9, np.nan), np.full((3, 2), np.nan), np.full((2, 3), np.nan)
    token[1:], decode[1:], prefill[:, 1:] = 0.5, 0.1, 0.2
    for name, (where, value) in cells.items():
        {"token_ms": token, "decode_ms": decode, "prefill_ms": prefill}[name][where] = value
    return {"token_ms": token, "decode_ms": decode, "prefill_ms": prefill, "num_layers": 2,
            "kv_granularity": 32}


def test_tables_with_a_negative_or_missing_time_are_refused(tmp_path):
    VidurTables(**tables())  # NaN only in the unreachable row and column
    with pytest.raises(InputError, match=r"^Vidur's predictions: decode_ms\[2, 1\] is -0.3 ms "
                                         r"\(1 such cells\), not a finite time >= 0"):
        VidurTables(**tables(decode_ms=((2, 1), -0.3)))
    path = tmp_path / "tables.npz"
    np.savez(path, **tables(prefill_ms=((0, 2), np.nan)))
    with pytest.raises(InputError, match=f"cached in {path}: remove its folder to rebuild"):
        VidurTables.load(path)


def saved_tables(path):
    VidurTables(**tables()).save(path)
    return path


@pytest.mark.parametrize(("damage", "reason"), [
    ("cut", "BadZipFile: File is not a zip file"),
    ("empty", "EOFError: No data left in file"),
    ("no_array", "KeyError: 'decode_ms is not a file in the archive'"),
])
def test_a_damaged_cached_table_is_one_error_saying_how_to_rebuild(tmp_path, damage, reason):
    path = saved_tables(tmp_path / "tables.npz")
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:300])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        arrays = dict(np.load(path))
        del arrays["decode_ms"]
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)
    with pytest.raises(InputError) as caught:
        VidurTables.load(path)
    assert str(caught.value) == (f"timing.vidur: the cached tables {path} cannot be read "
                                 f"({reason}); remove its folder to rebuild them")


@pytest.mark.parametrize(("content", "reason"), [
    (None, "No such file or directory"),
    ("{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_a_damaged_cached_build_record_is_one_error_saying_how_to_rebuild(tmp_path, content,
                                                                          reason):
    path = tmp_path / "build.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as caught:
        vidur._cached_json(path)
    assert str(caught.value) == (f"timing.vidur: the cached build.json in {tmp_path} cannot be "
                                 f"read ({reason}); remove that folder to rebuild it")


# ------------------------------------------------------------ end to end
needs_profiles = pytest.mark.skipif(not (DATA_DIR / "vidur" / "profiling" / MLP_7B).is_file(),
                                    reason="Vidur profiles not in the data directory")


@pytest.mark.slow
@needs_profiles
@pytest.mark.parametrize("damage", ["empty_mlp", "negative_attention"])
def test_the_command_line_refuses_a_corrupt_profile_before_training(tmp_path, damage):
    profiles = tmp_path / "profiling"
    (profiles / MLP_7B).parent.mkdir(parents=True)
    shutil.copyfile(DATA_DIR / "vidur" / "profiling" / MLP_7B, profiles / MLP_7B)
    frame = attention_profile(profiles / ATTENTION_7B)
    if damage == "empty_mlp":
        (profiles / MLP_7B).write_text("")
        expected = f"{profiles / MLP_7B} is not the file traces.fetch downloads as"
    else:
        frame.loc[5, PREFILL_TIME] = -0.5
        frame.to_csv(profiles / ATTENTION_7B, index=False)
        expected = (f"Vidur attention profile: {profiles / ATTENTION_7B} line 7: field "
                    f"'time_stats.attn_prefill.median' = -0.5 is not a finite number >= 0")
    done = run_cli("timing=vidur", "model=llama2_7b", "hardware=a100x1", "timing.attention=profile",
                   f"timing.profile_dir={profiles}", f"timing.cache_dir={tmp_path / 'cache'}",
                   "workload.n=5", f"hydra.run.dir={tmp_path / 'run'}", cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], done.stderr
    # Refused before a build was announced or its cache folder made: nothing was written.
    assert "building the random_forest predictor" not in done.stderr + done.stdout
    assert not (tmp_path / "cache").exists(), list((tmp_path / "cache").rglob("*"))
