"""Timing backends: ``unit``, ``linear`` and ``vidur`` (see :mod:`replay.timing.base`)."""

from replay.timing.base import BatchShape, TimingBackend
from replay.timing.simple import LinearTiming, UnitTiming

__all__ = ["BatchShape", "TimingBackend", "LinearTiming", "UnitTiming"]
