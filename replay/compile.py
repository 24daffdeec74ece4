"""``python -m replay.compile``: compile the step loop and every built-in rule now, once.

A run compiles what it needs on first use (the step loop, its policy's decision, its overflow
rule and its timing backend's price) and keeps it in the disk cache
(:mod:`replay.engine.jit`); after an edit of compiled code the first run of each policy and
backend waits for it again. This command pays all of it at once, before any run: the loop
and the compiled functions of every built-in policy, overflow rule and timing backend (the
classes of :class:`~replay.engine.rules.CompiledPolicy`, ``CompiledOverflow`` and
``CompiledTiming`` in the modules of :data:`~replay.engine.jit.JIT_SOURCES` and of the
built-in policy and timing configs), each for the one signature the loop calls it with.
Nothing is instantiated, so no data is read (Vidur's backend compiles without its
profiles). Already cached functions only load.

The loop and the rules are shared out over ``--jobs`` processes (default: the machine's
cores), which compile at once: this command holds the cache's lock
(:func:`replay.engine.jit.compile_lock`) for all of them, so a run started meanwhile waits
and then loads. Two processes may both compile a helper that rules of both call (numba
keeps whichever saves last); each module's functions are cached in a folder of their own.
"""

from __future__ import annotations

import importlib
import time
from concurrent.futures import ProcessPoolExecutor

from replay.config.cli import CommandParser, positive_int, run_or_exit
from replay.errors import end_worker_quietly_on_ctrl_c

#: The config groups whose built-in choices name compiled rules by ``_target_``.
RULE_GROUPS = ("policy", "timing")


def rule_modules() -> list[str]:
    """The modules that define compiled functions (:data:`~replay.engine.jit.JIT_SOURCES`)
    and those of every built-in policy and timing backend (a class in a module of its own,
    such as Vidur's backend, whose price is defined in a compiled module)."""
    import yaml

    from replay.config import CONFIG_DIR
    from replay.engine.jit import JIT_SOURCES

    modules = {path.removesuffix(".py").replace("/", ".") for path in JIT_SOURCES}
    for group in RULE_GROUPS:
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
            if isinstance(target, str):
                modules.add(target.rpartition(".")[0])
    return sorted(modules)


def _subclasses(base: type) -> list[type]:
    found, pending = [], [base]
    while pending:
        for sub in pending.pop().__subclasses__():
            found.append(sub)
            pending.append(sub)
    return found


def rule_names() -> list[tuple[str, str, str]]:
    """Every built-in compiled rule as ``(module, class, attribute)`` (each a compiled
    function the step loop takes as an argument), sorted, without repeats."""
    from replay.engine.rules import CompiledOverflow, CompiledPolicy, CompiledTiming

    for module in rule_modules():
        importlib.import_module(module)
    kinds = ((CompiledPolicy, ("decision",)), (CompiledOverflow, ("evict_victims",)),
             (CompiledTiming, ("price_batch", "price_decodes")))
    names, seen = [], set()
    for base, attributes in kinds:
        for cls in _subclasses(base):
            for attribute in attributes:
                function = getattr(cls, attribute)
                if function is None or id(function) in seen:
                    continue
                seen.add(id(function))
                names.append((cls.__module__, cls.__qualname__, attribute))
    return sorted(names)


def compile_share(names: list[tuple[str, str, str]], with_loop: bool) -> None:
    """Compile (or load) the rules ``names``, and the step loop first if ``with_loop``, in
    this process, without taking the cache's lock: :func:`main` holds it for every process."""
    from replay.engine.jit import resolve
    from replay.engine.loop import LOOP_AND_AROUND, RULE_KINDS

    functions = list(LOOP_AND_AROUND) if with_loop else []
    functions += [(resolve(f"{module}:{qualname}.{attribute}"), RULE_KINDS[attribute].signature)
                  for module, qualname, attribute in names]
    for function, signature in functions:
        function.compile(signature)


#: What compiling the step loop costs, in rules (their mean): the loop is one process's
#: share with that many fewer rules.
LOOP_IN_RULES = 12


def shares(names: list, jobs: int) -> list[list]:
    """``names`` dealt over at most ``jobs`` processes, the first of which also compiles the
    loop (counted as :data:`LOOP_IN_RULES` rules), each next rule to the least loaded."""
    parts = [[] for _ in range(max(1, min(jobs, len(names) + 1)))]
    load = [LOOP_IN_RULES] + [0] * (len(parts) - 1)
    for name in names:
        least = load.index(min(load))
        parts[least].append(name)
        load[least] += 1
    return parts


def main() -> None:
    parser = CommandParser(prog="python -m replay.compile",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="processes to share the rules out over (default: the cores "
                             "this process may run on)")
    args = parser.parse_args()
    from replay.engine.jit import CACHE_DIR, compile_lock, usable_cores

    started = time.perf_counter()
    names = rule_names()
    parts = shares(names, args.jobs or usable_cores())
    with compile_lock():
        if len(parts) == 1:
            compile_share(parts[0], with_loop=True)
        else:
            with ProcessPoolExecutor(len(parts),
                                     initializer=end_worker_quietly_on_ctrl_c) as pool:
                list(pool.map(compile_share, parts, [k == 0 for k in range(len(parts))]))
    print(f"the step loop and {len(names)} rules are compiled in {CACHE_DIR} "
          f"({time.perf_counter() - started:.1f} s, {len(parts)} processes)", flush=True)


if __name__ == "__main__":
    run_or_exit(main)
