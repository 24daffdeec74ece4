"""Replay-speed benchmark: ``python -m replay.bench [--n 10000] [hydra overrides...]``.

Replays ``n`` requests (synthetic LMSYS-like by default; ``--workload lmsys`` for the
real trace from the data directory) with the linear backend at high and low demand
for each policy, and prints simulated requests per wall-second, the policy's own
decision time per scheduling step and the rest of the wall time per step (engine,
timing backend and setup, including loading the workload). ``--scenarios all`` runs
the named scenarios instead (WAIT and Nested WAIT on their B workloads, Vidur timing
where named). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import time

from replay.run import build_and_run, compose_config

#: Named scenarios: the threshold policies on their own workloads (EXPERIMENTS.md B).
SCENARIOS = {
    "wait_b1_low_linear": ["experiment=b1_wait_low", "paper_policy=wait", "timing=linear",
                           "workload.load=0.8", "workload.duration_s=20"],
    "wait_b1_high_vidur": ["experiment=b1_wait_high", "paper_policy=wait"],
    "nested_b3_550_vidur": ["experiment=b3_nested_lmsys", "paper_policy=nested_lmsys",
                            "workload.total_rate=550"],
    "nested_b4_vidur": ["experiment=b4_nested_lmsys_real", "paper_policy=nested_lmsys"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--policies", default="fcfs,mcsf,vllm,sarathi")
    parser.add_argument("--workload", default="lmsys_synthetic")
    parser.add_argument("--rates", default="50,10")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--scenarios", default=None,
                        help=f"named scenarios instead of the policy grid: "
                             f"{','.join(SCENARIOS)} (or 'all')")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    print(f"{'run':<24}{'requests':>9}{'iterations':>11}{'wall s':>9}{'req/wall-s':>12}"
          f"{'decide us/step':>16}{'other us/step':>16}")
    if args.scenarios:
        names = list(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
        for name in names:
            report(name, compose_config([*SCENARIOS[name], *args.overrides]), args.repeat)
        return
    for policy in args.policies.split(","):
        for rate in args.rates.split(","):
            report(f"{policy} {rate}/s", compose_config([
                f"workload={args.workload}", "timing=linear", f"policy={policy}",
                "arrivals=poisson", f"arrivals.rate={rate}", f"workload.n={args.n}",
                *args.overrides]), args.repeat)


def report(label: str, cfg, repeat: int) -> None:
    """Replay ``cfg`` ``repeat`` times and print the best wall time's line."""
    best, decide = float("inf"), float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result, requests, _ = build_and_run(cfg)
        wall = time.perf_counter() - started
        if wall < best:
            best, decide = wall, result.decision_time_s
    steps = len(result.iterations)
    print(f"{label:<24}{len(requests):>9}{steps:>11}{best:>9.2f}{len(requests) / best:>12.0f}"
          f"{1e6 * decide / steps:>16.1f}{1e6 * (best - decide) / steps:>16.1f}", flush=True)


if __name__ == "__main__":
    main()
