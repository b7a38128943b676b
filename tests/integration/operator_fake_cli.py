"""Stand-in for the `infertune` CLI inside pods while `infertune tune` is being written elsewhere.

`serve` runs the real engine (only mapping `builtin://NAME` to `NAME`, until the engine accepts the
contract's URI form). `tune` runs the real tuner when INFERTUNE_REAL_TUNER=1; otherwise a placeholder that reads the mounted spec and writes a compact
summary in the contract's schema to the termination-message path: int4 for long prompts, int8
otherwise, with "measured" figures equal to the spec's traffic. It exercises the operator's side of
the contract (spec ConfigMap, argv, termination message), not tuning itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml


def _expected(dist: dict[str, object]) -> float:
    if dist.get("distribution") == "uniform":
        return (float(dist["min"]) + float(dist["max"])) / 2  # type: ignore[arg-type]
    return float(dist.get("mean", 0))  # type: ignore[arg-type]


def tune(argv: list[str]) -> int:
    spec = yaml.safe_load(Path(argv[0]).read_text())
    study = argv[argv.index("--study-name") + 1]
    out = Path(argv[argv.index("--termination-message") + 1])
    traffic = spec.get("traffic", {})
    prompt = _expected(traffic.get("promptTokens", {"mean": 128}))
    output = _expected(traffic.get("outputTokens", {"mean": 64}))
    rate = float(traffic.get("rate") or traffic.get("concurrency") or 1)
    quant = "int4" if prompt > 256 else "int8"
    bounds = {k: v for k, v in spec["slo"].items() if k in ("ttft", "itl", "e2e")}
    summary = {
        "version": 1, "status": "succeeded", "reason": "", "study": study,
        "trialsCompleted": 3, "trialsTotal": spec.get("budget", {}).get("maxTrials", 3),
        "hardware": "cpu", "gpuProduct": None,
        "best": {
            "engine": "builtin", "quantization": quant, "maxNumSeqs": 4, "maxNumBatchedTokens": 512,
            "kvBlockSize": 16, "cudaGraph": False,
            "measured": {"ttftP95Ms": 40.0, "itlP95Ms": 5.0, "e2eP95Ms": 200.0, "goodputRps": rate,
                         "requestRate": rate, "promptTokensMean": prompt, "outputTokensMean": output},
            "sloMarginsMs": {k: 1.0 for k in bounds},
        },
        "bindingConstraint": None,
        "profile": {"hardware": "cpu", "memoryBandwidthGbps": 20.0, "peakTflops": 0.4,
                    "prefill": {"bound": "compute", "percentOfRoofline": 40.0},
                    "decode": {"bound": "memory", "percentOfRoofline": 55.0}},
    }  # fmt: skip
    if spec["model"]["uri"].startswith("hf://"):
        # The tuner's own rule finds the files the fetch-model init step put in the cache.
        from infertune.tuner.api import ModelSource
        from infertune.tuner.models import resolve_model

        local = resolve_model(ModelSource.model_validate(spec["model"]))
        print(f"model {spec['model']['uri']} at {local}", flush=True)
        if not (local / "config.json").is_file():
            print(f"RuntimeError: no config.json in {local}", file=sys.stderr)
            return 3
    if "fail" in spec["model"].get("name", ""):
        print("RuntimeError: placeholder tuner asked to fail", file=sys.stderr)
        return 3
    out.write_text(json.dumps(summary))
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "tune" and os.environ.get("INFERTUNE_REAL_TUNER") != "1":
        return tune(args[1:])
    from infertune.cli import main as cli_main

    return cli_main([a.removeprefix("builtin://") for a in args])


if __name__ == "__main__":
    sys.exit(main())
