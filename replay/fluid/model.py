"""The fluid model of the WAIT paper (docs/policies/wait.md), as plain functions.

Types are ``(s, o, rate)`` in this harness's convention (docs/model.md: ``o``
iterations, holding ``s + j`` after the iteration that emits token ``j``). A
paper type ``(l, l')`` has exactly the footprint of ``(s, o) = (l - 1, l' + 1)``;
``convention="paper"`` takes types as ``(l, l')`` and reports the paper's own
numbers (its throughput counts ``l'`` decode tokens per request, the harness
counts ``o``; its prefill processes ``l`` tokens).

For the linear iteration time ``tau = d0 + d1 KV + d2 (prefill tokens) + d3 (decode
tokens) + d4 (prompts)`` (:class:`replay.timing.simple.LinearTiming`; derivation in
docs/fluid.md), per second of arrivals:

    W = sum_j rate_j o_j (s_j + (o_j + 1) / 2)     P = sum_j rate_j s_j
    D = sum_j rate_j (o_j - 1)                     R = sum_j rate_j
    load = d1 W + d2 P + d3 D + d4 R (stable iff < 1)   tau* = d0 / (1 - load)
    M* = tau* W     n_j* = tau* rate_j o_j     Throughput* = sum_j rate_j o_j

With ``d3 = d4 = 0`` every function gives what it gave before these terms existed.

``python -m replay.fluid [hydra overrides]`` prints these, the WAIT thresholds
and the condition checks for the configured typed workload as one JSON line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from replay.errors import ConfigError

CONVENTIONS = ("harness", "paper")
THRESHOLD_RULES = ("fluid", "paper_printed", "condition_11")


@dataclass(frozen=True)
class TypeMix:
    """Known request types in the harness convention (arrays of equal length)."""

    prompt_len: np.ndarray
    output_len: np.ndarray
    rate: np.ndarray
    convention: str = "harness"

    @classmethod
    def from_types(cls, types: Sequence[Mapping], convention: str = "harness") -> TypeMix:
        """``types``: ``[{prompt_len, output_len, rate}, ...]`` (paper: ``l``, ``l'``)."""
        if convention not in CONVENTIONS:
            raise ConfigError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        if not types:
            raise ConfigError("workload.types: need at least one type")
        try:
            s = np.array([float(t["prompt_len"]) for t in types])
            o = np.array([float(t["output_len"]) for t in types])
            rate = np.array([float(t["rate"]) for t in types])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"workload.types: each type needs numeric prompt_len, "
                              f"output_len and rate ({exc})") from exc
        # Paper types (l, l') need l >= 1, l' >= 0; harness types (s, o) need s, o >= 1.
        minimum = {"prompt_len": 1, "output_len": 0 if convention == "paper" else 1}
        for name, values in (("prompt_len", s), ("output_len", o)):
            bad = np.flatnonzero((values < minimum[name]) | (values != np.round(values)))
            if bad.size:
                raise ConfigError(f"workload.types[{int(bad[0])}].{name} = {values[bad[0]]:g}: "
                                  f"need an integer >= {minimum[name]}")
        bad = np.flatnonzero(~(rate > 0))
        if bad.size:
            raise ConfigError(f"workload.types[{int(bad[0])}].rate = {rate[bad[0]]:g}: need > 0")
        if convention == "paper":
            s, o = s - 1, o + 1
        return cls(s.astype(np.int64), o.astype(np.int64), rate, convention)

    @property
    def memory_per_request(self) -> np.ndarray:
        """Average KV held over a request's ``o`` iterations, times ``o``."""
        return self.output_len * (self.prompt_len + (self.output_len + 1) / 2)

    @property
    def tokens_per_request(self) -> np.ndarray:
        """Generated tokens: ``o`` (harness) or ``l' = o - 1`` (paper)."""
        return self.output_len - (1 if self.convention == "paper" else 0)

    @property
    def prefill_per_request(self) -> np.ndarray:
        """Prefill tokens: ``s`` (harness) or ``l = s + 1`` (paper)."""
        return self.prompt_len + (1 if self.convention == "paper" else 0)

    @property
    def decode_per_request(self) -> np.ndarray:
        """Decode iterations (one new token each): ``o - 1`` (= ``l'`` in the paper's terms);
        the first of the ``o`` iterations is the prefill."""
        return self.output_len - 1


