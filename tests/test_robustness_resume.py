"""Issue 45 items 2 and 8: what a resume or a reproduction reuses is verified all the way
down: the summary itself (an edited value is not reported as the result), the kvsched
version that wrote it, and, in a reproduction's up-to-date check, every run's tables."""

from __future__ import annotations

import json

import pytest

from replay.config import compose_config
from replay.experiments.targets import MANIFEST, TARGETS
from replay.reproduce import Tally, config_sha256, run_summaries, run_target
from replay.reproduce import stale_reason as target_stale_reason
from replay.run import TABLES, run
from replay.storage.outputs import (
    DIGEST_KEY,
    code_version,
    stale_reason,
    summary_digest,
    write_summary,
)

SMALL = ["workload=synthetic", "workload.n=6", "arrivals=all_at_once", "timing=unit",
         "kv.tokens=200", "engine.fast_forward=false"]


@pytest.fixture
def finished(tmp_path):
    """``(cfg, folder, summary)``: a small run, finished."""
    cfg = compose_config(SMALL)
    summary = run(cfg, tmp_path / "run")
    return cfg, tmp_path / "run", summary


def resolved(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def edit(folder, change) -> None:
    path = folder / "summary.json"
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary, indent=1))


def test_a_finished_run_verifies_and_is_reused(finished):
    cfg, folder, summary = finished
    assert stale_reason(folder, resolved(cfg), TABLES) is None
    written = {path.name: (path.read_bytes(), path.stat().st_mtime_ns)
               for path in folder.iterdir() if path.is_file()}
    run(cfg, folder)
    assert {path.name: (path.read_bytes(), path.stat().st_mtime_ns)  # reused: nothing rewritten
            for path in folder.iterdir() if path.is_file()} == written


def test_an_edited_value_is_recomputed_not_reported(finished):
    cfg, folder, summary = finished
    edit(folder, lambda s: s.update(tel=1.0))
    assert stale_reason(folder, resolved(cfg), TABLES) == (
        "its summary.json was changed after the run wrote it (its digest differs)")
    again = run(cfg, folder)
    assert again["tel"] == summary["tel"] != 1.0
    assert json.loads((folder / "summary.json").read_text())["tel"] == summary["tel"]


def test_a_summary_of_another_kvsched_version_is_not_reused(finished):
    cfg, folder, _ = finished

    def older(summary):
        summary["packages"]["kvsched"] = "0.0.9"
        summary[DIGEST_KEY] = summary_digest(summary)  # a consistent record of another version

    edit(folder, older)
    assert stale_reason(folder, resolved(cfg), TABLES) == (
        f"it was written by kvsched 0.0.9, and this is kvsched {code_version()}")
    assert run(cfg, folder)["packages"]["kvsched"] == code_version()


def test_a_summary_without_its_digest_is_not_trusted(finished):
    cfg, folder, _ = finished
    edit(folder, lambda s: s.pop(DIGEST_KEY))
    assert stale_reason(folder, resolved(cfg), TABLES) == (
        "its summary.json records no digest of its own content (written by an older version), "
        "so it cannot be verified")


def test_the_digest_survives_non_finite_numbers(tmp_path):
    written = write_summary(tmp_path / "summary.json", {"tel": float("inf"), "n": 3})
    read = json.loads((tmp_path / "summary.json").read_text())
    assert read == written and read["tel"] is None and read["non_finite"] == {"tel": "inf"}
    assert summary_digest(read) == read[DIGEST_KEY]


def test_a_reproduction_is_not_up_to_date_over_a_damaged_run_table(tmp_path):
    """The target's record holds (same configs, same run summaries); only the table, cut
    to 500 bytes inside the target, is wrong, and the check names it."""
    out_dir = tmp_path / "c3"
    cfg = compose_config(SMALL)
    run(cfg, out_dir / "runs" / "job")
    (out_dir / MANIFEST).write_text(json.dumps({
        "config_sha256": config_sha256(TARGETS["c3"], False),
        "runs": run_summaries(out_dir / "runs"), "outputs": []}))
    assert target_stale_reason("c3", out_dir, False) is None
    table = out_dir / "runs" / "job" / "requests.parquet"
    size = table.stat().st_size
    table.write_bytes(table.read_bytes()[:500])
    assert target_stale_reason("c3", out_dir, False) == (
        f"run runs/job: its requests.parquet has 500 bytes, {size} were written")
    # What the target then reruns: the run's own resume check recomputes that run, and its
    # figures are drawn again from the new summary.
    run(cfg, out_dir / "runs" / "job")
    assert table.stat().st_size == size
    assert target_stale_reason("c3", out_dir, False) == (
        "its runs changed since the figures were drawn")


@pytest.mark.slow
def test_a_target_reruns_only_the_run_whose_table_was_damaged(tmp_path):
    first = Tally()
    run_target("c3", outputs_root=tmp_path, tally=first)
    table = next((tmp_path / "c3" / "runs").glob("*/requests.parquet"))
    table.write_bytes(table.read_bytes()[:500])
    again = Tally()
    run_target("c3", outputs_root=tmp_path, tally=again)
    assert (again.up_to_date, again.ran, again.reused) == (False, 1, first.ran - 1)
    assert target_stale_reason("c3", tmp_path / "c3", False) is None


def test_a_failed_job_is_run_again(tmp_path):
    """Issue 45 item 7: a sweep job that raised leaves a summary that a resume never reuses."""
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "message": "x"}))
    assert stale_reason(tmp_path, {}, TABLES) == "it failed before (status failed)"
