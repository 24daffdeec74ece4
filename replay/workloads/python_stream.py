"""Known request types drawn as one merged stream by Python's ``random``: the generator of
the WAIT authors' Vidur fork (Luoxiaogan/vidur_or,
``vidur/request_generator/custom_prompt_generator.py`` at commit 1fe368d), so that a
replay can serve exactly the requests their simulator served.

Their generator, after Vidur seeds Python's ``random`` with the run's seed, draws each
request in turn: first its type with ``random.choices`` weighted by the types' rates, then
the gap since the previous arrival with ``random.expovariate(total rate)``. A fixed number
of requests is drawn (their ``num_requests``); the first arrives one gap after time 0. The
numbers here are that sequence call for call, so the trace is theirs bit for bit (the same
floating-point arrival times), not merely the same process: with seed 42 and the B1-high
types, the 10,000 requests carry 1,669,600 output tokens, the count every one of their
vLLM runs ends on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from replay.engine.requests import RequestError, Requests
from replay.fluid.model import TypeMix
from replay.params import RequestType, check


@dataclass(frozen=True)
class PythonRandomStream:
    """``n`` requests of the known ``types`` (``[{prompt_len, output_len, rate}, ...]``) as
    one stream drawn by ``random.Random(seed)``: per request ``random.choices`` by rate
    weight, then a ``random.expovariate(sum of rates)`` gap. Type ``j``'s requests carry
    ``type_id = j``. The stream has its own seed (default: the run's ``seed``) and does not
    use the run's numpy streams, so the same seed gives the same requests as the authors'
    generator. Run it with ``arrivals=trace``: the workload sets the arrival times."""

    types: Sequence[RequestType]
    n: int = field(metadata=check(ge=1))
    seed: int = 42
    name: str = "python_stream"

    #: The arrival times come from the workload: ``arrivals=trace`` replays them.
    defines_arrivals = True

    def __post_init__(self) -> None:
        TypeMix.from_types(list(self.types))  # validates every type's fields

    def expected_requests(self) -> tuple[float, str]:
        """How many requests :meth:`sample` draws, and the key that sets it (checked before
        anything that size is allocated)."""
        return float(self.n), "workload.n"

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Requests:
        if n is not None:
            raise RequestError(f"workload {self.name}: the number of requests is workload.n; "
                               f"it cannot be set by the arrivals")
        draw = random.Random(self.seed)
        rates = [float(t["rate"]) for t in self.types]
        total = sum(rates)
        kinds = range(len(rates))
        type_id = np.empty(self.n, dtype=np.int64)
        arrival = np.empty(self.n, dtype=np.float64)
        now = 0.0
        for i in range(self.n):  # the order of the two calls is theirs: type, then gap
            type_id[i] = draw.choices(kinds, weights=rates, k=1)[0]
            now += draw.expovariate(total)
            arrival[i] = now
        prompt = np.array([int(t["prompt_len"]) for t in self.types], dtype=np.int64)
        output = np.array([int(t["output_len"]) for t in self.types], dtype=np.int64)
        return Requests(prompt_len=prompt[type_id], output_len=output[type_id], arrival=arrival,
                        type_id=type_id, source=f"python_stream:{self.name}",
                        length_unit="tokens")
