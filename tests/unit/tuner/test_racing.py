"""Racing (racing.py) on real Optuna studies: the best few re-measured in alternation, each repeat
a trial of the budget, until their order is settled; the winner's advantage with an interval.

The evaluator is a fixed landscape with multiplicative noise drawn from a seeded generator, and
each measurement is judged by the real SLO constraints (Evaluation.constraints)."""

from __future__ import annotations

import random

import optuna
import pytest
from study_helpers import builtin_search, tpe_study

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.racing import (
    REMEASURE_ATTR,
    explore_then_race,
    race,
    race_budget,
    ratio_interval,
    standings,
)
from infertune.tuner.search import Evaluation, ReportFn, run_study
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import counted, params_of

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC = TuningSpec.model_validate(
    {
        "model": {"uri": "builtin://tiny"},
        "slo": {"ttft": {"max": "500ms"}, "itl": {"max": "50ms"}},
        "traffic": {"rate": 4, "numRequests": 20},
        "search": builtin_search([2, 4, 8, 16]),
    }
)


def cfg(q: str, seqs: int, tokens: int = 512) -> Candidate:
    return Candidate("builtin", q, seqs, tokens, 16, False)


BEST, SECOND, THIRD = cfg("fp32", 8), cfg("fp32", 16), cfg("fp32", 16, 128)


def true_value(c: Candidate) -> float:
    """fp32 seqs=8 is the best (10), two close behind (9, 8.5); int8 seqs=2 misses TTFT."""
    table = {BEST: 10.0, SECOND: 9.0, THIRD: 8.5}
    return table.get(c, 2.0 + c.max_num_seqs / 8)


class Noisy:
    """Every call draws new noise (a repeat is a new measurement); `lucky` configurations read
    high on their first measurement only (the winner's curse racing is there to undo)."""

    def __init__(self, cv: float, seed: int = 0, lucky: dict[Candidate, float] | None = None):
        self.rng = random.Random(seed)
        self.cv = cv
        self.lucky = dict(lucky or {})
        self.calls: list[Candidate] = []

    def __call__(self, c: Candidate, report: ReportFn) -> Evaluation:
        self.calls.append(c)
        value = true_value(c) * max(0.1, self.rng.gauss(1.0, self.cv))
        value *= self.lucky.pop(c, 1.0)
        ttft = 900.0 if (c.quantization, c.max_num_seqs) == ("int8", 2) else 200.0
        figures = {"goodputRps": value, "ttftP95Ms": ttft, "itlP95Ms": 20.0}
        return Evaluation(c, "ok", figures, {"ttft": 500 - ttft, "itl": 30.0})


@pytest.fixture
def space(cpu: Hardware) -> Space:
    return build_space(SPEC, cpu)


def new_study(space: Space, name: str = "race") -> optuna.Study:
    return tpe_study(space, None, name)


def measure_once(study: optuna.Study, space: Space, evaluate: Noisy, configs: list[Candidate]):
    for c in configs:
        study.enqueue_trial(params_of(c, space))
    run_study(study, space, SPEC, evaluate, max_trials=len(configs), max_seconds=60)


def test_ratio_interval() -> None:
    r = ratio_interval([10.0, 10.0, 10.0], [5.0, 5.0, 5.0])
    assert r.value == 2.0 and r.low == r.high == 2.0
    r = ratio_interval([10.0, 11.0, 9.0], [9.0, 10.0, 8.0])
    assert r.low is not None and r.high is not None and r.low < r.value < r.high
    assert r.low < 1.0  # 10 vs 9 with this spread is not separated
    assert ratio_interval([10.0], [9.0]).low is None  # one run each: no interval
    assert ratio_interval([10.0, 0.0], [5.0, 5.0]).value == 1.0  # an infeasible repeat counts 0


