"""The linear timing model's fit to Vidur as a reproduction target: the refit of
``python -m replay.tools.fit_linear`` (both model/hardware pairs), its error per region of
the shape grid, and a figure of those errors against the target (median <= 5 % and
max <= 20 % over decode batches of 1..512 at contexts 16..4,096).

Writes ``fit_linear.json`` (coefficients, provenance, errors), ``fit_regions.csv`` and
``fit_regions.png`` (with the regions' table as its CSV) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from replay.errors import ConfigError  # noqa: E402
from replay.experiments.plots.common import legend_beside, save_figure  # noqa: E402
from replay.storage.outputs import atomic_write_text  # noqa: E402
from replay.timing.fit_linear import MAX_BATCHES, TARGET_ERROR, fit_and_report  # noqa: E402


def plot(regions: pd.DataFrame, out: Path) -> Path:
    """Median and max relative error per region, one panel per model; the target region's
    limits as lines."""
    models = list(dict.fromkeys(regions["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5.5), squeeze=False)
    for ax, model in zip(axes.flat, models, strict=True):
        part = regions[regions["model"] == model]
        where = np.arange(len(part))
        ax.barh(where - 0.2, 100 * part["max_abs"], 0.4, label="max |error|")
        ax.barh(where + 0.2, 100 * part["median_abs"], 0.4, label="median |error|")
        ax.set_yticks(where)
        ax.set_yticklabels(part["cell"], fontsize=7)
        ax.invert_yaxis()
        for limit, name in ((TARGET_ERROR["median"], "median"), (TARGET_ERROR["max"], "max")):
            ax.axvline(100 * limit, color="k", ls="--" if name == "max" else ":", lw=0.8,
                       label=f"target {name} ({100 * limit:g} %, first row only)")
        ax.set_xlabel("relative error of timing=linear against timing=vidur (%)")
        ax.set_title(f"{model} on {part['hardware'].iloc[0]}", fontsize=9)
        ax.set_xlim(0, None)
        legend_beside(ax)
    fig.suptitle("The refitted linear timing model on a shape grid it was not fitted on")
    return save_figure(fig, out, regions)


def run_study(cfg: DictConfig, out_dir: Path, batches: int, seed: int = 0,
              overrides: list | None = None, quick: bool = False,
              quick_settings: dict | None = None) -> dict:
    started = time.perf_counter()  # the study's whole time, as a replay records it
    settings = {"batches": int(batches), "overrides": list(overrides or [])}
    if quick:
        settings.update(OmegaConf.to_container(quick_settings, resolve=True)
                        if isinstance(quick_settings, DictConfig) else dict(quick_settings or {}))
    if not 1 <= int(settings["batches"]) <= MAX_BATCHES:
        raise ConfigError(f"study.batches={settings['batches']} is not allowed: it must be "
                          f"1..{MAX_BATCHES:,} batches")
    extra = [str(o) for o in (OmegaConf.to_container(settings["overrides"])
                              if isinstance(settings["overrides"], ListConfig)
                              else settings["overrides"])]
    extra += [f"data_dir={cfg.data_dir}"]
    command = [f"--batches={settings['batches']}", f"--seed={seed}", *extra]
    results = fit_and_report(int(settings["batches"]), int(seed), extra, out_dir, command)
    regions = pd.read_csv(out_dir / "fit_regions.csv")
    plot(regions, out_dir / "fit_regions.png")
    summary = {"study": "linear_fit", "quick": bool(quick), "settings": settings,
               "target": TARGET_ERROR,
               "fits": {model: {k: v for k, v in fit.items() if k != "regions"}
                        for model, fit in results.items()},
               "config": OmegaConf.to_container(cfg, resolve=True)}
    summary["wall_time_s"] = time.perf_counter() - started
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary
