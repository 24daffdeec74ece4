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

The rules are shared out over ``--jobs`` processes (default: the machine's cores). The
cache's lock (:func:`replay.engine.jit.compile_lock`) lets one process at a time compile
into the cache folder, so the processes mostly overlap their start-up and loading, not
the compiling itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from concurrent.futures import ProcessPoolExecutor

from replay.config.cli import run_or_exit
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


def compile_rules(names: list[tuple[str, str, str]]) -> float:
    """Compile (or load) the step loop and the rules ``names`` in this process; the seconds
    it took."""
    from replay.engine.loop import ensure_compiled
    from replay.engine.state import DECIDE, EVICT, PRICE, PRICE_DECODES

    signature_of = {"decision": DECIDE, "evict_victims": EVICT, "price_batch": PRICE,
                    "price_decodes": PRICE_DECODES}
    rules = []
    for module, qualname, attribute in names:
        owner = importlib.import_module(module)
        for part in qualname.split("."):
            owner = getattr(owner, part)
        rules.append((getattr(owner, attribute), signature_of[attribute]))
    return ensure_compiled(rules)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m replay.compile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1,
                        help="processes to share the rules out over (default: the cores)")
    args = parser.parse_args()
    from replay.engine.jit import CACHE_DIR

    started = time.perf_counter()
    names = rule_names()
    shares = [names[i::args.jobs] for i in range(min(args.jobs, len(names)))]
    if len(shares) == 1:
        compile_rules(shares[0])
    else:
        with ProcessPoolExecutor(len(shares), initializer=end_worker_quietly_on_ctrl_c) as pool:
            list(pool.map(compile_rules, shares))
    print(f"the step loop and {len(names)} rules are compiled in {CACHE_DIR} "
          f"({time.perf_counter() - started:.1f} s, {len(shares)} processes)", flush=True)


if __name__ == "__main__":
    run_or_exit(main)
