"""The study loop, independent of how a configuration is measured (live trials, or a recorded landscape).

`evaluate(config, report)` returns an :class:`Evaluation`; the loop asks Optuna for configurations,
records heartbeats, tells Optuna the objective and the SLO constraints, and stops when the
budget (counted in the shared storage) or the wall-time cap is spent. A configuration already
measured in this study is answered from the earlier measurement and does not spend the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.capacity import CAPACITY_KEY
from infertune.tuner.cost import CostBasis
from infertune.tuner.space import Space
from infertune.tuner.study import (
    DUPLICATE_ATTR,
    GRACE_PERIOD,
    INFEASIBLE,
    OUTCOME_ATTR,
    SEED_ATTR,
    Heartbeat,
    await_other_worker,
    claim_slot,
    counted,
    give_back,
    in_flight,
    params_of,
    settle,
    suggest,
    wait_for_slot,
)
from infertune.tuner.verdict import figure_key

ReportFn = Callable[[int, float], bool]
# A minimised objective's value for a trial that produced nothing: finite, for every sampler.
FAILED_COST = 1e12
# (counted trials, the whole budget maxTrials, the trial's evaluation, best so far, phase):
# the phase is "exploring" (this study loop) or "racing" (racing.py's re-measurements).
ProgressFn = Callable[[int, int, "Evaluation", float | None, str], None]
PlanFn = Callable[[dict[Candidate, dict[str, float]]], Candidate | None]


@dataclass
class Evaluation:
    config: Candidate
    outcome: str  # ok, stopped, failed, infeasible-quality
    figures: dict[str, float] = field(default_factory=dict)
    margins_ms: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = None
    quality: dict[str, Any] | None = None
    quality_shortfall: float = 0.0  # > 0: below the quality guard by this much
    capacity: dict[str, Any] | None = None  # Capacity.to_dict(): the ramp's probes

    def constraints(self, spec: TuningSpec) -> list[float]:
        """One value per SLO bound (measured / bound - 1), throughput floor, quality; <= 0 feasible."""
        if self.outcome in ("failed",):
            return [INFEASIBLE] * (len(spec.slo.bounds()) + 2)
        out: list[float] = []
        for metric, obj in spec.slo.bounds().items():
            value = self.figures.get(figure_key(metric, obj.percentile))
            out.append(INFEASIBLE if value is None else value / obj.max.ms - 1.0)
        floor = spec.slo.min_output_tokens_per_second
        tps = self.figures.get("outputTokensPerSecond", 0.0)
        out.append(0.0 if floor is None else 1.0 - tps / floor)
        out.append(self.quality_shortfall)
        if self.outcome == "stopped":  # stopped because a bound was certainly missed
            out = [max(v, 1e-3) if i < len(spec.slo.bounds()) else v for i, v in enumerate(out)]
            if all(v <= 0 for v in out):
                out[0] = 1e-3
        return out

    def feasible(self, spec: TuningSpec) -> bool:
        return self.outcome == "ok" and all(v <= 0 for v in self.constraints(spec))


def minimises(spec: TuningSpec) -> bool:
    """Whether the study's single objective is minimised (cost) rather than maximised."""
    return spec.slo.objective == "cost-per-token"


def objective_value(ev: Evaluation, spec: TuningSpec, cost: CostBasis | None = None) -> float:
    """SLO capacity (capacity.py: the highest rate holding every bound, the spec's rate its
    floor; goodput at the spec's rate below it) by default; output tokens/s for throughput
    (maximised); for cost-per-token, USD per million output tokens (minimised), or GPU-hours per
    million output tokens when no GPU price is known (:mod:`infertune.tuner.cost`)."""
    if minimises(spec):
        if ev.outcome == "failed":
            return FAILED_COST
        return min(FAILED_COST, (cost or CostBasis()).objective(ev.figures))
    if ev.outcome == "failed":
        return 0.0
    if spec.slo.objective == "goodput":
        # SLO capacity when the spec's rate was held (>= that rate), else goodput at it (< it).
        return ev.figures.get(CAPACITY_KEY, ev.figures.get("goodputRps", 0.0))
    return ev.figures.get("outputTokensPerSecond", 0.0)


