"""E1: kvsched against real vLLM 0.19 runs (:mod:`replay.engine_check`), beside the peer
simulator's own published errors, and the factors behind the differences, each varied alone.

For every log folder of ``checks`` (under ``log_root``) and each timing source named for
it, the engine check replays the run with ``policy=vllm_v1``. The peer's errors are the
``Sim`` column of the folder's ``validation/summary.txt`` (LLMServingSim's comparison of
its own simulator with the same run); its ``vLLM`` column is what the check computes from
the log, to the printed precision (``tests/test_engine_check.py`` holds it so).

``factors`` are checks with one thing changed (name -> the log, the timing, and either
config overrides or a named variant):

* ``set``: config overrides (a KV capacity a few blocks larger or smaller, the admission
  gate off, another table version, ...): how far the result moves when one modelled detail
  moves, the schedule's sensitivity included;
* ``variant: cached_resume``: the recomputation after a preemption priced as an ideal
  prefix cache would leave it (below): the upper bound of what vLLM's prefix caching,
  which the real run had on and kvsched does not model, can save.

*Cached resume.* vLLM keeps the blocks a preempted request frees in its prefix cache until
they are needed for something else, and a readmitted request computes only what is not
found there (whole blocks, and at least its last token). kvsched recomputes everything
(``engine.preemption=recompute``). The variant replays the same schedule rules, but prices
every recomputed token that lies in the whole blocks of what the request held before as
cached (left out of the step's new tokens, added to its context); the token budget still
counts them, so only the time is changed. It assumes no such block was ever evicted: an
upper bound.

``step_prices`` compares two timing sources on the same steps: the steps of a check's
replay (``log``, priced by ``timing``) priced again by ``other``, summed by kind of step
(decodes only, or with prompt tokens) and decode batch size.

Writes, in the run folder: ``e1_<gpu>.png`` per log (the error of every metric, peer and
kvsched, with the table of both beside it), ``e1_<gpu>_<timing>_series.png`` (the
running, waiting and KV time series of each check against the log), ``e1_factors.png``
(every check and factor: the main errors and the preemptions), ``e1_step_prices.png``,
each with its CSV, the checks' own folders (``checks/``) and ``summary.json``.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from policies.vllm_v1 import VLLMV1  # noqa: E402
from replay import engine_check  # noqa: E402
from replay.config import compose_config  # noqa: E402
from replay.engine.timing import BatchShape  # noqa: E402
from replay.errors import ConfigError, InputError  # noqa: E402
from replay.experiments.plots.common import save_figure  # noqa: E402

#: The rows of the factors table: the errors shown (table keys) and their labels.
FACTOR_COLUMNS = (("ttft_mean", "TTFT mean"), ("ttft_p90", "TTFT P90"),
                  ("tpot_mean", "TPOT mean"), ("tpot_p90", "TPOT P90"),
                  ("latency_mean", "latency mean"), ("latency_p90", "latency P90"))
VARIANTS = ("cached_resume",)


# ---------------------------------------------------------------------- cached resume
class RecordingVLLMV1(VLLMV1):
    """vLLM v1, deciding through the engine's Python path (the same decisions: the policy
    keeps nothing across steps) and keeping, per batch member, how many of the prompt
    tokens it computes this step an ideal prefix cache would still hold."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.held_before: dict[int, int] = {}
        self.cached_tokens: np.ndarray = np.zeros(0, dtype=np.int64)

    def decide(self, view):
        batch = super().decide(view)
        for rid in view.running.tolist():
            self.held_before[rid] = max(self.held_before.get(rid, 0), int(view.held[rid]))
        members = np.concatenate((view.running if batch.advance is None else batch.advance,
                                  batch.start)).astype(np.int64)
        chunks = batch.prefill_chunks or {}
        block = view.kv_block_size
        cached = np.zeros(members.size, dtype=np.int64)
        for i, rid in enumerate(members.tolist()):
            total = int(view.prefill_len[rid])
            done = int(view.prefilled[rid])
            if done >= total:
                continue
            chunk = chunks.get(rid, total - done)
            # whole blocks of what it held before, and never its last token
            kept = min(self.held_before.get(rid, 0), total - 1) // block * block
            cached[i] = max(0, min(done + chunk, kept) - done)
        self.cached_tokens = cached
        return batch


