"""Record a search landscape: every configuration of a grid, measured once with the built-in engine.

    .venv/bin/python scripts/record_landscape.py [--out benchmarks/data/landscape_tiny_cpu.json]

The tiny model, the built-in engine on this machine, one fixed load (below). Each point is a real
trial (engine start, warm-up, load test); points already in the output file are kept, so an
interrupted recording continues where it stopped. A few points are measured a second time to
estimate the measurement noise that `benchmarks/bench_search.py` replays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from itertools import product
from pathlib import Path

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.trial import TrialRunner

GRID = {
    "quantization": ["fp32", "bf16", "int8", "int4"],
    "max_num_seqs": [1, 2, 4, 8, 16],
    "max_num_batched_tokens": [64, 128, 256, 512],
    "kv_block_sizes": [16, 64],
}
SPEC = {
    "model": {"uri": "builtin://tiny", "name": "tiny"},
    "slo": {
        "ttft": {"max": "1s", "percentile": "p95"},
        "itl": {"max": "150ms", "percentile": "p95"},
    },
    "traffic": {
        "arrival": "poisson",
        "rate": 4,
        "promptTokens": {"distribution": "uniform", "min": 32, "max": 96},
        "outputTokens": {"distribution": "fixed", "mean": 16},
        "numRequests": 24,
        "warmupRequests": 2,
    },
    "budget": {"trialTimeout": "3m"},
}
NOISE_REPEATS = 8


def grid() -> list[Candidate]:
    return [Candidate("builtin", q, s, t, b, False) for q, s, t, b in product(*GRID.values())]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/data/landscape_tiny_cpu.json"))
    p.add_argument("--limit", type=int, help="record at most this many new points, then stop")
    args = p.parse_args()
    spec = TuningSpec.model_validate(SPEC)
    hardware = discover(use_gpu=False)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data.update(
        {
            "spec": SPEC,
            "grid": GRID,
            "hardware": hardware.describe(),
            "command": "python scripts/record_landscape.py --out " + str(args.out),
        }
    )
    points: dict[str, dict[str, object]] = data.setdefault("points", {})
    repeats: dict[str, dict[str, object]] = data.setdefault("repeats", {})
    runner = TrialRunner(
        spec, ensure_model("tiny"), Path(tempfile.mkdtemp(prefix="infertune-landscape-")), hardware
    )
    todo = [c for c in grid() if c.config_hash not in points]
    todo += [
        c for c in grid()[:: max(1, len(grid()) // NOISE_REPEATS)] if c.config_hash not in repeats
    ]
    recorded = 0
    try:
        for c in todo:
            if args.limit is not None and recorded >= args.limit:
                break
            start = time.monotonic()
            m = runner.run(c)
            runner.close()  # every grid point starts its own engine, as a trial would
            target = points if c.config_hash not in points else repeats
            target[c.config_hash] = m.to_dict()
            recorded += 1
            print(
                f"{len(points)}/{len(grid())} {c.label()}: {m.status} goodput "
                f"{m.goodput:.2f} ({time.monotonic() - start:.0f}s)",
                flush=True,
            )
            data["noise_cv"] = noise_cv(points, repeats)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(data, indent=1))
    finally:
        runner.close()
    return 0


def noise_cv(points: dict[str, dict[str, object]], repeats: dict[str, dict[str, object]]) -> float:
    """Median relative difference of goodput between a point's two measurements."""
    diffs = []
    for key, again in repeats.items():
        first = points.get(key)
        if not first:
            continue
        a = float(first["figures"].get("goodputRps", 0.0))  # type: ignore[union-attr]
        b = float(again["figures"].get("goodputRps", 0.0))  # type: ignore[union-attr]
        if a + b > 0:
            diffs.append(abs(a - b) / ((a + b) / 2))
    return statistics.median(diffs) / 2**0.5 if diffs else 0.1


if __name__ == "__main__":
    raise SystemExit(main())
