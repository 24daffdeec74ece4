"""The WAIT authors' own B1-high runs beside ours (target ``b1_authors``).

**Their results.** The authors' Vidur fork (Luoxiaogan/vidur_or, commit 1fe368d) holds 84
result files of their B1-high cap sweep, one per policy and cap
(``$KVSCHED_DATA_DIR/wait_authors/results_analysis/test13_nested_long_decode/``; the data
README says where they come from). Each row is a batch end: ``Time (sec)`` and
``throughput``, the running count of batch members (their simulator adds the number of
requests in a batch when it ends, ``vidur/events/batch_end_event.py``). So the files give
their runs batch by batch: the members of each batch (the count's step) and when it ended.

**Their metric.** Their drawing notebook (``config.ipynb`` beside the files) divides the
count by the time, and summarises a run by the mean of ``count / T`` over the batch ends at
``T >= 150 s`` (:data:`NOTEBOOK_T0`); at the last batch end the same ratio is the run's
average rate of batch members. One unit per request per batch, so the unit is "tokens
generated, the first included" per second; iterations of requests that are later restarted
or dropped count too. :func:`batch_ends` computes both from our ``iterations.parquet``
(failed attempts, which ran no batch, left out) exactly as from their files.

**The side-by-side** (:func:`side_by_side`): for every policy and cap both sides have,
theirs and ours of both numbers, the largest batch, and whether the two runs formed the
same batches (the same members in the same order). Their WAIT and Nested WAIT are not the
paper's rules; ours offer theirs as options (``paper_policy=wait_authors`` and
``nested_authors``), and a run of ours counts as their variant only when its policy config
sets every one of those options (:data:`THEIR_OPTIONS`, :func:`their_variant`).

**Decode pricing past the profile** (:func:`pricing_table`): Vidur's A100 profiles end at
128 decodes; what a batch of more costs is an extrapolation (``timing.beyond_profile``).
Where our baselines form exactly their batches, each batch's interval (from the previous
batch end to its own) is compared with theirs, batch by batch; per mode, the median ratio
over the batches past the profile, and over those within it as a control. The mode whose
ratios lie closest to 1 is the one the experiment uses; the results page shows the table.

``python -m replay.experiments.authors TARGET_DIR`` prints both tables.
"""

from __future__ import annotations

import math
import os
import re
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from policies.labels import policy_label
from replay.config.cli import CommandParser, fail, run_or_exit
from replay.errors import InputError
from replay.experiments.verdicts import (
    AGREES,
    DIFFERS,
    NOT_MEASURED,
    Part,
    Result,
    Tolerance,
    TooFewSamples,
    count,
    judge_values,
    span,
)
from replay.storage.outputs import read_summary

#: Where their result files sit under the data directory.
THEIR_FOLDER = Path("wait_authors") / "results_analysis" / "test13_nested_long_decode"
#: Their folders and file-name patterns by our policy label; the cap is their total_limit
#: (WAIT, Nested WAIT) or batch_size_cap (baselines); WAIT's and Nested WAIT's names also
#: carry the largest batch the run reached.
THEIR_FILES = {
    "vLLM-like": ("vllm", r"throughput_vllm_batch_size_(?P<cap>\d+)\.csv"),
    "Sarathi-like": ("sarathi", r"throughput_sarathi_batch_size_(?P<cap>\d+)\.csv"),
    "WAIT": ("modified_booking_limit",
             r"throughput_modified_booking_limit_limit_(?P<cap>\d+)_batch_size_(?P<max>\d+)\.csv"),
    "Nested WAIT": ("nested_booking_limit",
                    r"throughput_general_nested_booking_limit_limit_(?P<cap>\d+)"
                    r"_batch_size_(?P<max>\d+)\.csv"),
}
#: Our paper-policy config of each of their variants.
THEIR_PAPER_POLICY = {"WAIT": "wait_authors", "Nested WAIT": "nested_authors"}
#: Their notebook averages count / T over the batch ends from this time on (seconds).
NOTEBOOK_T0 = 150.0
#: The largest decode batch in Vidur's A100 profiles.
PROFILE_EDGE = 128
#: Ours within this of theirs agrees (their runs are deterministic and so are ours).
AGREEMENT = Tolerance(relative=0.05)
#: The pricing sweeps of the target: ``pricing_<mode>_<policy>`` under ``runs/``.
PRICING_SWEEP = re.compile(r"pricing_(?P<mode>[a-z]+)_(?P<policy>[a-z_]+)")


