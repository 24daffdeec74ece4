"""The compiled fast path of the replay engine (numba): the same engine, step loop and
output tables as :meth:`replay.engine.Engine.run`, for the built-in policies that carry a
compiled decision. See :mod:`replay.compiled.driver`."""

from replay.compiled.driver import (
    CompiledRunResult,
    compile_kernels,
    run_compiled,
    supports_compiled,
    unsupported_reason,
)

__all__ = ["CompiledRunResult", "compile_kernels", "run_compiled", "supports_compiled",
           "unsupported_reason"]
