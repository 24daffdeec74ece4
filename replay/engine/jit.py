"""How kvsched compiles: one decorator, one disk cache, one lock, one line on first use.

Every rule that runs inside the step loop (the engine's phases, each built-in policy's
decision, each overflow rule, each timing backend's price) is a plain Python function
compiled by numba with :func:`jit`. They are compiled once per machine and kept in a disk
cache; a run loads them in a fraction of a second.

numba keys a cached function by its own source file only, so a caller cached before an
edit of a callee in another file would load stale machine code. Each module that defines
compiled functions (:data:`JIT_SOURCES`; a test keeps the list complete) is therefore cached
in a folder of its own, named by a hash of its code and of the code of every module of the
tree it imports, directly or through another (:func:`module_keys`; a module without
compiled code counts too, as a compiled function freezes the constants it reads): an edit
of a module starts fresh folders for it and for the modules that import it, and nothing
else compiles again. The
step loop reaches policies and timing backends only through function pointers and imports
none of them, so editing a policy compiles that policy's decision, not the loop. The hash
is of each source's code as Python parses it, without its docstrings (:func:`code_digest`),
so editing a comment, a docstring or the layout of a compiled module recompiles nothing;
numba's own check of a function's file (its bytes, and its line number in the index's
name) is replaced by that hash for these modules (:class:`ContentLocator`). The folders are
in ``$NUMBA_CACHE_DIR`` if set, else in ``numba/`` in kvsched's per-user cache folder; they
do not depend on where the sources are, so two checkouts of the same code share them.

numba rewrites a function's cache index whole (read, add, write), so two processes saving
into one index at once could lose each other's entry (it is then compiled again later);
:func:`compile_lock` lets one run at a time compile into the folders, and a run that
compiles may share its work with a helper process of its own (:func:`compile_in_a_helper`).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import fasteners
import numba
import platformdirs
from numba.core.caching import UserProvidedCacheLocator
from numba.core.errors import NumbaExperimentalFeatureWarning

from replay.errors import InputError

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


def imported_modules(source: bytes) -> list[str]:
    """Every module an import statement anywhere in ``source`` (a deferred one too) may
    name: ``a.b`` for ``import a.b``, and ``a`` and ``a.b`` for ``from a import b`` (``b``
    may be a module or a name in ``a``). Relative imports are not followed: the tree
    imports absolutely (ruff's ``TID252`` checks)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(names)


#: The definition of the facts :func:`_source_facts` records (raise it when that changes).
SOURCE_FACTS_VERSION = 2

#: How many source versions' facts :func:`_source_facts` keeps on disk.
MAX_RECORDED_SOURCES = 4096


#: The packages of the tree whose modules key the cache when a compiled module imports them.
PROJECT_PACKAGES = ("replay", "policies", "traces")


def _project_file(module: str) -> str | None:
    """The file of the tree that defines ``module``, or None (another library's module, or
    a name in a module rather than a module)."""
    if module.partition(".")[0] not in PROJECT_PACKAGES:
        return None
    path = module.replace(".", "/")
    for name in (f"{path}.py", f"{path}/__init__.py"):
        if (_ROOT / name).is_file():
            return name
    return None


def _source_facts(root: str) -> dict[str, tuple[str, list[str]]]:
    """For each of :data:`JIT_SOURCES` and every module of the tree they import, directly
    or not, its :func:`code_digest` and the files of the tree it imports. Parsing them all
    would cost every run a few tenths of a second, so the facts are kept in ``root`` by each
    file's SHA-256 and only a file edited since is parsed again (a lost or torn record is
    recomputed)."""
    # named by the facts' version: a record of another definition of them is not read
    record = Path(root) / f"source-facts-{SOURCE_FACTS_VERSION}.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    facts, file_hashes, parsed, pending = {}, [], False, list(JIT_SOURCES)
    while pending:
        name = pending.pop()
        if name in facts:
            continue
        source = (_ROOT / name).read_bytes()
        file_hashes.append(file_hash := hashlib.sha256(source).hexdigest())
        fact = known.get(file_hash)
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)
                and isinstance(fact[1], list)):
            imported = {_project_file(module) for module in imported_modules(source)}
            known[file_hash] = [code_digest(source), sorted(imported - {None, name})]
            parsed = True
        facts[name] = (known[file_hash][0], known[file_hash][1])
        pending.extend(facts[name][1])
    if parsed:
        # Every version seen is kept (going back to a branch parses nothing), up to a bound.
        kept = known if len(known) <= MAX_RECORDED_SOURCES else {
            h: known[h] for h in file_hashes}
        with contextlib.suppress(OSError):  # an unwritable cache: parse again next time
            record.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=record.parent, delete=False,
                                             suffix=".tmp") as tmp:
                json.dump(kept, tmp)
            os.replace(tmp.name, record)
    return facts


