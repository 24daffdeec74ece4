"""The fluid model (docs/policies/wait.md) against values computed by hand, in both conventions."""

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
    batch_time,
    condition_11,
    condition_12,
    equilibrium,
    nested_condition_thresholds,
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


# ---------------------------------------------------------------- per-token terms d3, d4
# Hand-worked cases (docs/fluid.md): per second W = KV touched, P = prefill tokens,
# D = decode tokens, R = prompts; load = d1 W + d2 P + d3 D + d4 R; tau* = d0 / (1 - load).


def test_one_type_with_a_decode_term_by_hand():
    # (s, o, rate) = (2, 3, 1): W = 1 * 3 * (2 + 2) = 12, P = 2, D = 1 * (3 - 1) = 2.
    one = mix((2, 3, 1))
    eq = equilibrium(one, 2.0, 0.01, 0.02, 0.1)
    assert (eq["W"], eq["P"], eq["D"], eq["R"]) == (12, 2, 2, 1)
    assert eq["load"] == pytest.approx(0.12 + 0.04 + 0.2)
    assert eq["tau_star"] == pytest.approx(3.125) and eq["m_star"] == pytest.approx(37.5)
    assert eq["n_star"] == pytest.approx([9.375]) and eq["throughput_star"] == 3
    assert stability_boundary(one, 0.01, 0.02, 0.1) == pytest.approx(1 / 0.36)
    # One fluid iteration at x = tau* per stage takes exactly tau*: KV 37.5, 6.25 prefill
    # and 6.25 decode tokens: 2 + 0.375 + 0.125 + 0.625.
    assert batch_time(one, np.array([3.125]), 2.0, 0.01, 0.02, 0.1) == pytest.approx(3.125)
    # Condition 11: n = 4 (Delta T = 2 + 4 * 0.36 = 3.44 <= 4; n = 3 gives 3.08 > 3).
    n = wait_thresholds(one, "condition_11", d0=2.0, d1=0.01, d2=0.02, d3=0.1)
    assert n.tolist() == [4]
    assert condition_11(one, n, 2.0, 0.01, 0.02, d3=0.1)["delta_t"] == pytest.approx(3.44)
    # Without d3: load 0.16, tau* = 2 / 0.84, and condition 11 needs only n = 3.
    eq0 = equilibrium(one, 2.0, 0.01, 0.02)
    assert eq0["load"] == pytest.approx(0.16) and eq0["tau_star"] == pytest.approx(2 / 0.84)
    assert wait_thresholds(one, "condition_11", d0=2.0, d1=0.01, d2=0.02).tolist() == [3]


def test_two_types_with_a_decode_term_by_hand():
    # (1, 2, 2) and (3, 4, 1): W = 2*2*(1 + 1.5) + 1*4*(3 + 2.5) = 32, P = 5, D = 2 + 3 = 5.
    two = mix((1, 2, 2), (3, 4, 1))
    eq = equilibrium(two, 0.5, 0.01, 0.05, 0.05)
    assert (eq["W"], eq["P"], eq["D"]) == (32, 5, 5) and eq["load"] == pytest.approx(0.82)
    assert eq["tau_star"] == pytest.approx(0.5 / 0.18)
    assert eq["m_star"] == pytest.approx(32 * 0.5 / 0.18)
    assert eq["n_star"] == pytest.approx([0.5 / 0.18 * 4] * 2) and eq["throughput_star"] == 8
    assert stability_boundary(two, 0.01, 0.05, 0.05) == pytest.approx(1 / 0.82)
    # Condition 11 on the ray n = max(1, ceil(x (2, 1))): (6, 3), Delta T = 0.5 + 0.96 + 0.75
    # + 0.75 = 2.96 <= min(6/2, 3/1); (5, 3) gives 2.81 > 2.5. Without d3: (4, 2).
    n = wait_thresholds(two, "condition_11", d0=0.5, d1=0.01, d2=0.05, d3=0.05)
    assert n.tolist() == [6, 3]
    assert condition_11(two, n, 0.5, 0.01, 0.05, d3=0.05)["delta_t"] == pytest.approx(2.96)
    assert not condition_11(two, np.array([5, 3]), 0.5, 0.01, 0.05, d3=0.05)["holds"]
    assert wait_thresholds(two, "condition_11", d0=0.5, d1=0.01, d2=0.05).tolist() == [4, 2]


