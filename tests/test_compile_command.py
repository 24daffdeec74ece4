"""``python -m replay.compile`` finds every built-in compiled rule without instantiating any."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from replay.compile import rule_names
from replay.config import CONFIG_DIR
from replay.engine.rules import CompiledPolicy, CompiledTiming


def test_every_built_in_compiled_policy_and_timing_is_found():
    names = set(rule_names())
    expected = set()
    for group in ("policy", "timing"):
        for path in CONFIG_DIR.glob(f"{group}/*.yaml"):
            module, _, name = yaml.safe_load(path.read_text())["_target_"].rpartition(".")
            cls = getattr(__import__(module, fromlist=[name]), name)
            if issubclass(cls, CompiledPolicy) and cls.decision is not None:
                expected.add(cls.decision)
            if issubclass(cls, CompiledTiming) and cls.price_batch is not None:
                expected.update((cls.price_batch, cls.price_decodes))
    found = set()
    for module, qualname, attribute in names:
        owner = __import__(module, fromlist=[qualname])
        found.add(getattr(getattr(owner, qualname), attribute))
    assert expected and expected <= found
    # the overflow rules too, each function once
    assert ("replay.engine.overflow", "EvictLIFO", "evict_victims") in names
    assert len(names) == len(set(names))


def test_bad_job_count_is_one_line():
    done = subprocess.run([sys.executable, "-m", "replay.compile", "--jobs", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: argument --jobs: must be at least 1, got 0 (see "
                                        "python -m replay.compile --help)"]


@pytest.mark.slow
def test_compiles_or_loads_everything():
    done = subprocess.run([sys.executable, "-m", "replay.compile", "--jobs", "2"],
                          capture_output=True, text=True, check=True)
    assert "rules are compiled in" in done.stdout


def test_the_loop_and_the_rules_are_dealt_to_the_least_loaded_process():
    from replay.compile import LOOP_IN_RULES, shares

    names = list(range(LOOP_IN_RULES + 6))
    one = shares(names, 1)
    assert one == [names]
    two = shares(names, 2)
    # the second process takes rules until it has the loop's weight, then they alternate
    assert two[1][:LOOP_IN_RULES] == names[:LOOP_IN_RULES]
    assert sorted(two[0] + two[1]) == names
    assert abs((LOOP_IN_RULES + len(two[0])) - len(two[1])) <= 1
    # never more processes than the loop and the rules
    assert len(shares(names[:2], 8)) == 3


def test_a_helper_compiles_into_the_disk_cache_and_says_what(tmp_path, monkeypatch):
    """The first run's helper process (replay.engine.jit.compile_in_a_helper) compiles what
    it is given into the disk cache and names what it compiled; what it cannot import is
    left to the caller, and a helper that fails named nothing."""
    from replay.engine import jit
    from replay.engine.loop import AROUND_THE_LOOP, _outcome

    signature_of = "replay.engine.loop:beside_the_loop_signature"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # the helper's cache: empty
    key = str([f for f, _ in AROUND_THE_LOOP].index(_outcome))
    helper = jit.compile_in_a_helper([("replay.engine.loop", "_outcome", key)], signature_of)
    assert jit.helper_compiled(helper) == ["_outcome"]
    assert list(tmp_path.glob("replay.engine.loop-*/loop._outcome-*.nbi"))

    unreachable = [("__main__", "decide", "decide"), ("mine", "make.<locals>.decide", "decide")]
    assert jit.compile_in_a_helper(unreachable, signature_of) is None
    failed = jit.compile_in_a_helper([("no_such_module", "decide", "decide")], signature_of)
    assert jit.helper_compiled(failed) == [] and failed.returncode != 0
    monkeypatch.setattr(jit, "usable_cores", lambda: 1)
    assert jit.compile_in_a_helper([("replay.engine.loop", "_outcome", key)],
                                   signature_of) is None


def test_usable_cores_are_those_the_process_may_run_on(monkeypatch):
    # A job limited to one core of a larger machine (Slurm, taskset, a container) starts no
    # helper: the two would share that core.
    from replay.engine import jit

    monkeypatch.setattr(jit.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(jit.os, "cpu_count", lambda: 64)
    assert jit.usable_cores() == 1
    monkeypatch.delattr(jit.os, "sched_getaffinity")
    assert jit.usable_cores() == 64
