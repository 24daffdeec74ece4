"""How kvsched compiles: one decorator, one disk cache, one lock, one line on first use.

Every rule that runs inside the step loop (the engine's phases, each built-in policy's
decision, each overflow rule, each timing backend's price) is a plain Python function
compiled by numba with :func:`jit`. They are compiled once per machine and kept in a disk
cache; a run loads them in a fraction of a second.

numba keys a cached function by its own source file only, so a caller cached before an
edit of a callee in another file would load stale machine code. Every compiled function
of kvsched is therefore cached in one folder named by a hash of all the sources that
define compiled functions (:data:`JIT_SOURCES`; a test keeps the list complete): an edit
of any of them starts a fresh folder, an edit of any other file costs nothing. The hash is
of each source's code as Python parses it, without its docstrings (:func:`code_digest`),
so editing a comment, a docstring or the layout of a compiled module recompiles nothing;
numba's own check of a function's file (its bytes, and its line number in the index's
name) is replaced by that hash for these modules (:class:`ContentLocator`). The folder
is ``$NUMBA_CACHE_DIR`` if set, else ``numba/`` in kvsched's per-user cache folder.

numba rewrites a function's cache index whole (read, add, write), so two processes saving
into one index at once could lose each other's entry; :func:`compile_lock` lets one process
at a time compile into the folder.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import fasteners
import numba
import platformdirs
from numba.core.caching import UserProvidedCacheLocator
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


def code_digest(source: bytes) -> str:
    """A hash of the code of a Python source, as parsed, without comments, layout, line
    numbers or docstrings: two sources with the same digest compile to the same functions."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            node.body = node.body[1:] or [ast.Pass()]  # a body of only a docstring: a pass
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


#: The definition of :func:`code_digest` (raise it when that changes).
CODE_DIGEST_VERSION = 1

#: How many source versions' code digests :func:`_code_digests` keeps on disk.
MAX_RECORDED_DIGESTS = 4096


def _code_digests(root: str) -> dict[str, str]:
    """:func:`code_digest` of each of :data:`JIT_SOURCES`. Parsing them all would cost every
    run a few tenths of a second, so the digests are kept in ``root`` by each file's SHA-256
    and only a file edited since is parsed again (a lost or torn record is recomputed)."""
    # named by the digest's version: a record of another definition of it is not read
    record = Path(root) / f"code-digests-{CODE_DIGEST_VERSION}.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    digests, file_hashes, parsed = {}, [], False
    for name in JIT_SOURCES:
        source = (_ROOT / name).read_bytes()
        file_hashes.append(file_hash := hashlib.sha256(source).hexdigest())
        if not isinstance(known.get(file_hash), str):
            known[file_hash], parsed = code_digest(source), True
        digests[name] = known[file_hash]
    if parsed:
        # Every version seen is kept (going back to a branch parses nothing), up to a bound.
        kept = known if len(known) <= MAX_RECORDED_DIGESTS else {
            h: known[h] for h in file_hashes}
        with contextlib.suppress(OSError):  # an unwritable cache: parse again next time
            record.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=record.parent, delete=False,
                                             suffix=".tmp") as tmp:
                json.dump(kept, tmp)
            os.replace(tmp.name, record)
    return digests


def _cache_dir() -> tuple[str, str]:
    root = os.path.expanduser(os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("KVSCHED_CACHE_DIR")
        or platformdirs.user_cache_dir("kvsched", appauthor=False), "numba"))
    digest = hashlib.sha256()
    for name, code in _code_digests(root).items():
        digest.update(f"{name}\0{code}\0".encode())
    key = digest.hexdigest()[:16]
    return os.path.join(root, f"kvsched-{key}"), key


#: The disk cache folder of every compiled function, and the hash of the compiled modules'
#: code that names it, fixed when this module is imported (the sources may change on disk
#: while a process runs).
CACHE_DIR, CODE_KEY = _cache_dir()
_SOURCE_FILES = frozenset(os.path.realpath(_ROOT / name) for name in JIT_SOURCES)


class ContentLocator(UserProvidedCacheLocator):
    """numba's locator for a cache folder of one's own (:data:`CACHE_DIR`), whose check that
    a cached function is current is the hash of the compiled modules' code
    (:data:`CODE_KEY`, which also names the folder) rather than the bytes of the function's
    file, and whose index is named without the function's line number: an edit that leaves
    the code unchanged (a comment, a docstring, a blank line) keeps every cached function.
    Functions in other files keep numba's own check."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._code = py_func.__code__.co_code + repr(py_func.__code__.co_names).encode()

    def _is_source(self) -> bool:
        return os.path.realpath(self._py_file) in _SOURCE_FILES

    def get_source_stamp(self):
        return CODE_KEY if self._is_source() else super().get_source_stamp()

    def get_disambiguator(self):
        # The index is named by the function's qualified name and this: two functions of one
        # name in a module (a redefinition) still differ by their bytecode.
        if not self._is_source():
            return super().get_disambiguator()
        return hashlib.sha256(self._code).hexdigest()[:8]


#: numba's cache locators while kvsched decorates: its own first, then numba's defaults after
#: the user-provided folder's (``__pycache__``, the user-wide cache...), for a cache folder
#: that cannot be written.
LOCATORS = (f"{__name__}.{ContentLocator.__name__},InTreeCacheLocator,UserWideCacheLocator,"
            "IPythonCacheLocator,ZipCacheLocator")


def jit(function=None, **options):
    """``numba.njit(cache=True)`` in :data:`CACHE_DIR` (numba reads its cache setting when it
    decorates). ``options`` go to numba (``inline="always"`` for helpers so small that a
    call would cost more than their body)."""

    def decorate(function):
        saved = numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES
        numba.config.CACHE_DIR = CACHE_DIR
        numba.config.CACHE_LOCATOR_CLASSES = LOCATORS
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES = saved

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
