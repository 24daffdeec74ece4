"""The wheel ships every package of the source tree (pyproject lists them explicitly)."""

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
