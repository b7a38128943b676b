"""Search efficiency on every recorded landscape (benchmarks/data/landscape_*.json), and warm starts.

Every configuration of a grid was measured with the built-in engine (scripts/record_landscape.py
re-records one; its header has the command). Each sampler runs the tuner's own study loop against
the recording, for 20 seeds, at budgets of 5%, 10% and 20% of the grid:

* "infertune": what `infertune tune` runs -- roofline pruning and seeds from the profile recorded
  with the landscape, TPE with the SLO constraints, then racing (racing.py): the best few are
  measured again in alternation, and the winner is the best mean.
* "plain-tpe": Optuna's default TPE; the winner is the best single measurement.
* "random": random search; the winner is the best single measurement.

Re-measurement is modelled honestly: every measurement of a configuration -- the first, or a
racing repeat -- draws new noise (a factor drawn from the landscape's recorded repeat pairs: each
pair's log-ratio over sqrt(2), either sign; from its recorded CV when it has too few pairs) and
costs one trial of the budget. A configuration's true value is its recorded objective (capacityRps
when recorded, else goodputRps) when it met every SLO, else 0. Reported per sampler and budget:
the median over seeds of true(winner) / grid optimum, and how many seeds reached 0.95.
Targets (infertune): >= 0.95 at 5% with >= 15/20 seeds there, >= 0.98 at 10%.

Warm start: for each pair of landscapes of the same model (A, B), a retune on B seeded from the
study on A (warm_start.py, down-weighted by how far the traffic moved) against a cold study on B;
reported: the median over seeds of the trials needed until the configuration the study would
report is within 95% of B's optimum. Target: warm <= half of cold.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from functools import cache
from pathlib import Path
from typing import Any

import optuna

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import TuningSpec
from infertune.tuner.campaign import engine_default
from infertune.tuner.candidate import Candidate
from infertune.tuner.capacity import CAPACITY_KEY
from infertune.tuner.hardware import Hardware
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.planning import SeedPlanner, prune_by_roofline
from infertune.tuner.racing import explore_then_race, standings
from infertune.tuner.search import Evaluation, ReportFn, best_value, run_study
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import counted, make_sampler, open_study
from infertune.tuner.tune import SEED_COUNT, startup_trials
from infertune.tuner.warm_start import Context, Prior, mark, prior_of, seed_study

DATA = Path(__file__).resolve().parent / "data"
SEEDS = 20
SHARES = (0.05, 0.10, 0.20)
SAMPLERS = ("infertune", "plain-tpe", "random")
TARGETS = {0.05: (0.95, 15), 0.10: (0.98, None)}
WARM_SHARE = 0.20
HARDWARE = Hardware(kind="cpu", product="replay", count=2, memory_bytes=1 << 34)


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


def objective_key(point: dict[str, Any]) -> str:
    return CAPACITY_KEY if CAPACITY_KEY in point["figures"] else "goodputRps"


def _true_value(point: dict[str, Any]) -> float:
    ok = point["status"] == "ok" and all(point["slo_met"].values())
    return float(point["figures"].get(objective_key(point), 0.0)) if ok else 0.0


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


def noise_factors(raw: dict[str, Any]) -> list[float]:
    """Multiplicative noise of one measurement, from the recorded repeat pairs (a, b) of points
    that ran to completion both times (a stopped run's partial goodput is no measurement of its
    objective, and such a point is worth 0 anyway): the log-ratio of two measurements has twice
    one measurement's variance, so each pair gives +-log(a/b)/sqrt(2). With fewer than 4 such
    pairs, 64 quantiles of a lognormal of the landscape's recorded CV."""
    logs: list[float] = []
    for key, again in raw.get("repeats", {}).items():
        first = raw["points"].get(key)
        if not first or first["status"] != "ok" or again["status"] != "ok":
            continue
        a = float(first["figures"].get(objective_key(first), 0.0))
        b = float(again["figures"].get(objective_key(again), 0.0))
        if a > 0 and b > 0:
            d = math.log(a / b) / math.sqrt(2)
            logs += [d, -d]
    if len(logs) < 8:
        cv = float(raw.get("noise_cv", 0.05))
        z = statistics.NormalDist()
        return [math.exp(cv * z.inv_cdf((i + 0.5) / 64)) for i in range(64)]
    return [math.exp(x) for x in logs]