def rates(mix: TypeMix) -> dict[str, float]:
    """Per second of arrivals: ``W`` (KV touched), ``P`` (prefill tokens), ``D`` (decode
    tokens) and ``R`` (prompts) that the iterations must process; each iteration of
    length ``tau`` processes ``tau`` times these in the fluid equilibrium."""
    return {"W": float((mix.rate * mix.memory_per_request).sum()),
            "P": float((mix.rate * mix.prefill_per_request).sum()),
            "D": float((mix.rate * mix.decode_per_request).sum()),
            "R": float(mix.rate.sum())}


def load_terms(mix: TypeMix, d1: float, d2: float = 0.0, d3: float = 0.0,
               d4: float = 0.0) -> dict[str, float]:
    """The load's four parts ``d1 W``, ``d2 P``, ``d3 D``, ``d4 R`` (their sum is the load)."""
    r = rates(mix)
    return {"d1_W": d1 * r["W"], "d2_P": d2 * r["P"], "d3_D": d3 * r["D"], "d4_R": d4 * r["R"]}


def equilibrium(mix: TypeMix, d0: float, d1: float, d2: float = 0.0, d3: float = 0.0,
                d4: float = 0.0) -> dict:
    """The fluid equilibrium (paper eqs. (8)-(10), plus the terms ``d2``, ``d3``, ``d4``)."""
    r = rates(mix)
    work = r["W"]
    terms = load_terms(mix, d1, d2, d3, d4)
    load = terms["d1_W"] + terms["d2_P"] + terms["d3_D"] + terms["d4_R"]
    out = {"W": work, "P": r["P"], "D": r["D"], "R": r["R"], "load": load,
           "load_terms": terms, "stable": load < 1,
           "throughput_star": float((mix.rate * mix.tokens_per_request).sum()),
           "convention": mix.convention}
    if load < 1:
        tau = d0 / (1 - load)
        out.update(tau_star=tau, m_star=tau * work,
                   n_star=(tau * mix.rate * mix.output_len).tolist())
    else:
        out.update(tau_star=None, m_star=None, n_star=None)
    return out


def stability_boundary(mix: TypeMix, d1: float, d2: float = 0.0, d3: float = 0.0,
                       d4: float = 0.0) -> float:
    """The factor by which the rates can be scaled before the load reaches 1 (every
    part of the load is proportional to the rates)."""
    unit = sum(load_terms(mix, d1, d2, d3, d4).values())
    return math.inf if unit == 0 else 1.0 / unit


def batch_memory(mix: TypeMix, n: np.ndarray) -> float:
    """``M_pi``: KV touched by an iteration with ``n_j`` requests at every stage of type ``j``."""
    return float((np.asarray(n) * mix.memory_per_request).sum())


def batch_time(mix: TypeMix, n: np.ndarray, d0: float, d1: float, d2: float = 0.0,
               d3: float = 0.0, d4: float = 0.0) -> float:
    """``Delta T``: that iteration's linear time. Its ``n_j`` stage-0 requests of type ``j``
    prefill (``prefill_per_request`` tokens each, as :func:`equilibrium` counts them) and
    its ``n_j (o_j - 1)`` later-stage requests decode."""
    n = np.asarray(n)
    return (d0 + d1 * batch_memory(mix, n) + d2 * float((n * mix.prefill_per_request).sum())
            + d3 * float((n * mix.decode_per_request).sum()) + d4 * float(n.sum()))


