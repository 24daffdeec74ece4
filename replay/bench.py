"""Replay-speed benchmark: ``python -m replay.bench [--n 10000] [hydra overrides...]``.

Replays ``n`` requests (synthetic LMSYS-like by default; ``--workload lmsys`` for the
real trace from the data directory) with the linear backend at high and low demand
for each policy, and prints simulated requests per wall-second, the policy's own
decision time per scheduling step and the rest of the wall time per step (engine,
timing backend and setup, including loading the workload).
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import time

from replay.run import build_and_run, compose_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--policies", default="fcfs,mcsf,vllm,sarathi")
    parser.add_argument("--workload", default="lmsys_synthetic")
    parser.add_argument("--rates", default="50,10")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    print(f"{'policy':<12}{'rate/s':>8}{'iterations':>12}{'wall s':>9}{'req/wall-s':>12}"
          f"{'decide us/step':>16}{'other us/step':>16}")
    for policy in args.policies.split(","):
        for rate in args.rates.split(","):
            cfg = compose_config([
                f"workload={args.workload}", "timing=linear", f"policy={policy}",
                "arrivals=poisson", f"arrivals.rate={rate}", f"workload.n={args.n}",
                *args.overrides])
            best, decide = float("inf"), float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                result, _, _ = build_and_run(cfg)
                wall = time.perf_counter() - started
                if wall < best:
                    best, decide = wall, result.decision_time_s
            steps = len(result.iterations)
            print(f"{policy:<12}{rate:>8}{steps:>12}{best:>9.2f}{args.n / best:>12.0f}"
                  f"{1e6 * decide / steps:>16.1f}{1e6 * (best - decide) / steps:>16.1f}")


if __name__ == "__main__":
    main()
