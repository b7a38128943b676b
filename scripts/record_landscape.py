"""Record a search landscape: every configuration of a grid, measured with the built-in engine.

    flock /tmp/infertune-measure.lock .venv/bin/python scripts/record_landscape.py \
        [--out benchmarks/data/landscape_tiny_cpu.json] [--minutes 9] [--workload demo]

Run it again (under the lock each time) until it prints "complete": each invocation records for
at most --minutes and then stops, and points already in the output file are kept, so the recording
proceeds in chunks that leave the shared machine to others in between.

The tiny model, the built-in engine on this machine, one fixed load: the demo workload
(examples/demo.yaml: its SLOs and traffic) with fewer requests per point. Each point is a real trial
(engine start, warm-up, load test) so the landscape says what a study would have measured,
including the study's early stop once a point's SLO is certainly missed (such a point counts 0 in
the replay whatever its goodput, so the rest of its run would not change the benchmark). After the grid, NOISE_REPEATS points spread over it are measured again; their spread is
the noise `benchmarks/bench_search.py` replays. The profile the tuner would take (ceilings and step
model per precision) is recorded once, so the replay can seed the way `infertune tune` does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from typing import Any

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import TuningSpec
from infertune.tuner.api.load import read_documents
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.trial import TrialRunner

ROOT = Path(__file__).resolve().parents[1]
GRID = {
    "quantization": ["fp32", "bf16", "int8", "int4"],
    "max_num_seqs": [2, 4, 8, 16, 32],
    "max_num_batched_tokens": [64, 128, 256, 512],
    "kv_block_sizes": [16, 64],
}
REQUESTS_PER_POINT = 24
NOISE_REPEATS = 16
# Workload shapes (traffic overrides of the demo's): "demo" is the demo's own traffic; "long-prompt"
# is retrieval-like, long prompts and short answers, where prefill chunking and precision dominate
# and the ITL bound rarely binds.
WORKLOADS: dict[str, dict[str, Any]] = {
    "demo": {},
    "long-prompt": {
        "rate": 1.0,
        "promptTokens": {"distribution": "uniform", "min": 512, "max": 1536},
        "outputTokens": {"distribution": "fixed", "mean": 8},
    },
}
# SLO overrides per workload: retrieval-like answers of a few tokens are judged by when they
# start, not by their token gaps, and a prompt of a thousand tokens takes seconds to prefill on two
# shared cores.
SLOS: dict[str, dict[str, Any]] = {
    "long-prompt": {
        "ttft": {"max": "4s", "percentile": "p95"},
        "itl": {"max": "250ms", "percentile": "p95"},
    },
}
# The grid per workload. long-prompt records each point's SLO capacity (a ramp of several load
# tests per point), so its grid is smaller: no bf16 (no native bf16 matmul on these CPUs: every
# point misses), one KV block size (it moved nothing on the demo's landscape), a 1024-token step.
GRIDS: dict[str, dict[str, list[Any]]] = {
    "demo": GRID,
    "long-prompt": {
        "quantization": ["fp32", "int8"],
        "max_num_seqs": [2, 4, 8, 16, 32],
        "max_num_batched_tokens": [64, 256, 512, 1024],
        "kv_block_sizes": [16],
    },
}
# Workloads whose points record SLO capacity (capacity.py) besides the measurement at the rate.
CAPACITY = {"long-prompt"}


def landscape_spec(workload: str = "demo") -> dict[str, Any]:
    """The demo's SLOs and traffic (with the workload's overrides), fewer requests per point."""
    (doc,) = [d for d in read_documents(ROOT / "examples/demo.yaml") if d]
    traffic = {**doc["spec"]["traffic"], **WORKLOADS[workload]}
    traffic["numRequests"] = min(REQUESTS_PER_POINT, traffic.get("numRequests", 10**9))
    return {
        "model": {"uri": "builtin://tiny", "name": "tiny"},
        "slo": {**doc["spec"]["slo"], **SLOS.get(workload, {})},
        "traffic": traffic,
        "budget": {"trialTimeout": "3m"},
    }


def grid(workload: str = "demo") -> list[Candidate]:
    axes = GRIDS[workload].values()
    return [Candidate("builtin", q, s, t, b, False) for q, s, t, b in product(*axes)]


def noise_points(workload: str = "demo") -> list[Candidate]:
    g = grid(workload)
    return g[:: max(1, len(g) // NOISE_REPEATS)][:NOISE_REPEATS]


def record_profile(spec: TuningSpec, hardware: Any) -> dict[str, Any]:
    """The ceilings and per-precision profile `infertune tune` would measure before its study."""
    from infertune.tuner.ceilings import load_or_measure
    from infertune.tuner.profiler import profile_model
    from infertune.tuner.roofline import ceiling_dtypes

    ceilings = load_or_measure(hardware, ceiling_dtypes(GRID["quantization"]))
    profile = profile_model(
        ensure_model("tiny"),
        GRID["quantization"],
        ceilings,
        prompt_tokens=max(1, round(spec.traffic.prompt_tokens.expected)),
        batch=min(max(GRID["max_num_seqs"]), 16),
        reference=spec.quality.reference,
    )
    return profile.to_dict()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/data/landscape_tiny_cpu.json"))
    p.add_argument("--minutes", type=float, default=9.0, help="stop starting points after this")
    p.add_argument("--limit", type=int, help="record at most this many new points, then stop")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="demo")
    args = p.parse_args()
    # SIGTERM unwinds through `finally`, which stops the engine of the point being measured.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    started = time.monotonic()
    raw_spec = landscape_spec(args.workload)
    spec = TuningSpec.model_validate(raw_spec)
    hardware = discover(use_gpu=False)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    the_grid = GRIDS[args.workload]
    if data.get("spec") not in (None, raw_spec) or data.get("grid") not in (None, the_grid):
        raise SystemExit(f"{args.out} was recorded for another spec or grid; move it away first")
    data.update(
        {
            "spec": raw_spec,
            "grid": the_grid,
            "hardware": hardware.describe(),
            "command": "flock /tmp/infertune-measure.lock .venv/bin/python "
            f"scripts/record_landscape.py --out {args.out} --workload {args.workload}  (repeat until it prints 'complete')",
        }
    )
    points: dict[str, dict[str, Any]] = data.setdefault("points", {})
    repeats: dict[str, dict[str, Any]] = data.setdefault("repeats", {})

    def save() -> None:
        data["noise_cv"] = noise_cv(points, repeats)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(args.out)  # an interrupted write never leaves a truncated file

    if "profile" not in data:
        print("profiling the tiny model (ceilings cached per machine)", flush=True)
        data["profile"] = record_profile(spec, hardware)
        save()
    todo = [c for c in grid(args.workload) if c.config_hash not in points]
    todo += [c for c in noise_points(args.workload) if c.config_hash not in repeats]
    runner = TrialRunner(
        spec,
        ensure_model("tiny"),
        Path(tempfile.mkdtemp(prefix="infertune-landscape-")),
        hardware,
    )
    recorded = 0
    try:
        for c in todo:
            if args.limit is not None and recorded >= args.limit:
                break
            if time.monotonic() - started > args.minutes * 60:
                break
            t0 = time.monotonic()
            m = runner.run(c)
            cap = runner.capacity(c, m) if args.workload in CAPACITY and m.meets_slo else None
            runner.close()  # every grid point starts its own engine, as a trial would
            target = points if c.config_hash not in points else repeats
            entry = m.to_dict()
            if cap is not None:  # the trial's own ramp (tune.make_evaluator), as a study runs it
                entry["figures"].update(cap.figures())
                entry["capacity"] = cap.to_dict()
            entry["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            entry["loadavg_1m"] = os.getloadavg()[0]  # the shared machine's load at the time
            target[c.config_hash] = entry
            recorded += 1
            print(
                f"{len(points)}/{len(grid(args.workload))} (+{len(repeats)} repeats) {c.label()}: {m.status} "
                f"SLO {'met' if m.meets_slo else 'missed'} goodput {m.goodput:.2f} "
                + (f"capacity {cap.rps:.2f} " if cap is not None else "")
                + f"({time.monotonic() - t0:.0f}s)",
                flush=True,
            )
            save()
    finally:
        runner.close()
    left = len(grid(args.workload)) - len(points) + len(noise_points(args.workload)) - len(repeats)
    print("complete" if left <= 0 else f"{left} measurements left: run again", flush=True)
    return 0


def noise_cv(points: dict[str, dict[str, Any]], repeats: dict[str, dict[str, Any]]) -> float:
    """Coefficient of variation of one goodput measurement, from the repeated points.

    For two measurements a, b of the same point, |a - b| / mean / sqrt(2) estimates the CV; the
    median over the repeated points is robust to one outlier.
    """
    diffs = []
    for key, again in repeats.items():
        first = points.get(key)
        if not first:
            continue
        key = "capacityRps" if "capacityRps" in first["figures"] else "goodputRps"
        a = float(first["figures"].get(key, 0.0))
        b = float(again["figures"].get(key, 0.0))
        if a + b > 0:
            diffs.append(abs(a - b) / ((a + b) / 2))
    return statistics.median(diffs) / 2**0.5 if diffs else 0.1


if __name__ == "__main__":
    raise SystemExit(main())