def wait_thresholds(mix: TypeMix, rule: str, batch_limit: float | None = None,
                    d0: float | None = None, d1: float | None = None, d2: float = 0.0,
                    max_steps: int = 1_000_000, d3: float = 0.0,
                    d4: float = 0.0) -> np.ndarray | None:
    """Per-stage thresholds ``n_j`` of WAIT (docs/policies/wait.md); ``None`` if none exist.

    * ``fluid``: ``max(1, round(B rate_j / sum_k rate_k o_k))`` (a full iteration holds
      about ``B`` requests);
    * ``paper_printed``: ``max(1, round(B rho_j / o_j))``, ``rho_j = rate_j / sum rate``;
    * ``condition_11``: the smallest ``n_j = max(1, ceil(x rate_j))`` (proportional to
      the rates, like ``fluid``) with ``Delta T(n) <= n_j / rate_j`` for every ``j``,
      found by raising ``x`` from one breakpoint of the ceilings to the next. On the
      ray ``n = x rate`` (before rounding) the condition reads ``d0 + x load <= x``, i.e.
      ``x >= tau*``: none exist when the load is >= 1.
    """
    if rule not in THRESHOLD_RULES:
        raise ConfigError(f"policy.thresholds must be one of {THRESHOLD_RULES}, got {rule!r}")
    if rule in ("fluid", "paper_printed"):
        if batch_limit is None or batch_limit <= 0:
            raise ConfigError(f"policy.batch_limit must be > 0 for thresholds={rule}")
        if rule == "fluid":
            raw = batch_limit * mix.rate / float((mix.rate * mix.output_len).sum())
        else:
            raw = batch_limit * (mix.rate / mix.rate.sum()) / mix.output_len
        return np.maximum(1, np.round(raw)).astype(np.int64)
    if d0 is None or d1 is None:
        raise ConfigError("thresholds=condition_11 needs the linear timing coefficients d0, d1")
    if not equilibrium(mix, d0, d1, d2, d3, d4)["stable"]:
        return None
    return smallest_on_ray(mix.rate, lambda n: batch_time(mix, n, d0, d1, d2, d3, d4)
                           <= float((n / mix.rate).min()), max_steps)


def smallest_on_ray(weights: np.ndarray, holds, max_steps: int = 1_000_000
                    ) -> np.ndarray | None:
    """The first ``n(x) = max(1, ceil(x * weights))`` for increasing ``x`` where ``holds(n)``.

    ``n(x)`` only changes just after a breakpoint ``x = n_k / w_k``, where the
    entries with the smallest ``n_k / w_k`` each grow by one; stepping through the
    breakpoints in integers visits every distinct ``n`` in order, without rounding.
    """
    w = np.asarray(weights, dtype=float)
    n = np.ones(w.size, dtype=np.int64)
    for _ in range(max_steps):
        if holds(n):
            return n
        ratio = n / w
        n = n + (ratio <= ratio.min() * (1 + 1e-12))
    return None


def condition_11(mix: TypeMix, n: np.ndarray, d0: float, d1: float, d2: float = 0.0,
                 kv_capacity: int | None = None, d3: float = 0.0, d4: float = 0.0) -> dict:
    """Check (11) for thresholds ``n``: ``Delta T <= n_j / rate_j`` for all ``j``; and M_pi <= M."""
    delta_t = batch_time(mix, n, d0, d1, d2, d3, d4)
    slack = np.asarray(n) / mix.rate - delta_t
    m_pi = batch_memory(mix, n)
    return {"delta_t": delta_t, "m_pi": m_pi, "holds": bool((slack >= 0).all()),
            "strict": bool((slack > 0).all()),
            "fits_memory": None if kv_capacity is None else m_pi <= kv_capacity}


# ------------------------------------------------------------------------ Nested WAIT
def segment_edges(boundaries: Sequence[int], max_output: int) -> np.ndarray:
    """``[b_0 = 0, b_1, ..., b_K]`` with ``b_K`` the longest output (the open end)."""
    inner = np.asarray(list(boundaries), dtype=np.int64)
    if inner.size and (inner[0] <= 0 or np.any(np.diff(inner) <= 0)):
        raise ConfigError(f"policy.boundaries must be increasing and > 0, got {list(inner)}")
    end = max(int(max_output), int(inner[-1]) + 1 if inner.size else 1)
    return np.concatenate(([0], inner, [end]))


def segment_tails(mix: TypeMix, edges: np.ndarray) -> np.ndarray:
    """``S_i``: total rate of the types whose output reaches segment ``i`` (``o > b_{i-1}``)."""
    return np.array([mix.rate[mix.output_len > b].sum() for b in edges[:-1]])


