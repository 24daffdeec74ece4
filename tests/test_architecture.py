"""The package's import rules (pyproject's ``[tool.importlinter]`` contracts) hold.

The contracts say which room imports which: commands over experiments over a run over
the policies and inputs over the simulator core; the core and the policies never reach
the command line, configs or plotting; no two modules of a package import each other in
a circle. The second test plants a violation of each kind in a copy of the tree, so the
rules are known to bite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_import_contracts_hold():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "planted", "broken"), [
    ("replay/engine/kv.py", "import replay.config.cli", "never import the command line"),
    ("replay/engine/kv.py", "import replay.experiments.report", "Layers"),
    ("replay/errors.py", "import replay.storage.data", "No import circles"),
    ("replay/engine/phases.py", "import replay.storage.data", "reads no config"),
    ("replay/engine/loop.py", "import policies.vllm", "Layers"),
])
def test_a_planted_violation_breaks_its_contract(tmp_path, module, planted, broken):
    for package in ("replay", "policies", "traces"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{planted}  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout.replace("\n", " ")


def test_the_engine_names_no_policy():
    """The step loop reaches a policy only through its function pointer: no module of the
    engine names a built-in policy, so a policy's rule lives in its own module alone."""
    names = {path.stem for path in (REPO / "policies").glob("*.py")} - {"__init__", "labels"}
    classes = {"VLLMLike", "SarathiLike", "FCFSLookahead", "MCSF", "AlphaProtection",
               "PaperFCFS", "Wait", "NestedWait", "SortedF", "SortedLP", "LPSwap", "AMin"}
    for path in (REPO / "replay" / "engine").glob("*.py"):
        text = path.read_text()
        assert "policies." not in text.replace("policies.common", ""), path
        named = {name for name in classes if f"{name}(" in text or f" {name}," in text}
        assert not named, (path, named)
        assert not {name for name in names if f"policies.{name}" in text}, path


def test_every_module_with_compiled_functions_keys_the_compile_cache():
    """The disk cache is keyed by the sources of every module that defines compiled
    functions (replay.engine.jit.JIT_SOURCES): a module missing from the list would let a
    caller load stale machine code after an edit of it."""
    from replay.engine.jit import JIT_SOURCES

    compiled = {str(path.relative_to(REPO)) for root in ("replay", "policies", "traces")
                for path in (REPO / root).rglob("*.py")
                if "@jit" in path.read_text() or " = jit(" in path.read_text()}
    assert compiled | {"replay/engine/jit.py"} == set(JIT_SOURCES)


@pytest.mark.slow
def test_a_policys_rule_changed_in_its_module_changes_a_default_run(tmp_path):
    """One source per rule: a copy of the tree whose FCFS decision (policies/fcfs.py, the
    default policy) starts at most one request per step gives another default run, without
    any other file touched."""
    for package in ("replay", "policies", "traces", "configs", "hydra_plugins"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    fcfs = tmp_path / "policies" / "fcfs.py"
    text = fcfs.read_text()
    edited = text.replace("s.qtail - s.qhead)", "min(1, s.qtail - s.qhead))")
    assert edited != text
    fcfs.write_text(edited)

    def tel(root: Path, cache: Path) -> float:
        env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(cache)}
        done = subprocess.run([sys.executable, "-m", "replay", "workload.n=200",
                               f"hydra.run.dir={cache / 'run'}"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=900, check=True)
        return json.loads(done.stdout.splitlines()[-1])["tel"]

    assert tel(tmp_path, tmp_path / "edited") != tel(REPO, tmp_path / "original")
