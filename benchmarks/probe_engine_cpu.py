"""Where the CPU goes at concurrency 8: `infertune serve` (with any extra flags) under the
engine benchmark's closed loop, with the CPU each process used over the middle 6 s.

Not a `make bench` module (its name does not start with `bench_`): a probe for questions such
as "does the engine use both cores?" or "what do two decode threads do under HTTP load?".

    .venv/bin/python benchmarks/probe_engine_cpu.py                # the defaults
    .venv/bin/python benchmarks/probe_engine_cpu.py --threads 2    # decode on two threads
    OMP_WAIT_POLICY=ACTIVE .venv/bin/python benchmarks/probe_engine_cpu.py --threads 2
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_engine import engine_server, load  # beside this script, first on sys.path
from infertune.engine.make_model import ensure_model


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(extra: list[str]) -> None:
    model = ensure_model("tiny")
    with engine_server(model, *extra) as (url, _ready):
        core = int(
            subprocess.check_output(["pgrep", "-f", "infertune.engine.core_process"]).split()[0]
        )
        server = int(
            subprocess.check_output(["pgrep", "-f", "infertune.engine.cli serve"]).split()[0]
        )
        pids = (server, core, os.getpid())
        shares: list[float] = []

        def sample() -> None:
            time.sleep(4)  # past the warm-up requests
            before, start = [cpu_seconds(p) for p in pids], time.monotonic()
            time.sleep(6)
            after, span = [cpu_seconds(p) for p in pids], time.monotonic() - start
            shares.extend((b - a) / span for a, b in zip(before, after, strict=True))

        watcher = threading.Thread(target=sample)
        watcher.start()
        result = load(url, 8, model, "tiny", duration="12s")
        watcher.join()
    server_cpu, core_cpu, loadgen_cpu = shares
    print(
        f"{' '.join(extra) or 'defaults'}: c=8 {result.output_throughput:.0f} tok/s, "
        f"ITL p50 {result.itl.p50 or 0:.2f} ms, TTFT p50 {result.ttft.p50 or 0:.1f} ms; cores used: "
        f"server {server_cpu:.2f}, engine core {core_cpu:.2f}, load generator {loadgen_cpu:.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
