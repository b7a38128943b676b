"""What a tuning run reports as its trials, and its progress line: only trials that ran count
(not a warm-start seed nor a dead worker's retry left WAITING, not transferred prior trials), and
the progress line shows the whole budget with the phase (exploring, then racing). Real Optuna
studies on SQLite files and in memory, as a tuning run uses them."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from study_helpers import builtin_search, tpe_study

from infertune.tuner.api import TuningSpec
from infertune.tuner.campaign import run_campaign
from infertune.tuner.candidate import Candidate
from infertune.tuner.cli import Progress
from infertune.tuner.hardware import Hardware
from infertune.tuner.racing import explore_then_race
from infertune.tuner.result import TuningResult
from infertune.tuner.search import Evaluation, ReportFn
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import (
    DUPLICATE_ATTR,
    HEARTBEAT_ATTR,
    counted,
    fail_stale,
    suggest,
)
from infertune.tuner.tune import trial_records

optuna.logging.set_verbosity(optuna.logging.WARNING)


def spec(rate: float = 4.0) -> TuningSpec:
    return TuningSpec.model_validate(
        {
            "model": {"uri": "builtin://tiny"},
            "slo": {"ttft": {"max": "500ms"}},
            "traffic": {"rate": rate, "numRequests": 20},
            "search": builtin_search([2, 4, 8, 16], seed=1),
        }
    )


def landscape(c: Candidate, report: ReportFn) -> Evaluation:
    value = c.max_num_seqs * (2.0 if c.quantization == "int8" else 1.0)
    value += c.max_num_batched_tokens / 512
    return Evaluation(c, "ok", {"goodputRps": value, "ttftP95Ms": 200.0}, {"ttft": 300.0})


def study_in(storage: str | None, space: Space, name: str) -> optuna.Study:
    return tpe_study(space, storage, name)


def result_of(study: optuna.Study, s: TuningSpec, budget: int) -> TuningResult:
    return TuningResult(study=study.study_name, status="succeeded", reason="", hardware={},
                        objective="goodput", slo=s.slo.to_wire(),
                        trials=trial_records(study, s), trials_total=budget)  # fmt: skip


def test_warm_start_seeds_left_waiting_and_transferred_trials_are_not_trials_of_the_run(
    cpu: Hardware, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    first = spec(rate=4.0)
    space = build_space(first, cpu)
    run_campaign(study_in(storage, space, "svc-run1"), space, first, landscape,
                 hardware="Test CPU", max_trials=8, max_seconds=120, log=lambda _: None)  # fmt: skip
    retune = spec(rate=4.0)  # same context: weight 1, the most seeds enqueued
    study = study_in(storage, space, "svc-run2")
    out = run_campaign(study, space, retune, landscape, hardware="Test CPU", max_trials=2,
                       max_seconds=120, log=lambda _: None)  # fmt: skip
    waiting = study.get_trials(states=(TrialState.WAITING,))
    # The situation of the report "7 of 6": more seeds enqueued than the budget ran.
    assert len(out.warm.enqueued) > 2 and waiting, out.warm
    transferred = {t.number for t in study.trials if t.user_attrs.get(DUPLICATE_ATTR)}
    assert len(transferred) >= out.warm.transferred > 0
    records = trial_records(study, retune)
    numbers = {r.number for r in records}
    assert len(records) == 2 == len(counted(study))
    assert not numbers & ({t.number for t in waiting} | transferred)
    assert all(r.outcome == "ok" for r in records)
    assert result_of(study, retune, 2).trials_completed == 2


def test_a_dead_workers_retry_nobody_took_is_not_counted(cpu: Hardware) -> None:
    s = spec()
    space = build_space(s, cpu)
    study = study_in(None, space, "retry")
    for _ in range(2):
        t = study.ask()
        study.tell(t, 1.0)  # measured (no figures: reported as plain completed trials)
    dead = study.ask()
    suggest(dead, space)
    dead.set_user_attr(HEARTBEAT_ATTR, time.time() - 100)
    assert fail_stale(study, 10) == [dead.number]  # its configuration re-enqueued, WAITING
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1
    records = trial_records(study, s)
    assert [r.outcome for r in records] == ["complete", "complete", "failed-stale"]
    result = result_of(study, s, 3)
    assert result.trials_completed == 2 == len(counted(study))


def test_progress_shows_the_whole_budget_and_the_phase(cpu: Hardware) -> None:
    s = spec()
    space = build_space(s, cpu)
    lines: list[tuple[int, int, str]] = []

    def progress(
        done: int, total: int, ev: Evaluation, best: float | None, phase: str = "?"
    ) -> None:
        lines.append((done, total, phase))

    explore_then_race(study_in(None, space, "progress"), space, s, landscape, max_trials=10,
                      max_seconds=60, progress=progress)  # fmt: skip
    assert {total for _, total, _ in lines} == {10}, lines
    phases = [phase for _, _, phase in lines]
    # Exploring first (10 less the race's 4), then racing; the count runs up to the budget.
    assert phases[:6] == ["exploring"] * 6 and "racing" in phases[6:], lines
    assert [done for done, _, _ in lines] == sorted(done for done, _, _ in lines)
    assert lines[-1][0] <= 10


@pytest.mark.parametrize(("phase", "shown"), [("exploring", "trial 6/10 (exploring)"),
                                              ("racing", "trial 8/10 (racing)")])  # fmt: skip
def test_the_progress_line_names_the_phase(
    phase: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = landscape(Candidate("builtin", "int8", 8, 512, 16, False), lambda step, value: False)
    done = int(shown.split()[1].split("/")[0])
    Progress(quiet=False)(done, 10, ev, 17.0, phase)
    assert shown in capsys.readouterr().out
