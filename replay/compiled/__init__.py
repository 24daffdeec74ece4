"""The compiled fast path of the replay engine (numba): the same engine, step loop and
output tables as :meth:`replay.engine.loop.Engine.run`, for the built-in policies that carry a
compiled decision. See :mod:`replay.compiled.driver`.

The ``@njit(cache=True)`` functions are cached on disk, but numba keys a cached function
by its own source file only: after an edit of :mod:`~replay.compiled.pricing` the step
loop in :mod:`~replay.compiled.kernels` would load its stale machine code. So the cache
lives in a folder named by a hash of the sources of its compiled modules, under
``$NUMBA_CACHE_DIR`` if set, else ``numba/`` in kvsched's per-user cache folder; numba's
own setting is restored once the functions are defined (other numba users in the process
keep theirs).

A cold compile is kept short by compiling each function once: numba compiles a called
function once per distinct tuple of argument types, and types a constant argument, or at
first a count that starts at ``0`` and grows in a loop, as the literal 0, which is a type
of its own. So small helpers that are called with constants are inlined
(``inline="always"``), and counts handed to another compiled function start as
``np.int64(0)``; ``tests/test_compiled.py`` checks that every function got one signature.
"""

import hashlib
import os
from pathlib import Path

import numba

from replay.data import cache_dir

#: The modules that define @njit functions: their sources key the cache.
_NJIT_MODULES = ("decisions.py", "kernels.py", "pricing.py", "sorting.py")


def _cache_dir() -> str:
    digest = hashlib.sha256()
    for name in _NJIT_MODULES:
        digest.update(name.encode() + b"\0" + (Path(__file__).parent / name).read_bytes())
    root = os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir("numba"))
    return os.path.join(root, f"kvsched-compiled-{digest.hexdigest()[:16]}")


_numba_cache_dir = numba.config.CACHE_DIR
numba.config.CACHE_DIR = _cache_dir()
try:
    from replay.compiled.driver import (
        CompiledRunResult,
        compile_kernels,
        compiled_decision,
        run_compiled,
        supports_compiled,
        unsupported_reason,
    )
finally:
    numba.config.CACHE_DIR = _numba_cache_dir

CACHE_DIR = _cache_dir()

__all__ = ["CACHE_DIR", "CompiledRunResult", "compile_kernels", "compiled_decision",
           "run_compiled", "supports_compiled", "unsupported_reason"]
