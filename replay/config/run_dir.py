"""Hydra callback: check the run (or sweep) folder before Hydra writes anything into it.

Hydra creates ``hydra.run.dir`` (``hydra.sweep.dir`` for ``-m``), saves ``.hydra/`` and
opens ``app.log`` there before the app's own code runs, so a folder that cannot be
written (a file in the way, a read-only or full disk, an impossible path) would end in
Hydra's traceback, and a run the app then refuses (the folder holds a finished run of
another config) would already have rewritten that run's ``.hydra/`` records. This
callback, registered in ``configs/config.yaml`` (``hydra.callbacks.run_folder``), runs
first (``on_run_start``/``on_multirun_start``) and answers both with one ``error:`` line
and exit status 2, leaving the folder as it was.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def _task_config(config: DictConfig) -> dict | None:
    """The resolved config the app will run (without the ``hydra`` node), or ``None`` when it
    does not resolve yet (the app reports that itself)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        HydraConfig.instance().set_config(config)  # for ${hydra:...}; run_job sets it too
        task = OmegaConf.to_container(config, resolve=False)
        task.pop("hydra", None)
        return OmegaConf.to_container(OmegaConf.create(task), resolve=True,
                                      throw_on_missing=True)
    except (OmegaConfBaseException, ValueError, TypeError, KeyError):
        return None


def refusal(folder: Path, config: DictConfig) -> str | None:
    """Why a run of ``config`` in ``folder`` will be refused (``None``: it will not be): the
    folder holds a finished run of another config and ``output.overwrite`` is off.
    The app makes the same check (:func:`replay.storage.outputs.stale_reason`)."""
    from replay.storage.outputs import NO_RESULT_STATUSES, read_summary, result_config

    if config.get("study") is not None or config.get("output", {}).get("overwrite", False):
        return None
    summary = read_summary(folder / "summary.json")
    if summary is None or summary.get("status") in NO_RESULT_STATUSES or "config" not in summary:
        return None
    task = _task_config(config)
    if task is None or result_config(summary["config"]) == result_config(task):
        return None
    return (f"{folder} holds a run of another config; choose another folder "
            f"(hydra.run.dir=...) or set output.overwrite=true to replace it")


class RunFolderCheck:
    """``on_run_start``: ``hydra.run.dir`` must be a writable folder and must not hold a
    finished run of another config; ``on_multirun_start``: ``hydra.sweep.dir`` must be
    writable. Otherwise one ``error:`` line, exit status 2, nothing written."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from replay.config.cli import fail
        from replay.errors import OutputError
        from replay.storage.outputs import ensure_writable_dir

        folder = Path(str(config.hydra.run.dir)).expanduser()
        refused = refusal(folder, config) if folder.is_dir() else None
        if refused:
            fail(refused)
        try:
            ensure_writable_dir(folder)
        except OutputError as exc:
            fail(f"{exc}; choose another hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from replay.config.cli import fail
        from replay.errors import OutputError
        from replay.storage.outputs import ensure_writable_dir

        try:
            ensure_writable_dir(Path(str(config.hydra.sweep.dir)).expanduser())
        except OutputError as exc:
            fail(f"{exc}; choose another hydra.sweep.dir")

    # Hydra calls these too; nothing to do.
    def on_run_end(self, config, **kwargs) -> None: ...
    def on_multirun_end(self, config, **kwargs) -> None: ...
    def on_job_start(self, config, **kwargs) -> None: ...
    def on_job_end(self, config, job_return, **kwargs) -> None: ...
    def on_compose_config(self, config, config_name, overrides) -> None: ...
