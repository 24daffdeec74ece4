"""The documentation stands alone and its example works.

The README stays an entry point (at most 250 lines); no page links outside the
repository except to full web addresses (papers, datasets, upstream projects); the
example policy of "Adding a policy" passes ruff and replays. The site itself is built
with ``mkdocs build --strict`` in CI (``.ci/run``), which checks every internal link,
included file and API reference.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from policies.labels import policy_label
from replay.config import compose_config
from replay.run import build_and_run

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
EXAMPLE = REPO / "docs" / "examples" / "longest_prompt_first.py"
#: Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")


def test_the_readme_is_an_entry_point_of_at_most_250_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_points_outside_the_repository(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        resolved = (page.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{page.name} links to {target}"
        assert resolved.exists(), f"{page.name} links to {target}, which does not exist"
    # Nor in prose: the shared spec folder or this machine's paths are not the reader's.
    for outside in ("../shared", "/work/", "/tmp/", "/root/", "/home/"):
        assert outside not in text, f"{page.name} mentions {outside}"


COMPILED = REPO / "docs" / "examples" / "longest_prompt_first_compiled.py"


def test_the_example_policies_pass_ruff():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run([ruff, "check", "--config", str(REPO / "pyproject.toml"),
                           str(EXAMPLE), str(COMPILED)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _example(path: Path, name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_compiled_example_decides_as_the_python_one(monkeypatch):
    """The page's two versions of longest prompt first give the same run, one deciding in
    Python through the engine's bridge, the other compiled."""
    import numpy as np

    from replay.engine.kv import explicit
    from replay.engine.loop import Engine
    from replay.engine.overflow import EvictLIFO
    from replay.engine.requests import Requests
    from replay.timing import LinearTiming

    plain = _example(EXAMPLE, "policies.longest_prompt_first", monkeypatch)
    compiled = _example(COMPILED, "policies.longest_prompt_first_compiled", monkeypatch)
    rng = np.random.default_rng(4)
    requests = Requests(rng.integers(1, 200, 300), rng.integers(1, 200, 300),
                        arrival=np.sort(rng.uniform(0, 10, 300)))
    runs = [Engine(requests, policy(EvictLIFO()), LinearTiming(0.01, 1e-5, 1e-4),
                   explicit(3000)).run()
            for policy in (plain.LongestPromptFirst, compiled.LongestPromptFirstCompiled)]
    assert [run.engine_path["policy"] for run in runs] == ["python", "compiled"]
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].iterations.equals(runs[1].iterations)


def test_the_example_policy_replays_with_its_config(monkeypatch):
    """Installed as the page says (the module as ``policies.longest_prompt_first``, the yaml
    as the ``policy`` group's config), it replays to completion under its label."""
    spec = importlib.util.spec_from_file_location("policies.longest_prompt_first", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    cfg = compose_config(["workload.n=100"])
    with open_dict(cfg):
        cfg.policy = OmegaConf.load(EXAMPLE.with_suffix(".yaml"))
    result, _, _ = build_and_run(cfg)
    assert result.status == "completed"
    assert policy_label(OmegaConf.to_container(cfg.policy)) == "LongestPromptFirst"


@pytest.mark.slow
def test_bench_times_the_example_policy_decided_in_python():
    """``replay.bench --user-policy``: a user's own policy, loaded from the docs' example
    file, runs beside a built-in one, its decision in Python, the built-in's compiled."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "replay.bench", "--n", "200", "--repeat", "1",
                           "--policies", "mcsf", "--rates", "20", "--user-policy"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split(" 20/s")[0]: line.split()[-1] for line in done.stdout.splitlines()
            if " 20/s" in line}
    assert rows == {"mcsf": "compiled", "user: longest prompt first": "python"}
