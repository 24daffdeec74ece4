"""The documentation against the code: every documented command, option, config key, target,
policy and metric exists, every metric a run writes is documented, and every document a
file of the repository cites is in the repository."""

from __future__ import annotations

import importlib.util
import json
import re
import runpy
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify
from omegaconf import OmegaConf

from replay.config import CONFIG_DIR, compose_config
from replay.engine.metrics import summarize
from replay.engine.overflow import EvictLIFO
from replay.experiments.targets import TARGETS
from replay.reproduce import targets_markdown
from tests.conftest import REPO, replay

DOCS = REPO / "docs"
#: The documentation a person reads: the README and the site's pages.
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
#: Where code and configs live (the files that may cite a document).
SOURCES = [p for folder in ("replay", "policies", "traces", "configs", "tests", "hydra_plugins")
           for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".yaml")]
URL = re.compile(r"https?://\S+")
#: A cited Markdown document: a path ending in .md, with an optional #anchor. In code and
#: configs only a path from the root (``docs/model.md``) or a capitalised name
#: (``README.md``) is a citation: a bare ``mcsf.md`` there names a page the code writes.
CITED = re.compile(r"(?<![\w/.-])((?:\.\./|[\w-]+/)*[\w.-]+\.md)(#[\w-]+)?")
CITED_IN_CODE = re.compile(r"^(docs/|\.\./|[A-Z][A-Z_]*\.md$)")
#: In a page, a link's target; a name in backticks there (``table.md``) is an output file.
LINKED = re.compile(r"\]\(((?:\.\./|[\w-]+/)*[\w.-]+\.md)(#[\w-]+)?\)")
def text_without_urls(path: Path) -> str:
    return URL.sub("", path.read_text())


@cache
def anchors(page: Path) -> set[str]:
    """The heading anchors MkDocs gives ``page`` (its default slugify over the heading's
    text without Markdown markup)."""
    found = set()
    for line in page.read_text().splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).replace("`", "")
            found.add(slugify(text, "-"))
    return found


def resolve(cited: str, citing: Path) -> Path | None:
    """The document ``cited`` names from ``citing``: relative to the citing file, to the
    repository's root or to docs/ (MkDocs pages link relative to themselves)."""
    for base in (citing.parent, REPO, DOCS):
        candidate = (base / cited).resolve()
        if candidate.is_file():
            return candidate
    return None


@pytest.mark.parametrize("path", SOURCES + PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_document_is_in_the_repository(path):
    missing = []
    pattern = LINKED if path.suffix == ".md" else CITED
    for match in pattern.finditer(text_without_urls(path)):
        cited, anchor = match.group(1), match.group(2)
        if path.suffix != ".md" and not CITED_IN_CODE.match(cited):
            continue
        document = resolve(cited, path)
        if document is None:
            missing.append(cited)
        elif anchor and anchor[1:] not in anchors(document):
            missing.append(f"{cited}{anchor} (no such heading)")
    assert not missing, f"{path.relative_to(REPO)} cites {missing}"


def test_the_spec_documents_outside_the_repository_are_not_cited():
    # The model, the policies and the experiments are described in docs/: cite those pages.
    for path in SOURCES + PAGES:
        assert not re.search(r"\b(MODEL|POLICIES|EXPERIMENTS)\.md", path.read_text()), path


def documented_commands() -> list[tuple[Path, str, str]]:
    """Every ``python -m MODULE ARGS`` written in the documentation: page, module, arguments
    (up to the end of the code span or line)."""
    found = []
    for page in PAGES:
        for match in re.finditer(r"python -m ([\w.]+)([^`\n|#]*)", page.read_text()):
            found.append((page, match.group(1), match.group(2)))
    return found


COMMANDS = documented_commands()


def test_the_documentation_shows_commands():
    assert len(COMMANDS) > 50  # the extraction sees the pages' commands


@pytest.mark.parametrize("module", sorted({m for _, m, _ in COMMANDS}))
def test_every_documented_command_exists(module):
    assert importlib.util.find_spec(module) is not None, module


#: Options of ``python -m replay`` that are Hydra's own.
HYDRA_FLAGS = {"--multirun", "--help", "--cfg", "--info", "--resolve", "--package",
               "--config-name", "--config-dir", "--hydra-help", "--shell-completion"}


@pytest.mark.parametrize("module", sorted({m for _, m, args in COMMANDS if "--" in args}))
def test_every_documented_option_of_a_command_is_in_its_code(module):
    spec = importlib.util.find_spec(module)
    source = Path(spec.origin)
    code = source.read_text()
    if source.name == "__main__.py" or source.name == "__init__.py":
        code += "".join(p.read_text() for p in source.parent.glob("*.py"))
    for page, name, args in COMMANDS:
        if name != module:
            continue
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args):
            if module == "replay" and option in HYDRA_FLAGS:
                continue
            assert f'"{option}"' in code, f"{page.relative_to(REPO)}: {module} {option}"


def replay_overrides(args: str) -> list[str] | None:
    """The config overrides of a documented ``python -m replay`` command, a sweep's first
    value of each option; ``None`` for a command with placeholders (``<run>``, ``...``)."""
    if "<" in args or "..." in args or "$" in args:
        return None
    overrides = []
    for word in args.split():
        if word.startswith(("-", "[", "hydra.")) or "=" not in word:
            continue
        key, value = word.split("=", 1)
        if "," in value and not re.search(r"[\[{(]", value):
            value = value.split(",")[0]
        overrides.append(f"{key}={value}")
    return overrides


