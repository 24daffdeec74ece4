"""Synthetic workloads whose prompts share prefixes, with the prompt-content ids a prefix
cache reads (:attr:`replay.engine.requests.Requests.block_ids`).

* :class:`SharedPrefix`: groups of requests share a system prompt, the users of a group
  each have a prefix of their own after it, and every request ends in a unique suffix.
* :class:`Sessions`: multi-turn conversations; each turn's prompt is the whole
  conversation so far plus a new message, released a think time after the previous turn
  completes (a closed loop per session, run by the engine).

Content ids name blocks of ``block_unit`` tokens of a prompt: equal ids, equal tokens.
A block that holds tokens of two parts (the end of a system prompt and the start of a
user's prefix, say) belongs to the later, less shared part, so sharing is exact to
within one ``block_unit``; with a KV block size that is a multiple of ``block_unit`` it
is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from replay.engine.requests import RequestError, Requests, offsets_of, segment_arange
from replay.errors import ConfigError, LimitError
from replay.params import check

#: The most content ids one workload may hold (8 bytes each, plus the same again while
#: they are built); lengths and ``block_unit`` set the count.
MAX_BLOCK_IDS = 100_000_000
#: The most groups x users (one prefix length each) a shared-prefix workload may declare.
MAX_USERS = 10_000_000


@dataclass(frozen=True)
class Lengths:
    """A length distribution in a generator's config (a plain record, not built by Hydra).

    ``{low, high}``: whole numbers uniform on ``low..high``;
    ``{distribution: lognormal, median, sigma, low, high}``: ``ceil(X)`` for
    ``X ~ LogNormal(ln median, sigma)``, clipped to ``[low, high]``.
    """

    low: int = field(metadata=check(ge=0))
    high: int = field(metadata=check(ge=0))
    distribution: Literal["uniform", "lognormal"] = "uniform"
    median: float | None = field(default=None, metadata=check(gt=0))
    sigma: float | None = field(default=None, metadata=check(gt=0))

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.distribution == "uniform":
            return rng.integers(self.low, self.high + 1, size=size, dtype=np.int64)
        x = np.ceil(rng.lognormal(np.log(self.median), self.sigma, size=size))
        return np.clip(x, self.low, self.high).astype(np.int64)


def lengths(value, key: str, low: int = 0) -> Lengths:
    """``value`` (a config mapping or a :class:`Lengths`) as a checked :class:`Lengths`;
    ``key`` names it in errors, ``low`` is the smallest length it may produce."""
    if not isinstance(value, Lengths):
        try:
            value = Lengths(**dict(value))
        except TypeError as exc:
            raise ConfigError(f"{key}: {exc}; give {{low, high}} or {{distribution: lognormal, "
                              f"median, sigma, low, high}}") from exc
    if not low <= value.low <= value.high:
        raise ConfigError(f"{key}: need {low} <= low <= high, got low={value.low}, "
                          f"high={value.high}")
    if value.distribution not in ("uniform", "lognormal"):
        raise ConfigError(f"{key}.distribution must be uniform or lognormal, got "
                          f"{value.distribution!r}")
    if value.distribution == "lognormal" and not (value.median and value.sigma):
        raise ConfigError(f"{key}: a lognormal needs median > 0 and sigma > 0")
    return value


def _set_lengths(component, minimum: Mapping[str, int]) -> None:
    """Convert a frozen component's length fields to checked :class:`Lengths`."""
    for name, low in minimum.items():
        object.__setattr__(component, name, lengths(getattr(component, name),
                                                    f"workload.{name}", low))


def zipf_weights(count: int, exponent: float) -> np.ndarray:
    """Popularity of ranks ``1..count`` proportional to ``rank ** -exponent`` (0: uniform)."""
    weights = np.arange(1, count + 1, dtype=np.float64) ** -float(exponent)
    return weights / weights.sum()


