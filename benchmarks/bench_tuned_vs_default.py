"""Tuned vs default on the demo workload: the study's winner against the built-in engine's defaults.

    flock /tmp/infertune-measure.lock .venv/bin/python benchmarks/bench_tuned_vs_default.py \
        [--result reports/demo/result.json] [--reps 3] [--capacity]

The winner is read from the study's result.json (`make demo-tune` writes reports/demo/result.json).
The default is what `infertune serve` runs without tuning flags (read from its argument parser, so
it follows the engine). Two figures, both side by side in one run, each run from a fresh engine:

* SLO capacity (the target, >= 1.5x): the highest Poisson arrival rate at which the configuration
  meets every SLO at its percentile on the demo's request shapes -- DistServe's goodput. Found by
  bracketing from the demo's rate and bisecting.
* Goodput at the demo's rate, per request (vLLM bench's `--goodput` convention: a request counts
  when its TTFT and its mean token gap are within the bounds), alternating tuned and default
  (tuned, default, default, tuned, ...) so that drift on this shared machine hits both alike. A
  configuration can miss the p95 ITL bound while most of its requests' mean gaps are fine, so this
  figure alone does not show what the SLO percentile costs.
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
from infertune.tuner.api import TuningSpec
from infertune.tuner.api.load import load_tuning_spec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.models import resolve_model
from infertune.tuner.trial import Measurement, TrialRunner

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


# Probes of the SLO capacity search: requests per probe cover ~PROBE_S seconds of arrivals.
PROBE_S = 10.0
MIN_PROBE_REQUESTS = 12
MIN_RATE = 0.25


def slo_capacity(cfg: Candidate, spec: TuningSpec, workdir: Path) -> tuple[float, list[str]]:
    """The highest Poisson arrival rate (req/s) at which `cfg` meets every SLO at its percentile,
    on the spec's request shapes: DistServe's goodput. Doubling or halving from the spec's rate
    brackets it, then three bisections; every probe starts a fresh engine. Returns the rate and
    one line per probe."""
    model_dir, hardware = resolve_model(spec.model), discover()
    lines: list[str] = []

    def meets(rate: float) -> bool:
        n = max(MIN_PROBE_REQUESTS, round(rate * PROBE_S))
        traffic = spec.traffic.model_copy(
            update={"rate": rate, "num_requests": n, "concurrency": None}
        )
        runner = TrialRunner(
            spec.model_copy(update={"traffic": traffic}), model_dir, workdir, hardware
        )
        try:
            m = runner.run(cfg)
        finally:
            runner.close()
        ok = m.status == "ok" and m.meets_slo
        f = m.figures
        lines.append(
            f"    {rate:6.2f} req/s x{n:3d}: {'meets' if ok else 'misses'} the SLOs "
            f"(ttft p95 {f.get('ttftP95Ms', 0):.0f}ms, itl p95 {f.get('itlP95Ms', 0):.1f}ms)"
        )
        print(lines[-1], flush=True)
        return ok

    rate = float(spec.traffic.rate or 1.0)
    lo, hi = 0.0, 0.0
    if meets(rate):
        lo, hi = rate, rate * 2
        while hi <= rate * 16 and meets(hi):
            lo, hi = hi, hi * 2
    else:
        hi = rate
        rate /= 2
        while rate >= MIN_RATE:
            if meets(rate):
                lo = rate
                break
            hi, rate = rate, rate / 2
        if lo == 0.0:
            return 0.0, lines
    for _ in range(3):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo, lines


def capacity(result: Path = RESULT) -> dict[str, Any] | None:
    found = winner_of(result)
    if found is None:
        return None
    winner, _ = found
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    work = Path(tempfile.mkdtemp(prefix="infertune-capacity-"))
    out: dict[str, Any] = {"winner": winner, "default": default_config()}
    for name in ("tuned", "default"):
        cfg = winner if name == "tuned" else out["default"]
        print(f"  SLO capacity of {name} {cfg.label()}:", flush=True)
        out[name], out[f"{name}_probes"] = slo_capacity(cfg, spec, work)
    out["ratio"] = out["tuned"] / out["default"] if out["default"] > 0 else float("inf")
    return out


def run() -> list[dict[str, Any]]:
    rows = _goodput_rows()
    cap = capacity()
    if cap is not None:
        rows.append(
            {
                "name": "tuned / default SLO capacity (demo workload)",
                "value": cap["ratio"],
                "unit": "x",
                "note": f"highest arrival rate meeting every SLO percentile: tuned "
                f"{cap['winner'].label()} {cap['tuned']:.2f} req/s vs default "
                f"{cap['default'].label()} {cap['default']:.2f} req/s; target >= 1.5x",
            }
        )
    return rows


def _goodput_rows() -> list[dict[str, Any]]:
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
            "name": "tuned / default goodput at the demo rate (per request)",
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
            f"{len(got['goodput']['tuned'])} alternating runs; a request counts when its TTFT and "
            "its mean token gap are within the bounds, so it does not see a p95 ITL miss",
        }
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", type=Path, default=RESULT)
    p.add_argument("--reps", type=int, default=REPS)
    p.add_argument(
        "--capacity",
        action="store_true",
        help="also search each configuration's SLO capacity (a few minutes)",
    )
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
    print(f"tuned / default goodput at the demo rate: {got['ratio']:.2f}x")
    if args.capacity:
        cap = capacity(args.result)
        assert cap is not None
        print(
            f"SLO capacity (highest rate meeting every SLO percentile): tuned {cap['tuned']:.2f} "
            f"req/s, default {cap['default']:.2f} req/s: {cap['ratio']:.2f}x (target >= 1.5x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