def test_race_undoes_a_lucky_first_measurement(space: Space) -> None:
    study = new_study(space)
    # The second-best reads 1.3x high once: by single measurements it would win.
    evaluate = Noisy(0.03, lucky={SECOND: 1.3})
    measure_once(study, space, evaluate, [SECOND, BEST, cfg("fp32", 2), cfg("int8", 4)])
    assert standings(study, SPEC)[0].config == SECOND
    result = race(study, space, SPEC, evaluate, max_trials=20, deadline=1e18)
    assert result.winner == BEST and result.runner_up == SECOND
    # The outlier stays in the runner-up's mean: the interval is wide, and it says so.
    r = result.over_runner_up
    assert r is not None and r.low is not None and r.high is not None
    assert r.low < 10 / 9 < r.high and not result.settled and "exhausted" in result.reason


def test_race_settles_when_the_order_is_clear(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.02, seed=1)
    measure_once(study, space, evaluate, [SECOND, BEST, cfg("fp32", 2)])
    result = race(study, space, SPEC, evaluate, max_trials=40, deadline=1e18)
    assert result.winner == BEST and result.settled, result.reason
    assert result.over_runner_up is not None and result.over_runner_up.low is not None
    assert result.over_runner_up.low > 1.0
    assert len(counted(study)) < 40  # stopped because settled, not because the budget ended


def test_repeats_alternate_and_each_costs_a_trial(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.3, seed=5)  # noisy enough that nothing settles within the budget
    top = [BEST, SECOND, THIRD]
    measure_once(study, space, evaluate, top)
    evaluate.calls.clear()
    result = race(
        study, space, SPEC, evaluate, max_trials=12, deadline=1e18, contenders=3, max_repeats=6
    )
    assert len(counted(study)) == 12 and result.remeasured == 9 == len(evaluate.calls)
    assert "budget spent" in result.reason
    repeats = [t for t in study.trials if t.user_attrs.get(REMEASURE_ATTR)]
    assert len(repeats) == 9
    # Alternation: no configuration gets a third measurement before each contender has two.
    counts = {c: 1 for c in top}
    for c in evaluate.calls:
        if c in counts:
            assert counts[c] <= min(counts.values()) + 1
            counts[c] += 1


def test_the_engine_default_is_measured_for_the_advantage(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.02, seed=2)
    default = cfg("fp32", 2)
    measure_once(study, space, evaluate, [BEST, SECOND, cfg("int8", 16)])
    result = race(study, space, SPEC, evaluate, max_trials=30, deadline=1e18, baseline=default)
    assert evaluate.calls.count(default) == 2  # once, then a second time for its interval
    assert result.default == default and result.over_default is not None
    # 10 vs 2.25 by construction; the interval brackets it.
    assert result.over_default.low is not None and result.over_default.high is not None
    assert result.over_default.low < 10 / 2.25 < result.over_default.high


def test_infeasible_repeats_count_zero(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.01, seed=3)
    measure_once(study, space, evaluate, [cfg("int8", 2), BEST])
    ranked = standings(study, SPEC)
    assert ranked[0].config == BEST and ranked[-1].values == [0.0]  # missed TTFT: worth 0


def test_explore_then_race_spends_exactly_the_budget(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.05, seed=4)
    result = explore_then_race(study, space, SPEC, evaluate, max_trials=10, max_seconds=60)
    assert len(counted(study)) == 10 == len(evaluate.calls)
    assert race_budget(10) >= 2 and result.remeasured >= 2
    assert result.winner is not None
    assert result.measurements[result.winner.label()]  # the winner's values are reported


def test_a_small_race_spends_nothing_on_the_default(space: Space) -> None:
    study = new_study(space)
    evaluate = Noisy(0.02, seed=6)
    default = cfg("fp32", 2)
    measure_once(study, space, evaluate, [BEST, SECOND])
    race(study, space, SPEC, evaluate, max_trials=6, deadline=1e18, baseline=default)
    assert default not in evaluate.calls and len(counted(study)) <= 6


def test_the_builtin_default_is_resolved_as_the_engine_resolves_it(space: Space) -> None:
    from infertune.engine.cli import build_serve_parser
    from infertune.tuner.campaign import engine_default

    parsed = build_serve_parser().parse_args(["--model", "m"])
    default = engine_default(space)
    assert default is not None and default.quantization in ("fp32", "bf16")
    assert default.max_num_seqs == parsed.max_num_seqs
    assert default.max_num_batched_tokens == parsed.max_num_batched_tokens
    assert engine_default(space, gpu=True) is None or parsed.quantization != "auto"
