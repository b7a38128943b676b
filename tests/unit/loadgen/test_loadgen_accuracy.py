"""Ground truth: a server emitting tokens at scripted delays, measured at 100 concurrent streams.

Measured TTFT/ITL/e2e percentiles must match the server's own record of when it wrote each token
(same monotonic clock) within 2 ms at p50 and 5 ms at p99; that record must follow the script.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import numpy as np
import pytest
from loadgen_helpers import ServerFactory, server_log

from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen import run_load_sync
from infertune.tuner.loadgen.scripted_server import boosted_priority

TTFT_MS = [20.0, 40.0, 60.0, 80.0, 100.0]
ITL_MS = [20.0, 30.0, 40.0]
OUT = 16
WARMUP = 100
N = 1500  # a multiple of 5 and 3: the measured requests cover the script evenly


def _script(first: int, n: int) -> dict[str, np.ndarray]:
    idx = np.arange(first, first + n)
    ttft = np.array(TTFT_MS)[idx % len(TTFT_MS)]
    itl = np.array(ITL_MS)[idx % len(ITL_MS)]
    return {
        "ttft": ttft,
        "itl": np.repeat(itl, OUT - 1),
        "e2e": ttft + (OUT - 1) * itl,
    }


@contextlib.contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """This thread on `cpus` for the block (the generator runs in the calling thread)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_percentiles_match_the_script_at_100_streams(scripted_server: ServerFactory) -> None:
    # Server and generator each on a core of their own, both ahead of ordinary work. The server's
    # record starts each request at its kernel arrival time: stamped when the busy server got to
    # it, requests looked 4-10 ms slower at p99 to the generator than to the server (CI failed so).
    cores = sorted(os.sched_getaffinity(0))
    server_cpu = cores[-1] if len(cores) > 1 else None
    url = scripted_server(TTFT_MS, ITL_MS, cpu=server_cpu)
    traffic = TrafficProfile.model_validate(
        {
            "concurrency": 100,
            "numRequests": N,
            "warmupRequests": WARMUP,
            "promptTokens": {"mean": 32},
            "outputTokens": {"mean": OUT},
        }
    )
    with pinned(set(cores[:-1] or cores)), boosted_priority():
        result = run_load_sync(url, traffic, model="scripted")
    assert result.completed == N and result.failed == 0
    assert result.itl.count == N * (OUT - 1)
    assert all(r.output_tokens == OUT for r in result.records)

    script = _script(WARMUP, N)
    log = server_log(url)[WARMUP:]
    actual = {
        "ttft": np.array([e[0] - rcv for rcv, e in log]) * 1e3,
        "itl": np.array([b - a for _, e in log for a, b in itertools.pairwise(e)]) * 1e3,
        "e2e": np.array([e[-1] - rcv for rcv, e in log]) * 1e3,
    }
    for metric in ("ttft", "itl", "e2e"):
        measured = getattr(result, metric)
        for pct, tol in (("p50", 2.0), ("p99", 5.0)):
            q = float(pct[1:])
            got = getattr(measured, pct)
            want = float(np.percentile(script[metric], q))
            emitted = float(np.percentile(actual[metric], q))
            # The generator's error: what it measured vs what the server did (its own write times).
            assert got == pytest.approx(emitted, abs=tol), f"{metric} {pct} vs server record"
            # The harness itself: the server kept to its script, so the record above is the
            # script's timing plus a small lateness. 100 streams started together stay in step and
            # up to 100 writes fall due at once, so the server runs ~0.5 ms late at p50 and
            # 1-1.5 ms at p99 here (measured); that is the server's lateness, not the generator's.
            assert emitted == pytest.approx(want, abs=tol), f"{metric} {pct}: server vs script"
    # TPOT = (e2e - TTFT) / (n - 1): with a constant scripted gap it is that gap.
    assert result.tpot.p50 == pytest.approx(30.0, abs=2.0)
