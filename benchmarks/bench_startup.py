"""Start-to-ready of ``infertune serve`` next to ``import torch`` alone, interleaved in one run.

The tuner starts one engine per trial, so start-up is trial overhead (#6 targets < 3 s for the
tiny model). Most of it is the engine core's ``import torch``, which takes 2-4 s on the CPUs
measured here and drifts with the host's load. So each round times a fresh ``python -c "import
torch"`` and then a full start (spawn to the "ready on" line, ``--log-level info``), and the
table gives the medians and what start-up costs beyond the core's own torch import (read from
the core's log line): the engine's share, which the project can change.

    .venv/bin/python benchmarks/bench_startup.py
    BENCH_ENGINE_QUICK=1 ...   # 2 rounds instead of 5
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_engine import _row, engine_server
from infertune.engine.make_model import ensure_model

ROUNDS = 2 if os.environ.get("BENCH_ENGINE_QUICK") else 5
TORCH_LINE = re.compile(r"torch imported in ([0-9.]+) s")


def import_torch_seconds() -> float:
    """``import torch`` in a fresh interpreter, timed inside it (as the core times its own), so
    neither interpreter start nor torch's slow exit counts."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def serve_start(model: Path) -> tuple[float, float]:
    """(spawn to ready, the core's own import torch) for one ``infertune serve`` start."""
    with (
        tempfile.TemporaryFile("w+") as log,
        engine_server(model, "--log-level", "info", stderr=log) as (_url, ready),
    ):
        log.seek(0)  # the core logs its import before it builds the model, so before ready
        found = TORCH_LINE.search(log.read())
    if found is None:
        raise RuntimeError("the engine core did not log its torch import time")
    return ready, float(found.group(1))


def run() -> list[dict[str, Any]]:
    model = ensure_model("tiny")
    alone, ready, beyond = [], [], []
    for _ in range(ROUNDS):
        alone.append(import_torch_seconds())
        total, torch_s = serve_start(model)
        ready.append(total)
        beyond.append(total - torch_s)
    med = statistics.median
    spread = f"{min(ready):.2f}-{max(ready):.2f} s over {ROUNDS} starts"
    return [
        _row("engine start-to-ready (tiny, fp32)", med(ready), "s", f"target < 3 s; {spread}"),
        _row("import torch alone (fresh interpreter)", med(alone), "s", "the floor on this host"),
        _row(
            "start-to-ready beyond the core's import torch",
            med(beyond),
            "s",
            "the engine's own start-up: spawn, imports, weights, KV cache, warm-up, server",
        ),
        _row("start-to-ready / import torch alone", med(ready) / med(alone), "x"),
    ]


if __name__ == "__main__":
    for r in run():
        print(r)
