"""Tuned vs default on the demo workload: the study's winner against the built-in engine's defaults.

    flock /tmp/infertune-measure.lock .venv/bin/python benchmarks/bench_tuned_vs_default.py \
        [--result reports/demo/result.json] [--reps 3] [--capacity]

The winner is read from the study's result.json (`make demo-tune` writes reports/demo/result.json).
The default is what `infertune serve` runs without tuning flags (read from its argument parser, so
it follows the engine). Two figures, both side by side in one run, each run from a fresh engine:

* SLO capacity (the target, >= 2.0x): the highest Poisson arrival rate at which the configuration
  meets every SLO at its percentile on the demo's request shapes -- DistServe's goodput, the
  study's objective. Found by the tuner's own ramp (capacity.py) from a quarter of the demo's
  rate, three times per configuration alternating; the ratio has a 90% interval
  (racing.ratio_interval).
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
import time
from pathlib import Path
from typing import Any

from infertune.tuner.api import TuningSpec
from infertune.tuner.api.durations import Duration
from infertune.tuner.api.load import load_tuning_spec
from infertune.tuner.campaign import engine_default
from infertune.tuner.candidate import Candidate
from infertune.tuner.capacity import probe_requests
from infertune.tuner.hardware import discover
from infertune.tuner.models import resolve_model
from infertune.tuner.racing import LEVEL, ratio_interval
from infertune.tuner.space import build_space
from infertune.tuner.trial import Measurement, TrialRunner

ROOT = Path(__file__).resolve().parents[1]
# The study whose winner is compared (INFERTUNE_BENCH_RESULT: another run's result.json).
RESULT = Path(os.environ.get("INFERTUNE_BENCH_RESULT", ROOT / "reports/demo/result.json"))
REPS = int(os.environ.get("INFERTUNE_BENCH_REPS", "3"))


def default_config() -> Candidate:
    """`infertune serve --model M` with no other flag ("auto" precision resolved by the engine's
    own rule on this host, as the tuner's race does: campaign.engine_default)."""
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    found = engine_default(build_space(spec, discover()))
    assert found is not None, "the demo searches the built-in engine"
    return found


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


# The SLO capacity of each configuration, measured CAPACITY_REPS times, alternating (tuned,
# default, default, tuned, ...), each time with the tuner's own ramp (capacity.py through
# TrialRunner.capacity, a fresh engine per search) from a floor well below the demo's rate so a
# configuration that misses the demo's rate still gets its capacity measured.
CAPACITY_REPS = int(os.environ.get("INFERTUNE_BENCH_CAPACITY_REPS", "3"))
FLOOR_SHARE = 0.25  # the ramp starts at a quarter of the demo's rate
CAPACITY_PROBES = 7
CAPACITY_RESOLUTION = 0.08


def slo_capacity(cfg: Candidate, spec: TuningSpec, workdir: Path) -> tuple[float, list[str]]:
    """The highest Poisson arrival rate (req/s) at which `cfg` meets every SLO at its percentile,
    on the spec's request shapes (DistServe's goodput), by the tuner's capacity search from
    FLOOR_SHARE of the spec's rate. Returns the rate (0: even the floor missed) and one line per
    probe."""
    rate = float(spec.traffic.rate or 1.0) * FLOOR_SHARE
    floor_n = probe_requests(rate)
    low = spec.model_copy(
        update={
            "traffic": spec.traffic.model_copy(
                update={"rate": rate, "num_requests": floor_n, "duration": None}
            ),
            # The whole search is one "trial": room for every probe (the demo's is 90 s).
            "budget": spec.budget.model_copy(update={"trial_timeout": Duration("10m")}),
        }
    )
    runner = TrialRunner(low, resolve_model(spec.model), workdir, discover())
    try:
        floor = runner.run(cfg)
        cap = runner.capacity(
            cfg, floor, max_probes=CAPACITY_PROBES, resolution=CAPACITY_RESOLUTION
        )
    finally:
        runner.close()
    lines = [
        f"    {rate:6.2f} req/s x{floor_n:3d}: {'meets' if floor.meets_slo else 'misses'} (floor)"
    ]
    lines += [
        f"    {p.rate:6.2f} req/s x{p.requests:3d}: {'meets' if p.met else 'misses'} {p.note}"
        for p in cap.probes
    ]
    for line in lines:
        print(line, flush=True)
    return (cap.rps if floor.meets_slo else 0.0), lines


def capacity(result: Path = RESULT, reps: int = CAPACITY_REPS) -> dict[str, Any] | None:
    found = winner_of(result)
    if found is None:
        return None
    winner, _ = found
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    work = Path(tempfile.mkdtemp(prefix="infertune-capacity-"))
    out: dict[str, Any] = {"winner": winner, "default": default_config(), "tuned": [], "base": []}
    for i in range(reps):
        order = (("tuned", winner), ("base", out["default"]))
        for name, cfg in order if i % 2 == 0 else order[::-1]:
            print(f"  SLO capacity of {name} {cfg.label()} (run {i + 1}/{reps}):", flush=True)
            rps, _ = slo_capacity(cfg, spec, work)
            out[name].append(rps)
    out["ratio"] = ratio_interval(out["tuned"], out["base"])
    return out


def trial_seconds(reps: int = 2) -> dict[str, list[float]] | None:
    """Seconds per trial of the demo's winner before (the spec's rate only) and after (plus the
    capacity ramp), alternating, each from a fresh engine: what capacity as the objective costs."""
    found = winner_of(RESULT)
    if found is None:
        return None
    spec = load_tuning_spec(ROOT / "examples/demo.yaml")
    runner = TrialRunner(
        spec, resolve_model(spec.model), Path(tempfile.mkdtemp(prefix="infertune-trial-")),
        discover(),
    )  # fmt: skip
    out: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for i in range(reps):
            for ramp in (False, True) if i % 2 == 0 else (True, False):
                t0 = time.monotonic()
                m = runner.run(found[0])
                if ramp and m.meets_slo:
                    runner.capacity(found[0], m)
                runner.close()
                out["after" if ramp else "before"].append(time.monotonic() - t0)
    finally:
        runner.close()
    return out


def run() -> list[dict[str, Any]]:
    rows = _goodput_rows()
    cap = capacity(RESULT)
    if cap is not None:
        r = cap["ratio"]
        interval = (
            f"[{r.low:.2f}, {r.high:.2f}] ({LEVEL:.0%})" if r.low is not None else "(no interval)"
        )
        rows.append(
            {
                "name": "tuned / default SLO capacity (demo workload)",
                "value": r.value,
                "unit": "x",
                "note": f"{interval}; highest arrival rate meeting every SLO percentile, "
                f"{len(cap['tuned'])} alternating searches each: tuned {cap['winner'].label()} "
                + ", ".join(f"{v:.2f}" for v in cap["tuned"])
                + f" req/s vs default {cap['default'].label()} "
                + ", ".join(f"{v:.2f}" for v in cap["base"])
                + " req/s; target >= 2.0x",
            }
        )
    secs = trial_seconds()
    if secs is not None:
        before, after = statistics.median(secs["before"]), statistics.median(secs["after"])
        rows.append(
            {
                "name": "seconds per trial, capacity ramp vs rate only (demo winner)",
                "value": after / before,
                "unit": "x",
                "note": f"median {after:.1f} s with the ramp vs {before:.1f} s at the demo's rate "
                f"only ({len(secs['after'])} alternating runs each)",
            }
        )
    return rows


def _goodput_rows() -> list[dict[str, Any]]:
    got = measure(RESULT)
    if got is None:
        return [
            {
                "name": "tuned vs default",
                "value": "-",
                "unit": "",
                "note": f"no study result at {RESULT}: run `make demo-tune`",
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
        r = cap["ratio"]
        print(
            f"SLO capacity (highest rate meeting every SLO percentile): tuned {cap['tuned']} "
            f"req/s, default {cap['base']} req/s: {r.value:.2f}x, {LEVEL:.0%} interval "
            f"[{r.low}, {r.high}] (target >= 2.0x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