def test_paper_convention_prefills_l_tokens_in_batch_time_too():
    # Paper (l, l') = (3, 2) at 1 (harness (2, 3)): P = l = 3, D = l' = 2 = Throughput*.
    paper = mix((3, 2, 1), convention="paper")
    eq = equilibrium(paper, 1.0, 0.01, 0.02, 0.1)
    assert (eq["W"], eq["P"], eq["D"], eq["throughput_star"]) == (12, 3, 2, 2)
    assert eq["load"] == pytest.approx(0.38) and eq["tau_star"] == pytest.approx(1 / 0.62)
    # The fluid iteration takes tau* in batch_time as well: it prefills l = 3 tokens per
    # entrant, as equilibrium counts them (it used s = 2 before, 0.02 * tau* too fast).
    x = eq["tau_star"]
    assert batch_time(paper, np.array([x]), 1.0, 0.01, 0.02, 0.1) == pytest.approx(x)
    assert batch_time(paper, np.array([1]), 0.0, 0.0, 1.0) == 3


def test_a_per_prompt_term_by_hand():
    # (2, 3, 1) with d4 = 0.05 per prompt: R = 1, load = 0.36 + 0.05 = 0.41.
    one = mix((2, 3, 1))
    eq = equilibrium(one, 2.0, 0.01, 0.02, 0.1, 0.05)
    assert eq["R"] == 1 and eq["load"] == pytest.approx(0.41)
    assert eq["tau_star"] == pytest.approx(2 / 0.59)
    assert eq["load_terms"] == pytest.approx({"d1_W": 0.12, "d2_P": 0.04, "d3_D": 0.2,
                                              "d4_R": 0.05})
    # Delta T(n) = 2 + 0.41 n <= n from n = 4 on (3 gives 3.23 > 3).
    assert wait_thresholds(one, "condition_11", d0=2.0, d1=0.01, d2=0.02, d3=0.1,
                           d4=0.05).tolist() == [4]
    # Past the boundary there are none: rates x 2.5 give load 1.025.
    faster = mix((2, 3, 2.5))
    assert not equilibrium(faster, 2.0, 0.01, 0.02, 0.1, 0.05)["stable"]
    assert wait_thresholds(faster, "condition_11", d0=2.0, d1=0.01, d2=0.02, d3=0.1,
                           d4=0.05) is None


def test_zero_new_terms_change_nothing():
    rng = np.random.default_rng(3)
    types = mix(*[(int(s), int(o), float(r)) for s, o, r in
                  zip(rng.integers(1, 100, 5), rng.integers(1, 300, 5), rng.uniform(1, 50, 5),
                      strict=True)])
    d0, d1, d2 = 0.00925, 3.686e-7, 6.399e-05
    old_load = d1 * float((types.rate * types.memory_per_request).sum()) + d2 * float(
        (types.rate * types.prompt_len).sum())
    eq = equilibrium(types, d0, d1, d2, 0.0, 0.0)
    assert eq["load"] == old_load and eq["tau_star"] == d0 / (1 - old_load)
    assert stability_boundary(types, d1, d2, 0.0, 0.0) == 1 / old_load
    n = wait_thresholds(types, "condition_11", d0=d0, d1=d1, d2=d2)
    assert (n == wait_thresholds(types, "condition_11", d0=d0, d1=d1, d2=d2, d3=0.0,
                                 d4=0.0)).all()


def test_nested_condition_16_with_the_token_terms_by_hand():
    # One segment of 2 stages (edges 0, 2), l = 1, tail rate 1: M_pi = n (2 + 3) = 5 n,
    # n prompts of 1 token, 2 n decodes. (16): 1 + 0.05 n + d2 n + 2 d3 n + d4 n <= n.
    tails, edges = np.array([1.0]), np.array([0, 2])

    def smallest(**d):
        n = nested_condition_thresholds(tails, edges, 1.0, 1.0, 0.01, 0.0, **d)
        return None if n is None else n.tolist()

    assert smallest() == [2]                                    # n >= 1 / 0.95
    assert smallest(d3=0.3) == [3]                              # n >= 1 / 0.35
    assert smallest(d2=0.1, d4=0.1) == [2]                      # n >= 1 / 0.75
    assert smallest(d2=0.1, d3=0.3, d4=0.1) == [7]              # n >= 1 / 0.15
    assert smallest(d2=0.1, d3=0.5, d4=0.1) is None             # the slope reaches 1


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
    assert paper["holds"] and not paper["strict"]  # equality, as docs/policies/wait.md says
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


@pytest.mark.slow
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


def test_a_threshold_margin_that_overflows_is_a_config_error():
    import numpy as np
    import pytest

    from replay.errors import ConfigError
    from replay.fluid.model import scale_thresholds

    edges = np.arange(0, 550, 50)
    assert scale_thresholds([1.0] * 10, edges, 512, epsilon=0.05)[-1] > 0
    with pytest.raises(ConfigError, match="policy.epsilon"):
        scale_thresholds([1.0] * 10, edges, 512, epsilon=1e40)
