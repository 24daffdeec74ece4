"""The Hydra app behind ``python -m replay [overrides]``: one replay (or a multirun with ``-m``).

It lives in an importable module (not ``replay/__main__.py``) so that sweep workers
(joblib, Ray, Slurm) import it by reference and run its module-level setup: the
``job_dirname`` resolver that keeps job folders inside the sweep folder.

The last line printed is the run summary as one JSON object.

An experiment config may set ``study`` to a callable (``_target_``) that runs
many replays or trials itself (e.g. the competitive-ratio experiments); it is
called as ``study(cfg=cfg, out_dir=out_dir)`` and returns the summary dict.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

from replay.cli import error_summary, fail, input_error_message, is_input_error
from replay.config import CONFIG_DIR, register_resolvers
from replay.errors import InputError
from replay.outputs import atomic_write_text
from replay.run import run
from replay.validate import validate_config

register_resolvers()  # before Hydra resolves hydra.sweep.subdir


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def main(cfg: DictConfig) -> dict:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        validate_config(cfg)
        if cfg.get("study") is not None:
            summary = instantiate(cfg.study, _partial_=True)(cfg=cfg, out_dir=out_dir)
        else:
            summary = run(cfg, out_dir)
    except (InputError, InstantiationException) as exc:
        # Bad input, not a bug: the message names the file, row and field (and, when a
        # component rejects its config, the config key); no traceback.
        if not is_input_error(exc):
            raise
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            fail(input_error_message(exc))
        # In a sweep the other jobs go on: this one leaves a summary saying why it failed,
        # and the sweep's report counts it (replay.cli.SweepReport).
        print(f"error: {input_error_message(exc)}", file=sys.stderr, flush=True)
        summary = error_summary(cfg, exc)
        atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, default=str), flush=True)
    return summary

