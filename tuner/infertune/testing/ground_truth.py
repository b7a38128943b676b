"""The generator's accuracy check: 100 streams against the scripted server, and the server's own
record of what it did to compare with.

One scenario for the test that asserts the accuracy (tests/unit/loadgen/test_loadgen_accuracy.py)
and the benchmark that shows it under a CPU hog (benchmarks/bench_loadgen_accuracy.py). The script
cycles 5 TTFTs and 3 ITLs; 100 closed-loop streams started together stay in step, so up to 100
token writes fall due at once: the hardest case for both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Iterator

from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen.endpoint import Endpoint, fetch_json

TTFT_MS = [20.0, 40.0, 60.0, 80.0, 100.0]
ITL_MS = [20.0, 30.0, 40.0]
OUTPUT_TOKENS = 16
WARMUP = 100
REQUESTS = 1500  # a multiple of 5 and 3: the measured requests cover the script evenly


def hundred_streams() -> TrafficProfile:
    return TrafficProfile.model_validate(
        {
            "concurrency": 100,
            "numRequests": REQUESTS,
            "warmupRequests": WARMUP,
            "promptTokens": {"mean": 32},
            "outputTokens": {"mean": OUTPUT_TOKENS},
        }
    )


@contextlib.contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """This thread on `cpus` for the block (the generator runs in the calling thread)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def server_log(url: str) -> list[tuple[float, list[float]]]:
    """The scripted server's record: (request arrived, [token write times]) per request, in order."""
    doc = asyncio.run(fetch_json(Endpoint.parse(url), "/scripted/log"))
    return [(float(rcv), [float(t) for t in emits]) for rcv, emits in doc["log"]]


def recorded_latencies(log: list[tuple[float, list[float]]]) -> dict[str, list[float]]:
    """TTFT, ITL and e2e (ms) as the server did them: from arrival to each token's write."""
    return {
        "ttft": [(emits[0] - rcv) * 1e3 for rcv, emits in log],
        "itl": [(b - a) * 1e3 for _, emits in log for a, b in itertools.pairwise(emits)],
        "e2e": [(emits[-1] - rcv) * 1e3 for rcv, emits in log],
    }
