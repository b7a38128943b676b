"""Search efficiency on a recorded landscape (benchmarks/data/landscape_*.json).

Every configuration of a grid was measured once with the built-in engine (scripts/record_landscape.py
re-records it). Each sampler runs the tuner's own study loop against the recording, with the
recorded measurement noise added, for 20 seeds and a budget of 10% of the grid. Reported per
sampler: the median over seeds of (true objective of the best feasible configuration it found) /
(grid optimum). Target for the tuner's sampler: >= 95%.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import optuna

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.search import Evaluation, ReportFn, run_study
from infertune.tuner.space import build_space
from infertune.tuner.study import make_sampler, open_study

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


def replay(path: Path, sampler: str, seed: int) -> float:
    raw = json.loads(path.read_text())
    spec = _spec(raw)
    points = {Candidate.from_dict(p["config"]): p for p in raw["points"].values()}
    optimum = max(_true_value(p) for p in points.values())
    cpu = Hardware(kind="cpu", product="replay", count=2, memory_bytes=1 << 34)
    space = build_space(spec, cpu)
    budget = max(1, round(BUDGET_SHARE * space.size()))
    noise = random.Random(seed)
    cv = float(raw.get("noise_cv", 0.05))

    def evaluate(c: Candidate, report: ReportFn) -> Evaluation:
        p = points[c]
        figures = dict(p["figures"])
        figures["goodputRps"] = max(0.0, figures.get("goodputRps", 0.0) * noise.gauss(1.0, cv))
        return Evaluation(c, p["status"], figures, dict(p["margins_ms"]), reason=p.get("reason"))

    if sampler == "tuner":
        s = make_sampler(
            "tpe", space, seed=seed, multi_objective=False, startup_trials=min(10, budget // 3 + 1)
        )
    elif sampler == "plain-tpe":
        s = optuna.samplers.TPESampler(seed=seed)
    else:
        s = optuna.samplers.RandomSampler(seed=seed)
    study = open_study(f"replay-{sampler}-{seed}", None, s, multi_objective=False)
    run_study(study, space, spec, evaluate, max_trials=budget, max_seconds=600)
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
        raw = json.loads(path.read_text())
        values = sorted(_true_value(p) for p in raw["points"].values())
        spread = (
            values[-1] / statistics.median(values) if statistics.median(values) else float("inf")
        )
        for sampler in ("tuner", "plain-tpe", "random"):
            ratios = [replay(path, sampler, seed) for seed in range(SEEDS)]
            rows.append(
                {
                    "name": f"{path.stem} {sampler}: median best/optimum @10% of grid",
                    "value": statistics.median(ratios),
                    "unit": "ratio",
                    "note": f"{len(raw['points'])} points, {SEEDS} seeds, worst seed {min(ratios):.3f}, "
                    f"optimum/median point {spread:.2f}",
                }
            )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