def multi_values(ev: Evaluation) -> list[float]:
    """(output tokens/s ↑, e2e p95 ms ↓, peak memory MiB ↓) for NSGA-II."""
    if ev.outcome == "failed":
        return [0.0, 1e9, 1e9]
    return [
        ev.figures.get("outputTokensPerSecond", 0.0),
        ev.figures.get("e2eP95Ms", 1e9),
        (ev.peak_memory_bytes or 0) / 2**20,
    ]


def enqueue_seeds(study: optuna.Study, space: Space, configs: list[Candidate]) -> int:
    """Enqueue the seeds once per study (a resumed study already has them)."""
    if study.get_trials(deepcopy=False):
        return 0
    for c in configs:
        study.enqueue_trial(params_of(c, space), user_attrs={SEED_ATTR: True})
    return len(configs)


def constraint_names(spec: TuningSpec) -> list[str]:
    """The names of Evaluation.constraints' values, in order."""
    return [*spec.slo.bounds(), "throughput", "quality"]


def store_measurement(trial: optuna.Trial, ev: Evaluation, spec: TuningSpec) -> None:
    trial.set_user_attr("config", ev.config.to_dict())
    trial.set_user_attr(OUTCOME_ATTR, ev.outcome)
    trial.set_user_attr("figures", ev.figures)
    trial.set_user_attr(
        "margins_ms", {k: v for k, v in ev.margins_ms.items() if v == v and abs(v) != float("inf")}
    )
    constraints = ev.constraints(spec)
    trial.set_user_attr("constraints", constraints)
    # Optuna >= 5 reads constraints from the trial (<= 0 feasible) in TPE, NSGA-II and GP.
    names = constraint_names(spec)
    for name, value in zip(names, constraints, strict=True):
        trial.set_constraint(name, value)
    if ev.reason:
        trial.set_user_attr("failure_reason" if ev.outcome == "failed" else "reason", ev.reason)
    if ev.peak_memory_bytes is not None:
        trial.set_user_attr("peak_memory_bytes", ev.peak_memory_bytes)
    if ev.startup_s is not None:
        trial.set_user_attr("startup_s", ev.startup_s)
    if ev.quality is not None:
        trial.set_user_attr("quality", ev.quality)
    trial.set_user_attr("quality_shortfall", ev.quality_shortfall)
    if ev.capacity is not None:
        trial.set_user_attr("capacity", ev.capacity)


def evaluation_of(t: FrozenTrial) -> Evaluation | None:
    """The Evaluation stored on a finished trial (None for trials that never measured)."""
    raw = t.user_attrs.get("config")
    if t.state != TrialState.COMPLETE or raw is None:
        return None
    return Evaluation(
        config=Candidate.from_dict(raw),
        outcome=str(t.user_attrs.get(OUTCOME_ATTR, "ok")),
        figures=dict(t.user_attrs.get("figures", {})),
        margins_ms=dict(t.user_attrs.get("margins_ms", {})),
        reason=t.user_attrs.get("failure_reason") or t.user_attrs.get("reason"),
        peak_memory_bytes=t.user_attrs.get("peak_memory_bytes"),
        startup_s=t.user_attrs.get("startup_s"),
        quality=t.user_attrs.get("quality"),
        quality_shortfall=float(t.user_attrs.get("quality_shortfall", 0.0)),
        capacity=t.user_attrs.get("capacity"),
    )


def recorded(study: optuna.Study) -> dict[Candidate, Evaluation]:
    """Configurations this study already measured (a resumed worker does not measure them again)."""
    out: dict[Candidate, Evaluation] = {}
    for t in study.get_trials(deepcopy=False):
        ev = evaluation_of(t)
        if ev is not None and not t.user_attrs.get(DUPLICATE_ATTR):
            out.setdefault(ev.config, ev)
    return out