def module_name(source: str) -> str:
    """The module a file of the tree defines (``replay/engine/loop.py`` ->
    ``replay.engine.loop``, ``replay/timing/__init__.py`` -> ``replay.timing``)."""
    return source.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def reached_sources(facts: dict[str, tuple[str, list[str]]]) -> dict[str, set[str]]:
    """Each file of ``facts`` (as :func:`_source_facts` gives them) with every file it
    imports, directly or through another."""
    reached_by = {}
    for name in facts:
        reached, pending = {name}, [name]
        while pending:
            for other in set(facts[pending.pop()][1]) - reached:
                reached.add(other)
                pending.append(other)
        reached_by[name] = reached
    return reached_by


def module_keys(facts: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """Each of :data:`JIT_SOURCES`' cache key: a hash of the code digests of the files it
    reaches (:func:`reached_sources`; a compiled function may freeze a constant of a module
    without compiled code); ``""`` keys the code of all of them, for compiled functions
    defined elsewhere (a user's policy calling the engine's helpers)."""

    def key(sources) -> str:
        digest = hashlib.sha256()
        for name in sorted(sources):
            digest.update(f"{name}\0{facts[name][0]}\0".encode())
        return digest.hexdigest()[:16]

    reached = reached_sources(facts)
    return {"": key(facts)} | {name: key(reached[name]) for name in JIT_SOURCES}


#: The root of the disk cache: ``$NUMBA_CACHE_DIR`` if set, else ``numba/`` in kvsched's
#: per-user cache folder.
CACHE_DIR = os.path.expanduser(os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
    os.environ.get("KVSCHED_CACHE_DIR")
    or platformdirs.user_cache_dir("kvsched", appauthor=False), "numba"))
#: Each compiled module's cache key (:func:`module_keys`), fixed when this module is
#: imported (the sources may change on disk while a process runs).
MODULE_KEYS = module_keys(_source_facts(CACHE_DIR))
#: The folder of compiled functions defined outside :data:`JIT_SOURCES`, keyed by all of them.
OTHER_FUNCTIONS_DIR = os.path.join(CACHE_DIR, f"kvsched-{MODULE_KEYS['']}")
_SOURCE_OF_FILE = {os.path.realpath(_ROOT / name): name for name in JIT_SOURCES}