# ------------------------------------------------------------------------ their files
class DataFileError(InputError, ValueError):
    """One of their result files is not as their simulator writes them."""


class MissingData(InputError, FileNotFoundError):
    """Their result files are not in the data directory."""


def data_dir() -> Path:
    """The data directory (``$KVSCHED_DATA_DIR``) their files are read from."""
    found = os.environ.get("KVSCHED_DATA_DIR")
    if not found:
        raise MissingData("KVSCHED_DATA_DIR is not set (the authors' result files are read "
                          "from the data directory)")
    return Path(found).expanduser()


def their_runs(root: Path | None = None) -> pd.DataFrame:
    """One row per result file of theirs: policy label, cap, largest batch (WAIT and
    Nested WAIT only), path."""
    folder = (root or data_dir()) / THEIR_FOLDER
    if not folder.is_dir():
        raise MissingData(f"$KVSCHED_DATA_DIR/{THEIR_FOLDER}: not found (the authors' result "
                          f"files; see the data README)")
    rows = []
    for label, (sub, pattern) in THEIR_FILES.items():
        for path in sorted((folder / sub).glob("*.csv")):
            found = re.fullmatch(pattern, path.name)
            if found is None:
                continue
            rows.append({"policy": label, "cap": int(found["cap"]),
                         "their_max_batch": int(found["max"]) if found.groupdict().get("max")
                         else None, "path": path})
    return pd.DataFrame(rows).sort_values(["policy", "cap"], kind="stable").reset_index(drop=True)


@lru_cache(maxsize=256)
def their_batches(path: Path) -> pd.DataFrame:
    """Their run batch by batch: ``end`` (s) and ``members`` (requests in the batch), from
    the running count at each batch end (the file's first row is the start, count 0)."""
    table = pd.read_csv(path)
    for column in ("Time (sec)", "throughput"):
        if column not in table.columns:
            raise DataFileError(f"{path}: no column {column!r} (their result files have "
                                f"'Time (sec)' and 'throughput')")
    end = table["Time (sec)"].to_numpy(float)
    count = table["throughput"].to_numpy(np.int64)
    return pd.DataFrame({"end": end[1:], "members": np.diff(count)})


def our_batches(run_dir: Path) -> pd.DataFrame:
    """Our run batch by batch, as theirs: ``end`` and ``members`` of every executed
    iteration (a failed attempt ran no batch)."""
    iterations = pd.read_parquet(Path(run_dir) / "iterations.parquet",
                                 columns=["start_time", "duration", "batch_size", "failed"])
    ran = iterations[~iterations["failed"].astype(bool)]
    return pd.DataFrame({"end": (ran["start_time"] + ran["duration"]).to_numpy(float),
                         "members": ran["batch_size"].to_numpy(np.int64)})


def at_last_batch_end(batches: pd.DataFrame) -> float:
    """Their metric at the run's last batch end: all batch members over that time."""
    if batches.empty:
        return 0.0
    return float(batches["members"].sum() / batches["end"].iloc[-1])


def notebook_mean(batches: pd.DataFrame, t0: float = NOTEBOOK_T0) -> float:
    """Their notebook's summary: the mean of ``count / T`` over the batch ends at
    ``T >= t0`` with a positive value (NaN if the run ended before ``t0``)."""
    ratio = batches["members"].cumsum().to_numpy(float) / batches["end"].to_numpy(float)
    keep = (batches["end"].to_numpy(float) >= t0) & (ratio > 0)
    return float(ratio[keep].mean()) if keep.any() else math.nan


