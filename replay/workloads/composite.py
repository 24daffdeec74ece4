"""Workloads built from others: a shuffled mix of several workloads, and an
explicit list of request groups for hand-checkable instances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from replay.engine.requests import RequestError, Requests
from replay.errors import ConfigError
from replay.params import check


def concatenate(parts: Mapping[str, Requests], source: str) -> Requests:
    """One request table holding ``parts`` in order; provenance is kept per part.

    Drop counts are prefixed with the part's name; the length unit is shared or,
    when the parts differ, spelled out per part (e.g. ``lmsys:words,arxiv:tokens``).
    """
    items = list(parts.items())
    units = {r.length_unit for _, r in items}
    arrivals = [r.arrival for _, r in items]
    return Requests(
        prompt_len=np.concatenate([r.prompt_len for _, r in items]),
        output_len=np.concatenate([r.output_len for _, r in items]),
        arrival=None if any(a is None for a in arrivals) else np.concatenate(arrivals),
        source=source,
        source_row=np.concatenate([r.source_row if r.source_row is not None
                                   else np.arange(len(r)) for _, r in items]),
        length_unit=units.pop() if len(units) == 1 else ",".join(
            f"{name}:{r.length_unit}" for name, r in items),
        dropped={f"{name}:{reason}": count for name, r in items
                 for reason, count in r.dropped.items()},
        files=tuple(f for _, r in items for f in r.files),
    )


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    names = list(weights)
    w = np.asarray([float(weights[k]) for k in names])
    if (w < 0).any() or w.sum() <= 0:
        raise RequestError(f"workload mixed: ratio weights must be >= 0 with a positive sum, "
                           f"got {dict(weights)}")
    exact = total * w / w.sum()
    counts = np.floor(exact).astype(int)
    shortfall = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:shortfall]] += 1
    return dict(zip(names, counts.tolist(), strict=True))


@dataclass(frozen=True)
class Mixed:
    """Several workloads shuffled together (docs/reproducing/sorted-f.md C2: 1,600 LMSYS + 400
    arXiv).

    ``parts`` maps a name to a workload. Either ``counts`` (name -> number of
    requests drawn from that part) or ``ratio`` (name -> weight, with ``n`` the
    total, split by largest remainder) fixes the composition. The parts are
    drawn from independent child streams of the seed, concatenated and shuffled;
    with ``counts`` and a smaller ``n``, the first ``n`` of the shuffled pool are
    kept, so a smaller ``n`` is a uniform subsample and a prefix of a larger one.
    Drop counts are those of each part's pool (prefixed ``part:``), not of the sample.
    """

    parts: Mapping[str, object]
    counts: Mapping[str, int] | None = field(default=None, metadata=check(ge=0))
    ratio: Mapping[str, float] | None = field(default=None, metadata=check(ge=0))
    n: int | None = field(default=None, metadata=check(ge=1))
    name: str = "mixed"

    def expected_requests(self) -> tuple[float, str] | None:
        """How many requests a sample holds (``run.guard_requests`` bounds it before any
        part is drawn)."""
        if self.n is not None:
            return float(self.n), "workload.n"
        if self.counts is not None:
            return float(sum(int(c) for c in self.counts.values())), "workload.counts"
        return None

    def part_counts(self, n: int | None) -> dict[str, int]:
        if (self.counts is None) == (self.ratio is None):
            raise RequestError(f"workload {self.name}: give exactly one of counts or ratio")
        weights = self.counts if self.counts is not None else self.ratio
        mismatch = set(weights) ^ set(self.parts)
        if mismatch:
            raise RequestError(f"workload {self.name}: counts/ratio name {sorted(weights)} but "
                               f"the parts are {sorted(self.parts)}")
        if self.counts is not None:
            return {k: int(v) for k, v in self.counts.items()}
        if n is None:
            raise RequestError(f"workload {self.name}: with ratio, set workload.n")
        return apportion(n, self.ratio)

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        n = self.n if n is None else n
        counts = self.part_counts(n)
        total = sum(counts.values())
        if n is not None and n > total:
            raise RequestError(f"workload {self.name}: asked for n={n} but the parts give "
                               f"{total} ({counts})")
        shuffle_rng, *part_rngs = rng.spawn(len(counts) + 1)
        drawn = {k: self.parts[k].sample(r, n=counts[k])
                 for (k, r) in zip(counts, part_rngs, strict=True)}
        pool = concatenate(drawn, source=f"{self.name}({', '.join(counts)})")
        order = shuffle_rng.permutation(total)
        return pool.take(order if n is None else order[:n])


@dataclass(frozen=True)
class RequestGroup:
    """One group of a fixed workload (``workload.groups[i]``): ``count`` requests of the same
    lengths (the schema of a plain record, not built by Hydra)."""

    count: int = field(metadata=check(ge=1))
    prompt_len: int = field(metadata=check(ge=1))
    output_len: int = field(metadata=check(ge=1))


@dataclass(frozen=True)
class FixedGroups:
    """An explicit list of request groups, each ``{count, prompt_len, output_len}``.

    Used for hand-checkable instances such as docs/reproducing/sorted-f.md C3. Requests keep
    the listed order (which decides ties in FCFS).
    """

    groups: Sequence[RequestGroup]
    name: str = "fixed"

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("workload.groups: lists no request group; give at least one "
                              "{count, prompt_len, output_len}")

    def expected_requests(self) -> tuple[float, str]:
        """The number of requests listed (``run.guard_requests`` bounds it before they are
        allocated)."""
        return float(sum(int(g["count"]) for g in self.groups)), "workload.groups[*].count"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        s = np.concatenate([np.full(int(g["count"]), int(g["prompt_len"])) for g in self.groups])
        o = np.concatenate([np.full(int(g["count"]), int(g["output_len"])) for g in self.groups])
        if n is not None and n != len(s):
            raise RequestError(f"workload {self.name}: lists {len(s)} requests, asked for {n}")
        return Requests(prompt_len=s.astype(np.int64), output_len=o.astype(np.int64),
                        source=f"fixed:{self.name}")