def _guard_ids(prompt_len: np.ndarray, unit: int, keys: str) -> np.ndarray:
    """``ceil(prompt_len / unit)`` per request, refused before allocation when the total is
    beyond :data:`MAX_BLOCK_IDS`."""
    counts = -(-prompt_len // unit)
    total = int(counts.sum())
    if total > MAX_BLOCK_IDS:
        raise LimitError(f"this workload would hold {total:,} content ids (limit "
                         f"{MAX_BLOCK_IDS:,}); it follows from {keys} and workload.block_unit: "
                         f"raise block_unit or lower them")
    return counts


def layered_ids(prompt_len: np.ndarray, bounds: list[np.ndarray], bases: list[np.ndarray],
                unit: int) -> tuple[np.ndarray, np.ndarray]:
    """Content ids of prompts made of nested shared parts.

    Block ``j`` of request ``i`` (tokens ``[j * unit, min((j + 1) * unit, prompt_len))``)
    takes the id ``bases[k][i] + j`` of the first layer ``k`` whose part it lies within
    (its end ``<= bounds[k][i]``), or a fresh id of its own beyond every layer. Layers
    are ordered from the most shared (e.g. a group's system prompt) to the least; each
    layer's bases must leave room for its blocks. Returns ``(ids, offsets)``.
    """
    counts = -(-prompt_len // unit)
    request = np.repeat(np.arange(prompt_len.size), counts)
    j = segment_arange(counts)
    end = np.minimum((j + 1) * unit, prompt_len[request])
    ids = np.full(j.size, -1, dtype=np.int64)
    for bound, base in zip(bounds, bases, strict=True):
        inside = (ids < 0) & (end <= bound[request])
        ids[inside] = base[request[inside]] + j[inside]
    fresh = ids < 0
    top = max((int(b.max(initial=0)) + int(counts.max(initial=0)) for b in bases), default=0)
    ids[fresh] = top + np.arange(int(fresh.sum()), dtype=np.int64)
    return ids, offsets_of(counts)


@dataclass(frozen=True)
class SharedPrefix:
    """Requests sharing prefixes: a system prompt per group, a prefix per user, a suffix each.

    Each of ``groups`` groups has a system prompt (length drawn once per group from
    ``system_prompt_len``) and ``users_per_group`` users, each with a prefix of their own
    (length drawn once per user from ``user_prefix_len``). A request picks a group with
    probability proportional to ``rank ** -group_zipf`` and a user of it by
    ``rank ** -user_zipf`` (0: uniform), and its prompt is that system prompt, that
    user's prefix, then a unique suffix (``suffix_len``, at least 1 token); its output
    length comes from ``output_len``. Every request carries content ids in blocks of
    ``block_unit`` tokens. Arrival times come from the ``arrivals`` group.
    """

    n: int | None = field(default=None, metadata=check(ge=1))
    groups: int = field(default=4, metadata=check(ge=1))
    users_per_group: int = field(default=8, metadata=check(ge=1))
    system_prompt_len: Lengths = Lengths(512, 2048)
    user_prefix_len: Lengths = Lengths(0, 512)
    suffix_len: Lengths = Lengths(16, 256)
    output_len: Lengths = Lengths(16, 512)
    group_zipf: float = field(default=0.0, metadata=check(ge=0))
    user_zipf: float = field(default=0.0, metadata=check(ge=0))
    block_unit: int = field(default=16, metadata=check(ge=1))
    name: str = "shared_prefix"

    def __post_init__(self) -> None:
        _set_lengths(self, {"system_prompt_len": 0, "user_prefix_len": 0, "suffix_len": 1,
                            "output_len": 1})
        if self.groups * self.users_per_group > MAX_USERS:
            raise LimitError(f"workload.groups x workload.users_per_group = "
                             f"{self.groups * self.users_per_group:,} users (limit "
                             f"{MAX_USERS:,}): lower them")

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        n = self.n if n is None else n
        if n is None:
            raise RequestError(f"workload {self.name}: set workload.n (number of requests)")
        users = self.groups * self.users_per_group
        system = self.system_prompt_len.draw(rng, self.groups)
        prefix = self.user_prefix_len.draw(rng, users)
        group = rng.choice(self.groups, size=n, p=zipf_weights(self.groups, self.group_zipf))
        user = group * self.users_per_group + rng.choice(
            self.users_per_group, size=n, p=zipf_weights(self.users_per_group, self.user_zipf))
        suffix = self.suffix_len.draw(rng, n)
        output = self.output_len.draw(rng, n)
        system_end = system[group]
        user_end = system_end + prefix[user]
        prompt = user_end + suffix
        _guard_ids(prompt, self.block_unit, "workload.n and the length distributions")
        # Each group owns ids for its system prompt's blocks, each user for all blocks up
        # to the end of its prefix; the ranges do not overlap.
        group_blocks = -(-system // self.block_unit)
        user_blocks = -(-(system[np.arange(users) // self.users_per_group] + prefix)
                        // self.block_unit)
        group_base = offsets_of(group_blocks)
        user_base = group_base[-1] + offsets_of(user_blocks)
        ids, offsets = layered_ids(prompt, [system_end, user_end],
                                   [group_base[group], user_base[user]], self.block_unit)
        return Requests(prompt_len=prompt, output_len=output, source=f"synthetic:{self.name}",
                        length_unit="tokens", block_ids=ids, block_offsets=offsets,
                        block_unit=self.block_unit)


@dataclass(frozen=True)
class Sessions:
    """Multi-turn sessions: each turn's prompt extends the previous turn's by its answer
    and a new message; later turns are released by the engine (a closed loop).

    ``sessions`` sessions start as a Poisson stream of ``session_rate`` per second (drawn
    here, from the workload's seed: run with ``arrivals=trace``). A session has a number
    of turns from ``turns``; turn ``t``'s prompt is a ``system_prompt_len``-token system
    prompt shared by every session, then every earlier turn's message and answer, then
    its own new message (``message_len``); its answer has ``output_len`` tokens. Turn
    ``t + 1`` arrives ``think_time`` seconds (exponential with mean
    ``think_time_mean_s``) after turn ``t`` completes: its arrival is NaN here and its
    ``predecessor`` names turn ``t``'s row. With ``max_total_len``, a session ends before
    the first turn whose prompt plus answer would exceed it (those turns are counted in
    ``dropped``). Rows are in session order (by start time), turns in order.
    """

    sessions: int = field(default=100, metadata=check(ge=1))
    session_rate: float = field(default=1.0, metadata=check(gt=0))
    turns: Lengths = Lengths(1, 8)
    system_prompt_len: int = field(default=0, metadata=check(ge=0))
    message_len: Lengths = Lengths(16, 256)
    output_len: Lengths = Lengths(16, 512)
    think_time_mean_s: float = field(default=10.0, metadata=check(ge=0))
    max_total_len: int | None = field(default=None, metadata=check(ge=2))
    block_unit: int = field(default=16, metadata=check(ge=1))
    name: str = "sessions"

    #: The first turns' arrival times come from the workload: ``arrivals=trace`` replays them.
    defines_arrivals = True

    def __post_init__(self) -> None:
        _set_lengths(self, {"turns": 1, "message_len": 1, "output_len": 1})

    def expected_requests(self) -> tuple[float, str]:
        """At most this many turns (checked before anything that size is drawn)."""
        return float(self.sessions) * self.turns.high, "workload.sessions x workload.turns.high"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        if n is not None:
            raise RequestError(f"workload {self.name}: the number of requests follows from "
                               f"sessions and turns; it cannot be set")
        start = np.cumsum(rng.exponential(1.0 / self.session_rate, size=self.sessions))
        turns = self.turns.draw(rng, self.sessions)
        session = np.repeat(np.arange(self.sessions, dtype=np.int64), turns)
        turn = segment_arange(turns)
        message = self.message_len.draw(rng, session.size)
        output = self.output_len.draw(rng, session.size)
        think = np.where(turn > 0, rng.exponential(self.think_time_mean_s, session.size), 0.0)
        # Turn t's prompt: system + messages 0..t + answers 0..t-1 of its session.
        grown = np.cumsum(message + output)
        before = np.repeat(grown[offsets_of(turns)[:-1]] - (message + output)[turn == 0], turns)
        prompt = self.system_prompt_len + grown - before - output
        dropped = {}
        keep = np.ones(session.size, dtype=bool)
        if self.max_total_len is not None:
            # prompt + output grows with the turn, so the kept turns are each session's first.
            keep = prompt + output <= self.max_total_len
            if not keep.all():
                dropped[f"total_len>{self.max_total_len}"] = int((~keep).sum())
            if not keep.any():
                raise RequestError(f"workload {self.name}: no turn fits max_total_len = "
                                   f"{self.max_total_len}")
        session, turn, message, output, think, prompt = (
            a[keep] for a in (session, turn, message, output, think, prompt))
        _guard_ids(prompt, self.block_unit, "workload.sessions, turns and the lengths")
        # Every turn's prompt is a prefix of its session's one stream of tokens: block j has
        # the same id in every turn; blocks wholly inside the system prompt are shared by all.
        system_blocks = -(-self.system_prompt_len // self.block_unit)
        stream_blocks = np.zeros(self.sessions, dtype=np.int64)
        np.maximum.at(stream_blocks, session, -(-prompt // self.block_unit))
        stream_base = system_blocks + offsets_of(stream_blocks)[:-1]
        ids, offsets = layered_ids(
            prompt, [np.full(prompt.size, self.system_prompt_len), prompt],
            [np.zeros(prompt.size, dtype=np.int64), stream_base[session]], self.block_unit)
        rows = np.arange(session.size, dtype=np.int64)
        return Requests(
            prompt_len=prompt, output_len=output,
            arrival=np.where(turn == 0, start[session], np.nan),
            source=f"synthetic:{self.name}", length_unit="tokens", dropped=dropped,
            block_ids=ids, block_offsets=offsets, block_unit=self.block_unit,
            session=session, predecessor=np.where(turn > 0, rows - 1, -1), think_time=think,
        )
