"""Racing: re-measure the best few configurations in alternation until their order is settled.

Why: a study that reports its best single measurement reports the luckiest one. Replayed on the
recorded landscape (noise CV 0.09) the best-measured configuration was the true best in about half
the seeds, and more trials did not help (issue 24). So before declaring a winner the top
`contenders` by mean are measured again, one at a time, always the one with the fewest
measurements (alternation: drift on a shared machine hits them alike), until the leader's
advantage over every other contender has a confidence interval above 1, a contender falls clearly
behind (its interval entirely below), each has `max_repeats` measurements, or the budget ends.
Every re-measurement is a trial of the study: it costs the budget like any other.

The engine's default configuration (`baseline`) is measured too when the space holds it (after the
two leaders have two measurements each), so the result can say what tuning bought, with an
interval.

Values: a measurement's value is its objective when it met every constraint and 0 otherwise (a
configuration that misses its SLO on a repeat has, that time, no capacity to offer); for a
minimised objective (cost) an infeasible measurement counts as FAILED_COST.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.cost import CostBasis
from infertune.tuner.search import (
    FAILED_COST,
    Evaluation,
    ProgressFn,
    ReportFn,
    best_value,
    evaluation_of,
    minimises,
    objective_value,
    run_study,
    store_measurement,
)
from infertune.tuner.space import Space
from infertune.tuner.study import (
    DUPLICATE_ATTR,
    claim_slot,
    counted,
    give_back,
    params_of,
    suggest,
)

REMEASURE_ATTR = "remeasure_of"  # a racing trial: the config hash it measures again
CONTENDERS = 3
MAX_REPEATS = 4
LEVEL = 0.90  # two-sided confidence of the intervals
# Share of the budget held back for the race. Replayed on the recorded demo landscape (20 seeds):
# 0.25 -> median 0.953 of the optimum at 10% of the grid, 0.4 -> 0.976 (its top ten lie within
# the measurement noise of each other, so repeats pay more than further exploration).
RACE_SHARE = 0.4
# The engine's default is measured (twice, for an interval) only when the race has this many
# trials: on a small budget they go to separating the contenders.
BASELINE_MIN_RACE = 5
# Student's t, upper 95% point (two-sided 90%), by degrees of freedom; beyond 30 the normal's.
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
        9: 1.833, 10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}  # fmt: skip


def t95(df: float) -> float:
    if df >= 30:
        return 1.645 if df > 120 else 1.697
    below = max(k for k in _T95 if k <= max(1.0, df))
    return _T95[below]


@dataclass(frozen=True)
class Ratio:
    """a / b of two configurations' mean values, with a LEVEL interval (None: too few repeats)."""

    value: float
    low: float | None
    high: float | None
    n_a: int
    n_b: int

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None or not math.isfinite(x) else round(x, 4)

        return {"ratio": r(self.value), "low": r(self.low), "high": r(self.high),
                "n": [self.n_a, self.n_b], "level": LEVEL}  # fmt: skip


