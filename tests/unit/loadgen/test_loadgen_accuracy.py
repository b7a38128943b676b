"""Ground truth: a server emitting tokens at scripted delays, measured at 100 concurrent streams.

Measured TTFT/ITL/e2e percentiles must match the server's own record of when it wrote each token
(same monotonic clock) within 2 ms at p50 and 5 ms at p99; that record must follow the script.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from loadgen_helpers import ServerFactory

from infertune.testing.ground_truth import (
    ITL_MS,
    OUTPUT_TOKENS,
    REQUESTS,
    TTFT_MS,
    WARMUP,
    hundred_streams,
    pinned,
    recorded_latencies,
    server_log,
)
from infertune.testing.scripted_server import boosted_priority
from infertune.tuner.loadgen import run_load_sync


def _script(first: int, n: int) -> dict[str, np.ndarray]:
    idx = np.arange(first, first + n)
    ttft = np.array(TTFT_MS)[idx % len(TTFT_MS)]
    itl = np.array(ITL_MS)[idx % len(ITL_MS)]
    return {
        "ttft": ttft,
        "itl": np.repeat(itl, OUTPUT_TOKENS - 1),
        "e2e": ttft + (OUTPUT_TOKENS - 1) * itl,
    }


def test_percentiles_match_the_script_at_100_streams(scripted_server: ServerFactory) -> None:
    # Server and generator each on a core of their own, both ahead of ordinary work. The server's
    # record starts each request at its kernel arrival time: stamped when the busy server got to
    # it, requests looked 4-10 ms slower at p99 to the generator than to the server (CI failed so).
    cores = sorted(os.sched_getaffinity(0))
    server_cpu = cores[-1] if len(cores) > 1 else None
    url = scripted_server(TTFT_MS, ITL_MS, cpu=server_cpu)
    with pinned(set(cores[:-1] or cores)), boosted_priority():
        result = run_load_sync(url, hundred_streams(), model="scripted")
    assert result.completed == REQUESTS and result.failed == 0
    assert result.itl.count == REQUESTS * (OUTPUT_TOKENS - 1)
    assert all(r.output_tokens == OUTPUT_TOKENS for r in result.records)

    script = _script(WARMUP, REQUESTS)
    actual = recorded_latencies(server_log(url)[WARMUP:])
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
