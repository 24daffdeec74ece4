"""Compiled path against ``Engine.run``: ``python -m replay.bench_compiled [--n 1000]``.

For each case (by default the crosscheck's vLLM-like and Sarathi-like cases: LMSYS at 5
and 20 requests/s, arXiv at 0.1 and 0.3, Vidur timing, EXPERIMENTS.md D3), builds the
engine twice from one config, replays it with ``Engine.run()`` and with
:func:`replay.compiled.run_compiled`, checks that the tables and the token-gap
histogram are identical, and prints each path's step-loop wall time (best of
``--repeat``), the per-step cost, the speed-up and, apart, the time this process spent
compiling the case's step loop (or loading it from numba's on-disk cache; 0 when an
earlier case of the same policy and timing backend did). Not a test: numbers depend on
the machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from replay import run
from replay.bench import SCENARIOS
from replay.compiled.driver import compile_kernels, run_compiled, unsupported_reason
from replay.config import compose_config
from replay.crosscheck import RATES, Setup
from replay.engine.loop import Engine, RunResult


def build_engine(cfg) -> Engine:
    """The engine :func:`replay.run.build_and_run` would run for ``cfg``, not yet run."""
    return run.build_engine(cfg)[0]


def assert_identical(python: RunResult, compiled: RunResult) -> None:
    """The two paths' outputs are the same, bit for bit."""
    assert (python.status, python.message) == (compiled.status, compiled.message)
    pd.testing.assert_frame_equal(python.requests, compiled.requests, check_exact=True)
    pd.testing.assert_frame_equal(python.iterations, compiled.iterations, check_exact=True)
    a, b = python.token_gaps, compiled.token_gaps
    a._flush()
    b._flush()
    assert (a.count, a.total, a.max) == (b.count, b.total, b.max)
    assert np.array_equal(a.counts, b.counts)


def crosscheck_cases(n: int, schedulers=("vllm", "sarathi")) -> dict[str, list[str]]:
    setup = Setup(n=n)
    return {f"{workload} {rate:g}/s {scheduler}": setup.overrides(workload, rate, scheduler)
            for workload, rates in RATES.items() for rate in rates for scheduler in schedulers}


def measure(label: str, overrides: list[str], repeat: int) -> dict:
    """Both paths on one config, alternating, best of ``repeat``: the wall time of the call
    (``engine.run()`` or ``run_compiled``, result tables included) and the step loop's
    own ``loop_time_s``."""
    cfg = compose_config(overrides)
    engine = build_engine(cfg)
    if (reason := unsupported_reason(engine)) is not None:
        print(f"{label}: {reason}")
        return {}
    compiled_in = compile_kernels(engine)
    wall = {"python": np.inf, "compiled": np.inf}
    loop = dict(wall)
    results = {}
    for _ in range(repeat):
        for path in wall:
            engine = build_engine(cfg)
            started = time.perf_counter()
            result = engine.run() if path == "python" else run_compiled(engine)
            wall[path] = min(wall[path], time.perf_counter() - started)
            loop[path] = min(loop[path], result.loop_time_s)
            results[path] = result
    assert_identical(results["python"], results["compiled"])
    steps = len(results["python"].iterations)
    row = {"case": label, "requests": len(results["python"].requests), "steps": steps,
           "decisions_python": results["python"].decisions,
           **{f"{path}_wall_s": wall[path] for path in wall},
           **{f"{path}_loop_s": loop[path] for path in loop},
           **{f"{path}_loop_us_per_step": 1e6 * loop[path] / steps for path in loop},
           "speedup_wall": wall["python"] / wall["compiled"],
           "speedup_loop": loop["python"] / loop["compiled"], "compile_s": compiled_in}
    print(f"{label:<26.26}{row['requests']:>8}{steps:>8}{wall['python']:>9.3f}"
          f"{wall['compiled']:>9.4f}{row['speedup_wall']:>7.1f}x"
          f"{row['python_loop_us_per_step']:>10.1f}{row['compiled_loop_us_per_step']:>10.2f}"
          f"{row['speedup_loop']:>7.1f}x{compiled_in:>10.2f}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="requests per case")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--schedulers", default="vllm,sarathi")
    parser.add_argument("--scenarios", default=None,
                        help="replay.bench's named scenarios instead of the crosscheck cases "
                             "(comma-separated, or 'all'): WAIT and Nested WAIT")
    parser.add_argument("--grid", action="store_true",
                        help="replay.bench's default grid instead (fcfs, mcsf, vllm, sarathi at "
                             "50 and 10 requests/s, lmsys_synthetic, linear timing)")
    args = parser.parse_args()
    print(f"{'case':<26}{'requests':>8}{'steps':>8}{'py wall':>9}{'nb wall':>9}{'x':>8}"
          f"{'py us/st':>10}{'nb us/st':>10}{'x':>8}{'compile s':>10}")
    print(f"{'':<42}(best call of run(), s){'':<4}(step loop only, per step)")
    if args.scenarios:
        names = list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
        cases = {name: SCENARIOS[name] for name in names}
    elif args.grid:
        cases = {f"{policy} {rate}/s": [
            "workload=lmsys_synthetic", "timing=linear", f"policy={policy}", "arrivals=poisson",
            f"arrivals.rate={rate}", f"workload.n={args.n}"]
            for policy in ("fcfs", "mcsf", "vllm", "sarathi") for rate in (50, 10)}
    else:
        cases = crosscheck_cases(args.n, tuple(args.schedulers.split(",")))
    for label, overrides in cases.items():
        measure(label, overrides, args.repeat)


if __name__ == "__main__":
    from replay.cli import run_or_exit

    run_or_exit(main)