def ratio_interval(a: list[float], b: list[float]) -> Ratio:
    """mean(a) / mean(b) with a delta-method interval on its logarithm (Welch's degrees of
    freedom): var(log r) ~ var_a / (n_a mean_a^2) + var_b / (n_b mean_b^2). Zeros are allowed
    (an infeasible repeat); a mean of zero has no ratio."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    if mb <= 0:
        return Ratio(math.inf if ma > 0 else 1.0, None, None, len(a), len(b))
    if ma <= 0:
        return Ratio(0.0, None, None, len(a), len(b))
    value = ma / mb
    if len(a) < 2 or len(b) < 2:
        return Ratio(value, None, None, len(a), len(b))
    ua = statistics.variance(a) / (len(a) * ma * ma)
    ub = statistics.variance(b) / (len(b) * mb * mb)
    se = math.sqrt(ua + ub)
    if se == 0:
        return Ratio(value, value, value, len(a), len(b))
    df = (ua + ub) ** 2 / (ua * ua / (len(a) - 1) + ub * ub / (len(b) - 1) or 1e-300)
    half = t95(df) * se
    return Ratio(value, value * math.exp(-half), value * math.exp(half), len(a), len(b))


@dataclass
class Standing:
    """Every measurement of one configuration in this study (transferred trials excluded)."""

    config: Candidate
    values: list[float] = field(default_factory=list)
    feasible: list[bool] = field(default_factory=list)
    trials: list[int] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def ever_feasible(self) -> bool:
        return any(self.feasible)


def measurement_value(ev: Evaluation, spec: TuningSpec, cost: CostBasis | None = None) -> float:
    if ev.feasible(spec):
        return objective_value(ev, spec, cost)
    return FAILED_COST if minimises(spec) else 0.0


def standings(
    study: optuna.Study, spec: TuningSpec, cost: CostBasis | None = None
) -> list[Standing]:
    """Configurations measured in this study, best mean first (lowest first when minimised)."""
    by: dict[Candidate, Standing] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        # Repeats answered from a measurement, and trials transferred from a prior study
        # (warm_start.py marks them duplicates too), were not measured here.
        if t.user_attrs.get(DUPLICATE_ATTR):
            continue
        ev = evaluation_of(t)
        if ev is None:
            continue
        s = by.setdefault(ev.config, Standing(ev.config))
        s.values.append(measurement_value(ev, spec, cost))
        s.feasible.append(ev.feasible(spec))
        s.trials.append(t.number)
    sign = 1.0 if minimises(spec) else -1.0
    # Ties: more measurements first (a surer mean), then the configuration's own order.
    return sorted(by.values(), key=lambda s: (sign * s.mean, -len(s.values), s.config))


def advantage(a: Standing, b: Standing, spec: TuningSpec) -> Ratio:
    """How much better `a` is than `b` (> 1: better), whichever way the objective points."""
    return (
        ratio_interval(b.values, a.values)
        if minimises(spec)
        else ratio_interval(a.values, b.values)
    )


@dataclass
class RaceResult:
    winner: Candidate | None
    settled: bool
    reason: str
    remeasured: int  # trials the race spent
    over_runner_up: Ratio | None = None
    runner_up: Candidate | None = None
    over_default: Ratio | None = None
    default: Candidate | None = None
    measurements: dict[str, list[float]] = field(default_factory=dict)  # config label -> values

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": None if self.winner is None else self.winner.to_dict(),
            "settled": self.settled,
            "reason": self.reason,
            "remeasured": self.remeasured,
            "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
            "over_runner_up": None
            if self.over_runner_up is None
            else self.over_runner_up.to_dict(),
            "default": None if self.default is None else self.default.to_dict(),
            "over_default": None if self.over_default is None else self.over_default.to_dict(),
            "measurements": self.measurements,
        }


def _order_settled(top: list[Standing], spec: TuningSpec, max_repeats: int) -> tuple[bool, str]:
    """(whether the race can stop, why): every contender separated from the leader, or measured
    max_repeats times alongside it (as sure as the race can make it)."""
    capped = False
    for other in top[1:]:
        r = advantage(top[0], other, spec)
        if r.low is not None and r.low > 1.0:
            continue
        if len(top[0].values) >= max_repeats and len(other.values) >= max_repeats:
            capped = True
            continue
        return False, f"{other.config.label()} not yet separated from the leader"
    if capped:
        return True, f"repeats exhausted: not every contender separated after {max_repeats} runs"
    return True, "settled: every contender separated from the leader"


def next_to_measure(
    ranked: list[Standing],
    spec: TuningSpec,
    *,
    contenders: int = CONTENDERS,
    max_repeats: int = MAX_REPEATS,
    baseline: Candidate | None = None,
) -> tuple[Candidate | None, str]:
    """The configuration to measure next, or None with why the race is over."""
    alive = [s for s in ranked if s.ever_feasible]
    if not alive:
        return None, "no configuration met the SLOs: nothing to race"
    leader = alive[0]
    top = [leader]
    for s in alive[1:]:
        if len(top) >= contenders:
            break
        r = advantage(leader, s, spec)
        if r.low is not None and r.low > 1.0 and len(s.values) >= 2:
            continue  # clearly behind: dropped from the race
        top.append(s)
    # The two leaders first reach two measurements each: the least a ratio interval needs.
    for s in top[:2]:
        if len(s.values) < 2:
            return s.config, "leaders to two measurements"
    by_config = {s.config: s for s in ranked}
    base = by_config.get(baseline) if baseline is not None else None
    if baseline is not None and base is None:
        return baseline, "the engine's default, for the advantage over it"
    settled, why = _order_settled(top, spec, max_repeats)
    if not settled:
        # Alternation: the fewest-measured unsettled contender, leader first among equals.
        pending = [s for s in top if len(s.values) < max_repeats]
        if pending:
            return min(pending, key=lambda s: len(s.values)).config, why
    if baseline is not None and base is not None and len(base.values) < 2:
        return baseline, "the engine's default's second measurement, for its interval"
    return None, why


def race(
    study: optuna.Study,
    space: Space,
    spec: TuningSpec,
    evaluate: Callable[[Candidate, ReportFn], Evaluation],
    *,
    max_trials: int,
    deadline: float,
    contenders: int = CONTENDERS,
    max_repeats: int = MAX_REPEATS,
    baseline: Candidate | None = None,
    cost: CostBasis | None = None,
    log: Callable[[str], None] | None = None,
    progress: ProgressFn | None = None,
) -> RaceResult:
    """Re-measure until `next_to_measure` says the race is over, the study holds `max_trials`
    counted trials, or `deadline` (time.monotonic) passes. Each re-measurement is enqueued and
    measured as a trial of the study (REMEASURE_ATTR), so the budget in the storage counts it."""
    spent = 0
    reason = ""
    if baseline is not None and baseline.engine not in space.engines:
        baseline = None
    if baseline is not None and params_of_or_none(baseline, space) is None:
        baseline = None  # the default lies outside the searched space: not compared
    if max_trials - len(counted(study)) < BASELINE_MIN_RACE:
        baseline = None  # too few trials left: they go to the contenders
    while True:
        ranked = standings(study, spec, cost)
        nxt, reason = next_to_measure(
            ranked, spec, contenders=contenders, max_repeats=max_repeats, baseline=baseline
        )
        if nxt is None:
            break
        if len(counted(study)) >= max_trials:
            reason = f"budget spent ({reason})"
            break
        if time.monotonic() >= deadline:
            reason = f"time budget spent ({reason})"
            break
        study.enqueue_trial(
            params_of(nxt, space),
            user_attrs={REMEASURE_ATTR: nxt.config_hash},
            skip_if_exists=False,
        )
        trial = study.ask()
        if not claim_slot(study, trial, max_trials):  # parallel workers took the last slot
            give_back(study, trial)
            reason = f"budget spent ({reason})"
            break
        config = suggest(trial, space)
        ev = evaluate(config, lambda step, value: False)  # a repeat is never pruned
        store_measurement(trial, ev, spec)
        study.tell(trial, objective_value(ev, spec, cost), state=TrialState.COMPLETE)
        spent += 1
        if log is not None:
            log(f"race: measured {config.label()} again ({reason})")
        if progress is not None:
            progress(len(counted(study)), max_trials, ev, best_value(study, spec), "racing")
    return summarise(standings(study, spec, cost), spec, baseline, spent, reason)


def params_of_or_none(config: Candidate, space: Space) -> dict[str, Any] | None:
    """`config`'s params when every knob value is one the space searches, else None."""
    engine = space.engines.get(config.engine)
    if engine is None:
        return None
    for knob, values in engine.by_knob().items():
        if config[knob] not in values:
            return None
    return params_of(config, space)


