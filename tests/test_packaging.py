"""The wheel ships every package of the source tree and every config group (pyproject lists
them explicitly)."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO


def test_every_source_package_is_in_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(init.parent.relative_to(REPO).parts)
             for top in ("replay", "policies", "traces") for init in (REPO / top).rglob(
                 "__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_every_config_group_is_a_listed_package():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    groups = {".".join(("kvsched_configs", *folder.relative_to(REPO / "configs").parts))
              for folder in (REPO / "configs").rglob("*") if folder.is_dir()}
    assert groups <= listed, f"config groups missing from pyproject.toml: {sorted(groups - listed)}"
