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
import logging
import os
import sys
from pathlib import Path

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
from replay.errors import InputError, resend_interrupts_lost_in_callbacks, surfacing_interrupts
from replay.storage.outputs import NO_RESULT_STATUSES, atomic_write_text, summary_json

register_resolvers()  # before Hydra resolves hydra.sweep.subdir
# Hydra finds plugins by scanning the hydra_plugins folders on sys.path, which misses an
# editable install's; registering the sweeper by hand works for every install.
Plugins.instance().register(KvschedSweeper)
log = logging.getLogger(__name__)


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
        surfacing_interrupts(replay_job)
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
    # A sweep's job runs in a launcher's worker process, which did not start as a command:
    # a Ctrl-C landing in numba's compile there would print Python's "ignored" traceback.
    resend_interrupts_lost_in_callbacks()
    try:
        return surfacing_interrupts(_replay, cfg, out_dir)  # a job cut by Ctrl-C has not failed
    except Exception as exc:
        # The terminal shows the error; the run folder keeps it too, with the traceback of
        # a bug (a rejected input was written there by _replay as one line).
        if not getattr(exc, "logged", False):
            _log_to_file(f"{type(exc).__name__}: {exc}", exc)
        # A disk that refuses writes refuses every job: that ends the sweep (one line).
        if HydraConfig.get().mode != RunMode.MULTIRUN or refused_write(exc) is not None:
            raise
        return _failed_job(cfg, out_dir, exc)


def _print_summary_line(summary: dict) -> None:
    """The run's summary on stdout, one JSON object a line, handed over in one write: the
    jobs of a sweep share the stdout pipe, and ``print`` hands over the object and its
    newline separately (a sweep test found another job's line joined to one's object)."""
    sys.stdout.write(summary_json(summary, indent=None) + "\n")
    sys.stdout.flush()


def _failed_job(cfg: DictConfig, out_dir: Path, exc: Exception) -> dict:
    """A sweep job that raised (a bug: a user policy's, say) leaves a summary with status
    ``failed`` and the error, like a job whose input was rejected, so the other jobs go on
    and the sweep's table counts it (:class:`SweepReport`); its traceback is in its
    ``app.log``. A resume runs it again."""
    message = " ".join(f"{type(exc).__name__}: {exc}".split())
    summary = error_summary(cfg, f"{message} (traceback in app.log)", status="failed")
    atomic_write_text(out_dir / "summary.json", summary_json(summary, indent=1))
    print(f"error: {_shown(out_dir)}: the job failed: {message} (traceback in its app.log)",
          file=sys.stderr, flush=True)
    _print_summary_line(summary)
    return summary


def _log_to_file(message: str, exc: BaseException | None = None) -> None:
    """Write ``message`` (and ``exc``'s traceback) to the job's log file (``app.log``) only:
    the console has its own ``error:`` line."""
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _replay(cfg: DictConfig, out_dir: Path) -> dict:
    """One job of ``replay_job``: its summary, or its rejected input as one line."""
    try:
        resolved = validate_config(cfg)
        # Imported here, not at the top: the engine (numba, pandas, scipy) is most of the
        # start-up, and `--help`, a config error or a sweep's parent process needs none of it.
        from replay.engine.jit import count_references_plainly
        from replay.run import run

        count_references_plainly()  # before this process first compiles or loads compiled code
        if cfg.get("study") is not None:
            summary = instantiate(cfg.study, _partial_=True)(cfg=cfg, out_dir=out_dir)
        else:
            summary = run(cfg, out_dir, resolved)
    except (InputError, InstantiationException) as exc:
        # Bad input, not a bug: the message names the file, row and field (and, when a
        # component rejects its config, the config key); no traceback.
        if not is_input_error(exc):
            raise
        _log_to_file(f"error: {input_error_message(exc)}")
        exc.logged = True
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            fail(input_error_message(exc))
        # In a sweep the other jobs go on: this one leaves a summary saying why it failed,
        # and the sweep's report counts it (SweepReport).
        summary = error_summary(cfg, input_error_message(exc))
        # A disk that refuses even this record (full, read-only) refuses every job: its
        # error ends the sweep (one line, exit 2) rather than leave a job without a summary
        # that the sweep's report would not count.
        atomic_write_text(out_dir / "summary.json", summary_json(summary, indent=1))
        print(f"error: {input_error_message(exc)}", file=sys.stderr, flush=True)
    if HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep prints one table at its end
        print(human_summary(summary, out_dir), file=sys.stderr, flush=True)
    _print_summary_line(summary)
    return summary


#: The width of the printed summary block and of its labels (vLLM's benchmark printout's).
BLOCK_WIDTH, LABEL_WIDTH = 52, 40
#: The distributions of the printed block: summary key suffix, section title, short name.
SECTIONS = (("ttft", "Time to first token", "TTFT"),
            ("tpot", "Time per output token (excl. 1st token)", "TPOT"),
            ("tbt", "Inter-token latency", "ITL"),
            ("latency", "End-to-end latency", "E2EL"))