class CachedResumeTiming:
    """A timing backend that prices each step as ``inner`` does, with the tokens the
    recording policy marks as cached left out of the new tokens and added to the context."""

    time_unit = "seconds"

    def __init__(self, inner, policy: RecordingVLLMV1) -> None:
        self.inner, self.policy = inner, policy

    def duration(self, batch: BatchShape) -> float:
        cached = self.policy.cached_tokens
        if cached.size != batch.size:
            raise RuntimeError("cached_resume: the step's members are not the batch decided")
        computed = batch.new_tokens - cached
        keep = computed > 0
        if not keep.any():
            return 0.0
        return self.inner.duration(BatchShape(computed[keep], (batch.context + cached)[keep],
                                              batch.is_prefill[keep]))

    def describe(self) -> dict:
        return {**self.inner.describe(), "variant": "cached_resume"}


def cached_resume(cfg: DictConfig):
    policy = RecordingVLLMV1(**{k: v for k, v in OmegaConf.to_container(
        cfg.policy, resolve=True).items() if k not in ("_target_", "overflow")},
        overflow=instantiate(cfg.policy.overflow))
    return policy, CachedResumeTiming(instantiate(cfg.timing), policy)


# ------------------------------------------------------------------- step prices
class RecordingTiming:
    """Prices as ``inner`` does and keeps every step's shape."""

    time_unit = "seconds"

    def __init__(self, inner) -> None:
        self.inner, self.shapes = inner, []

    def duration(self, batch: BatchShape) -> float:
        self.shapes.append(BatchShape(batch.new_tokens.copy(), batch.context.copy(),
                                      batch.is_prefill.copy()))
        return self.inner.duration(batch)

    def describe(self) -> dict:
        return self.inner.describe()


#: Decode batch sizes of the step-price table (upper ends).
DECODE_BINS = (8, 32, 64, 128, 256, 1 << 30)


def step_prices(shapes, first, second) -> pd.DataFrame:
    """Each step priced by ``first`` and ``second`` (timing backends), summed by kind of step
    and decode batch size."""
    rows = []
    for shape in shapes:
        decodes = int((~shape.is_prefill).sum())
        rows.append({"kind": "with prompt tokens" if shape.is_prefill.any() else "decodes only",
                     "decodes": decodes, "prompt_tokens": int(shape.new_tokens[
                         shape.is_prefill].sum()),
                     "first_s": first.duration(shape), "second_s": second.duration(shape)})
    steps = pd.DataFrame(rows)
    steps["decode batch"] = pd.cut(steps["decodes"], [-1, *DECODE_BINS],
                                   labels=[f"<= {b}" if b < 1 << 30 else f"> {DECODE_BINS[-2]}"
                                           for b in DECODE_BINS])
    table = steps.groupby(["kind", "decode batch"], observed=True, as_index=False).agg(
        steps=("first_s", "size"), first_s=("first_s", "sum"), second_s=("second_s", "sum"))
    total = steps.groupby("kind", as_index=False).agg(
        steps=("first_s", "size"), first_s=("first_s", "sum"), second_s=("second_s", "sum"))
    total["decode batch"] = "all"
    table = pd.concat([table, total], ignore_index=True)
    table["ratio"] = table["second_s"] / table["first_s"]
    return table


