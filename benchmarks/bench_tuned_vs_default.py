"""Tuned vs default: the demo winner's goodput / the built-in engine's default configuration's.

    flock /tmp/infertune-measure.lock .venv/bin/python benchmarks/bench_tuned_vs_default.py \
        [--result reports/demo/result.json] [--reps 3]

The winner is read from the study's result.json (`make demo-tune` writes reports/demo/result.json).
The default is what `infertune serve` runs without tuning flags (read from its argument parser, so
it follows the engine). Both serve the demo workload (examples/demo.yaml: its traffic and SLOs) in
the same run, alternating (tuned, default, default, tuned, ...) so that drift on this shared machine
hits both alike, each from a fresh engine, with the whole load run (no early stop on a missed SLO,
so the two goodputs cover the same requests). Goodput counts the requests that met every bound,
per second; the ratio is of the medians over repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from infertune.engine.cli import build_serve_parser
from infertune.tuner.api.load import load_tuning_spec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.trial import Measurement, TrialRunner
from infertune.tuner.tune import resolve_model

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "reports/demo/result.json"
REPS = int(os.environ.get("INFERTUNE_BENCH_REPS", "3"))


def default_config() -> Candidate:
    """`infertune serve --model M` with no other flag."""
    args = build_serve_parser().parse_args(["--model", "tiny"])
    return Candidate(
        "builtin",
        args.quantization,
        args.max_num_seqs,
        args.max_num_batched_tokens,
        args.kv_block_size,
        bool(args.cuda_graph),
    )


def winner_of(path: Path) -> tuple[Candidate, str] | None:
    """The study's best configuration and the study's status (an infeasible study's "best" is
    its closest configuration: it is still compared, and labelled so)."""
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    if result.get("status") not in ("succeeded", "infeasible") or not result.get("best"):
        return None
    return Candidate.from_dict(result["best"]["config"]), str(result["status"])


def _line(name: str, m: Measurement) -> str:
    f = m.figures
    slo = "met" if m.meets_slo else f"missed ({m.reason or 'percentile over its bound'})"
    return (
        f"  {name:8s} {m.config.label():42s} goodput {m.goodput:5.2f} req/s  "
        f"ttft p95 {f.get('ttftP95Ms', 0):6.0f}ms  itl p95 {f.get('itlP95Ms', 0):6.1f}ms  SLO {slo}"
    )


def measure(result: Path = RESULT, reps: int = REPS) -> dict[str, Any] | None:
    found = winner_of(result)
    if found is None:
        return None
    winner, status = found
    default = default_config()
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    runner = TrialRunner(
        spec,
        resolve_model(spec.model),
        Path(tempfile.mkdtemp(prefix="infertune-bench-")),
        discover(),
        stop_on_violation=False,
    )
    runs: dict[str, list[Measurement]] = {"tuned": [], "default": []}
    try:
        for i in range(reps):
            order = (("tuned", winner), ("default", default))
            for name, cfg in order if i % 2 == 0 else order[::-1]:
                m = runner.run(cfg)
                runner.close()  # each run starts its own engine: same cold state for both
                runs[name].append(m)
                print(_line(name, m), flush=True)
    finally:
        runner.close()
    goodput = {k: [m.goodput if m.status == "ok" else 0.0 for m in v] for k, v in runs.items()}
    tuned, base = statistics.median(goodput["tuned"]), statistics.median(goodput["default"])
    return {
        "winner": winner,
        "study_status": status,
        "default": default,
        "goodput": goodput,
        "slo_met": {k: [m.meets_slo for m in v] for k, v in runs.items()},
        "ratio": tuned / base if base > 0 else float("inf"),
        "tuned": tuned,
        "base": base,
    }


def run() -> list[dict[str, Any]]:
    got = measure()
    if got is None:
        return [
            {
                "name": "tuned vs default",
                "value": "-",
                "unit": "",
                "note": f"no study result at {RESULT.relative_to(ROOT)}: run `make demo-tune`",
            }
        ]
    met = {k: sum(v) for k, v in got["slo_met"].items()}
    return [
        {
            "name": "tuned / default goodput (demo workload)",
            "value": got["ratio"],
            "unit": "x",
            "note": (
                ""
                if got["study_status"] == "succeeded"
                else "NO WINNER (study infeasible; its closest configuration) "
            )
            + f"tuned {got['winner'].label()} {got['tuned']:.2f} req/s (SLO met "
            f"{met['tuned']}/{len(got['slo_met']['tuned'])}) vs default "
            f"{got['default'].label()} {got['base']:.2f} req/s (SLO met "
            f"{met['default']}/{len(got['slo_met']['default'])}); medians of "
            f"{len(got['goodput']['tuned'])} alternating runs; target >= 1.5x",
        }
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", type=Path, default=RESULT)
    p.add_argument("--reps", type=int, default=REPS)
    args = p.parse_args()
    got = measure(args.result, args.reps)
    if got is None:
        print(f"no study result at {args.result}: run `make demo-tune` first", file=sys.stderr)
        return 2
    for name, median in (("tuned", got["tuned"]), ("default", got["base"])):
        runs = ", ".join(f"{g:.2f}" for g in got["goodput"][name])
        print(f"{name:8s} goodput per run: {runs} req/s (median {median:.2f})")
    if got["study_status"] != "succeeded":
        print("the study found no configuration meeting the SLOs: 'tuned' is its closest one")
    print(f"tuned / default goodput: {got['ratio']:.2f}x (target >= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
