"""Tiny-sized runs of every reproduction target, the make-like skip (manifest, run inputs,
outputs), the HTML report in a headless browser and the generated results pages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replay.experiments.plots.common import runs_under, save_figure
from replay.experiments.report import build_report, write_results_pages
from replay.experiments.targets import MANIFEST, TARGETS, Target
from replay.reproduce import Tally, run_target, stale_reason
from tests.conftest import DATA_DIR

#: Slow (every reproduction target, scaled down, and the report in a browser):
#: CI runs it, and so does `pytest -m slow`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """Run each quick target once per module: ``quick(name) -> (outputs, root)``.

    CI first runs ``python -m replay.reproduce all report --quick`` into the folder named by
    ``KVSCHED_QUICK_OUTPUTS``; the targets found there up to date are checked, not rerun.
    """
    given = os.environ.get("KVSCHED_QUICK_OUTPUTS")
    root = Path(given) if given else tmp_path_factory.mktemp("reproduce")
    done: dict[str, list] = {}

    def get(name: str):
        if TARGETS[name].needs_data and not (DATA_DIR / "vidur").is_dir():
            pytest.skip(f"target {name} needs the data directory ({DATA_DIR} is absent)")
        if name not in done:
            done[name] = run_target(name, quick=True, outputs_root=root)
        return done[name], root
    return get


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_quick_target_writes_figures_and_is_then_up_to_date(name, quick):
    outputs, root = quick(name)
    assert outputs
    for png in outputs:
        assert png.stat().st_size > 1000
        assert not pd.read_csv(png.with_suffix(".csv")).empty
    stamp = {p: p.stat().st_mtime_ns for p in outputs}
    assert run_target(name, quick=True, outputs_root=root) == outputs
    assert {p: p.stat().st_mtime_ns for p in outputs} == stamp


def test_c3_target_reproduces_the_worked_example(quick):
    (png,), root = quick("c3")
    table = pd.read_csv(png.with_suffix(".csv"))
    # The figure is drawn from the target's results table.
    kept = pd.read_parquet(root / "c3-quick" / "runs" / "results.parquet")
    assert sorted(kept["tel"]) == sorted(table["tel"])
    tel = dict(zip(table["run"], table["tel"], strict=True))
    # FCFS: 64 with the long prompt first, 45 after it; MC-SF 64 both ways; every
    # Sorted-F solver, Sorted-LP and LP-Swap 45 both ways.
    assert sorted(v for k, v in tel.items() if "=fcfs," in k) == [45, 64]
    assert [v for k, v in tel.items() if "=mcsf," in k] == [64, 64]
    others = [v for k, v in tel.items() if "=fcfs," not in k and "=mcsf," not in k]
    assert others == [45] * 10


def test_a3_small_puts_mcsf_first_under_memory_pressure(quick):
    outputs, _ = quick("a3_small")
    curves = pd.read_csv(next(p for p in outputs if p.name == "latency_of_first_n_rate50.png")
                         .with_suffix(".csv"))
    final = curves[curves["n"] == curves["n"].max()].set_index("policy")
    assert len(final) == 8  # MC-SF, FCFS, two alpha-protection, four alpha/beta-clearing
    completed = final[final["status"] == "completed"]
    assert completed["mean_latency"].idxmin() == "MC-SF"
    unfinished = final[final["status"] != "completed"]
    assert (unfinished["n_completed"] < unfinished["n"]).all()


def test_a4_statistics_account_for_every_seed(quick):
    outputs, _ = quick("a4")
    assert sorted(p.name for p in outputs) == ["seed_statistics.png",
                                               "seed_statistics_back.png"]
    for png in outputs:
        stats = pd.read_csv(png.with_suffix(".csv"), index_col="policy")
        assert len(stats) == 8
        assert ((stats["count"] + stats["n_livelock"]) == 3).all()  # quick: seeds 0, 1, 2
        finished = stats[stats["count"] > 0]
        assert (finished["min"] <= finished["mean"]).all()
        assert (finished["mean"] <= finished["max"]).all()
        assert stats.loc["MC-SF", "ratio_to_mcsf"] == 1.0
        assert stats.loc["MC-SF", "paper_mean"] == 32.112


def test_a3_plots_separate_runs_per_n_with_slope_ratios(quick):
    outputs, _ = quick("a3_small")
    runs = pd.read_csv(next(p for p in outputs if p.name == "latency_vs_n_runs_rate50.png")
                       .with_suffix(".csv"))
    assert sorted(runs["n"].unique()) == [60, 120]
    assert len(runs) == 16  # eight policy settings x two n
    assert (runs.loc[runs["policy"] == "MC-SF", "slope_ratio_to_mcsf"] == 1.0).all()


def test_a7_reports_the_smallest_alpha_for_both_requeue_positions(quick):
    outputs, root = quick("a7_small")
    smallest = pd.read_csv(root / "a7_small-quick" / "runs" / "smallest_alpha.csv")
    assert sorted(smallest["requeue"].unique()) == ["back", "front"]
    assert sorted(smallest["rate"].unique()) == [10, 50]


def test_c1_table_puts_the_paper_beside_the_measured_and_the_lp_bound_below(quick):
    outputs, root = quick("c1")
    assert {p.name for p in outputs} == {"c1_tel.png"}
    run = root / "c1-quick" / "runs"
    assert "[paper 9763.0]" in (run / "table.md").read_text()
    trials = pd.read_csv(run / "trials.csv")
    assert set(trials["distribution"]) == {"uniform", "normal", "binomial", "exponential",
                                           "mixed"}
    tels = trials[[c for c in trials.columns if c.startswith("tel_")]]
    assert (tels.min(axis=1) >= trials["lp_bound"]).all()


def test_c2_has_every_policy_with_its_decision_time(quick):
    outputs, _ = quick("c2")
    latency = pd.read_csv(next(p for p in outputs if p.name == "c2_latency.png")
                          .with_suffix(".csv"))
    assert set(latency["policy"]) == {"FCFS (MC-Benchmark)", "MC-SF", "Sorted-LP", "LP-Swap",
                                      "Sorted-F (swap)", "Sorted-F (quantile)"}
    assert (latency["unfinished_runs"] == 0).all() and (latency["count"] == 2).all()
    decision = pd.read_csv(next(p for p in outputs if p.name == "c2_decision_time.png")
                           .with_suffix(".csv"))
    assert (decision["mean"] > 0).all()


def test_d2_exact_predictions_make_the_interval_variants_sorted_f(quick):
    outputs, _ = quick("d2")
    interval = pd.read_csv(next(p for p in outputs if p.name == "d2_alpha.png")
                           .with_suffix(".csv"))
    exact = interval[interval["alpha"] == 1]
    assert len(exact) == 3 and exact["mean_latency"].nunique() == 1
    assert (exact["mean_evictions"] == 0).all()
    point = pd.read_csv(next(p for p in outputs if p.name == "d2_sigma.png").with_suffix(".csv"))
    assert set(point["sigma"]) == {0, 0.5}


def test_e1_puts_the_peers_errors_beside_kvsched_and_each_factor_beside_its_check(quick):
    outputs, _ = quick("e1")
    names = {p.name: p for p in outputs}
    table = pd.read_csv(names["e1_RTXPRO6000.png"].with_suffix(".csv"))
    assert len(table) == 15 and table["metric"].iloc[0] == "TTFT Mean"
    assert {"vLLM (ms)", "LLMServingSim (ms)", "LLMServingSim diff %",
            "kvsched layer_profile (ms)", "kvsched layer_profile diff %"} <= set(table.columns)
    # the peer's differences are its summary.txt's, against the vLLM values we compute
    assert table["LLMServingSim diff %"].iloc[:2].tolist() == [-4.0, -8.6]
    peer = (table["LLMServingSim (ms)"] - table["vLLM (ms)"]) / table["vLLM (ms)"] * 100
    assert (peer - table["LLMServingSim diff %"]).abs().max() < 0.2
    factors = pd.read_csv(names["e1_factors.png"].with_suffix(".csv"))
    assert factors["change"].tolist() == ["none (the check)",
                                          "no_admission_gate (policy.reserve_full_isl=false)"]
    series = pd.read_csv(names["e1_RTXPRO6000_layer_profile_series.png"].with_suffix(".csv"))
    assert {"t", "kvsched_running", "vllm_running", "vllm_waiting"} <= set(series.columns)


def test_progress_counts_summaries_even_when_parallel_jobs_share_a_line(monkeypatch):
    from replay import reproduce

    lines = ['{"status": "completed", "tel": 1}{"status": "error", "message": "x"}\n',
             "[INFO] skipping d: finished run with the same config and inputs\n",
             '{"status": "completed"}\n']

    class FakeProcess:
        stdout = iter(lines)
        returncode = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(reproduce.subprocess, "Popen", lambda *a, **k: FakeProcess())
    tally = reproduce.Tally()
    assert reproduce._run_quietly(["-m"], "x", tally)[0] == 0
    assert (tally.ran, tally.reused, tally.failed) == (2, 1, 1)


def test_d1_puts_every_policy_in_every_setting_and_bounds_the_offline_panel(quick):
    (png,), _ = quick("d1")
    table = pd.read_csv(png.with_suffix(".csv"))
    assert set(table["panel"]) == {"online_70b", "trace_70b", "offline"}
    per_setting = table.groupby(["panel", "workload"])["policy"].nunique()
    assert (per_setting[["online_70b", "trace_70b"]] == 9).all()
    assert (per_setting["offline"] == 11).all()  # + Sorted-LP and LP-Swap
    online = table[table["panel"] != "offline"]
    assert online["lp_gap"].isna().all() and (online["timing"] == "vidur").all()
    offline = table[(table["panel"] == "offline") & (table["status"] == "completed")]
    assert (offline["lp_gap"] >= 0).all() and offline["lp_gap"].notna().all()
    assert set(table["kv"]) == {"explicit"}


def _browser():
    """Debian's headless Chromium through its chromedriver (CI installs both)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: .ci/run installs them")
        pytest.skip("no chromium/chromedriver here (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


IMAGES = ("return Array.from(document.images).map("
          "i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0])")


def _absolute_paths(text: str, *roots: Path) -> list[str]:
    """The folders of this machine that ``text`` names (it should name none)."""
    places = {str(r) for root in roots for r in (root, root.resolve())} | {str(Path.home())}
    return sorted(place for place in places if place in text)


def test_report_shows_every_figure_with_its_claims_in_a_headless_browser(quick, tmp_path):
    for name in ("c3", "b0"):  # no data needed; in CI every quick target is there already
        quick(name)
    _, root = quick("c3")
    report = build_report(TARGETS, root, tmp_path / "report", quick=True)
    ran = [name for name in TARGETS if (root / f"{name}-quick" / MANIFEST).is_file()]
    expected = sum(len(json.loads((root / f"{name}-quick" / MANIFEST).read_text())["figures"])
                   for name in ran)
    expected += (root.parent / "crosscheck" / "comparison.csv").is_file()  # CI runs D3 too
    browser = _browser()
    try:
        browser.get(report.as_uri())
        images = browser.execute_script(IMAGES)
        assert len(images) == expected >= 2
        assert all(loaded for _, loaded in images), [src for src, ok in images if not ok]
        text = browser.find_element("tag name", "body").text
        assert "MC-SF's TEL is 64 and Sorted-F's 45" in text and "agrees" in text
        assert "Data sources and caveats" in text and "kvsched " in text
        # The overview opens the page: one row per target that ran, with its state, run time
        # and verdicts, and the never-run targets in one line (no empty section for them).
        rows = browser.execute_script(
            "return Array.from(document.querySelectorAll('#overview-table tr.target-row'))"
            ".map(r => Array.from(r.cells).map(c => c.innerText))")
        by_target = {row[0]: row for row in rows}
        assert set(ran) <= set(by_target)
        assert by_target["c3"][1] == "done" and by_target["c3"][2].endswith(" s")
        assert by_target["c3"][4] == "agrees"
        never = [name for name in TARGETS if name not in ran]
        if never:
            line = browser.find_element("id", "never-run").text
            assert all(name in line for name in never)
            headings = browser.execute_script(
                "return Array.from(document.querySelectorAll('h2')).map(h => h.id)")
            assert not set(never) & set(headings)
        # No path of this machine: outputs are named relative to the outputs folder, data
        # files as $KVSCHED_DATA_DIR/...
        assert _absolute_paths(browser.page_source, root, tmp_path, DATA_DIR) == []
        # The check can fail: a figure missing beside the page is reported as not loaded.
        (tmp_path / "report" / "figures" / "c3" / "tel.png").unlink()
        browser.get(report.as_uri())
        broken = [src for src, ok in browser.execute_script(IMAGES) if not ok]
        assert broken == ["figures/c3/tel.png"]
    finally:
        browser.quit()


def test_results_pages_stamp_every_table_and_figure_and_name_no_machine_path(quick, tmp_path):
    quick("c3")
    _, root = quick("c3")
    pages = write_results_pages(TARGETS, root, tmp_path / "results", quick=True)
    assert [p.name for p in pages] == ["mcsf.md", "wait.md", "sorted-f.md", "harness.md",
                                       "engine.md", "time.md", "index.md"]
    # The index opens with the count of verdicts per series.
    index = (tmp_path / "results" / "index.md").read_text()
    assert "| series | claims | agrees | in shape |" in index
    assert "\n| [C: Sorted-F](sorted-f.md) | " in index
    assert "| c3 | 14 |" in (tmp_path / "results" / "time.md").read_text()
    text = (tmp_path / "results" / "sorted-f.md").read_text()
    assert "![c3: tel.png](figures/c3/tel.png)" in text
    assert (tmp_path / "results" / "figures" / "c3" / "tel.png").is_file()
    assert (tmp_path / "results" / "figures" / "c3" / "tel.csv").is_file()
    # The claims table and the figure each carry the commit, config and date.
    c3 = text.split("\n## c3\n")[1].split("\n## ")[0]
    stamps = c3.count("config: `experiment=c3_example")
    assert stamps >= 2 and c3.count("commit `") == stamps
    assert "| c3 " in text.replace("[c3](#c3)", "c3") and "agrees" in text
    for page in pages:
        assert _absolute_paths(page.read_text(), root, tmp_path, DATA_DIR) == []


TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
    f"{i},{10 + 7 * i % 50},{5 + 3 * i % 20}\n" for i in range(20))


