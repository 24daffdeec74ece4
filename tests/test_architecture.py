"""The package's import rules (pyproject's ``[tool.importlinter]`` contracts) hold.

The contracts say which room imports which: commands over experiments over a run over
the policies and inputs over the simulator core; the core and the policies never reach
the command line, configs or plotting; no two modules of a package import each other in
a circle. The second test plants a violation of each kind in a copy of the tree, so the
rules are known to bite.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
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


#: What any layer may use (the architecture page's plumbing), and the entry point of
#: ``python -m replay``, which only calls the app.
PLUMBING = {"replay.errors", "replay.params", "replay.config", "replay.storage", "replay.__main__"}


def unlayered(root: Path) -> set[str]:
    """The modules of ``replay`` under ``root``, at any depth, that no layer of the layers
    contract and no plumbing module holds. A package's ``__init__`` may stay outside when it
    imports nothing but plumbing (``replay.fluid`` only names its two modules, which sit in
    different layers)."""
    layers = next(c["layers"] for c in tomllib.loads((root / "pyproject.toml").read_text())[
        "tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    holders = {name.strip() for layer in layers for name in layer.split("|")} | PLUMBING

    def held(module: str) -> bool:
        return any(module == h or module.startswith(f"{h}.") for h in holders)

    found = set()
    for path in (root / "replay").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if held(module):
            continue
        nodes = list(ast.walk(ast.parse(path.read_text())))
        package = parts[:-1]  # where a relative import of this file starts
        imported = {".".join([*package[:len(package) - node.level + 1], *filter(None, [
                        node.module])]) if node.level else node.module
                    for node in nodes if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in nodes if isinstance(node, ast.Import)
                     for alias in node.names}
        ours = {name for name in imported if name.split(".")[0] in ("replay", "policies",
                                                                     "traces")}
        plumbing_only = all(any(name == p or name.startswith(f"{p}.") for p in PLUMBING)
                            for name in ours)
        if parts[-1] != "__init__" or not plumbing_only:
            found.add(module)
    return found


def test_every_module_of_replay_is_in_a_layer_or_plumbing():
    # A module in no layer is held by no layer rule: a new command left out of the list
    # could import anything, and the contracts would still pass.
    assert unlayered(REPO) == set()


@pytest.mark.parametrize(("planted", "text"), [
    ("replay/fluid/solver.py", "import numpy\n"),   # in a package split over two layers
    ("replay/sweep.py", "import replay.run\n"),      # a new top-level command
    ("replay/fluid/__init__.py", "from replay.fluid.model import TypeMix\n"),
    ("replay/fluid/__init__.py", "from .model import TypeMix\n"),
])
def test_a_module_outside_every_layer_is_found(tmp_path, planted, text):
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "replay", tmp_path / "replay",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / planted).write_text(text)
    module = planted.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert unlayered(tmp_path) == {module}


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
    # The listing names every contract with its outcome (names wrap over lines): the one
    # planted against must be the one broken.
    listing = " ".join(result.stdout.split())
    outcome = re.search(r" (KEPT|BROKEN)\b", listing[listing.index(broken):])
    assert outcome and outcome.group(1) == "BROKEN", result.stdout


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


def _tree_facts():
    from replay.engine.jit import CACHE_DIR, _source_facts

    return _source_facts(CACHE_DIR)


def test_each_compiled_module_is_keyed_by_every_module_of_the_tree_it_imports():
    """A compiled module's cache key covers every module of the tree it imports, directly or
    not, compiled or not (a compiled function freezes the constants it reads): the same as
    grimp's import graph finds, and the package ``__init__`` files an import runs."""
    import grimp

    from replay.engine.jit import JIT_SOURCES, module_name, reached_sources

    graph = grimp.build_graph("replay", "policies", "traces")
    reached = reached_sources(_tree_facts())
    for name in JIT_SOURCES:
        found = graph.find_upstream_modules(module_name(name))
        assert found <= {module_name(other) for other in reached[name]}, name
        extra = {other for other in reached[name] - {name} if module_name(other) not in found}
        assert all(other.endswith("/__init__.py") for other in extra), (name, extra)
    assert "replay/timing/vidur_tables.py" in reached["replay/timing/vidur_pricing.py"]


def test_an_edit_changes_the_keys_of_the_modules_that_import_it_and_no_other():
    """The loop imports no policy or timing backend (it calls them through function
    pointers): a policy's edit changes that policy's key alone, a shared helper's those of
    the policies that call it; an edit of the state record changes the key of every module
    that reads it, and one of the decorator every key."""
    from replay.engine.jit import module_keys

    facts = _tree_facts()
    keys = module_keys(facts)
    assert len(set(keys.values())) == len(keys)

    def keys_after_editing(name):
        return module_keys(facts | {name: ("edited", facts[name][1])})

    fcfs = keys_after_editing("policies/fcfs.py")
    assert {name for name in keys if fcfs[name] != keys[name]} == {"", "policies/fcfs.py"}
    lookahead = keys_after_editing("policies/common/lookahead.py")
    assert {name for name in keys if lookahead[name] != keys[name]} == {
        "", "policies/common/lookahead.py", "policies/fcfs.py", "policies/mcsf.py"}
    state = keys_after_editing("replay/engine/state.py")
    # the helpers that take arrays and scalars, not the record, keep theirs
    assert {name for name in keys if state[name] == keys[name]} == {
        "replay/engine/jit.py", "replay/engine/sorting.py", "replay/engine/paging.py",
        "replay/engine/numeric.py", "replay/engine/histogram.py",
        "replay/engine/prefix_cache.py", "replay/engine/sessions.py",
        "replay/timing/grid_lookup.py", "replay/timing/vidur_pricing.py",
        "replay/timing/layer_profile_step.py", "replay/timing/aiconfigurator_step.py",
        "policies/common/lookahead.py", "policies/common/serving.py"}
    # a module without compiled code whose constants a compiled one freezes
    tables = keys_after_editing("replay/timing/vidur_tables.py")
    assert {name for name in keys if tables[name] != keys[name]} == {
        "", "replay/timing/vidur_pricing.py"}
    jit = keys_after_editing("replay/engine/jit.py")  # the decorator: every key
    assert all(jit[name] != keys[name] for name in keys)


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

    cache = tmp_path / "numba"

    def run(root: Path, name: str) -> tuple[float, str]:
        env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(cache)}
        done = subprocess.run([sys.executable, "-m", "replay", "workload.n=200",
                               f"hydra.run.dir={tmp_path / name}"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=900, check=True)
        return json.loads(done.stdout.splitlines()[-1])["tel"], done.stdout + done.stderr

    original, _ = run(REPO, "original")
    edited, said = run(tmp_path, "edited")
    assert edited != original
    # the shared cache holds the original's loop: the edit compiles the decision alone
    assert "kvsched: compiled fcfs_decide in " in said, said
