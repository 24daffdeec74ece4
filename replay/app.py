"""The Hydra app behind ``python -m replay [overrides]``: one replay (or a multirun with ``-m``).

It lives in an importable module (not ``replay/__main__.py``) so that sweep workers
(joblib, Ray, Slurm) import it by reference and run its module-level setup: the
``job_dirname`` resolver that keeps job folders inside the sweep folder.

A person reads a short summary on stderr (status, latencies, TTFT, TPOT, throughput and
the run folder); the last line on stdout is the run summary as one JSON object, for
scripts. A config that does not compose (an unknown option or key, bad override syntax)
is one ``error:`` line with the valid choices and exit status 2, as for every command.

An experiment config may set ``study`` to a callable (``_target_``) that runs
many replays or trials itself (e.g. the competitive-ratio experiments); it is
called as ``study(cfg=cfg, out_dir=out_dir)`` and returns the summary dict.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

from hydra_plugins.kvsched_sweeper.sweeper import KvschedSweeper
from policies.labels import policy_label
from replay.config import CONFIG_DIR, register_resolvers
from replay.config.cli import (
    CONFIG_ERRORS,
    check_overrides,
    config_error_line,
    error_summary,
    fail,
    input_error_message,
    interrupted,
    is_input_error,
    refused_write,
)
from replay.config.validate import validate_config
from replay.errors import InputError
from replay.storage.outputs import atomic_write_text, read_summary, summary_json

if TYPE_CHECKING:
    import pandas as pd

register_resolvers()  # before Hydra resolves hydra.sweep.subdir
# Hydra finds plugins by scanning the hydra_plugins folders on sys.path, which misses an
# editable install's; registering the sweeper by hand works for every install.
Plugins.instance().register(KvschedSweeper)


#: What Ctrl-C leaves: every run folder holds a finished run or none (the summary is
#: written last), and a run's resume check reuses only finished, verified runs.
RESUME_HINT = "finished runs are kept, and the same command resumes from them"


def main() -> None:
    """``python -m replay``: the Hydra app, with Hydra's own config errors as one line."""
    # Hydra otherwise prints its errors over many lines and exits 1; asked for the full
    # error, it raises, and the error contract can speak (a bug keeps its traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        check_overrides(_overrides(sys.argv[1:]))
        replay_job()
    except CONFIG_ERRORS as exc:
        fail(config_error_line(exc, sys.argv[1:]))
    except InputError as exc:
        fail(exc)
    except OSError as exc:  # Hydra's own files (.hydra/, the log) on a full disk, say
        line = refused_write(exc, _output_folder())
        if line is None:
            raise
        fail(line)
    except KeyboardInterrupt as exc:
        interrupted(exc, RESUME_HINT)


def _overrides(argv: list[str]) -> list[str]:
    """The overrides among ``argv``, as Hydra's own command line parses them."""
    from hydra._internal.utils import get_args_parser

    known, _ = get_args_parser().parse_known_args(argv)
    return list(known.overrides or [])


