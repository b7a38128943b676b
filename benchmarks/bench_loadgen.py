"""The generator is not the bottleneck: the highest request rate it sustains on one core.

A zero-latency scripted server runs in its own process on its own core; the generator runs here,
pinned to another, both scheduled ahead of other work where allowed. A baseline p50 TTFT is taken at a low rate, then the offered rate is raised
until the p50 TTFT rises by 1 ms or more over that baseline (or requests fail, or the rate is not
achieved). Short streamed responses (8-token prompt, 4 output tokens) make this a test of the
generator's per-request cost. Run with the default asyncio loop and with uvloop, side by side.

    .venv/bin/python benchmarks/bench_loadgen.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any

from infertune.testing.scripted_server import boosted_priority, start_process, stop_process
from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen import LoadResult, run_load

TARGET_RATE = 1000.0
ADDED_TTFT_LIMIT_MS = 1.0
RATES = (250.0, 500.0, 1000.0, 2000.0, 3000.0, 4000.0, 6000.0, 8000.0, 12000.0)
STEP_SECONDS = 3.0


def _traffic(rate: float, seconds: float) -> TrafficProfile:
    return TrafficProfile.model_validate(
        {
            "rate": rate,
            "arrival": "poisson",
            "duration": f"{seconds}s",
            "warmupRequests": 50,
            "promptTokens": {"mean": 8},
            "outputTokens": {"mean": 4},
        }
    )


def _measure(url: str, rate: float, seconds: float, factory: Any) -> LoadResult:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(run_load(url, _traffic(rate, seconds), model="scripted"))


def _sustained(res: LoadResult, baseline_ms: float) -> tuple[bool, str]:
    p50 = res.ttft.p50 or float("inf")
    sat = res.saturation
    if res.failed:
        return False, f"{res.failed} failed"
    if p50 - baseline_ms >= ADDED_TTFT_LIMIT_MS:
        return False, f"p50 TTFT {p50 - baseline_ms:+.2f} ms"
    if sat.saturated:
        return False, "; ".join(sat.reasons)
    return True, f"p50 TTFT {p50 - baseline_ms:+.2f} ms"


def search(url: str, factory: Any, label: str, log: Callable[[str], None]) -> list[dict[str, Any]]:
    base = _measure(url, 50.0, 2.0, factory)
    baseline = base.ttft.p50 or 0.0
    log(f"[{label}] baseline p50 TTFT at 50 req/s: {baseline:.3f} ms")
    best, best_note, best_cpu = 0.0, "none sustained", 0.0
    for rate in RATES:
        before = time.process_time()  # this process only: the server's CPU is not counted
        res = _measure(url, rate, STEP_SECONDS, factory)
        cpu_us = (time.process_time() - before) / max(1, res.sent) * 1e6
        ok, why = _sustained(res, baseline)
        log(f"[{label}] {rate:6.0f} req/s: {'ok ' if ok else 'NO '} {why}; {cpu_us:.0f} us CPU/req")
        if not ok:
            break
        best, best_note, best_cpu = rate, why, cpu_us
    return [
        {
            "name": f"loadgen.baseline_ttft_p50[{label}]",
            "value": round(baseline, 3),
            "unit": "ms",
            "note": "zero-latency server at 50 req/s (loopback + server + client)",
        },
        {
            "name": f"loadgen.max_rate_1core[{label}]",
            "value": best,
            "unit": "req/s",
            "note": f"added p50 TTFT < {ADDED_TTFT_LIMIT_MS} ms ({best_note}); target >= "
            f"{TARGET_RATE:.0f}; highest step tried {RATES[-1]:.0f}",
        },
        {
            "name": f"loadgen.max_rate_vs_target[{label}]",
            "value": round(best / TARGET_RATE, 2),
            "unit": "x",
            "note": "ratio to the 1,000 req/s target",
        },
        {
            "name": f"loadgen.cpu_per_request[{label}]",
            "value": round(best_cpu, 1),
            "unit": "us",
            "note": "generator CPU per request at that rate (warm-up and setup included)",
        },
    ]


def run(log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[-1] if len(cpus) > 1 else None
    proc, port = start_process([0.0], [0.0], cpu=server_cpu, boost=True)
    mine = os.sched_getaffinity(0)
    try:
        # The generator gets exactly one core, not the server's.
        os.sched_setaffinity(0, {cpus[0]})
        url = f"http://127.0.0.1:{port}"
        # Ahead of ordinary work (real-time where allowed, like the server): the machine is shared,
        # and this measures the generator, not the neighbours.
        with boosted_priority():
            rows = search(url, None, "asyncio", log)
            if _has_uvloop():
                import uvloop

                rows += search(url, uvloop.new_event_loop, "uvloop", log)
        return rows
    finally:
        os.sched_setaffinity(0, mine)
        stop_process(proc)


def _has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<40} {row['value']:>10} {row['unit']:<6} {row['note']}")