def scale_thresholds(weights: Sequence[float], edges: np.ndarray, batch_limit: float,
                     epsilon: float = 0.0) -> np.ndarray:
    """``n_i = ceil(c w_i (1 + eps)^(i-1))`` with ``c = B / sum_i (b_i - b_{i-1}) w_i``."""
    w = np.asarray(weights, dtype=float)
    widths = np.diff(edges)
    if w.size != widths.size:
        raise ConfigError(f"policy: {w.size} threshold weights for {widths.size} segments")
    if np.any(w <= 0):
        raise ConfigError(f"policy: threshold weights must be > 0, got {w.tolist()}")
    c = batch_limit / float((widths * w).sum())
    with np.errstate(over="ignore"):
        scaled = np.ceil(c * w * (1 + epsilon) ** np.arange(w.size) - 1e-9)
    # A large margin over many segments overflows: a threshold no batch can reach.
    if not np.all(np.isfinite(scaled)) or scaled.max() > 2**31:
        raise ConfigError(f"policy.epsilon: {epsilon} makes the last segments' thresholds "
                          f"unreachable (about {scaled.max():.3g} requests per stage)")
    return scaled.astype(np.int64)


def condition_12(n: Sequence[int], tails: Sequence[float]) -> dict:
    """(12)'s ratio part: ``n_{i+1} / n_i > S_{i+1} / S_i`` for every ``i`` (strict)."""
    n, s = np.asarray(n, dtype=float), np.asarray(tails, dtype=float)
    lhs, rhs = n[1:] / n[:-1], s[1:] / s[:-1]
    return {"strict": bool(np.all(lhs > rhs + 1e-12)),
            "holds": bool(np.all(lhs >= rhs - 1e-12)),
            "ratios": lhs.tolist(), "tail_ratios": rhs.tolist()}


def theta(n_k: float, n_prev: float, p: float) -> float:
    """Positive root of ``exp(-theta n_k) (1 - p + p e^theta)^n_prev = 1``.

    ``0`` when (12) holds only with equality (``n_k = p n_prev``: no positive root,
    the queue bound is infinite); ``inf`` when ``n_k >= n_prev`` (no root: the
    boundary queue cannot grow).
    """
    if n_k >= n_prev:
        return math.inf
    slope = -n_k + n_prev * p  # f'(0); f is convex with f(0) = 0
    if slope >= -1e-9 * n_k:
        return 0.0

    def f(t: float) -> float:  # log of the left side; log(1 - p + p e^t) written stably
        return -t * n_k + n_prev * (t + math.log((1 - p) * math.exp(-t) + p))

    from scipy.optimize import brentq  # deferred: scipy.optimize is a slow import

    lo, hi = 0.5, 1.0
    while f(hi) < 0:
        lo, hi = hi, 2 * hi
    while f(lo) >= 0:
        lo /= 2
    return brentq(f, lo, hi, xtol=1e-14, rtol=1e-12)


def segment_memory_terms(output_len: np.ndarray, rate: np.ndarray, prompt_len: float,
                         segments: int, n: np.ndarray, horizon: float, delta: float) -> dict:
    """The three memory terms of the segment design (paper §7.2; docs/policies/wait.md).

    Types are ``l' = output_len`` (paper convention) with common prompt ``l``; the
    ``m`` types are cut into ``segments`` groups of ``m / L`` consecutive lengths,
    and segment ``k`` spans decode stages ``b_{k-1} + 1 .. b_k``.
    """
    order = np.argsort(output_len)
    lengths, rates = np.asarray(output_len)[order], np.asarray(rate, dtype=float)[order]
    groups = np.array_split(np.arange(lengths.size), segments)
    upper = np.array([lengths[g[-1]] for g in groups])
    edges = np.concatenate(([0], upper))
    tails = np.array([rates[lengths > b].sum() for b in edges[:-1]])
    n = np.asarray(n, dtype=float)
    term1 = sum(n[k] * sum(prompt_len + stage for stage in range(edges[k] + 1, edges[k + 1] + 1))
                for k in range(segments))
    term2 = float(sum(n[k] * (prompt_len + edges[k]) for k in range(1, segments)))
    log_term = math.log((segments - 1) * (horizon + 1) / delta) if segments > 1 else 0.0
    thetas = [theta(n[k], n[k - 1], tails[k] / tails[k - 1]) for k in range(1, segments)]
    term3 = float(sum((prompt_len + edges[k]) * log_term / t if t > 0 else math.inf
                      for k, t in zip(range(1, segments), thetas, strict=True)))
    return {"segments": segments, "term1": float(term1), "term2": term2, "term3": term3,
            "total": float(term1) + term2 + term3, "edges": edges.tolist(),
            "tails": tails.tolist(), "theta": thetas}


