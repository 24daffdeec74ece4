"""The child process of :func:`replay.bounds.lp._solve_in_worker`: reads ``(seconds left,
label, linprog problem)`` pickled on stdin, solves it with the same deadline rule as an
in-process solve, and writes ``(result fields, timed out)`` pickled to stdout."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time

from replay.bounds.lp import _solve_here, result_fields


def main() -> None:
    # Ctrl-C reaches this child too (a terminal signals the whole process group): it ends at
    # once and silently; the process that started it reports the interrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The answer goes to the original stdout; anything a library prints goes to stderr,
    # where it cannot corrupt the answer.
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    seconds_left, label, problem = pickle.load(sys.stdin.buffer)
    result, timed_out = _solve_here(time.perf_counter() + seconds_left, label, **problem)
    pickle.dump((result_fields(result), timed_out), answer, protocol=pickle.HIGHEST_PROTOCOL)
    answer.close()


if __name__ == "__main__":
    main()
