"""Unit-time instances of the hindsight program, schedules on them, and the disjoint
tails that strengthen both the integer program and its LP."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Instance:
    """One unit-time instance: prompt lengths ``s``, outputs ``o``, integer arrivals ``a``."""

    prompt_len: np.ndarray
    output_len: np.ndarray
    arrival: np.ndarray
    kv_capacity: int

    def __post_init__(self) -> None:
        s, o, a = (np.asarray(x) for x in (self.prompt_len, self.output_len, self.arrival))
        if not len(s) == len(o) == len(a):
            raise ValueError("Instance: prompt_len, output_len and arrival differ in length")
        if np.any(np.mod(a, 1) != 0) or np.any(a < 0):
            raise ValueError("Instance: the integer program needs arrivals on rounds >= 0")
        if np.any(s < 1) or np.any(o < 1):
            raise ValueError("Instance: prompt and output lengths must be >= 1")
        if np.any(s + o > self.kv_capacity):
            i = int(np.flatnonzero(s + o > self.kv_capacity)[0])
            raise ValueError(f"Instance: request {i} needs s + o = {s[i] + o[i]} > M = "
                             f"{self.kv_capacity} slots and can never run")
        for name, x in (("prompt_len", s), ("output_len", o), ("arrival", a)):
            object.__setattr__(self, name, x.astype(np.int64))

    @classmethod
    def from_requests(cls, requests, kv_capacity: int) -> Instance:
        return cls(requests.prompt_len, requests.output_len, requests.arrival, int(kv_capacity))

    def __len__(self) -> int:
        return len(self.prompt_len)


# ------------------------------------------------------------------ schedules
def tel(inst: Instance, starts) -> int:
    starts = np.asarray(starts, dtype=np.int64)
    return int((starts + inst.output_len - inst.arrival).sum())


def tel_constant(inst: Instance) -> int:
    """TEL minus the sum of start rounds: ``sum_i (o_i - a_i)``."""
    return int(inst.output_len.sum() - inst.arrival.sum())


def kv_profile(inst: Instance, starts) -> np.ndarray:
    """KV held after each iteration round ``0..max(p + o) - 1`` under ``starts``."""
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size == 0:
        return np.zeros(0, dtype=np.int64)
    o, s = inst.output_len, inst.prompt_len
    owner = np.repeat(np.arange(len(inst)), o)
    step = np.arange(o.sum()) - np.repeat(np.cumsum(o) - o, o)  # 0..o_i-1
    profile = np.zeros(int((starts + o).max()), dtype=np.int64)
    np.add.at(profile, starts[owner] + step, s[owner] + step + 1)
    return profile


def is_feasible(inst: Instance, starts) -> bool:
    starts = np.asarray(starts, dtype=np.int64)
    return bool(np.all(starts >= inst.arrival)) and bool(
        np.all(kv_profile(inst, starts) <= inst.kv_capacity))


def latest_starts(inst: Instance, upper_bound_tel: int | None = None) -> np.ndarray:
    """Per request, the last start round some optimal schedule needs (§11's two bounds)."""
    total_output = int(inst.output_len.sum())
    latest = inst.arrival.max(initial=0) + total_output - inst.output_len
    if upper_bound_tel is not None:
        latest = np.minimum(latest, inst.arrival + int(upper_bound_tel) - total_output)
    if np.any(latest < inst.arrival):
        raise ValueError(f"latest_starts: upper bound {upper_bound_tel} is below the TEL of "
                         f"running every request alone at its arrival; it is not a feasible TEL")
    return latest


def symmetry_groups(inst: Instance) -> list[np.ndarray]:
    """Ids of requests with identical ``(s, o, a)``, each group ascending (size >= 2)."""
    keys = np.stack([inst.prompt_len, inst.output_len, inst.arrival], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    groups = [np.flatnonzero(inverse.ravel() == g) for g in range(inverse.max(initial=-1) + 1)]
    return [g for g in groups if g.size > 1]


def max_overlap(inst: Instance) -> np.ndarray:
    """``overlap[i, j]``: the most rounds ``i`` and ``j`` can run together, on their own,
    when ``j`` starts no earlier than ``i``.

    Started ``d < o_i`` rounds after ``i``, ``j`` overlaps it up to ``i``'s iteration
    ``t_end + 1 = min(o_i, d + o_j)``, where the pair holds the most:
    ``s_i + s_j + 2 t_end - d + 2`` (it grows by two per round)."""
    s, o, kv = inst.prompt_len, inst.output_len, inst.kv_capacity
    overlap = np.zeros((len(inst), len(inst)), dtype=np.int64)
    for i in range(len(inst)):
        d = np.arange(o[i])[:, None]
        t_end = np.minimum(o[i], d + o[None, :]) - 1
        fits = s[i] + s[None, :] + 2 * t_end - d + 2 <= kv
        overlap[i] = np.where(fits, t_end - d + 1, 0).max(axis=0)
    return overlap


def disjoint_tails(inst: Instance) -> list[tuple[np.ndarray, np.ndarray]]:
    """Families ``(requests, heads)`` whose tails (request ``j`` without its first
    ``heads[j]`` iterations) never run at the same time in a feasible schedule.

    For the requests whose peak ``s + o`` reaches a threshold, ``heads[j]`` is the most
    any other of them can overlap ``j`` when starting no later (:func:`max_overlap`):
    if ``i`` starts first, it completes at most ``heads[j]`` rounds after ``p_j``, so before
    ``j``'s tail starts. One family per distinct set with two or more non-empty tails.
    """
    overlap = max_overlap(inst)
    np.fill_diagonal(overlap, 0)
    peaks = inst.prompt_len + inst.output_len
    families, seen = [], set()
    for threshold in np.unique(peaks):
        members = np.flatnonzero(peaks >= threshold)
        heads = overlap[np.ix_(members, members)].max(axis=0)
        keep = heads < inst.output_len[members]
        key = (tuple(members[keep]), tuple(heads[keep]))
        if keep.sum() < 2 or key in seen:
            continue
        seen.add(key)
        families.append((members[keep], heads[keep]))
    return families


def canonical_hint(inst: Instance, starts) -> np.ndarray:
    """``starts`` with identical requests' starts sorted by id (same TEL, same profile)."""
    starts = np.asarray(starts, dtype=np.int64).copy()
    for g in symmetry_groups(inst):
        starts[g] = np.sort(starts[g])
    return starts

