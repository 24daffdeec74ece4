"""Replay-speed benchmark: ``python -m replay.bench [--n 10000] [hydra overrides...]``.

Replays ``n`` requests (synthetic LMSYS-like by default; ``--workload lmsys`` for the
real trace from the data directory) with the linear backend (``--timing vidur`` for
Vidur's predictor) at high and low demand for each policy, and prints simulated
requests per wall-second and, per scheduling step, the time spent in the policy's
decision, in the timing backend and in the engine itself (the step loop minus those
two), the mean batch and the loop time per batch member and step (what compares policies
whose batches differ in size), plus the setup time outside the loop (loading the workload,
building the backend, assembling the result tables). ``--scenarios all`` runs the named
scenarios instead (WAIT and Nested WAIT on their B workloads, Vidur timing where
named). ``--user-policy`` adds a user's own Python policy to the grid: the documentation's
example (``docs/examples/longest_prompt_first.py``, loaded as a user would install it),
whose decision runs in Python, called from the same compiled step loop; the ``policy``
column says which kind of decision ran (``compiled`` or ``python``). ``--sorted``
measures the Sorted-F family instead: one Phase-1 plan of Sorted-F (swap, quantile) over
2,000 and 20,000 waiting requests, and the LP's build and solve time at the sizes of C1
(Uniform, n = 100, M = 100) and C2 (mixed, n = 2,000). ``--sweep N`` times a sweep
instead: N short replays (LMSYS-like, 1,000 requests each, the ``--policies`` in turn over
seeds) as one multirun of ``python -m replay -m``, as a user launches it, and reports runs per
second and where a job's time goes (:func:`bench_sweep`).
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from hydra.utils import instantiate

from replay.bounds.instance import Instance
from replay.bounds.lp import area_rounds, auto_grid, bucketed, latest_starts, lp_bound, time_indexed
from replay.config import compose_config
from replay.config.cli import CommandParser, compose_or_exit, positive_int, run_or_exit
from replay.engine.jit import count_references_plainly
from replay.run import build_and_run
from replay.workloads.synthetic import Synthetic

#: Named scenarios: the threshold policies on their own workloads (docs/reproducing/wait.md).
SCENARIOS = {
    "wait_b1_low_linear": ["experiment=b1_wait_low", "paper_policy=wait", "timing=linear",
                           "workload.load=0.8", "workload.duration_s=20"],
    "wait_b1_high_vidur": ["experiment=b1_wait_high", "paper_policy=wait"],
    "nested_b3_550_vidur": ["experiment=b3_nested_lmsys", "paper_policy=nested_lmsys",
                            "workload.total_rate=550"],
    "nested_b4_vidur": ["experiment=b4_nested_lmsys_real", "paper_policy=nested_lmsys"],
}


def positive_rates(text: str) -> list[float]:
    """``--rates``: a comma-separated list of finite numbers > 0."""
    import math

    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}") from None
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"every rate must be a finite number > 0: {text!r}")
    return rates


def scenario_names(text: str) -> list[str]:
    """``--scenarios``: ``all`` or a comma-separated list of the named scenarios."""
    names = list(SCENARIOS) if text == "all" else text.split(",")
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no scenario {', '.join(map(repr, unknown))}; "
                                         f"choose from {', '.join(SCENARIOS)} or all")
    return names


def main() -> None:
    parser = CommandParser(prog="python -m replay.bench",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, default=10_000)
    parser.add_argument("--policies", default="fcfs,mcsf,vllm,sarathi")
    parser.add_argument("--workload", default="lmsys_synthetic")
    parser.add_argument("--rates", type=positive_rates, default=[50.0, 10.0],
                        help="comma-separated arrival rates > 0 (requests per second)")
    parser.add_argument("--timing", default="linear", help="timing backend: linear, vidur, unit")
    parser.add_argument("--repeat", type=positive_int, default=3, help="best of this many runs")
    parser.add_argument("--scenarios", type=scenario_names, default=None,
                        help=f"named scenarios instead of the policy grid: "
                             f"{','.join(SCENARIOS)} (or 'all')")
    parser.add_argument("--user-policy", action="store_true",
                        help="also the documentation's example policy, a user's own Python "
                             "policy (a decision written in Python)")
    parser.add_argument("--sorted", action="store_true",
                        help="Phase-1 plan and LP times of the Sorted-F family instead")
    parser.add_argument("--sweep", type=positive_int, default=None, metavar="N",
                        help="time a multirun of N short replays instead (policies in turn)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    plain = run_or_exit(count_references_plainly)
    print(f"numba reference counts: {'plain' if plain else 'atomic'} "
          f"(replay.engine.jit.count_references_plainly)")
    if args.sweep:
        bench_sweep(args.sweep, args.policies.split(","), args.overrides)
        return
    if args.sorted:
        bench_sorted(args.repeat)
        return
    print(f"{'run':<36}{'requests':>9}{'iterations':>11}{'wall s':>9}{'req/wall-s':>12}"
          f"{'decide us/step':>16}{'timing us/step':>16}{'engine us/step':>16}{'batch':>7}"
          f"{'ns/member':>10}{'setup s':>9}{'decided %':>10}  policy")
    if args.scenarios:
        for name in args.scenarios:
            report(name, compose_or_exit([*SCENARIOS[name], *args.overrides]), args.repeat)
        return
    policies = {policy: [f"policy={policy}"] for policy in args.policies.split(",")}
    if args.user_policy:
        policies["user: longest prompt first"] = [
            "policy=mcsf", f"policy._target_={install_example_policy()}.LongestPromptFirst"]
    for label, choice in policies.items():
        for rate in args.rates:
            report(f"{label} {rate:g}/s", compose_or_exit([
                f"workload={args.workload}", f"timing={args.timing}", *choice,
                "arrivals=poisson", f"arrivals.rate={rate}", f"workload.n={args.n}",
                *args.overrides]), args.repeat)


def install_example_policy() -> str:
    """Import the documentation's example policy as a user's own module would be (it is
    not in the package) and return its module name."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "kvsched_example_longest_prompt_first"
    path = Path(__file__).resolve().parent.parent / "docs" / "examples" / \
        "longest_prompt_first.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return name


