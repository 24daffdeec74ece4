"""The fluid model (POLICIES.md §6-7) against values computed by hand, in both conventions."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from replay.errors import ConfigError
from replay.fluid.model import (
    TypeMix,
    condition_11,
    condition_12,
    equilibrium,
    scale_thresholds,
    segment_edges,
    segment_memory_terms,
    segment_tails,
    stability_boundary,
    theta,
    wait_thresholds,
)
from tests.conftest import REPO


def mix(*types, convention="harness"):
    return TypeMix.from_types([dict(zip(("prompt_len", "output_len", "rate"), t, strict=True))
                               for t in types], convention)


def test_b0_example_in_the_harness_convention():
    # (s, o) = (1, 2) at 4 per round, one round per iteration: W = 4 * 2 * (1 + 3/2) = 20.
    eq = equilibrium(mix((1, 2, 4)), d0=1.0, d1=0.0)
    assert (eq["W"], eq["load"], eq["tau_star"], eq["m_star"]) == (20, 0, 1, 20)
    assert eq["n_star"] == [8]  # tau* * rate * o: 4 per stage over 2 stages
    assert eq["throughput_star"] == 8  # tokens per round: 4 requests * 2 tokens


def test_the_papers_example_2_in_its_own_convention():
    # Paper type (l, l') = (1, 1) at 4: C = M* = 4 * 1 + 4 * 2 = 12, 4 tokens per iteration.
    eq = equilibrium(mix((1, 1, 4), convention="paper"), d0=1.0, d1=0.0)
    assert eq["m_star"] == 12
    assert eq["throughput_star"] == 4


def test_linear_equilibrium_by_hand():
    # (s, o, rate) = (10, 10, 100): W = 100 * 10 * (10 + 5.5) = 15,500; d1 = 1e-5: load 0.155.
    eq = equilibrium(mix((10, 10, 100)), d0=0.01, d1=1e-5)
    assert eq["W"] == 15_500 and eq["load"] == pytest.approx(0.155)
    assert eq["tau_star"] == pytest.approx(0.01 / 0.845)
    assert eq["m_star"] == pytest.approx(0.01 / 0.845 * 15_500)
    assert eq["n_star"] == pytest.approx([0.01 / 0.845 * 1000])
    assert eq["throughput_star"] == 1000
    # The paper's (l, l') = (10, 10): W = 100 * 11 * (10 + 5) = 16,500; tokens 100 * 10.
    paper = equilibrium(mix((10, 10, 100), convention="paper"), d0=0.01, d1=1e-5)
    assert paper["W"] == 16_500 and paper["tau_star"] == pytest.approx(0.01 / 0.835)
    assert paper["throughput_star"] == 1000
    # The prefill term: P = 100 * 10 = 1000 tokens/s, d2 = 1e-4 adds 0.1 to the load.
    assert equilibrium(mix((10, 10, 100)), 0.01, 1e-5, 1e-4)["load"] == pytest.approx(0.255)
    assert stability_boundary(mix((10, 10, 100)), 1e-5, 1e-4) == pytest.approx(1 / 0.255)


def test_unstable_input_says_unstable():
    eq = equilibrium(mix((10, 10, 100)), d0=0.01, d1=1e-3)
    assert eq["stable"] is False and eq["load"] == pytest.approx(15.5)
    assert eq["tau_star"] is None and eq["m_star"] is None and eq["n_star"] is None
    assert wait_thresholds(mix((10, 10, 100)), "condition_11", d0=0.01, d1=1e-3) is None


def test_wait_threshold_rules():
    low = mix((10, 10, 1000), (10, 20, 1000))
    # fluid: B * rate / sum(rate * o) = 90 * 1000 / 30,000 = 3 per stage for each type.
    assert wait_thresholds(low, "fluid", 90).tolist() == [3, 3]
    # paper_printed: B * rho / o = 120 * 0.5 / 10 = 6 and 120 * 0.5 / 20 = 3.
    assert wait_thresholds(low, "paper_printed", 120).tolist() == [6, 3]
    # condition_11 with d0 = 9.25 ms, d1 = 3.686e-7: tau* * rate = 11.7 -> 12 per stage,
    # and one fewer of either type violates (11).
    n = wait_thresholds(low, "condition_11", d0=0.00925, d1=3.686e-7)
    assert n.tolist() == [12, 12]
    assert condition_11(low, n, 0.00925, 3.686e-7)["holds"]
    for fewer in ([11, 12], [12, 11]):
        assert not condition_11(low, np.array(fewer), 0.00925, 3.686e-7)["holds"]
    with pytest.raises(ConfigError, match="thresholds"):
        wait_thresholds(low, "bogus", 100)


def test_condition_11_reports_memory():
    one = mix((1, 2, 4))
    check = condition_11(one, np.array([4]), 1.0, 0.0, kv_capacity=20)
    # M_pi = 4 * 2 * (1 + 1.5) = 20 <= 20; Delta T = 1 <= 4 / 4.
    assert check["m_pi"] == 20 and check["fits_memory"] and check["holds"]
    assert not check["strict"]


def test_nested_thresholds_from_tail_rates():
    b2 = mix((10, 20, 20), (10, 40, 40), (10, 80, 80), (10, 160, 160))
    edges = segment_edges([20, 40, 80], 160)
    tails = segment_tails(b2, edges)
    assert tails.tolist() == [300, 280, 240, 160]  # the paper's 15:14:12:8
    # widths 20, 20, 40, 80: sum(width * tail) = 33,000, so B = 33,000 / 20 gives tails / 20.
    assert scale_thresholds(tails, edges, 1650).tolist() == [15, 14, 12, 8]
    paper = condition_12([15, 14, 12, 8], tails)
    assert paper["holds"] and not paper["strict"]  # equality, as POLICIES.md says
    assert condition_12(scale_thresholds(tails, edges, 33_000, epsilon=0.1), tails)["strict"]


def test_theta_root_and_its_limits():
    assert theta(14, 15, 280 / 300) == 0.0  # equality in (12): no positive root
    assert theta(5, 4, 0.5) == math.inf     # n_k >= n_{k-1}: the queue cannot grow
    t = theta(6, 10, 0.5)
    assert t > 0
    assert math.exp(-t * 6) * (0.5 + 0.5 * math.exp(t)) ** 10 == pytest.approx(1.0)


def test_segment_memory_terms_by_hand():
    # m = 4 types l' = 1..4 at rate 1, l = 2, L = 2 (edges 0, 2, 4), thresholds (4, 3).
    terms = segment_memory_terms(np.arange(1, 5), np.ones(4), 2.0, 2, np.array([4, 3]),
                                 horizon=10, delta=0.1)
    assert terms["edges"] == [0, 2, 4] and terms["tails"] == [4, 2]
    assert terms["term1"] == 4 * (3 + 4) + 3 * (5 + 6)
    assert terms["term2"] == 3 * (2 + 2)
    root = theta(3, 4, 0.5)
    assert terms["term3"] == pytest.approx((2 + 2) * math.log(1 * 11 / 0.1) / root)


def test_types_are_validated_with_their_index():
    with pytest.raises(ConfigError, match=r"types\[1\].output_len"):
        mix((1, 2, 4), (1, 0, 4))
    with pytest.raises(ConfigError, match=r"types\[0\].rate"):
        mix((1, 2, 0))


def fluid_cli(*args):
    return subprocess.run([sys.executable, "-m", "replay.fluid", *args], cwd=REPO,
                          capture_output=True, text=True)


def test_cli_prints_one_json_line():
    done = fluid_cli("experiment=b1_wait_low", "timing=linear", "workload.load=0.5")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("W", "load", "stable", "tau_star", "m_star", "n_star", "throughput_star",
                "thresholds"):
        assert key in out
    assert out["stable"] and out["load"] == pytest.approx(0.5)
    assert set(out["thresholds"]) == {"fluid", "paper_printed", "condition_11"}
    unstable = json.loads(fluid_cli("experiment=b1_wait_low").stdout.strip().splitlines()[-1])
    assert unstable["stable"] is False and unstable["m_star"] is None
    paper = json.loads(fluid_cli("experiment=b0_cascade", "fluid_convention=paper")
                       .stdout.strip().splitlines()[-1])
    assert paper["convention"] == "paper"


def test_cli_help_and_bad_input():
    assert fluid_cli("--help").returncode == 0
    bad = fluid_cli("workload=lmsys_synthetic")
    assert bad.returncode == 2 and bad.stderr.startswith("error:")
    assert "typed workload" in bad.stderr
    assert fluid_cli("policy=nope").returncode == 2