def same_batches(ours: pd.DataFrame, theirs: pd.DataFrame) -> bool:
    """Whether two runs formed batches of the same sizes in the same order."""
    return len(ours) == len(theirs) and bool(
        (ours["members"].to_numpy() == theirs["members"].to_numpy()).all())


def interval_split(ours: pd.DataFrame, theirs: pd.DataFrame) -> dict:
    """For two runs that formed the same batches: each batch's interval (from the previous
    batch end to its own) ours over theirs, as the median over the batches past the
    profile (> :data:`PROFILE_EDGE` members) and within it, and how many seconds each group
    moved our last batch end from theirs (the two add up to the whole shift)."""
    interval = np.diff(ours["end"].to_numpy(), prepend=0.0)
    their_interval = np.diff(theirs["end"].to_numpy(), prepend=0.0)
    ratio, shift = interval / their_interval, interval - their_interval
    past = ours["members"].to_numpy() > PROFILE_EDGE
    return {"batches_past_profile": int(past.sum()),
            "median_ratio_past_profile": float(np.median(ratio[past])) if past.any()
            else math.nan,
            "median_ratio_within_profile": float(np.median(ratio[~past])) if (~past).any()
            else math.nan,
            "end_shift_past_profile_s": float(shift[past].sum()),
            "end_shift_within_profile_s": float(shift[~past].sum())}


# --------------------------------------------------------------------------- our runs
#: The options that make our WAIT and Nested WAIT the authors' variants, by policy class
#: (docs/policies/wait.md, "The authors' variant").
THEIR_OPTIONS = {
    "policies.wait.Wait": {"thresholds": "authors", "in_flight_limit": "per_type",
                           "readiness": "any_type", "force_clear": True},
    "policies.nested_wait.NestedWait": {"thresholds": "authors", "force_clear": True},
}


def their_variant(policy_cfg: dict) -> bool:
    """Whether our policy ran as their variant: a WAIT or Nested WAIT whose config sets every
    option of :data:`THEIR_OPTIONS` (``force_clear`` alone is not their scheduler)."""
    wanted = THEIR_OPTIONS.get(str(policy_cfg.get("_target_")))
    return wanted is not None and all(policy_cfg.get(key) == value
                                      for key, value in wanted.items())


def our_runs(sweep_dir: Path) -> pd.DataFrame:
    """One row per finished run under ``sweep_dir``: policy label, cap, whether it is their
    variant, the decode pricing past the profile, run folder."""
    rows = []
    for summary_path in sorted(Path(sweep_dir).rglob("summary.json")):
        summary = read_summary(summary_path)
        if summary is None or not (summary_path.parent / "iterations.parquet").is_file():
            continue
        config = summary.get("config", {})
        policy = config.get("policy", {})
        beyond = (summary.get("timing") or {}).get("beyond_profile") or {}
        rows.append({"policy": policy_label(policy), "cap": config.get("batch_limit"),
                     "their_variant": their_variant(policy),
                     "beyond_profile": beyond.get("mode"), "status": summary.get("status"),
                     "run_dir": summary_path.parent})
    return pd.DataFrame(rows, columns=["policy", "cap", "their_variant", "beyond_profile",
                                       "status", "run_dir"])