def summarise(
    ranked: list[Standing],
    spec: TuningSpec,
    baseline: Candidate | None,
    spent: int,
    reason: str,
) -> RaceResult:
    alive = [s for s in ranked if s.ever_feasible]
    if not alive:
        return RaceResult(None, False, reason, spent)
    leader = alive[0]
    out = RaceResult(leader.config, reason.startswith("settled"), reason, spent)
    if len(alive) > 1:
        out.runner_up = alive[1].config
        out.over_runner_up = advantage(leader, alive[1], spec)
    base = next((s for s in ranked if s.config == baseline), None)
    if base is not None and base.config != leader.config:
        out.default = base.config
        out.over_default = advantage(leader, base, spec)
    shown = alive[:CONTENDERS] + (
        [base] if base is not None and base not in alive[:CONTENDERS] else []
    )
    out.measurements = {s.config.label(): [round(v, 4) for v in s.values] for s in shown}
    return out


def race_budget(max_trials: int, share: float = RACE_SHARE) -> int:
    """Trials held back from exploration for the race: none on a budget too small to explore
    (fewer than 6 trials), else `share` of it, at least 2 (the runner-up's and the leader's
    second measurements)."""
    if max_trials < 6:
        return 0
    return max(2, round(share * max_trials))


def explore_then_race(
    study: optuna.Study,
    space: Space,
    spec: TuningSpec,
    evaluate: Callable[[Candidate, ReportFn], Evaluation],
    *,
    max_trials: int,
    max_seconds: float,
    baseline: Candidate | None = None,
    race_share: float = RACE_SHARE,
    cost: CostBasis | None = None,
    log: Callable[[str], None] | None = None,
    **explore: Any,
) -> RaceResult:
    """The study (search.run_study) on the budget less the race's share, then the race; budget
    the race did not need goes back to exploration (its new configurations are then judged by
    their single measurement against the raced means)."""
    started = time.monotonic()
    deadline = started + max_seconds
    hold = race_budget(max_trials, race_share)
    progress: ProgressFn | None = explore.pop("progress", None)  # shows the whole budget

    def explore_until(n: int) -> None:
        left = deadline - time.monotonic()
        if left > 0 and len(counted(study)) < n:
            run_study(study, space, spec, evaluate, max_trials=n, max_seconds=left, cost=cost,
                      progress=progress, budget=max_trials, **explore)  # fmt: skip

    explore_until(max_trials - hold)
    result = race(study, space, spec, evaluate, max_trials=max_trials, deadline=deadline,
                  baseline=baseline, cost=cost, log=log, progress=progress)  # fmt: skip
    if len(counted(study)) < max_trials:
        explore_until(max_trials)
        result = race(study, space, spec, evaluate, max_trials=max_trials, deadline=deadline,
                      baseline=baseline, cost=cost, log=log, progress=progress)  # fmt: skip
    return result
