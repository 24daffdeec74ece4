"""Typed workloads: known request types with their own Poisson arrivals (the WAIT
paper's setting), and the clustering of a trace's outputs into such types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from replay.engine.requests import RequestError, Requests
from replay.errors import ConfigError
from replay.fluid.model import TypeMix, stability_boundary
from replay.params import RequestType, check


@dataclass(frozen=True)
class Typed:
    """Known request types with their own Poisson arrivals (WAIT experiments, B0-B3).

    ``types`` is ``[{prompt_len, output_len, rate}, ...]`` in this harness's
    convention; type ``j``'s requests carry ``type_id = j``, visible to policies.
    With ``time_unit="seconds"`` each type is a Poisson process of ``rate`` per
    second over ``[0, duration_s)``; with ``"rounds"`` (unit time) each round
    ``1..duration_s`` gets ``Poisson(rate)`` arrivals of each type. The workload
    sets the arrival times itself: run it with ``arrivals=trace``. Requests are
    ordered by arrival, ties by type then draw order.

    ``total_rate`` or ``load`` (optional, not both) rescale every rate, keeping the
    mix: to that total rate, or so that the fluid load ``d1 W + d2 P + d3 D + d4 R``
    (:func:`replay.fluid.model.equilibrium`) equals ``load`` (1 is the stability boundary
    of the linear timing model ``d1 .. d4``).
    """

    types: Sequence[RequestType]
    duration_s: float = field(metadata=check(gt=0))
    time_unit: Literal["seconds", "rounds"] = "seconds"
    total_rate: float | None = field(default=None, metadata=check(gt=0))
    load: float | None = field(default=None, metadata=check(gt=0))
    d1: float | None = field(default=None, metadata=check(ge=0))
    d2: float = field(default=0.0, metadata=check(ge=0))
    d3: float = field(default=0.0, metadata=check(ge=0))
    d4: float = field(default=0.0, metadata=check(ge=0))
    name: str = "typed"

    #: The arrival times come from the workload: ``arrivals=trace`` replays them.
    defines_arrivals = True

    def __post_init__(self) -> None:
        mix = TypeMix.from_types(list(self.types))  # validates every type's fields
        if self.load is not None and self.total_rate is not None:
            raise ConfigError("workload: give total_rate or load, not both")
        scale = 1.0
        if self.total_rate is not None:
            if not self.total_rate > 0:
                raise ConfigError(f"workload.total_rate must be > 0, got {self.total_rate}")
            scale = self.total_rate / float(mix.rate.sum())
        if self.load is not None:
            if not self.load > 0 or not self.d1 or self.d1 <= 0:
                raise ConfigError(f"workload.load must be > 0 and needs d1 > 0, got load="
                                  f"{self.load}, d1={self.d1}")
            scale = self.load * stability_boundary(mix, self.d1, self.d2, self.d3, self.d4)
        if scale != 1.0:
            object.__setattr__(self, "types", [{**dict(t), "rate": float(t["rate"]) * scale}
                                               for t in self.types])
        if not self.duration_s > 0:
            raise ConfigError(f"workload.duration_s must be > 0, got {self.duration_s}")
        if self.time_unit not in ("seconds", "rounds"):
            raise ConfigError(f"workload.time_unit must be seconds or rounds, "
                              f"got {self.time_unit!r}")

    def expected_requests(self) -> tuple[float, str]:
        """How many requests :meth:`sample` draws on average, and the keys that set it (a
        cheap estimate, checked before anything that size is allocated)."""
        total = sum(float(t["rate"]) for t in self.types)
        periods = int(self.duration_s) if self.time_unit == "rounds" else self.duration_s
        rates = ("workload.total_rate" if self.total_rate is not None else
                 "workload.load" if self.load is not None else "workload.types[*].rate")
        return total * periods, f"{rates} x workload.duration_s"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        if n is not None:
            raise RequestError(f"workload {self.name}: the number of requests follows from the "
                               f"rates and duration_s; it cannot be set")
        times, kinds = [], []
        for j, t in enumerate(self.types):
            if self.time_unit == "rounds":
                counts = rng.poisson(float(t["rate"]), size=int(self.duration_s))
                arrival = np.repeat(np.arange(1, int(self.duration_s) + 1, dtype=float), counts)
            else:
                count = rng.poisson(float(t["rate"]) * self.duration_s)
                arrival = np.sort(rng.uniform(0.0, self.duration_s, size=count))
            times.append(arrival)
            kinds.append(np.full(arrival.size, j, dtype=np.int64))
        arrival, type_id = np.concatenate(times), np.concatenate(kinds)
        order = np.lexsort((np.arange(arrival.size), type_id, arrival))
        s = np.array([int(t["prompt_len"]) for t in self.types], dtype=np.int64)
        o = np.array([int(t["output_len"]) for t in self.types], dtype=np.int64)
        type_id = type_id[order]
        return Requests(prompt_len=s[type_id], output_len=o[type_id], arrival=arrival[order],
                        type_id=type_id, source=f"typed:{self.name}",
                        length_unit="tokens")


def output_length_types(requests: Requests, width: int, max_len: int) -> pd.DataFrame:
    """Cluster a trace's outputs into types by length bin (docs/reproducing/wait.md B3).

    Bin ``k`` holds outputs in ``((k - 1) * width, k * width]``; its type has output
    ``k * width``, the bin's mean prompt, and a rate share proportional to its
    count. Outputs above ``max_len`` are counted in the ``beyond`` row, not binned.
    """
    o, s = requests.output_len, requests.prompt_len
    upper = np.arange(width, max_len + 1, width)
    bins = np.searchsorted(upper, o, side="left")
    rows = []
    for k, edge in enumerate(upper):
        inside = bins == k
        rows.append({"output_len": int(edge), "count": int(inside.sum()),
                     "mean_prompt_len": float(s[inside].mean()) if inside.any() else np.nan})
    table = pd.DataFrame(rows)
    table["share"] = table["count"] / max(int(table["count"].sum()), 1)
    beyond = int((o > upper[-1]).sum()) if upper.size else int(o.size)
    table.attrs["beyond"] = beyond
    return table