def side_by_side(runs_dir: Path, root: Path | None = None) -> pd.DataFrame:
    """Per policy and cap both sides have: their metric at the last batch end and their
    notebook's mean over ``T >= 150 s``, theirs and ours, the largest batch of each,
    whether the runs formed the same batches and, where they did, where the time went
    (:func:`interval_split`). Our runs are those of the policy sweeps (``runs/<policy>/``),
    not the pricing sweeps; ``beyond_profile`` says how each priced decodes past the
    profile."""
    theirs = their_runs(root)
    ours = pd.concat([our_runs(d) for d in sorted(Path(runs_dir).iterdir())
                      if d.is_dir() and not PRICING_SWEEP.fullmatch(d.name)]
                     or [our_runs(Path(runs_dir) / "none")], ignore_index=True)
    rows = []
    for _, mine in ours.iterrows():
        match = theirs[(theirs["policy"] == mine["policy"]) & (theirs["cap"] == mine["cap"])]
        if match.empty:
            continue
        their = their_batches(match["path"].iloc[0])
        own = our_batches(mine["run_dir"])
        same = same_batches(own, their)
        rows.append({
            "policy": mine["policy"], "cap": int(mine["cap"]),
            "their_variant": bool(mine["their_variant"]),
            "beyond_profile": mine["beyond_profile"],
            "theirs_at_end": at_last_batch_end(their), "ours_at_end": at_last_batch_end(own),
            "theirs_mean_150s": notebook_mean(their), "ours_mean_150s": notebook_mean(own),
            "theirs_end_s": float(their["end"].iloc[-1]), "ours_end_s": float(own["end"].iloc[-1]),
            "theirs_max_batch": int(their["members"].max()),
            "ours_max_batch": int(own["members"].max()) if len(own) else 0,
            "same_batches": same,
            **(interval_split(own, their) if same else {}),
            "their_file": f"$KVSCHED_DATA_DIR/{THEIR_FOLDER}/"
                          f"{match['path'].iloc[0].parent.name}/{match['path'].iloc[0].name}"})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["ours_over_theirs_at_end"] = table["ours_at_end"] / table["theirs_at_end"]
    table["ours_over_theirs_mean_150s"] = table["ours_mean_150s"] / table["theirs_mean_150s"]
    return table.sort_values(["policy", "cap"], kind="stable").reset_index(drop=True)


def pricing_table(runs_dir: Path, root: Path | None = None) -> pd.DataFrame:
    """Per pricing mode, baseline and cap (the ``pricing_<mode>_<policy>`` sweeps): how many
    batches, whether ours and theirs formed the same batches, and, where they did, the
    median ratio of our batch interval to theirs over the batches past the profile
    (> 128 members) and within it, and the ratio of the runs' last batch ends."""
    theirs = their_runs(root)
    rows = []
    for sweep in sorted(Path(runs_dir).iterdir()):
        named = PRICING_SWEEP.fullmatch(sweep.name) if sweep.is_dir() else None
        if named is None:
            continue
        for _, mine in our_runs(sweep).iterrows():
            match = theirs[(theirs["policy"] == mine["policy"]) & (theirs["cap"] == mine["cap"])]
            if match.empty:
                continue
            their = their_batches(match["path"].iloc[0])
            own = our_batches(mine["run_dir"])
            row = {"mode": named["mode"], "policy": mine["policy"], "cap": int(mine["cap"]),
                   "batches": len(own), "same_batches": same_batches(own, their),
                   "end_ratio": float(own["end"].iloc[-1] / their["end"].iloc[-1])}
            if row["same_batches"]:
                split = interval_split(own, their)
                row.update({key: split[key] for key in (
                    "batches_past_profile", "median_ratio_past_profile",
                    "median_ratio_within_profile")})
            rows.append(row)
    table = pd.DataFrame(rows, columns=["mode", "policy", "cap", "batches", "same_batches",
                                        "batches_past_profile", "median_ratio_past_profile",
                                        "median_ratio_within_profile", "end_ratio"])
    return table.sort_values(["mode", "policy", "cap"], kind="stable").reset_index(drop=True)


def pricing_summary(pricing: pd.DataFrame) -> pd.DataFrame:
    """Per mode: over the (policy, cap) runs with batches past the profile, the median and
    the largest distance of the median interval ratio from 1 (``|log ratio|``), and the
    number of such runs. The best mode has the smallest median distance."""
    past = pricing.dropna(subset=["median_ratio_past_profile"])
    past = past[past["batches_past_profile"] > 0]
    rows = []
    for mode, group in past.groupby("mode"):
        distance = np.abs(np.log(group["median_ratio_past_profile"].astype(float)))
        rows.append({"mode": mode, "runs": len(group),
                     "median_ratio": float(np.median(group["median_ratio_past_profile"])),
                     "median_distance": float(np.median(distance)),
                     "max_distance": float(distance.max())})
    return pd.DataFrame(rows, columns=["mode", "runs", "median_ratio", "median_distance",
                                       "max_distance"]).sort_values("median_distance")


