"""The compiled fast path of the replay engine (numba): the same engine, step loop and
output tables as :meth:`replay.engine.loop.Engine.run`, for the built-in policies that carry a
compiled decision. See :mod:`replay.compiled.driver`.

The ``@njit(cache=True)`` functions are cached on disk in the folder that
:func:`replay.engine.numeric.numba_cache_dir` names, keyed by the sources of every module
with compiled functions (numba alone would key a cached step loop by its own file, and
load stale machine code after an edit of a callee in another file).

A cold compile is kept short by compiling each function once: numba compiles a called
function once per distinct tuple of argument types, and types a constant argument, or at
first a count that starts at ``0`` and grows in a loop, as the literal 0, which is a type
of its own. So small helpers that are called with constants are inlined
(``inline="always"``), and counts handed to another compiled function start as
``np.int64(0)``; ``tests/test_compiled.py`` checks that every function got one signature.
"""

import numba  # noqa: F401  (without numba this import fails, and runs take the Python path)

from replay.engine.numeric import kvsched_numba_cache, numba_cache_dir

with kvsched_numba_cache():
    from replay.compiled.driver import (
        CompiledRunResult,
        compile_kernels,
        compiled_decision,
        run_compiled,
        supports_compiled,
        unsupported_reason,
    )

CACHE_DIR = numba_cache_dir()

__all__ = ["CACHE_DIR", "CompiledRunResult", "compile_kernels", "compiled_decision",
           "run_compiled", "supports_compiled", "unsupported_reason"]
