"""Warm-started retunes (warm_start.py, campaign.py) on a real SQLite study storage: a second study
of the same model finds the first, enqueues its best, transfers a share of its trials weighted by
how far the traffic moved, never counts or reports them as its own, and says how many it used."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from study_helpers import builtin_search, tpe_study

from infertune.operator.summary import parse_summary
from infertune.tuner.api import TuningSpec
from infertune.tuner.campaign import apply, run_campaign
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.racing import standings
from infertune.tuner.result import TuningResult, compact_summary
from infertune.tuner.search import Evaluation, ReportFn
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import DUPLICATE_ATTR, SEED_ATTR, counted, open_study
from infertune.tuner.tune import trial_records
from infertune.tuner.warm_start import (
    TRANSFERRED_ATTR,
    Context,
    find_priors,
    seed_study,
    warm_key,
    weight,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def spec(rate: float = 4.0, prompt: int = 128, model: str = "builtin://tiny") -> TuningSpec:
    return TuningSpec.model_validate(
        {
            "model": {"uri": model},
            "slo": {"ttft": {"max": "500ms"}},
            "traffic": {"rate": rate, "numRequests": 20, "promptTokens": {"mean": prompt}},
            "search": builtin_search([2, 4, 8, 16], seed=1),
        }
    )


def landscape(c: Candidate, report: ReportFn) -> Evaluation:
    """int8 with many sequences is best; fp32 seqs=2 misses TTFT."""
    value = (
        c.max_num_seqs * (2.0 if c.quantization == "int8" else 1.0) + c.max_num_batched_tokens / 512
    )
    ttft = 900.0 if (c.quantization, c.max_num_seqs) == ("fp32", 2) else 200.0
    figures = {"goodputRps": value, "ttftP95Ms": ttft}
    return Evaluation(c, "ok", figures, {"ttft": 500 - ttft})


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/studies.db"


def campaign(space: Space, s: TuningSpec, storage: str, name: str, trials: int):
    study = tpe_study(space, storage, name, startup_trials=4)
    out = run_campaign(study, space, s, landscape, hardware="Test CPU", max_trials=trials,
                       max_seconds=120, log=lambda _: None)  # fmt: skip
    return study, out


def test_weight_falls_with_distance() -> None:
    here = Context(4.0, 128, 64, "A")
    assert weight(here, here) == 1.0
    assert weight(here, Context(8.0, 128, 64, "A")) == pytest.approx(0.5)  # exp(-ln 2)
    assert weight(here, Context(4.0, 128, 64, "B")) == pytest.approx(0.3679, abs=1e-3)
    assert weight(here, Context(16.0, 512, 64, "B")) < weight(here, Context(8.0, 128, 64, "A"))


def test_a_retune_starts_from_the_previous_study(cpu: Hardware, storage: str) -> None:
    first_spec = spec(rate=4.0)
    space = build_space(first_spec, cpu)
    first, _ = campaign(space, first_spec, storage, "svc-run1", 12)
    prior_best = standings(first, first_spec)[0].config

    retune = spec(rate=8.0)  # traffic doubled: weight exp(-ln 2) = 0.5
    study, out = campaign(build_space(retune, cpu), retune, storage, "svc-run2", 10)
    warm = out.warm
    assert warm.studies == ["svc-run1"] and warm.weights == [pytest.approx(0.5)]
    # The prior's best is measured first, here, as a seed.
    first_trial = min(
        (t for t in study.trials if not t.user_attrs.get(DUPLICATE_ATTR)), key=lambda t: t.number
    )
    assert first_trial.user_attrs.get(SEED_ATTR) and warm.enqueued[0] == prior_best
    assert Candidate.from_dict(first_trial.user_attrs["config"]) == prior_best
    transferred = [t for t in study.trials if t.user_attrs.get(TRANSFERRED_ATTR)]
    assert len(transferred) == warm.transferred
    measured_before = len([t for t in first.trials if not t.user_attrs.get(DUPLICATE_ATTR)])
    # Half the prior's distinct configurations (weight 0.5), rescaled by the rate ratio.
    assert 3 <= warm.transferred < measured_before
    assert all(t.user_attrs.get(DUPLICATE_ATTR) for t in transferred)
    # Transferred trials spend no budget and are not reported as this run's trials.
    assert len(counted(study)) == 10
    assert all(
        r.number not in {t.number for t in transferred} for r in trial_records(study, retune)
    )
    assert warm.prior_trials == warm.transferred + len(warm.enqueued)


def test_a_far_context_transfers_less(cpu: Hardware, storage: str) -> None:
    first_spec = spec(rate=4.0)
    space = build_space(first_spec, cpu)
    campaign(space, first_spec, storage, "svc-run1", 12)
    counts = {}
    for name, s in (("near", spec(rate=4.0)), ("far", spec(rate=32.0, prompt=1024))):
        study = open_study(
            name, storage, optuna.samplers.RandomSampler(seed=0), multi_objective=False
        )
        priors = find_priors(study._storage, warm_key(s, space), name, s)
        here = Context.of(s, "Test CPU")
        counts[name] = seed_study(study, space, s, here, priors)
    assert counts["near"].transferred > counts["far"].transferred >= 3
    assert len(counts["near"].enqueued) > len(counts["far"].enqueued) >= 1


def test_other_models_are_not_priors(cpu: Hardware, storage: str) -> None:
    first_spec = spec(model="builtin://tiny")
    campaign(build_space(first_spec, cpu), first_spec, storage, "a-run1", 8)
    other = spec(model="hf://org/other")
    _, out = campaign(build_space(other, cpu), other, storage, "b-run1", 8)
    assert out.warm.prior_trials == 0 and out.warm.studies == []


def test_status_says_how_many_prior_trials_it_used(cpu: Hardware, storage: str) -> None:
    first_spec = spec(rate=4.0)
    space = build_space(first_spec, cpu)
    campaign(space, first_spec, storage, "svc-run1", 10)
    retune = spec(rate=6.0)
    study, out = campaign(space, retune, storage, "svc-run2", 10)
    records = trial_records(study, retune)
    result = TuningResult(study="svc-run2", status="succeeded", reason="", hardware={},
                          objective="goodput", slo=retune.slo.to_wire(), trials=records,
                          trials_total=10)  # fmt: skip
    result.best = max((r for r in records if r.feasible), key=lambda r: r.objective or 0)
    apply(result, out)
    summary = parse_summary(json.dumps(compact_summary(result)))
    assert not isinstance(summary, str), summary
    assert summary.warm_start is not None
    assert summary.warm_start.prior_trials == out.warm.prior_trials > 0
    advantage = summary.advantage()
    assert advantage is not None and advantage.remeasured >= 2
    assert summary.best is not None and out.race is not None
    assert summary.best.candidate() == out.race.winner
