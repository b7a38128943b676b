"""Tuned vs default: the demo winner's goodput under the SLOs / the built-in engine's defaults'.

Both configurations run the demo workload (examples/demo.yaml) in the same run, alternating, twice
each. The winner is read from reports/demo/result.json (`make demo` writes it).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from infertune.tuner.api.load import load_tuning_spec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.trial import TrialRunner
from infertune.tuner.tune import resolve_model

ROOT = Path(__file__).resolve().parents[1]
# `infertune serve` with no tuning flags: fp32, 32 sequences, 512 tokens per step, 16-token pages.
DEFAULT = Candidate("builtin", "fp32", 32, 512, 16, False)


def run() -> list[dict[str, Any]]:
    result = ROOT / "reports/demo/result.json"
    if not result.exists():
        return [
            {"name": "tuned vs default", "value": "-", "unit": "", "note": "run `make demo` first"}
        ]
    best = json.loads(result.read_text())["best"]
    winner = Candidate.from_dict(best["config"])
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    runner = TrialRunner(
        spec,
        resolve_model(spec.model),
        Path(tempfile.mkdtemp(prefix="infertune-bench-")),
        discover(),
    )
    goodput: dict[str, list[float]] = {"tuned": [], "default": []}
    try:
        for _ in range(2):
            for name, cfg in (("tuned", winner), ("default", DEFAULT)):
                m = runner.run(cfg)
                runner.close()
                goodput[name].append(m.goodput if m.status == "ok" else 0.0)
    finally:
        runner.close()
    tuned, default = statistics.median(goodput["tuned"]), statistics.median(goodput["default"])
    return [
        {
            "name": "tuned / default goodput (demo workload)",
            "value": tuned / default if default > 0 else float("inf"),
            "unit": "x",
            "note": f"tuned {winner.label()} {tuned:.2f} req/s vs default {default:.2f} req/s",
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
