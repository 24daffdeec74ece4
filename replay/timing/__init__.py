"""Timing backends: ``unit``, ``linear`` and ``vidur``; the contract they meet is
:mod:`replay.engine.timing`, their compiled price :class:`replay.engine.rules.CompiledTiming`."""

from replay.timing.simple import LinearTiming, UnitTiming

__all__ = ["LinearTiming", "UnitTiming"]