#: The tutorial's commands run the policy the reader adds there.
TUTORIAL = DOCS / "adding-a-policy.md"


@pytest.mark.parametrize("args", sorted({args.strip() for page, m, args in COMMANDS
                                         if m == "replay" and page != TUTORIAL
                                         and replay_overrides(args)}))
def test_every_documented_replay_command_composes(args):
    compose_config(replay_overrides(args))


def documented_keys() -> set[str]:
    """The dotted config keys of the configuration page's tables (``| `output.fail_on` |``)."""
    text = (DOCS / "configuration.md").read_text()
    return set(re.findall(r"^\| `([a-z_]+\.[\w.]+)` \|", text, flags=re.M))


@pytest.mark.parametrize("key", sorted(documented_keys()))
def test_every_documented_config_key_exists(key):
    group, _, rest = key.partition(".")
    if (CONFIG_DIR / group).is_dir():  # a group's key: in one of its options
        options = [yaml.safe_load(p.read_text()) or {} for p in (CONFIG_DIR / group).glob("*.yaml")]
        assert any(OmegaConf.select(OmegaConf.create(o), rest) is not None
                   or rest in o for o in options), key
    else:
        config = compose_config([])
        assert OmegaConf.select(config, key, default="absent") != "absent", key


def test_the_configuration_page_lists_every_policy():
    text = (DOCS / "configuration.md").read_text()
    for option in sorted(p.stem for p in (CONFIG_DIR / "policy").glob("*.yaml")):
        assert f"`{option}`" in text, option


def test_the_reproducing_page_holds_the_generated_table_of_every_target():
    text = (DOCS / "reproducing" / "index.md").read_text()
    assert targets_markdown() in text, (
        "docs/reproducing/index.md's table of targets is out of date: paste the output of "
        "`python -m replay.reproduce --list --markdown`")
    for name in TARGETS:
        assert f"| `{name}` |" in text


def test_every_documented_reproduce_target_exists():
    for page, module, args in COMMANDS:
        if module == "replay.reproduce":
            for word in args.split():
                if word.startswith("-"):
                    break  # an option's value follows
                assert word in (*TARGETS, "all", "report"), f"{page.relative_to(REPO)}: {word}"


# ------------------------------------------------------------------------------ metrics
def metrics_table(title: str, marked: str = "") -> set[str]:
    """The field names in the first column of the table under ``title`` in metrics.md
    (patterns such as ``p<q>_ttft`` left out), of the rows that say ``marked`` if given."""
    text = (DOCS / "metrics.md").read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `") and marked in line:
            names |= {n for n in re.findall(r"`([\w.]+)`", line.split("|")[1])}
    return names


@pytest.fixture(scope="module")
def small_run():
    """A unit-time replay with an eviction: two requests that cannot both finish in M."""
    return replay([1, 1, 1], [2, 2, 2], type_of_lookahead_policy(), 3)


def type_of_lookahead_policy():
    from policies.fcfs import FCFSLookahead

    return FCFSLookahead(EvictLIFO())


def test_every_summary_field_the_engine_writes_is_documented(small_run):
    documented = metrics_table("Per run: `summary.json`")
    written = set(summarize(small_run))
    assert written <= documented, sorted(written - documented)


def test_a_runs_summary_json_has_exactly_the_documented_fields(tmp_path):
    # A whole run (the engine's metrics and what the run adds: config, files, timings),
    # with SLO objectives so that their fields are written too. (Matching any string of
    # the code, as this test once did, passed a documented name the run never wrote.)
    from replay.run import run

    cfg = compose_config(["workload.n=20", "metrics.slo.ttft_ms=1000",
                          "metrics.slo.tpot_ms=100"])
    run(cfg, tmp_path)
    written = set(json.loads((tmp_path / "summary.json").read_text()))
    assert written == metrics_table("Per run: `summary.json`")


def test_the_request_and_iteration_tables_match_their_documentation(small_run):
    # Both ways: a run with the prefix cache on writes every documented column (a column the
    # code stopped writing would otherwise stay in the table), one without writes all but
    # those the table marks as the cache's.
    from replay.run import build_engine

    cfg = compose_config(["workload=shared_prefix", "workload.n=20", "kv.block_size=16",
                          "kv.prefix_cache=block_hash", "policy=vllm"])
    with_cache = build_engine(cfg)[0].run()
    for title, table in (("Per request: `requests.parquet`", "requests"),
                         ("Per iteration: `iterations.parquet`", "iterations")):
        documented = metrics_table(title)
        assert set(getattr(with_cache, table).columns) == documented
        cache_only = metrics_table(title, marked="with the prefix cache on only")
        assert documented - set(getattr(small_run, table).columns) == cache_only


# ------------------------------------------------------------------------------ --help
#: Commands whose help is plain text (the others still print their reST docstrings).
PLAIN_HELP = {"traces.fetch", "replay.reproduce", "replay.results"}


@pytest.mark.parametrize("module", sorted({m for _, m, _ in COMMANDS} - {"replay"}))
def test_every_documented_command_helps_under_the_name_it_is_run_by(module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as done:
        assert done.code in (0, None)
    text = capsys.readouterr().out
    assert f"python -m {module}" in text.splitlines()[0], text[:200]  # not "usage: x.py"
    if module in PLAIN_HELP:
        assert "``" not in text and ":mod:" not in text, text  # plain text, not reST