def report(label: str, cfg, repeat: int) -> None:
    """Replay ``cfg`` ``repeat`` times and print the best wall time's line."""
    best, fastest = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result, requests, _ = run_or_exit(build_and_run, cfg)
        wall = time.perf_counter() - started
        if wall < best:
            best, fastest = wall, result
    steps = len(fastest.iterations)
    # A step's work grows with its batch: the loop time per member of a step compares
    # policies whose batches differ in size.
    members = int(fastest.iterations["batch_size"].sum())
    engine = fastest.loop_time_s - fastest.decision_time_s - fastest.timing_time_s
    print(f"{label:<36}{len(requests):>9}{steps:>11}{best:>9.2f}{len(requests) / best:>12.0f}"
          f"{1e6 * fastest.decision_time_s / steps:>16.1f}"
          f"{1e6 * fastest.timing_time_s / steps:>16.1f}{1e6 * engine / steps:>16.1f}"
          f"{members / steps:>7.0f}{1e9 * fastest.loop_time_s / max(members, 1):>10.1f}"
          f"{best - fastest.loop_time_s:>9.2f}{100 * fastest.decisions / steps:>10.1f}"
          f"  {(fastest.engine_path or {}).get('policy', '?')}", flush=True)


def bench_sweep(n_runs: int, policies: list[str], overrides: list[str]) -> None:
    """Run ``n_runs`` replays of 1,000 LMSYS-like requests as one multirun (``policies`` in
    turn, each over ``ceil(n_runs / len(policies))`` seeds, so the count is rounded up to a
    multiple of the policies) in a temporary sweep folder, and print runs per second of the
    whole command and the mean time per job: composing its config (timed here, in this
    process, on the first job's overrides), the run's setup and step loop (from its summary)
    and the rest a worker spends outside the run (starting the job, writing the tables and
    Hydra's files): ``workers x sweep wall / runs`` minus those three.
    """
    import json
    import statistics
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    seeds = -(-n_runs // len(policies))
    job = ["workload=lmsys_synthetic", "workload.n=1000", "timing=linear", *overrides]
    workers = int(run_or_exit(launcher_config, job).get("n_jobs") or 1)
    composing = composing_times([f"policy={policies[0]}", *job], seeds=6)
    with tempfile.TemporaryDirectory(prefix="kvsched-sweep-bench-") as folder:
        command = [sys.executable, "-m", "replay", "-m", f"policy={','.join(policies)}",
                   f"seed=range(0,{seeds})", *job, f"hydra.sweep.dir={folder}"]
        started = time.perf_counter()
        finished = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if finished.returncode != 0:
            sys.exit(f"error: the sweep failed (exit {finished.returncode}): "
                     f"{finished.stderr.strip().splitlines()[-1:]}")
        summaries = [json.loads(p.read_text()) for p in Path(folder).glob("*/summary.json")]
    runs = len(summaries)
    run_s = statistics.fmean(s["wall_time_s"] for s in summaries)
    loop_s = statistics.fmean(s["loop_time_s"] for s in summaries)
    compose_s = statistics.median(composing)
    rest_s = workers * wall / runs - run_s - compose_s
    print(f"{runs} runs ({len(policies)} policies x {seeds} seeds, 1,000 requests each), "
          f"{workers} workers: {wall:.1f} s for the whole command, {runs / wall:.2f} runs/s, "
          f"{wall / runs:.3f} s per run")
    print(f"per job, worker seconds: {workers * wall / runs:.3f} in all = composing "
          f"{compose_s:.3f} + setup {run_s - loop_s:.3f} + loop {loop_s:.3f} + outside the run "
          f"(job start, writing) {rest_s:.3f}", flush=True)


def composing_times(overrides: list[str], seeds: int) -> list[float]:
    """Seconds to compose each of ``seeds`` jobs (``seed=0, 1, ...`` added to ``overrides``)
    with the config loader a sweep hands its workers, after one job composed untimed."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    from replay.config import CONFIG_DIR, register_resolvers
    from replay.config.compose_once import compose_once

    register_resolvers()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    compose_once(loader)
    times = []
    for seed in range(seeds + 1):
        started = time.perf_counter()
        loader.load_configuration("config", [*overrides, f"seed={seed}"], RunMode.MULTIRUN)
        times.append(time.perf_counter() - started)
    return times[1:]


def launcher_config(overrides: list[str]):
    """``hydra.launcher`` as a multirun of ``overrides`` would have it."""
    from hydra import compose, initialize_config_dir

    from replay.config import CONFIG_DIR, register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides,
                       return_hydra_config=True).hydra.launcher


def bench_sorted(repeat: int) -> None:
    """Phase-1 plan time (one decision over the whole backlog) and LP build/solve times."""
    print(f"{'Sorted-F plan':<34}{'waiting':>9}{'plan s':>9}{'decide s (run)':>16}")
    for solver in ("swap", "quantile"):
        for n in (2_000, 20_000):
            cfg = compose_config(["workload=lmsys_synthetic", f"workload.n={n}",
                                  "arrivals=all_at_once", "timing=linear", "policy=sorted_f",
                                  f"policy.solver={solver}"])
            best = min((build_and_run(cfg)[0] for _ in range(repeat)),
                       key=lambda r: r.policy_info["phase1_time_s"])
            print(f"{'lmsys_synthetic, M = 16,492, ' + solver:<34}{n:>9}"
                  f"{best.policy_info['phase1_time_s']:>9.3f}{best.decision_time_s:>16.3f}",
                  flush=True)
    c1 = Synthetic(n=100, distribution="uniform").sample(np.random.default_rng(0))
    mixed = instantiate(compose_config(["workload=mixed", "workload.n=2000"]).workload)
    c2 = mixed.sample(np.random.default_rng(0))
    print(f"{'LP':<34}{'grid':>6}{'columns':>9}{'build s':>9}{'total s':>9}{'status':>10}")
    # The grid caps of the C1 study and of the C2 setup (and C2 with a finer grid).
    for label, requests, kv, caps in (("C1 uniform n=100 M=100", c1, 100, None),
                                      ("C1 uniform n=100 M=100", c1, 100, (50_000, None)),
                                      ("C2 mixed n=2000 M=16,492", c2, 16_492,
                                       (800_000, 2_000_000)),
                                      ("C2 mixed n=2000 M=16,492", c2, 16_492,
                                       (800_000, 5_000_000))):
        inst = Instance(requests.prompt_len, requests.output_len,
                        np.zeros(len(requests), dtype=np.int64), kv)
        grid = 1 if caps is None else auto_grid(inst, *caps)
        # The first LP's window (the memory-area horizon), as lp_bound builds it.
        window = np.minimum(latest_starts(inst), area_rounds(inst) + int(inst.output_len.max()))
        started = time.perf_counter()
        (time_indexed(inst, window) if grid == 1 else bucketed(inst, window, grid))
        build = time.perf_counter() - started
        lp = lp_bound(inst, tail_cuts=False, grid=grid, time_limit_s=600)
        print(f"{label:<34}{grid:>6}{lp.columns:>9}{build:>9.2f}{lp.solve_time_s:>9.2f}"
              f"{lp.status:>10}", flush=True)


if __name__ == "__main__":
    run_or_exit(main)