class Landscape:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.full = json.loads(path.read_text())
        self.raw = recorded_grid(self.full)
        self.spec = _spec(self.raw)
        self.points = {Candidate.from_dict(p["config"]): p for p in self.raw["points"].values()}
        self.optimum = max((_true_value(p) for p in self.points.values()), default=0.0)
        self.noise = noise_factors(self.raw)
        self.total = grid_size(self.full["grid"])

    def true(self, c: Candidate) -> float:
        return _true_value(self.points[c])

    def evaluator(self, seed: int) -> Any:
        rng = random.Random(seed)

        def evaluate(c: Candidate, report: ReportFn) -> Evaluation:
            p = self.points[c]
            figures = dict(p["figures"])
            key = objective_key(p)
            figures[key] = max(0.0, figures.get(key, 0.0) * rng.choice(self.noise))
            return Evaluation(
                c, p["status"], figures, dict(p["margins_ms"]), reason=p.get("reason")
            )

        return evaluate

    def space(self, pruned: bool) -> tuple[Space, SeedPlanner | None]:
        space = build_space(self.spec, HARDWARE)
        if not pruned or not self.raw.get("profile"):
            return space, None
        profile = ModelProfile.from_dict(self.raw["profile"])
        prune_by_roofline(space, self.spec, _tiny_shape(), profile)
        return space, SeedPlanner(space, self.spec, profile, SEED_COUNT)


@cache
def _tiny_shape() -> ModelShape:
    return ModelShape.from_dir(ensure_model("tiny"))


@cache
def default_config() -> Candidate | None:
    """What `infertune serve` runs with no tuning flag, resolved as the tuner resolves it
    (campaign.engine_default: "auto" precision timed on this host), raced as the baseline."""
    space = build_space(
        _spec(json.loads(next(DATA.glob("landscape_*.json")).read_text())), HARDWARE
    )
    return engine_default(space)


