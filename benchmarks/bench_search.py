"""Search efficiency on a recorded landscape (benchmarks/data/landscape_*.json).

Every configuration of a grid was measured once with the built-in engine (scripts/record_landscape.py
re-records it; its header has the command). Each sampler runs the tuner's own study loop against the
recording, with the recorded measurement noise added, for 20 seeds and a budget of 10% of the grid:
"tuner" is what `infertune tune` runs (roofline pruning and seeds from the profile recorded with the
landscape, then TPE with the SLO constraints), "plain-tpe" is Optuna's default TPE, "random" random
search. Reported per sampler: the median over seeds of (true objective of the configuration the
study reports as best) / (grid optimum), where a configuration's true objective is its recorded
goodput when it met every SLO and 0 otherwise. Target for the tuner's sampler: >= 95%.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import optuna

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.planning import SeedPlanner, prune_by_roofline
from infertune.tuner.search import Evaluation, ReportFn, run_study
from infertune.tuner.space import build_space
from infertune.tuner.study import make_sampler, open_study
from infertune.tuner.tune import SEED_COUNT, startup_trials

DATA = Path(__file__).resolve().parent / "data"
SEEDS = 20
BUDGET_SHARE = 0.10


def _spec(raw: dict[str, Any]) -> TuningSpec:
    grid = raw["grid"]
    search = {
        "engines": ["builtin"],
        "quantizations": grid["quantization"],
        "maxNumSeqs": {"values": grid["max_num_seqs"]},
        "maxNumBatchedTokens": {"values": grid["max_num_batched_tokens"]},
        "kvBlockSizes": grid["kv_block_sizes"],
        "cudaGraph": [False],
    }
    return TuningSpec.model_validate({**raw["spec"], "search": search})


def _true_value(point: dict[str, Any]) -> float:
    ok = point["status"] == "ok" and all(point["slo_met"].values())
    return float(point["figures"].get("goodputRps", 0.0)) if ok else 0.0


def recorded_grid(raw: dict[str, Any]) -> dict[str, Any]:
    """The landscape restricted to the largest fully recorded sub-grid.

    The recording runs in chunks, quantization by quantization; until it is complete the replay
    uses the quantizations whose every point is recorded (a sampler must never propose a point
    that has no measurement), and says so.
    """
    grid = dict(raw["grid"])
    have = {
        (p["config"]["quantization"], p["config"]["max_num_seqs"],
         p["config"]["max_num_batched_tokens"], p["config"]["kv_block_size"])
        for p in raw["points"].values()
    }  # fmt: skip
    grid["quantization"] = [
        q
        for q in grid["quantization"]
        if all(
            (q, s, t, b) in have
            for s in grid["max_num_seqs"]
            for t in grid["max_num_batched_tokens"]
            for b in grid["kv_block_sizes"]
        )
    ]
    keep = {
        k: p
        for k, p in raw["points"].items()
        if p["config"]["quantization"] in grid["quantization"]
    }
    return {**raw, "grid": grid, "points": keep}


def grid_size(grid: dict[str, list[Any]]) -> int:
    n = 1
    for values in grid.values():
        n *= len(values)
    return n


def replay(path: Path, sampler: str, seed: int) -> float:
    raw = recorded_grid(json.loads(path.read_text()))
    spec = _spec(raw)
    points = {Candidate.from_dict(p["config"]): p for p in raw["points"].values()}
    optimum = max(_true_value(p) for p in points.values())
    cpu = Hardware(kind="cpu", product="replay", count=2, memory_bytes=1 << 34)
    space = build_space(spec, cpu)
    budget = max(1, round(BUDGET_SHARE * len(points)))  # 10% of the grid, before any pruning
    noise = random.Random(seed)
    cv = float(raw.get("noise_cv", 0.05))

    def evaluate(c: Candidate, report: ReportFn) -> Evaluation:
        p = points[c]
        figures = dict(p["figures"])
        figures["goodputRps"] = max(0.0, figures.get("goodputRps", 0.0) * noise.gauss(1.0, cv))
        return Evaluation(c, p["status"], figures, dict(p["margins_ms"]), reason=p.get("reason"))

    planner: SeedPlanner | None = None
    if sampler == "tuner":
        # What `infertune tune` does (tune.profile_and_plan, then the seed planner during the
        # study), from the profile recorded with the landscape: prune by the roofline floors,
        # then seed with the step model recalibrated after every seed.
        if raw.get("profile"):
            profile = ModelProfile.from_dict(raw["profile"])
            prune_by_roofline(space, spec, ModelShape.from_dir(ensure_model("tiny")), profile)
            planner = SeedPlanner(space, spec, profile, SEED_COUNT)
        s = make_sampler(
            "tpe",
            space,
            seed=seed,
            multi_objective=False,
            startup_trials=startup_trials(SEED_COUNT if planner else 0, budget),
        )
    elif sampler == "plain-tpe":
        s = optuna.samplers.TPESampler(seed=seed)
    else:
        s = optuna.samplers.RandomSampler(seed=seed)
    study = open_study(f"replay-{sampler}-{seed}", None, s, multi_objective=False)
    run_study(
        study,
        space,
        spec,
        evaluate,
        max_trials=budget,
        max_seconds=600,
        plan_next=planner.next if planner else None,
    )
    found = [
        Candidate.from_dict(t.user_attrs["config"])
        for t in study.trials
        if t.user_attrs.get("outcome") == "ok" and all(v <= 0 for v in t.user_attrs["constraints"])
    ]
    if not found:
        return 0.0
    # The configuration the study would report (best observed), judged by its true value.
    best = max(found, key=lambda c: next(
        (t.values[0] for t in study.trials if t.user_attrs.get("config") == c.to_dict() and t.values), 0.0
    ))  # fmt: skip
    return _true_value(points[best]) / optimum if optimum > 0 else 0.0


def run() -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows: list[dict[str, Any]] = []
    for path in sorted(DATA.glob("landscape_*.json")):
        full = json.loads(path.read_text())
        raw = recorded_grid(full)
        total = grid_size(full["grid"])
        if not raw["points"]:
            rows.append(
                {
                    "name": f"{path.stem}: incomplete",
                    "value": "-",
                    "unit": "",
                    "note": f"{len(full['points'])}/{total} points recorded; re-run "
                    "scripts/record_landscape.py (see its header)",
                }
            )
            continue
        values = sorted(_true_value(p) for p in raw["points"].values())
        feasible = sum(1 for v in values if v > 0)
        median = statistics.median(values)
        spread = values[-1] / median if median else float("inf")
        partial = (
            ""
            if len(raw["points"]) == total
            else f"PARTIAL: {len(raw['points'])} of {total} points ({', '.join(raw['grid']['quantization'])}), "
        )
        for sampler in ("tuner", "plain-tpe", "random"):
            ratios = [replay(path, sampler, seed) for seed in range(SEEDS)]
            rows.append(
                {
                    "name": f"{path.stem} {sampler}: median best/optimum @10% of grid",
                    "value": statistics.median(ratios),
                    "unit": "ratio",
                    "note": f"{partial}{len(raw['points'])} points ({feasible} feasible), "
                    f"{SEEDS} seeds, worst seed {min(ratios):.3f}, seeds >= 0.95: "
                    f"{sum(r >= 0.95 for r in ratios)}/{SEEDS}, optimum/median point {spread:.2f}, "
                    f"noise cv {float(full.get('noise_cv', 0.05)):.3f}; target (tuner) >= 0.95",
                }
            )
    return rows


if __name__ == "__main__":
    print(f"{'landscape / sampler':62s} {'median':>7s}  note")
    for row in run():
        value = row["value"]
        shown = f"{value:7.3f}" if isinstance(value, float) else f"{value:>7s}"
        print(f"{row['name']:62s} {shown}  {row['note']}")