def tel_figure(runs_dir: Path, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    runs = runs_under(runs_dir)
    fig, ax = plt.subplots()
    ax.bar(range(len(runs)), runs["tel"])
    return [save_figure(fig, out_dir / "tel.png", runs[["tel"]])]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A one-run target that reads a trace file of its own (unit time: seconds to run)."""
    data = tmp_path / "data"
    (data / "traces").mkdir(parents=True)
    # Not under a name traces.fetch knows: such a file must be the validated copy.
    (data / "traces" / "tiny.csv").write_text(TRACE)
    monkeypatch.setitem(TARGETS, "tiny", Target(
        "a trace file in unit time", ("workload=csv", f"workload.path={data}/traces/tiny.csv",
                                      "timing=unit", "arrivals=all_at_once", "kv=explicit",
                                      "kv.tokens=400", "policy=mcsf"),
        figures=(tel_figure,)))
    root = tmp_path / "reproduce"
    (png,) = run_target("tiny", outputs_root=root)
    tally = Tally()
    assert run_target("tiny", outputs_root=root, tally=tally) == [png]
    assert tally.up_to_date and stale_reason("tiny", root / "tiny", quick=False) is None
    return root, png, data / "traces" / "tiny.csv"


def test_a_changed_input_file_makes_the_target_run_again(tiny):
    root, png, trace = tiny
    before = pd.read_csv(png.with_suffix(".csv"))["tel"].item()
    trace.write_text(TRACE.replace("\n0,10,5\n", "\n0,300,100\n"))
    assert "input files changed" in stale_reason("tiny", root / "tiny", quick=False)
    tally = Tally()
    assert run_target("tiny", outputs_root=root, tally=tally) == [png]
    assert not tally.up_to_date and (tally.ran, tally.reused) == (1, 0)
    assert pd.read_csv(png.with_suffix(".csv"))["tel"].item() > before
    assert stale_reason("tiny", root / "tiny", quick=False) is None


def test_a_corrupted_figure_csv_makes_the_target_redraw(tiny):
    root, png, _ = tiny
    csv = png.with_suffix(".csv")
    good = csv.read_bytes()
    csv.write_text("garbage\n")
    assert stale_reason("tiny", root / "tiny", quick=False) == ("tel.csv changed since it was "
                                                                "written")
    tally = Tally()
    assert run_target("tiny", outputs_root=root, tally=tally) == [png]
    assert not tally.up_to_date and (tally.ran, tally.reused) == (0, 1)  # redrawn, not rerun
    assert csv.read_bytes() == good
    # A deleted output and an edited run summary are caught too.
    csv.unlink()
    assert stale_reason("tiny", root / "tiny", quick=False) == "tel.csv is gone"
    run_target("tiny", outputs_root=root)
    summary = next((root / "tiny" / "runs").rglob("summary.json"))
    summary.write_text(summary.read_text().replace('"status"', '"status" ', 1))
    assert "runs changed" in stale_reason("tiny", root / "tiny", quick=False)
    manifest = json.loads((root / "tiny" / MANIFEST).read_text())
    assert {o["path"] for o in manifest["outputs"]} == {"tel.png", "tel.csv"}


def test_time_breakdown_sums_the_replays_and_keeps_the_phases(tmp_path):
    from replay.reproduce import time_breakdown

    for job, (wall, loop, decide) in enumerate(((2.0, 1.5, 0.5), (3.0, 2.0, 1.0))):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "summary.json").write_text(json.dumps(
            {"wall_time_s": wall, "loop_time_s": loop, "decision_time_s": decide,
             "compile_time_s": 0.25}))
    (tmp_path / "study.json").write_text("{}")  # not a run summary: not counted
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "summary.json").write_text(json.dumps({"study": "x"}))  # no times
    (tmp_path / "h").mkdir()  # a study: its solver's time as statistics over its trials
    (tmp_path / "h" / "summary.json").write_text(json.dumps({
        "wall_time_s": 10.0, "solve_time_s": {"count": 4, "mean": 1.5, "max": 3.0},
        "lp_time_s": {"count": 4, "mean": 0.25}}))
    assert time_breakdown(tmp_path, 4.0, 0.5) == {
        "runs_s": 4.0, "figures_s": 0.5, "sum_wall_time_s": 15.0, "sum_loop_time_s": 3.5,
        "sum_decision_time_s": 1.5, "sum_compile_time_s": 0.5, "sum_solve_s": 7.0,
        "runs": 4}


def test_set_overrides_reach_every_run_and_the_manifest(tiny):
    root, png, _ = tiny
    settings = ("engine.fast_forward=false",)
    # The manifest was written without them: with them, the target is out of date.
    assert stale_reason("tiny", root / "tiny", quick=False, settings=settings) == \
        "its configs or overrides changed"
    # In a folder of its own (in the same one, a run's own resume check would reuse the
    # first runs: fast-forward changes nothing, so the run config is the same).
    reference = root.parent / "reference"
    run_target("tiny", outputs_root=reference, settings=settings)
    manifest = json.loads((reference / "tiny" / MANIFEST).read_text())
    assert manifest["config"]["overrides"][-1] == "engine.fast_forward=false"
    summary = json.loads(next((reference / "tiny" / "runs").rglob("summary.json")).read_text())
    assert summary["config"]["engine"]["fast_forward"] is False
    assert stale_reason("tiny", reference / "tiny", quick=False, settings=settings) is None


@pytest.mark.parametrize("setting, message", [
    ("engine.fast_forward=nope", "engine.fast_forward='nope' is not allowed"),
    ("engine.no_such_key=1", "engine.no_such_key: no such config key"),
    ("compiled", "--set 'compiled': expected KEY=VALUE")])
def test_a_bad_set_override_is_one_error_line(tmp_path, setting, message):
    done = subprocess.run([sys.executable, "-m", "replay.reproduce", "b0", "--set", setting,
                           "--outputs", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "b0").exists()
