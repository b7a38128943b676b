"""How far the generator's latencies drift when it shares its core: kernel vs read-time stamps.

The tuning Job runs the generator beside the engine, whose CPU threads compete for the same
cores; `infertune bench` often runs on a busy host. A CPU hog shares the generator's core here
(no priority boost), while a scripted server on the other core emits tokens at known times at
100 concurrent streams and records when it wrote each one (the ground truth, same clock). The
generator's error (its p50/p99 minus the server's record) is measured twice in one run: chunks
timed by the kernel's receive stamp (`--kernel-timestamps`) and by when the generator read them
(the default, as peer tools do).

    .venv/bin/python benchmarks/bench_loadgen_accuracy.py
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from infertune.testing import ground_truth as truth
from infertune.testing.scripted_server import start_process, stop_process
from infertune.tuner.loadgen import LoadResult, run_load_sync
from infertune.tuner.loadgen.runner import Options

MODES = (("kernel stamps", True), ("read-time stamps", False))


@contextlib.contextmanager
def _hog(cpu: int) -> Iterator[None]:
    """A busy loop pinned to `cpu` at ordinary priority, for the block."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _errors(url: str, kernel_stamps: bool) -> dict[str, float]:
    """p50/p99 of measured minus recorded TTFT and ITL (ms) for one run of the scenario."""
    before = len(truth.server_log(url))
    opts = Options(kernel_timestamps=kernel_stamps)
    result: LoadResult = run_load_sync(url, truth.hundred_streams(), model="scripted", options=opts)
    assert result.completed == truth.REQUESTS and result.failed == 0
    recorded = truth.recorded_latencies(truth.server_log(url)[before + truth.WARMUP :])
    out = {}
    for metric in ("ttft", "itl"):
        for pct in ("p50", "p99"):
            measured = getattr(getattr(result, metric), pct)
            out[f"{metric}_{pct}"] = measured - float(
                np.percentile(recorded[metric], float(pct[1:]))
            )
    return out


def run(log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        log("needs two cores (server and generator apart); skipped")
        return []
    proc, port = start_process(truth.TTFT_MS, truth.ITL_MS, cpu=cpus[-1], boost=True)
    url = f"http://127.0.0.1:{port}"
    found: dict[str, dict[str, float]] = {}
    try:
        with truth.pinned({cpus[0]}), _hog(cpus[0]):
            for label, kernel in MODES:
                found[label] = _errors(url, kernel)
                shown = ", ".join(f"{k} {v:+.2f}" for k, v in found[label].items())
                log(f"[{label}] generator error vs the server's record (ms): {shown}")
    finally:
        stop_process(proc)
    rows: list[dict[str, Any]] = []
    for key in ("ttft_p99", "itl_p99", "ttft_p50"):
        for label, _ in MODES:
            rows.append(
                {
                    "name": f"loadgen_accuracy.{key}_error[{label}]",
                    "value": round(found[label][key], 2),
                    "unit": "ms",
                    "note": "measured minus server record; 100 streams, CPU hog on the "
                    "generator's core",
                }
            )
    kernel, read = (abs(found[label]["ttft_p99"]) for label, _ in MODES)
    rows.append(
        {
            "name": "loadgen_accuracy.ttft_p99_error_read_vs_kernel",
            "value": round(read / max(kernel, 0.01), 1),
            "unit": "x",
            "note": "read-time stamps' p99 TTFT error over the kernel stamps' (floor 0.01 ms), "
            "same run",
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<55} {row['value']:>8} {row['unit']:<4} {row['note']}")