def human_summary(summary: dict, run_dir: Path) -> str:
    """The run's headline numbers for a person, laid out like vLLM's benchmark printout
    (``vllm bench serve``): counts and throughputs, then the mean and the chosen
    percentiles (``output.percentiles``) of TTFT, TPOT, ITL and end-to-end latency, every
    time in milliseconds (in rounds under unit time)."""
    from replay.engine.metrics import DEFAULT_PERCENTILES, percentile_key

    rounds = summary.get("time_unit") == "rounds"
    clock, per = ("rounds", "round") if rounds else ("ms", "s")
    scale = 1.0 if rounds else 1e3
    length = "words" if summary.get("length_unit") == "words" else "tokens"
    config = summary.get("config") or {}
    chosen = (config.get("output") or {}).get("percentiles") or DEFAULT_PERCENTILES

    def row(label: str, value) -> str:
        return f"{label + ':':<{LABEL_WIDTH}}{value}"

    def number(value, digits: int = 2) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    def rule(title: str = "", fill: str = "-") -> str:
        return f" {title} ".center(BLOCK_WIDTH, fill) if title else fill * BLOCK_WIDTH

    status = summary.get("status")
    lines = [rule(f"kvsched replay: {status}", "=")]
    if summary.get("message"):
        lines.append(row("Message", summary["message"]))
    policy = config.get("policy")
    if policy and "_target_" in policy:
        lines.append(row("Policy", policy_label(policy)))
    if "mean_latency" in summary:
        lines += [
            row("Completed requests", f"{summary.get('n_completed', 0):,} of "
                                      f"{summary.get('n_requests', 0):,}"
                + (" (statistics over these)" if summary.get("partial") else "")),
            row(f"Duration ({'rounds' if rounds else 's'})", number(summary.get("makespan"))),
            row(f"Total input {length}", f"{summary.get('total_input_tokens', 0):,}"),
            row(f"Total generated {length}", f"{summary.get('total_output_tokens', 0):,}"),
            row(f"Request throughput (req/{per})",
                number(summary.get("throughput_requests_per_s"))),
            row(f"Output token throughput (tok/{per})",
                number(summary.get("throughput_tokens_per_s"))),
            row(f"Total token throughput (tok/{per})",
                number(summary.get("throughput_total_tokens_per_s"))),
            row("Evictions (requests evicted)", f"{summary.get('evictions', 0):,} "
                                                f"({summary.get('requests_evicted', 0):,})"),
        ]
        cache = summary.get("prefix_cache") or {}
        if cache.get("hit_ratio_tokens") is not None:
            lines.append(row("Prefix cache hit ratio (tokens)",
                             number(cache["hit_ratio_tokens"], 3)))
        if "slo_attainment" in summary:
            lines += [row("SLO attainment", number(summary["slo_attainment"], 3)),
                      row(f"Goodput (req/{per})", number(summary.get("goodput_requests_per_s")))]
        for key, title, short in SECTIONS:
            lines.append(rule(title))
            lines.append(row(f"Mean {short} ({clock})", _scaled(summary.get(f"mean_{key}"),
                                                                scale, number)))
            for q in chosen:
                name = "Median" if q == 50 else f"P{q:g}"
                lines.append(row(f"{name} {short} ({clock})", _scaled(
                    summary.get(f"{percentile_key(q)}_{key}"), scale, number)))
    lines += [rule(), row("Run folder", _shown(run_dir))]
    return "\n".join(lines)


def _scaled(value, scale: float, number) -> str:
    """``value`` (seconds or rounds) times ``scale``, as ``number`` writes it."""
    return number(None if value is None else value * scale)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class SweepReport:
    """Hydra callback: after a multirun, one table of its jobs and a count of the failed.

    The table (on stderr, :func:`replay.results.sweep_tables`) has a row per job folder under
    ``hydra.sweep.dir``: its status, policy, completions, TTFT, TPOT, latency and throughput
    with their units; when a configuration ran with several seeds, a second table gives
    each configuration's mean and 95 % interval over them. A job whose summary has status
    ``error`` or ``failed`` (:data:`~replay.storage.outputs.NO_RESULT_STATUSES`), or one of
    ``output.fail_on`` (e.g. ``[livelock, stalled]``), counts as
    failed; then the sweep exits with status 1, so a script cannot miss it.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from replay.results import sweep_jobs, sweep_text

        fail_on = {*NO_RESULT_STATUSES, *config.output.get("fail_on", [])}
        sweep = Path(config.hydra.sweep.dir)
        jobs = sweep_jobs(sweep)
        if jobs:
            print(f"{len(jobs)} jobs in {_shown(sweep)}:\n{sweep_text(jobs)}", file=sys.stderr,
                  flush=True)
        failed = [j.summary.get("status") for j in jobs.values()
                  if j.summary.get("status") in fail_on]
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