class ContentLocator(UserProvidedCacheLocator):
    """numba's locator for kvsched's cache folders. A function of a module of
    :data:`JIT_SOURCES` is cached in a folder named by the module and its key
    (:data:`MODULE_KEYS`), which is also the check that a cached function is current (in
    place of the bytes of its file), and its index is named without its line number: an edit
    that leaves the code unchanged (a comment, a docstring, a blank line) keeps every cached
    function. Functions in other files are cached under :data:`OTHER_FUNCTIONS_DIR` with
    numba's own check."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._code = py_func.__code__.co_code + repr(py_func.__code__.co_names).encode()
        self._source = _SOURCE_OF_FILE.get(os.path.realpath(py_file))
        if self._source is not None:
            self._cache_path = os.path.join(
                CACHE_DIR, f"{module_name(self._source)}-{MODULE_KEYS[self._source]}")

    def get_source_stamp(self):
        if self._source is None:
            return super().get_source_stamp()
        return MODULE_KEYS[self._source]

    def get_disambiguator(self):
        # The index is named by the function's qualified name and this: two functions of one
        # name in a module (a redefinition) still differ by their bytecode.
        if self._source is None:
            return super().get_disambiguator()
        return hashlib.sha256(self._code).hexdigest()[:8]


#: numba's cache locators while kvsched decorates: its own first, then numba's defaults after
#: the user-provided folder's (``__pycache__``, the user-wide cache...), for a cache folder
#: that cannot be written.
LOCATORS = (f"{__name__}.{ContentLocator.__name__},InTreeCacheLocator,UserWideCacheLocator,"
            "IPythonCacheLocator,ZipCacheLocator")


def jit(function=None, **options):
    """``numba.njit(cache=True)`` in kvsched's cache folders (:class:`ContentLocator`; numba
    reads its cache setting when it decorates). ``options`` go to numba: ``inline="always"``
    for helpers so small that a call would cost more than their body, and for a function
    with one caller whose callees are many (compiled on its own, it would have them
    optimised once more)."""

    def decorate(function):
        saved = numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES
        numba.config.CACHE_DIR = OTHER_FUNCTIONS_DIR
        numba.config.CACHE_LOCATOR_CLASSES = LOCATORS
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR, numba.config.CACHE_LOCATOR_CLASSES = saved

    return decorate if function is None else decorate(function)


#: ``1`` keeps numba's atomic reference counts in kvsched's commands; ``0`` (or unset) does
#: not.
ATOMIC_REFCOUNTS_ENV = "KVSCHED_ATOMIC_REFCOUNTS"


def count_references_plainly() -> bool:
    """Make numba count references without atomic instructions in this process, if its
    runtime is not up yet; returns whether the counts are plain. kvsched's commands call it
    first thing. Every compiled call that takes the state record counts a reference to it up
    and down, and the atomic kind of count is slow next to a step of the steady stretch,
    which does little else (``replay.crosscheck``'s arXiv cases show it). The kind comes
    from the runtime of the process that runs the code, not from the disk cache. Plain
    counts are safe where one thread at a time runs compiled code, which holds for kvsched
    (it never releases the GIL in compiled code); a process that also runs numba code on
    several threads (``parallel=True``, ``nogil=True``) must set
    :data:`ATOMIC_REFCOUNTS_ENV`. A library use of kvsched keeps numba's default."""
    from numba.core.runtime import nrt, nrtdynmod

    if not hasattr(nrtdynmod, "_disable_atomicity"):  # a numba without the switch (a test
        return False                                  # holds the installed one to having it)
    keep_atomic = os.environ.get(ATOMIC_REFCOUNTS_ENV, "0")
    if keep_atomic not in ("0", "1"):
        raise InputError(f"{ATOMIC_REFCOUNTS_ENV}={keep_atomic!r}: set it to 1 to keep numba's "
                         f"atomic reference counts, or to 0 (or unset it) for plain ones")
    if keep_atomic == "0" and not nrt.rtsys._init:
        nrtdynmod._disable_atomicity = 1  # numba's own switch, read when its runtime starts
    return reference_counts() == "plain"


def reference_counts() -> str:
    """How this process's numba runtime counts references: ``plain`` or ``atomic``."""
    from numba.core.runtime import nrtdynmod

    return "plain" if getattr(nrtdynmod, "_disable_atomicity", 0) else "atomic"


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


def in_disk_cache(dispatcher, signature) -> bool:
    """Whether the disk cache holds ``dispatcher`` compiled for ``signature`` (numba's own
    lookup, which loads it; the compile that follows loads it again, in hundredths of a
    second)."""
    return dispatcher._cache.load_overload(signature, dispatcher.targetctx) is not None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (a
    Slurm job, ``taskset`` or a container limited to fewer cores than the machine has),
    else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this system (macOS, Windows)
        return os.cpu_count() or 1


def compile_in_a_helper(functions: list[tuple[str, str, str]], signature_of: str):
    """Start a process that compiles ``functions`` (module, name, and a key of the
    signature) into the disk cache, each for ``signature_of(key)``, a function named by
    ``module:name``; the caller holds :func:`compile_lock` for it and compiles something else
    meanwhile. Functions it cannot import (defined in ``__main__`` or a function's body) are
    left out; a function it did not save is compiled by the caller as if there had been no
    helper. It prints a line of the names of the functions it compiled rather than loaded
    (:func:`helper_compiled` reads it). None on a single usable core (:func:`usable_cores`),
    or with nothing to compile."""
    shared = [list(f) for f in functions if f[0] != "__main__" and "<" not in f[1]]
    if not shared or usable_cores() < 2:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", "import sys; from replay.engine.jit import "
                                   "_helper_compiles; _helper_compiles(sys.argv[1], sys.argv[2])",
             json.dumps(shared), signature_of], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)})
    except OSError:  # no interpreter to start (an embedded Python): the caller compiles all
        return None


def resolve(qualified: str):
    """The object ``module:name`` names (``name`` may be dotted: a class's attribute)."""
    module, _, name = qualified.partition(":")
    owner = importlib.import_module(module)
    for part in name.split("."):
        owner = getattr(owner, part)
    return owner


def _helper_compiles(functions: str, signature_of: str) -> None:
    """The helper of :func:`compile_in_a_helper`."""
    signature, compiled = resolve(signature_of), []
    for module, name, key in json.loads(functions):
        function = resolve(f"{module}:{name}")
        function.compile(signature(key))
        compiled += [name] if function.stats.cache_misses else []
    print(json.dumps(compiled), flush=True)
    # The run waits for this process to end: every file is saved, so it ends now, without
    # the interpreter's teardown of numba and LLVM (half a second).
    os._exit(0)


def helper_compiled(helper: subprocess.Popen) -> list[str]:
    """Wait for a helper of :func:`compile_in_a_helper`; the names of the functions it
    compiled (none if it failed)."""
    out, _ = helper.communicate()
    try:
        return json.loads(out.splitlines()[-1]) if helper.returncode == 0 else []
    except (IndexError, ValueError):
        return []


def compiled_from_scratch(dispatchers) -> list:
    """Those of ``dispatchers`` compiled in this process rather than loaded from the disk
    cache (numba counts both)."""
    return [d for d in dispatchers if d.stats.cache_misses]
