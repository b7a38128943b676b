"""Storage URLs, budget counting, stale-trial recovery and resuming, on real Optuna storages.

The evaluator here reads a fixed table of configurations -> figures (a recorded landscape), so the
study machinery is exercised exactly as in a live run without starting engines.
"""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from study_helpers import builtin_search, tpe_study

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.search import Evaluation, ReportFn, enqueue_seeds, run_study
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import (
    HEARTBEAT_ATTR,
    STALE_ATTR,
    counted,
    fail_stale,
    storage_for,
    suggest,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC = TuningSpec.model_validate(
    {
        "model": {"uri": "builtin://tiny"},
        "slo": {"ttft": {"max": "500ms"}, "itl": {"max": "50ms"}},
        "traffic": {"rate": 4, "numRequests": 20},
        "search": builtin_search([1, 4, 16], seed=3),
    }
)


def landscape(c: Candidate, report: ReportFn) -> Evaluation:
    """Goodput grows with max_num_seqs and is higher for int8; seqs=1 misses the TTFT bound."""
    goodput = (
        c.max_num_seqs * (2.0 if c.quantization == "int8" else 1.0) + c.max_num_batched_tokens / 512
    )
    ttft = 900.0 if c.max_num_seqs == 1 else 200.0
    figures = {
        "goodputRps": goodput,
        "ttftP95Ms": ttft,
        "itlP95Ms": 20.0,
        "outputTokensPerSecond": goodput * 32,
    }
    return Evaluation(c, "ok", figures, {"ttft": 500 - ttft, "itl": 30.0})


@pytest.fixture
def space(cpu: Hardware) -> Space:
    return build_space(SPEC, cpu)


def study(space: Space, storage: str | None, name: str = "s") -> optuna.Study:
    return tpe_study(space, storage, name)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_storages_open_and_reopen(tmp_path: Path, kind: str, space: Space) -> None:
    url = {
        "memory": None,
        "sqlite": f"sqlite:///{tmp_path}/s.db",
        "journal": f"journal://{tmp_path}/j.log",
    }[kind]
    s = study(space, url)
    run_study(s, space, SPEC, landscape, max_trials=3, max_seconds=60)
    assert len(counted(s)) == 3
    if url is not None:
        again = study(space, url)
        assert len(again.trials) == len(s.trials)


def test_bad_storage_url_names_the_choices() -> None:
    with pytest.raises(ValueError, match="sqlite:///PATH"):
        storage_for("redis://x")


def test_budget_is_spent_on_distinct_measurements(space: Space) -> None:
    s = study(space, None)
    calls: list[Candidate] = []

    def counting(c: Candidate, report: ReportFn) -> Evaluation:
        calls.append(c)
        return landscape(c, report)

    run_study(s, space, SPEC, counting, max_trials=8, max_seconds=60)
    assert len(calls) == len(set(calls)) == len(counted(s)) == 8
    best = max((t for t in s.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0])
    assert best.user_attrs["config"]["max_num_seqs"] >= 4


def test_infeasible_trials_are_constrained(space: Space) -> None:
    s = study(space, None)
    run_study(s, space, SPEC, landscape, max_trials=6, max_seconds=60)
    for t in s.trials:
        ttft_violation = t.user_attrs["constraints"][0]
        assert (ttft_violation > 0) == (t.user_attrs["config"]["max_num_seqs"] == 1)


def test_seeds_are_enqueued_once_and_run_first(tmp_path: Path, space: Space) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    seed = Candidate("builtin", "int8", 16, 512, 16, False)
    s = study(space, url)
    assert enqueue_seeds(s, space, [seed]) == 1
    run_study(s, space, SPEC, landscape, max_trials=2, max_seconds=60)
    assert s.trials[0].user_attrs["config"] == seed.to_dict()
    assert enqueue_seeds(study(space, url), space, [seed]) == 0  # a resumed study is not reseeded


def test_planned_seeds_run_first_and_see_what_was_measured(space: Space) -> None:
    # The seed planner is asked before each trial while nothing is waiting; it sees the figures
    # measured so far and returns None when it has no more seeds.
    plan = [
        Candidate("builtin", "int8", 16, 512, 16, False),
        Candidate("builtin", "fp32", 4, 128, 16, False),
    ]
    seen: list[set[Candidate]] = []

    def plan_next(measured: dict[Candidate, dict[str, float]]) -> Candidate | None:
        seen.append(set(measured))
        assert all("goodputRps" in f for f in measured.values())
        return plan.pop(0) if plan else None

    s = study(space, None)
    run_study(s, space, SPEC, landscape, max_trials=4, max_seconds=60, plan_next=plan_next)
    configs = [t.user_attrs["config"] for t in s.trials]
    assert configs[0] == Candidate("builtin", "int8", 16, 512, 16, False).to_dict()
    assert configs[1] == Candidate("builtin", "fp32", 4, 128, 16, False).to_dict()
    assert seen[0] == set() and len(seen[1]) == 1 and len(counted(s)) == 4


def test_stale_running_trial_is_failed_and_retried(tmp_path: Path, space: Space) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    s = study(space, url)
    run_study(s, space, SPEC, landscape, max_trials=2, max_seconds=60)
    dead = s.ask()  # a worker that asked for a trial, started measuring it, and died
    suggest(dead, space)
    dead.set_user_attr(HEARTBEAT_ATTR, time.time() - 3600)
    resumed = study(space, url)
    assert fail_stale(resumed) == [dead.number]
    frozen = resumed.trials[dead.number]
    assert frozen.state == TrialState.FAIL and frozen.user_attrs[STALE_ATTR]
    run_study(resumed, space, SPEC, landscape, max_trials=5, max_seconds=60)
    assert len(counted(resumed)) == 5  # the stale trial did not spend the budget
    retried = [t for t in resumed.trials if t.user_attrs.get("retry_of") == dead.number]
    assert len(retried) == 1 and retried[0].params == frozen.params