def nested_condition_thresholds(tails: np.ndarray, edges: np.ndarray, prompt_len: float,
                                d0: float, d1: float, epsilon: float,
                                max_steps: int = 1_000_000, d2: float = 0.0, d3: float = 0.0,
                                d4: float = 0.0) -> np.ndarray | None:
    """The smallest ``n_k = ceil(x S_k (1 + eps)^(k-1))`` meeting condition (16).

    Both parts: ``Delta T <= n_1 / S_1`` and ``n_{k+1} / n_k > S_{k+1} / S_k`` strictly
    after rounding. ``Delta T`` is the time of an iteration holding ``n_k`` requests at
    every stage of segment ``k`` (paper stages ``b_{k-1} + 1 .. b_k``, decodes at
    ``l + stage``) next to ``n_1`` entering prompts of ``l`` tokens:
    ``d0 + d1 M_pi + d2 n_1 l + d3 sum_k n_k (b_k - b_{k-1}) + d4 n_1``. ``None`` if
    the family never meets it.
    """
    weights = tails * (1 + epsilon) ** np.arange(tails.size)
    per_stage = np.array([sum(prompt_len + st for st in range(edges[k] + 1, edges[k + 1] + 1))
                          for k in range(tails.size)])
    widths = np.diff(edges)[:tails.size].astype(float)

    def growth(n: np.ndarray) -> float:  # Delta T - d0
        n = np.asarray(n, dtype=float)
        return (d1 * float((n * per_stage).sum()) + d2 * float(n[0]) * prompt_len
                + d3 * float((n * widths).sum()) + d4 * float(n[0]))

    if growth(weights) >= weights[0] / tails[0]:
        return None  # the time grows faster along the ray than n_1 / S_1: never met
    reached = tails > 0

    def holds(n: np.ndarray) -> bool:
        ratios_ok = condition_12(n[reached], tails[reached])["strict"]
        return ratios_ok and d0 + growth(n) <= n[0] / tails[0]

    return smallest_on_ray(np.where(reached, weights, 1e-300), holds, max_steps)


COEFFICIENTS = ("d0", "d1", "d2", "d3", "d4")


def linear_coefficients(cfg) -> dict:
    """``{d0, d1, d2, d3, d4, source}`` of the linear iteration-time model a config implies
    (a coefficient the config does not give is 0).

    Unit time: one round per iteration (``d0 = 1``). ``timing=linear``: its own
    coefficients. Otherwise (Vidur) the model's fitted ones for the hardware
    (``model.linear_timing``): they define the stability boundary.
    """
    timing = cfg.timing
    if str(timing.get("_target_", "")).endswith("UnitTiming"):
        return {"d0": 1.0, "d1": 0.0, "d2": 0.0, "d3": 0.0, "d4": 0.0,
                "source": "unit time: d0 = 1 round"}
    if timing.get("d0") is not None:
        linear, source = timing, "timing=linear"
    else:
        linear = (cfg.model.get("linear_timing") or {}).get(cfg.hardware.name)
        if linear is None:
            raise ConfigError(
                f"model.linear_timing.{cfg.hardware.name}: model {cfg.model.name} has no linear "
                f"timing coefficients for hardware {cfg.hardware.name}, which the fluid "
                f"benchmark of a typed workload needs (fit them with python -m "
                f"replay.timing.fit_linear)")
        source = f"model.linear_timing.{cfg.hardware.name} of {cfg.model.name}"
    return {**{k: float(linear[k]) if k in ("d0", "d1", "d2") else float(linear.get(k) or 0.0)
               for k in COEFFICIENTS}, "source": source}