def study_for(
    land: Landscape, sampler: str, seed: int, budget: int, prior: list[Prior] | None = None
) -> tuple[optuna.Study, Candidate | None]:
    """Run one replayed study; returns it and the winner it reports."""
    evaluate = land.evaluator(seed)
    if sampler != "infertune":
        s: optuna.samplers.BaseSampler = (
            optuna.samplers.TPESampler(seed=seed)
            if sampler == "plain-tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        )
        space, _ = land.space(pruned=False)
        study = open_study(f"replay-{sampler}-{seed}", None, s, multi_objective=False)
        run_study(study, space, land.spec, evaluate, max_trials=budget, max_seconds=600)
        best = best_value(study, land.spec)
        found = [
            Candidate.from_dict(t.user_attrs["config"])
            for t in study.trials
            if t.values and best is not None and t.values[0] == best
        ]
        return study, found[0] if found else None
    space, planner = land.space(pruned=True)
    warm = bool(prior)
    tpe = make_sampler(
        "tpe",
        space,
        seed=seed,
        multi_objective=False,
        startup_trials=startup_trials(SEED_COUNT if planner else 0, budget),
    )
    study = open_study(f"replay-{sampler}-{seed}", None, tpe, multi_objective=False)
    if warm and prior:
        here = Context.of(land.spec, HARDWARE.describe())
        seed_study(study, space, land.spec, here, prior)
    race = explore_then_race(
        study,
        space,
        land.spec,
        evaluate,
        max_trials=budget,
        max_seconds=600,
        baseline=default_config(),
        plan_next=planner.next if planner else None,
    )
    return study, race.winner


def trials_to_reach(land: Landscape, study: optuna.Study, share: float = 0.95) -> int | None:
    """Counted trials until the configuration the study would report (the best mean so far) is
    within `share` of the optimum; None: never within the budget."""
    measured = sorted(counted(study), key=lambda t: t.number)
    for k in range(1, len(measured) + 1):
        keep = {t.number for t in measured[:k]}
        sub = optuna.create_study(directions=study.directions)
        for t in study.get_trials(deepcopy=False):
            if t.number in keep:
                sub.add_trial(t)
        ranked = [s for s in standings(sub, land.spec) if s.ever_feasible]
        if ranked and land.true(ranked[0].config) >= share * land.optimum:
            return k
    return None


def prior_from(land: Landscape, study: optuna.Study, spec: TuningSpec) -> Prior:
    """The prior a retune finds in the storage (warm_start.find_priors does this per study)."""
    space, _ = land.space(pruned=False)
    mark(study, land.spec, space, HARDWARE.describe())
    prior = prior_of(study, spec)
    assert prior is not None
    return prior


def _landscapes() -> list[Landscape]:
    return [Landscape(p) for p in sorted(DATA.glob("landscape_*.json"))]


def search_rows(land: Landscape) -> list[dict[str, Any]]:
    name = land.path.stem
    if not land.points:
        return [{"name": f"{name}: incomplete", "value": "-", "unit": "",
                 "note": f"{len(land.full['points'])}/{land.total} points recorded; re-run "
                 "scripts/record_landscape.py (see its header)"}]  # fmt: skip
    values = sorted(_true_value(p) for p in land.points.values())
    feasible = sum(1 for v in values if v > 0)
    partial = (
        ""
        if len(land.points) == land.total
        else f"PARTIAL: {len(land.points)} of {land.total} points "
        f"({', '.join(land.raw['grid']['quantization'])}), "
    )
    rows = []
    for share in SHARES:
        budget = max(1, round(share * land.total))
        for sampler in SAMPLERS:
            ratios = []
            for seed in range(SEEDS):
                _, winner = study_for(land, sampler, seed, budget)
                ratios.append(land.true(winner) / land.optimum if winner and land.optimum else 0.0)
            target = TARGETS.get(share)
            want = ""
            if sampler == "infertune" and target:
                want = f"; target >= {target[0]}" + (
                    f" with >= {target[1]}/20" if target[1] else ""
                )
            rows.append(
                {
                    "name": f"{name} {sampler}: median best/optimum @{share:.0%} ({budget} trials)",
                    "value": statistics.median(ratios),
                    "unit": "ratio",
                    "note": f"{partial}{len(land.points)} points ({feasible} feasible), {SEEDS} "
                    f"seeds, worst {min(ratios):.3f}, seeds >= 0.95: "
                    f"{sum(r >= 0.95 for r in ratios)}/{SEEDS}, noise cv "
                    f"{float(land.full.get('noise_cv', 0.05)):.3f}{want}",
                }
            )
    return rows


def warm_rows(a: Landscape, b: Landscape) -> list[dict[str, Any]]:
    budget = max(1, round(WARM_SHARE * b.total))
    cold: list[float] = []
    warm: list[float] = []
    used: list[int] = []
    for seed in range(SEEDS):
        prior_study, _ = study_for(a, "infertune", seed, max(1, round(WARM_SHARE * a.total)))
        prior = [prior_from(a, prior_study, b.spec)]
        c_study, _ = study_for(b, "infertune", 1000 + seed, budget)
        w_study, _ = study_for(b, "infertune", 1000 + seed, budget, prior=prior)
        c, w = trials_to_reach(b, c_study), trials_to_reach(b, w_study)
        cold.append(float(budget + 1 if c is None else c))
        warm.append(float(budget + 1 if w is None else w))
        used.append(sum(1 for t in w_study.trials if t.user_attrs.get("transferred_from")))
    mc, mw = statistics.median(cold), statistics.median(warm)
    weight = math.exp(-Context.of(b.spec, "").distance(Context.of(a.spec, "")))
    return [
        {
            "name": f"warm start {a.path.stem} -> {b.path.stem}: trials to 95% of optimum",
            "value": mw,
            "unit": "trials",
            "note": f"cold {mc:g}, warm {mw:g} (median of {SEEDS} seeds, budget {budget}; "
            f"{budget + 1} = never), warm/cold {mw / mc:.2f}; prior weight {weight:.2f}, "
            f"{statistics.median(used):g} prior trials transferred; target warm <= cold / 2",
        }
    ]


def run() -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    lands = _landscapes()
    rows: list[dict[str, Any]] = []
    for land in lands:
        rows += search_rows(land)
    usable = [x for x in lands if x.points and x.optimum > 0]
    for a in usable:
        for b in usable:
            if a is not b and a.spec.model.uri == b.spec.model.uri:
                rows += warm_rows(a, b)
    return rows


if __name__ == "__main__":
    print(f"{'landscape / sampler':70s} {'value':>7s}  note")
    for row in run():
        value = row["value"]
        shown = f"{value:7.3f}" if isinstance(value, float) else f"{value:>7s}"
        print(f"{row['name']:70s} {shown}  {row['note']}")
