"""Start-up stays light: importing the app loads none of the heavy libraries a run may not need.

The app is imported by every command line (``--help``, a config error, a sweep's parent), so a
module-level import of the engine or of scipy is paid by all of them (issue 44: it was 1.2 s
of CPU before the engine's imports were deferred to the run).
"""

from __future__ import annotations

import json
import subprocess
import sys

#: Libraries costing tenths of a second each to import, which ``import replay.app`` must not.
HEAVY = ("scipy", "pandas", "numba", "matplotlib", "vidur", "pyarrow")


def _loaded_after(statement: str) -> list[str]:
    probe = (f"import sys, json; {statement}; "
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_the_app_loads_no_heavy_library():
    assert _loaded_after("import replay.app") == []


def test_the_probe_sees_a_heavy_import():
    # the check above could pass vacuously if the probe never saw a module: it does
    assert _loaded_after("import replay.app, scipy.special") == ["scipy"]


def test_the_compile_cache_key_ignores_comments_docstrings_and_layout_only():
    from replay.engine.jit import code_digest

    source = b'"""Module."""\n\ndef f(x):\n    """Twice x."""\n    return 2 * x\n'
    same_code = (b'# a comment\n"""Another docstring."""\n\n\n'
                 b'def f(x):  # shifted two lines down\n    return 2 * x\n')
    other_code = b'"""Module."""\n\ndef f(x):\n    """Twice x."""\n    return 3 * x\n'
    assert code_digest(source) == code_digest(same_code)
    assert code_digest(source) != code_digest(other_code)
    # a string that is not the first statement is code, not a docstring
    assert code_digest(b"def f():\n    x = 1\n    'kept'\n") != code_digest(
        b"def f():\n    x = 1\n")