# ----------------------------------------------------------------------------- figures
def figures(runs_dir: Path, out_dir: Path) -> list[Path]:
    """The target's figures: ``b1_authors.png`` (theirs and ours per policy against the cap,
    both numbers, with the table as its CSV) and ``pricing.png`` (per mode, our batch
    intervals past the profile over theirs against the cap)."""
    from replay.experiments.plots.common import plt, save_figure

    written = []
    table = side_by_side(Path(runs_dir))
    if not table.empty:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, (theirs, ours, what) in zip(axes, (
                ("theirs_at_end", "ours_at_end", "at the last batch end"),
                ("theirs_mean_150s", "ours_mean_150s",
                 f"mean over batch ends at T >= {NOTEBOOK_T0:g} s (their notebook)")),
                strict=True):
            for index, (policy, rows) in enumerate(table.groupby("policy", sort=True)):
                color = f"C{index}"
                ax.plot(rows["cap"], rows[theirs], marker="s", ls="--", color=color,
                        label=f"{policy}: theirs")
                variant = ("" if policy not in THEIR_PAPER_POLICY or rows["their_variant"].all()
                           else " (not their variant)")
                ax.plot(rows["cap"], rows[ours], marker="o", color=color,
                        label=f"{policy}: ours{variant}")
            ax.set_xlabel("cap (their total_limit / batch_size_cap = our batch_limit)")
            ax.set_ylabel("batch members per second (count / T)")
            ax.set_title(what, fontsize=10)
            ax.legend(fontsize=7)
        fig.suptitle("B1-high as the WAIT authors ran it: their result files beside our runs "
                     "of their trace")
        written.append(save_figure(fig, Path(out_dir) / "b1_authors.png",
                                   table.drop(columns=["their_file"])))
    pricing = pricing_table(Path(runs_dir))
    if not pricing.empty and pricing["median_ratio_past_profile"].notna().any():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for (mode, policy), rows in pricing.groupby(["mode", "policy"]):
            rows = rows.dropna(subset=["median_ratio_past_profile"])
            ax.plot(rows["cap"], rows["median_ratio_past_profile"], marker="o",
                    label=f"{mode}, {policy}")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_xlabel("cap")
        ax.set_ylabel("median of our batch interval / theirs\n(batches of > 128 members)")
        ax.set_title("Decode pricing past the profile (timing.beyond_profile), batch by batch "
                     "against their baselines", fontsize=10)
        ax.legend(fontsize=7)
        written.append(save_figure(fig, Path(out_dir) / "pricing.png", pricing))
    return written


# ----------------------------------------------------------------------- claim parts
def _target_runs(out_dir: Path) -> Path:
    runs = Path(out_dir) / "runs"
    if not runs.is_dir():
        raise FileNotFoundError("runs/")
    return runs


def _pricing_judge(out_dir: Path) -> Result:
    pricing = pricing_table(_target_runs(out_dir))
    summary = pricing_summary(pricing)
    if summary.empty:
        raise TooFewSamples("no pricing sweep formed their batches past the profile")
    used = our_runs(_target_runs(out_dir) / "vllm")["beyond_profile"].dropna().unique()
    used = str(used[0]) if len(used) else "unknown"
    best = summary.iloc[0]
    shown = "; ".join(f"{r['mode']} {r['median_ratio']:.3f} (median distance "
                      f"{r['median_distance']:.3f})" for _, r in summary.iterrows())
    sample = f"{int(summary['runs'].min())} baseline runs per mode"
    if summary["runs"].min() < 5:
        return Result(NOT_MEASURED, f"Not measured: {sample} (needs 5).", shown, sample)
    if best["mode"] == used:
        return Result(AGREES, f"Of the pricings past the profile, {used} (the one used) puts "
                              f"our baselines' batch intervals closest to theirs: median "
                              f"ratio {best['median_ratio']:.3f}.", shown, sample)
    return Result(DIFFERS, f"The runs use {used}, but {best['mode']} puts our baselines' "
                           f"batch intervals closest to theirs (median ratio "
                           f"{best['median_ratio']:.3f}).", shown, sample)