# ------------------------------------------------------------------------ the peer
def peer_errors(folder: Path) -> dict[str, tuple[float, float, float]] | None:
    """``key -> (vLLM ms, Sim ms, Diff %)`` as ``validation/summary.txt`` prints them, or
    None without one."""
    path = folder / "validation" / "summary.txt"
    if not path.is_file():
        return None
    rows = {}
    for line in path.read_text().splitlines():
        match = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)"
                         r"\s+([-\d.]+)\s+([-\d.]+)\s+([-+\d.]+)%", line)
        if match:
            rows[f"{match[1].lower()}_{match[2].lower()}"] = (
                float(match[3]), float(match[4]), float(match[5]))
    return rows or None


# ------------------------------------------------------------------------- figures
def error_table(checks: list[dict], peer) -> pd.DataFrame:
    """One log's metrics: vLLM, the peer's and each timing's kvsched value and error."""
    first = pd.DataFrame(checks[0]["table"])
    table = pd.DataFrame({"metric": first["metric"], "vLLM (ms)": first["vllm"]})
    if peer is not None:  # as the peer published them (its Diff% from unrounded values)
        table["LLMServingSim (ms)"] = [peer[k][1] for k in first["key"]]
        table["LLMServingSim diff %"] = [peer[k][2] for k in first["key"]]
    for check in checks:
        rows = pd.DataFrame(check["table"])
        table[f"kvsched {check['timing']} (ms)"] = rows["kvsched"]
        table[f"kvsched {check['timing']} diff %"] = rows["diff_pct"]
    return table


