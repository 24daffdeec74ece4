"""Shared helpers: build and run small replays directly, without Hydra."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from replay.engine.kv import explicit
from replay.engine.loop import Engine, RunResult
from replay.engine.requests import Requests
from replay.timing import UnitTiming

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("KVSCHED_DATA_DIR", REPO.parent / "shared" / "data"))
# Subprocesses (``python -m replay`` in CLI and reproduction tests) read the same directory.
os.environ.setdefault("KVSCHED_DATA_DIR", str(DATA_DIR))

# CI (.ci/run) replays a fixed sequence of property-test examples, so a landing does not
# hinge on a fresh random draw; a plain ``pytest`` draws new ones each run and keeps any
# failure in .hypothesis/ to replay first. ``HYPOTHESIS_PROFILE=ci pytest`` replays CI's.
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# A shell starts a background job (``pytest &``) with Ctrl-C ignored, and every process it
# starts inherits that: the tests that interrupt a command would find the interrupt ignored.
# A terminal's foreground process has it, so the tests give it back (to this process, and
# through it to the commands they start).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def replay(prompt_len, output_len, policy, kv_tokens: int, arrival=None, timing=None,
           seed: int = 0, block_size: int = 1, **engine_options) -> RunResult:
    """Run ``policy`` on the given lengths (all at time 0 unless ``arrival`` is given)."""
    s = np.asarray(prompt_len, dtype=np.int64)
    o = np.asarray(output_len, dtype=np.int64)
    a = np.zeros(s.size) if arrival is None else np.asarray(arrival, dtype=float)
    engine = Engine(Requests(s, o, arrival=a), policy, timing or UnitTiming(),
                    explicit(kv_tokens, block_size), seed=seed, **engine_options)
    return engine.run()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "traces").is_dir():
        pytest.skip(f"data directory {DATA_DIR} not present (set KVSCHED_DATA_DIR)")
    return DATA_DIR