PRICING_PART = Part("shape", "decode pricing past the profile that fits their batch "
                    "intervals", "their batch ends (vLLM, Sarathi)", "closest median ratio",
                    "5 baseline runs per mode", _pricing_judge)


def _metric_part(policy: str, column: str, what: str) -> Part:
    def judge(out_dir: Path) -> Result:
        table = side_by_side(_target_runs(out_dir))
        rows = table[table["policy"] == policy] if len(table) else table
        if rows.empty:
            raise TooFewSamples(f"no cap where both sides ran {policy}")
        ratio = rows[f"ours_over_theirs_{column}"]
        detail = (f"{policy}, {what}: the same batches as theirs at "
                  f"{int(rows['same_batches'].sum())} of {count(len(rows), 'caps')}; ours over "
                  f"theirs by cap: " + ", ".join(f"{c} {r:.3f}" for c, r in
                                                 zip(rows["cap"], ratio, strict=True)),)
        same = rows[rows["same_batches"].astype(bool)]
        if len(same):  # the same batches: only their times differ, in which batches?
            detail += (f"{policy}: where the batches are the same, our last batch end moved "
                       f"from theirs by {same['end_shift_past_profile_s'].abs().sum():.1f} s "
                       f"in the batches past the {PROFILE_EDGE}-decode profile and "
                       f"{same['end_shift_within_profile_s'].abs().sum():.1f} s in those "
                       f"within it (absolute shifts summed over "
                       f"{count(len(same), 'caps')})",)
        if not rows["their_variant"].all() and policy in ("WAIT", "Nested WAIT"):
            return Result(NOT_MEASURED, f"Not measured: runs of our {policy} that are not "
                                        f"their variant (paper_policy="
                                        f"{THEIR_PAPER_POLICY[policy]}); shown side by side "
                                        f"only.", span(ratio), count(len(rows), "caps"),
                          detail)
        values = pd.DataFrame({"label": [f"cap {c}" for c in rows["cap"]], "value": ratio,
                               "n": len(rows)})
        found = judge_values(values, 1.0, 1.0, AGREEMENT, 3,
                             f"our {policy} over theirs ({what})", "caps", reference="",
                             cases="caps")
        return Result(found.verdict, found.sentence, found.measured, found.sample, detail)
    return Part("value", f"{policy}: {what}, ours over theirs", "theirs at each cap (1)",
                AGREEMENT.says(), "3 caps", judge)


PARTS: tuple[Part, ...] = (PRICING_PART, *(
    _metric_part(policy, column, what)
    for policy in THEIR_FILES
    for column, what in (("mean_150s", f"their notebook's mean over T >= {NOTEBOOK_T0:g} s"),
                         ("at_end", "the metric at the last batch end"))))


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m replay.experiments.authors", description=__doc__.split("\n\n")[0])
    parser.add_argument("target_dir", type=Path, nargs="?",
                        default=Path("outputs/reproduce/b1_authors"),
                        help="the b1_authors target folder (its runs/ holds the sweeps)")
    args = parser.parse_args(argv)
    runs = args.target_dir / "runs"
    if not runs.is_dir():
        fail(f"{runs}: no runs there (python -m replay.reproduce b1_authors runs them)")
    table = run_or_exit(side_by_side, runs)
    pricing = run_or_exit(pricing_table, runs)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.drop(columns=["their_file"]).round(3).to_string(index=False)
              if len(table) else "no cap both sides ran")
        if len(pricing):
            print(pricing.round(4).to_string(index=False))
            print(pricing_summary(pricing).round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    from replay.config.cli import run_or_exit

    sys.exit(run_or_exit(main))
