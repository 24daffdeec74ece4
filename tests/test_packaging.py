"""The wheel ships every package of the source tree and every config group (pyproject lists
them explicitly)."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO

LISTED = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_source_package_is_in_the_wheel():
    found = {".".join(init.parent.relative_to(REPO).parts)
             for top in ("replay", "policies", "traces") for init in (REPO / top).rglob(
                 "__init__.py")}
    assert found <= LISTED, f"packages missing from pyproject.toml: {sorted(found - LISTED)}"


def test_every_config_group_is_a_listed_package():
    groups = {".".join(("kvsched_configs", *folder.relative_to(REPO / "configs").parts))
              for folder in (REPO / "configs").rglob("*") if folder.is_dir()}
    assert groups <= LISTED, f"config groups missing from pyproject.toml: {sorted(groups - LISTED)}"