def run_study(
    study: optuna.Study,
    space: Space,
    spec: TuningSpec,
    evaluate: Callable[[Candidate, ReportFn], Evaluation],
    *,
    max_trials: int,
    max_seconds: float,
    multi_objective: bool = False,
    progress: ProgressFn | None = None,
    heartbeat_interval: float = 10.0,
    stale_after: float = GRACE_PERIOD,
    plan_next: PlanFn | None = None,
    cost: CostBasis | None = None,
    budget: int | None = None,
) -> None:
    """Ask, measure, tell until `max_trials` are counted. `budget` (default `max_trials`) is the
    whole budget the progress line shows when this loop explores only part of it (racing.py).
    `plan_next`, when given, is asked for a configuration to enqueue whenever no enqueued trial is
    waiting (the seed planner: it sees what was measured so far and returns None once it has no
    more seeds)."""
    started = time.monotonic()
    measured = recorded(study)
    asks = 0
    while True:
        # Before every trial, not only at start: a retried Job pod starts well within the grace
        # period, and the trial its killed predecessor left RUNNING goes stale only later. The
        # budget is counted in the storage, other workers' running trials included (study.py).
        if (
            not wait_for_slot(study, max_trials, max_seconds, stale_after)
            or time.monotonic() - started >= max_seconds
        ):
            break
        for c, done in recorded(study).items():  # other workers' measurements
            measured.setdefault(c, done)
        if plan_next is not None and not study.get_trials(
            deepcopy=False, states=(TrialState.WAITING,)
        ):
            planned = plan_next(
                {c: ev.figures for c, ev in measured.items() if ev.outcome != "failed"}
            )
            if (
                planned is not None
                and planned not in measured
                and planned not in in_flight(study, space)
            ):
                study.enqueue_trial(params_of(planned, space), user_attrs={SEED_ATTR: True})
        asks += 1
        if asks > 4 * max_trials + 20:  # the sampler keeps proposing measured points: converged
            break
        trial = study.ask()
        if not claim_slot(study, trial, max_trials):  # another worker took the last slot
            give_back(study, trial)
            continue
        config = suggest(trial, space)
        await_other_worker(study, space, config, trial.number, stale_after)
        for c, done in recorded(study).items():  # measured meanwhile by another worker?
            measured.setdefault(c, done)
        previous = measured.get(config)
        if previous is not None:
            # A repeat spends no measurement and does not count against the budget.
            trial.set_user_attr(DUPLICATE_ATTR, previous.config.config_hash)
            ev = previous
        else:

            def report(step: int, value: float, trial: optuna.Trial = trial) -> bool:
                trial.report(value, step)
                return bool(trial.should_prune())

            with Heartbeat(study, trial, heartbeat_interval):
                ev = evaluate(config, report)
            measured[config] = ev
        store_measurement(trial, ev, spec)
        values = multi_values(ev) if multi_objective else objective_value(ev, spec, cost)
        if ev.outcome == "failed":
            # Told as COMPLETE with zero objective and infeasible constraints, not FAIL: the
            # sampler then learns to avoid the region instead of proposing it again.
            study.tell(trial, values, state=TrialState.COMPLETE)
        else:
            study.tell(trial, values)
        if progress is not None and previous is None:
            best = best_value(study, spec)
            progress(len(counted(study)), budget or max_trials, ev, best, "exploring")
    # Other workers' last trials: the result is assembled from the finished study.
    settle(study, stale_after, timeout=float(spec.budget.trial_timeout) + stale_after + 60)


def best_value(study: optuna.Study, spec: TuningSpec) -> float | None:
    feasible: list[float] = [
        t.values[0]
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values
        and all(c <= 0 for c in t.user_attrs.get("constraints", [1.0]))
        and t.user_attrs.get(OUTCOME_ATTR) == "ok"
    ]
    if not feasible:
        return None
    return min(feasible) if minimises(spec) else max(feasible)
