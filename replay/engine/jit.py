"""How kvsched compiles: one decorator, one disk cache, one lock, one line on first use.

Every rule that runs inside the step loop (the engine's phases, each built-in policy's
decision, each overflow rule, each timing backend's price) is a plain Python function
compiled by numba with :func:`jit`. They are compiled once per machine and kept in a disk
cache; a run loads them in a fraction of a second.

numba keys a cached function by its own source file only, so a caller cached before an
edit of a callee in another file would load stale machine code. Every compiled function
of kvsched is therefore cached in one folder named by a hash of all the sources that
define compiled functions (:data:`JIT_SOURCES`; a test keeps the list complete): an edit
of any of them starts a fresh folder, an edit of any other file costs nothing. The folder
is ``$NUMBA_CACHE_DIR`` if set, else ``numba/`` in kvsched's per-user cache folder.

numba rewrites a function's cache index whole (read, add, write), so two processes saving
into one index at once could lose each other's entry; :func:`compile_lock` lets one process
at a time compile into the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from pathlib import Path

import fasteners
import numba
import platformdirs
from numba.core.errors import NumbaExperimentalFeatureWarning

#: Modules (relative to the folder holding the ``replay`` and ``policies`` packages) that
#: define compiled functions: their sources key the disk cache.
JIT_SOURCES = (
    "replay/engine/jit.py", "replay/engine/state.py", "replay/engine/phases.py",
    "replay/engine/loop.py", "replay/engine/rules.py", "replay/engine/sorting.py",
    "replay/engine/paging.py", "replay/engine/numeric.py", "replay/engine/histogram.py",
    "replay/engine/overflow.py", "replay/engine/prefix_cache.py", "replay/engine/sessions.py",
    "replay/timing/simple.py",
    "replay/timing/vidur_pricing.py",
    "replay/timing/grid_lookup.py", "replay/timing/layer_profile_step.py",
    "replay/timing/aiconfigurator_step.py",
    "policies/common/lookahead.py", "policies/common/serving.py",
    "policies/common/staging.py", "policies/fcfs.py", "policies/mcsf.py",
    "policies/protection.py", "policies/paper_fcfs.py", "policies/vllm.py",
    "policies/sarathi.py", "policies/wait.py", "policies/nested_wait.py", "policies/lpm.py",
    "policies/vllm_v1.py",
)
_ROOT = Path(__file__).resolve().parent.parent.parent

# The engine passes each rule to the step loop as a typed function pointer (numba's
# first-class function type), which numba still labels experimental.
warnings.filterwarnings("ignore", category=NumbaExperimentalFeatureWarning)


def _cache_dir() -> str:
    digest = hashlib.sha256()
    for name in JIT_SOURCES:
        digest.update(name.encode() + b"\0" + (_ROOT / name).read_bytes())
    root = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("KVSCHED_CACHE_DIR")
        or platformdirs.user_cache_dir("kvsched", appauthor=False), "numba")
    return os.path.join(os.path.expanduser(root), f"kvsched-{digest.hexdigest()[:16]}")


#: The disk cache folder of every compiled function, fixed when this module is imported
#: (the sources it is keyed by may change on disk while a process runs).
CACHE_DIR = _cache_dir()


def jit(function=None, **options):
    """``numba.njit(cache=True)`` in :data:`CACHE_DIR` (numba reads its cache setting when it
    decorates). ``options`` go to numba (``inline="always"`` for helpers so small that a
    call would cost more than their body)."""

    def decorate(function):
        saved = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = CACHE_DIR
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR = saved

    return decorate if function is None else decorate(function)


@contextlib.contextmanager
def compile_lock():
    """One process at a time compiles into (or loads from) :data:`CACHE_DIR`. Where the
    folder cannot be made, numba caches elsewhere or not at all, and no lock is taken."""
    try:
        Path(CACHE_DIR).mkdir(parents=True, exist_ok=True)
        lock = fasteners.InterProcessLock(os.path.join(CACHE_DIR, ".compile.lock"))
        lock.acquire()
    except OSError:
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def compiled_from_scratch(dispatchers) -> bool:
    """Whether any of ``dispatchers`` was compiled in this process rather than loaded from
    the disk cache (numba counts both)."""
    return any(d.stats.cache_misses for d in dispatchers)