def plot_errors(table: pd.DataFrame, title: str, out: Path) -> Path:
    diffs = [c for c in table.columns if c.endswith("diff %")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(diffs)
    x = np.arange(len(table))
    for i, column in enumerate(diffs):
        ax.bar(x + (i - (len(diffs) - 1) / 2) * width, table[column], width,
               label=column.replace(" diff %", ""))
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, table["metric"], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("difference from vLLM (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, out, table.round(2))


def plot_factors(table: pd.DataFrame, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(table) + 1.5))
    y = np.arange(len(table))
    shown = ("TTFT mean", "TPOT mean", "latency mean")
    for i, column in enumerate(shown):
        ax.barh(y + (i - 1) * 0.25, table[column], 0.25, label=column)
    ax.set_yticks(y, table["log"] + ", " + table["timing"] + ": " + table["change"], fontsize=7)
    ax.axvline(0, color="black", lw=0.6)
    ax.invert_yaxis()
    ax.set_xlabel("kvsched's difference from vLLM (%)")
    ax.legend(fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, out, table.round(2))


def plot_step_prices(table: pd.DataFrame, names: tuple[str, str], title: str,
                     out: Path) -> Path:
    shown = table[table["decode batch"] != "all"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for kind, rows in shown.groupby("kind"):
        ax.plot(rows["decode batch"].astype(str), rows["ratio"], "o-", label=kind)
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("decodes in the step")
    ax.set_ylabel(f"{names[1]} / {names[0]}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    numbers = table.rename(columns={"first_s": f"{names[0]} (s)", "second_s": f"{names[1]} (s)"})
    return save_figure(fig, out, numbers.round(4))


# ---------------------------------------------------------------------------- study
def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(
        value, DictConfig | ListConfig) else value


def gpu_of(log: str) -> str:
    return log.split("/")[0]


def run_study(cfg: DictConfig, out_dir: Path, log_root: str, checks: dict,
              factors: dict | None = None, step_prices_of: dict | None = None,
              quick: bool = False, quick_settings: dict | None = None) -> dict:
    started = time.perf_counter()
    settings = {"checks": _plain(checks), "factors": _plain(factors) or {},
                "step_prices_of": _plain(step_prices_of)}
    if quick:
        settings.update(_plain(quick_settings) or {})
    root = Path(log_root)
    if not root.is_dir():
        raise InputError(f"study.log_root: no folder at {root}")
    for name, factor in settings["factors"].items():
        if factor.get("variant") not in (None, *VARIANTS):
            raise ConfigError(f"study.factors.{name}.variant={factor['variant']}: one of "
                              f"{', '.join(VARIANTS)}")
    checks_dir = out_dir / "checks"
    records, figures = {}, []

    def run(log: str, timing: str, name: str, extra=(), variant=None) -> dict:
        record = engine_check.check(root / log, timing, extra=list(extra),
                                    out=checks_dir / f"{gpu_of(log)}-{timing}-{name}",
                                    components=cached_resume if variant else None)
        record.pop("config")
        return record

    # the checks, and their figures
    for log, timings in settings["checks"].items():
        done = [run(log, timing, "check") for timing in timings]
        records[log] = done
        gpu = gpu_of(log)
        table = error_table(done, peer_errors(root / log))
        figures.append(plot_errors(table, f"{log}: difference from the real vLLM 0.19 run, "
                                          f"LLMServingSim (its summary.txt) and kvsched",
                                   out_dir / f"e1_{gpu}.png"))
        for record in done:
            source = Path(record["out"])
            series = out_dir / f"e1_{gpu}_{record['timing']}_series.png"
            shutil.copy2(source / "timeseries.png", series)
            shutil.copy2(source / "timeseries.csv", series.with_suffix(".csv"))
            figures.append(series)
    # the factors, each beside its check
    rows = []
    for log, done in records.items():
        for record in done:
            rows.append(_factor_row(log, record["timing"], "none (the check)", record))
    for name, factor in settings["factors"].items():
        log, timing = factor["log"], factor["timing"]
        record = run(log, timing, name, factor.get("set") or (), factor.get("variant"))
        overrides = " ".join(factor.get("set") or ())
        rows.append(_factor_row(log, timing, f"{name} ({overrides})" if overrides else name,
                                record))
    factor_table = pd.DataFrame(rows)
    figures.append(plot_factors(factor_table, out_dir / "e1_factors.png"))
    # two timing sources on the same steps
    prices = None
    if settings["step_prices_of"]:
        spec = settings["step_prices_of"]
        prices = _step_price_table(root / spec["log"], spec["timing"], spec["other"])
        figures.append(plot_step_prices(
            prices, (spec["timing"], spec["other"]),
            f"{spec['log']}: the steps of the {spec['timing']} replay priced by both sources",
            out_dir / "e1_step_prices.png"))
    return {"study": "engine_fidelity", "quick": bool(quick), "settings": settings,
            "checks": {log: [{k: r[k] for k in ("timing", "table", "preemptions", "kv")}
                             for r in done] for log, done in records.items()},
            "factors": factor_table.to_dict(orient="records"),
            "figures": [p.name for p in figures], "wall_time_s": time.perf_counter() - started}


def _factor_row(log: str, timing: str, change: str, record: dict) -> dict:
    table = {row["key"]: row["diff_pct"] for row in record["table"]}
    counts = record["preemptions"]
    return {"log": gpu_of(log), "timing": timing, "change": change,
            **{label: table[key] for key, label in FACTOR_COLUMNS},
            "preemptions": counts["kvsched_preemptions"],
            "preemptions seen per second": counts["kvsched_bound_per_second"],
            "vLLM log: at least": counts.get("vllm_bound_per_second")}


def _step_price_table(log_dir: Path, timing: str, other: str) -> pd.DataFrame:
    recorder = {}

    def components(cfg):
        recorder["timing"] = RecordingTiming(instantiate(cfg.timing))
        return instantiate(cfg.policy), recorder["timing"]

    run = engine_check.read_run(log_dir)
    engine_check.replay(run, *_composed(run, timing, components))
    second = instantiate(compose_config(engine_check.overrides_for(run, other)).timing)
    return step_prices(recorder["timing"].shapes, recorder["timing"].inner, second)


def _composed(run, timing: str, components):
    cfg = compose_config(engine_check.overrides_for(run, timing))
    policy, backend = components(cfg)
    return cfg, policy, backend
