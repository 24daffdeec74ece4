"""kvsched's commands make numba count references without atomic instructions (measured to
matter for the steady stretch: replay.engine.jit.count_references_plainly), unless the
process asks to keep them or numba's runtime is already up."""

import json
import os
import subprocess
import sys

import pytest

from replay.engine.jit import ATOMIC_REFCOUNTS_ENV

#: Calls count_references_plainly (optionally after starting numba's runtime), compiles a
#: function that counts references, and prints the answer and whether the runtime's count
#: functions use atomic instructions.
PROBE = """
import sys
import numba
import numpy as np
from numba.core.runtime import nrt
from replay.engine.jit import count_references_plainly

@numba.njit
def total(n):
    return np.zeros(n).sum()

if sys.argv[1] == "late":
    total(3)
plain = count_references_plainly()
total(3)
print(plain, "atomicrmw" in nrt.rtsys.library.get_llvm_str())
"""


def probe(when: str, **env) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, when], capture_output=True, text=True,
                          env={**os.environ, **env}, check=True, timeout=120)
    return done.stdout.strip()


@pytest.mark.parametrize(("when", "env", "expected"), [
    ("first", {}, "True False"),  # a command's process: plain counts
    ("first", {ATOMIC_REFCOUNTS_ENV: "1"}, "False True"),  # asked to keep them atomic
    ("late", {}, "False True"),  # numba's runtime already up: left as it is
])
def test_commands_count_references_plainly(when, env, expected):
    assert probe(when, **env) == expected


def test_a_run_of_the_command_records_plain_counts(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "replay", "workload.n=20",
                           f"hydra.run.dir={out}"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine_path"]["reference_counts"] == "plain"


@pytest.mark.parametrize("command", [["replay", "workload.n=20", "hydra.run.dir=run"],
                                     ["replay.bench", "--n", "20"]])
def test_a_bad_value_of_the_switch_is_one_error_line(tmp_path, command):
    done = subprocess.run([sys.executable, "-m", *command],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, ATOMIC_REFCOUNTS_ENV: "yes"}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {ATOMIC_REFCOUNTS_ENV}='yes'"), done.stderr
    assert "Traceback" not in done.stderr