def _output_folder() -> str | None:
    """The run (or sweep) folder of the app's config, once Hydra has composed it."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    return str(hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else hydra_cfg.run.dir)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def replay_job(cfg: DictConfig) -> dict:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        validate_config(cfg)
        # Imported here, not at the top: the engine (numba, pandas, scipy) is most of the
        # start-up, and `--help`, a config error or a sweep's parent process needs none of it.
        from replay.run import run

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
        # and the sweep's report counts it (SweepReport).
        summary = error_summary(cfg, exc)
        # A disk that refuses even this record (full, read-only) refuses every job: its
        # error ends the sweep (one line, exit 2) rather than leave a job without a summary
        # that the sweep's report would not count.
        atomic_write_text(out_dir / "summary.json", summary_json(summary, indent=1))
        print(f"error: {input_error_message(exc)}", file=sys.stderr, flush=True)
    if HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep prints one table at its end
        print(human_summary(summary, out_dir), file=sys.stderr, flush=True)
    print(summary_json(summary, indent=None), flush=True)
    return summary


def human_summary(summary: dict, run_dir: Path) -> str:
    """The run's headline numbers for a person, in the units of its clock (ms and s, or
    rounds under unit time), like vLLM's benchmark printout."""
    rounds = summary.get("time_unit") == "rounds"

    def span(seconds) -> str:
        if seconds is None:
            return "-"
        if rounds:
            return f"{seconds:,.1f} rounds"
        return f"{seconds * 1e3:,.1f} ms" if abs(seconds) < 1 else f"{seconds:,.2f} s"

    per = "round" if rounds else "s"
    policy = summary.get("config", {}).get("policy")
    lines = [
        f"{'status':<12}{summary.get('status')} ({summary.get('n_completed', 0):,} of "
        f"{summary.get('n_requests', 0):,} requests completed)"
        + (f": {summary['message']}" if summary.get("message") else ""),
    ]
    if policy and "_target_" in policy:
        lines.append(f"{'policy':<12}{policy_label(policy)}")
    if "mean_latency" in summary:
        requests_rate = summary.get("throughput_requests_per_s")
        tokens_rate = summary.get("throughput_tokens_per_s")
        lines += [
            f"{'latency':<12}mean {span(summary.get('mean_latency'))}   "
            f"p50 {span(summary.get('p50_latency'))}   p99 {span(summary.get('p99_latency'))}",
            f"{'TTFT':<12}mean {span(summary.get('mean_ttft'))}   "
            f"p99 {span(summary.get('p99_ttft'))}",
            f"{'TPOT':<12}mean {span(summary.get('mean_tpot'))}   "
            f"p99 {span(summary.get('p99_tpot'))}",
            f"{'throughput':<12}"
            + (f"{requests_rate:,.2f} requests/{per}   {tokens_rate:,.0f} tokens/{per}"
               if requests_rate is not None and tokens_rate is not None else "-"),
            f"{'evictions':<12}{summary.get('evictions', 0):,}",
        ]
    lines.append(f"{'run folder':<12}{_shown(run_dir)}")
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class SweepReport:
    """Hydra callback: after a multirun, one table of its jobs and a count of the failed.

    The table (on stderr) has a row per job folder under ``hydra.sweep.dir``: its status,
    policy, completions, latencies and throughput. A job whose summary has status
    ``error``, or one of ``output.fail_on`` (e.g. ``[livelock, stalled]``), counts as
    failed; then the sweep exits with status 1, so a script cannot miss it.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        fail_on = {"error", *config.output.get("fail_on", [])}
        sweep = Path(config.hydra.sweep.dir)
        jobs = {p.parent.name: read_summary(p) or {}
                for p in sorted(sweep.glob("*/summary.json"))}
        if jobs:
            table = sweep_table(jobs).to_string(index=False)
            print(f"{len(jobs)} jobs in {_shown(sweep)}:\n{table}", file=sys.stderr, flush=True)
        failed = [s.get("status") for s in jobs.values() if s.get("status") in fail_on]
        if failed:
            counts = {k: failed.count(k) for k in sorted(set(failed))}
            print(f"error: {len(failed)} of {len(jobs)} jobs in {sweep} failed "
                  f"({json.dumps(counts)}); their summary.json says why", file=sys.stderr,
                  flush=True)
            sys.exit(1)

    # Hydra calls these too; nothing to do.
    def on_run_start(self, config, **kwargs) -> None: ...
    def on_run_end(self, config, **kwargs) -> None: ...
    def on_multirun_start(self, config, **kwargs) -> None: ...
    def on_job_start(self, config, **kwargs) -> None: ...
    def on_job_end(self, config, job_return, **kwargs) -> None: ...
    def on_compose_config(self, config, config_name, overrides) -> None: ...


def sweep_table(jobs: dict[str, dict]) -> pd.DataFrame:
    """One row per job (folder name -> summary) with the numbers a person compares."""
    import pandas as pd  # only a sweep's closing table needs it: not at start-up

    rows = []
    for folder, s in jobs.items():
        policy = (s.get("config") or {}).get("policy") or {}
        rows.append({
            "job": folder, "status": s.get("status", "?"),
            "policy": policy_label(policy) if "_target_" in policy else "-",
            "completed": f"{s.get('n_completed', 0)}/{s.get('n_requests', 0)}",
            "mean latency": s.get("mean_latency"), "p99 latency": s.get("p99_latency"),
            f"requests/{'round' if s.get('time_unit') == 'rounds' else 's'}":
                s.get("throughput_requests_per_s"),
            # with metrics.slo set: the share of requests meeting it, and goodput
            **({"SLO attainment": s["slo_attainment"],
                "goodput/s": s.get("goodput_requests_per_s")} if "slo_attainment" in s else {}),
        })
    return pd.DataFrame(rows).round(4)
