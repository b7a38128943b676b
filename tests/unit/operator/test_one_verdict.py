"""One SLO verdict and one goodput: the trial, the search, the live check (and so the canary) agree
on the same percentiles, and the live monitor's goodput is the tuner's goodput of the same requests,
so `beats_live` compares like with like."""

from __future__ import annotations

import random

import pytest
from fake_engine_metrics import FakeEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from infertune.operator.api import Figures, ServingConfig
from infertune.operator.drift import beats_live, slo_check
from infertune.operator.histograms import parse_exposition
from infertune.operator.monitor import Window, summarise
from infertune.tuner.api import SLO, TuningSpec
from infertune.tuner.api.base import PERCENTILES, to_camel
from infertune.tuner.api.slo import SLO_METRICS
from infertune.tuner.candidate import Candidate
from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.loadgen.stats import summarize
from infertune.tuner.search import Evaluation
from infertune.tuner.trial import FIGURE_KEYS, slo_margins
from infertune.tuner.verdict import figure_key

BOUND_MS = st.sampled_from([20.0, 50.0, 300.0, 1000.0])
VALUE_MS = st.one_of(st.none(), st.floats(1.0, 2000.0, allow_nan=False))


@st.composite
def slo_and_values(draw: st.DrawFn) -> tuple[SLO, dict[str, float | None]]:
    metrics = draw(st.lists(st.sampled_from(SLO_METRICS), min_size=1, max_size=3, unique=True))
    raw = {m: {"max": f"{draw(BOUND_MS):g}ms", "percentile": draw(st.sampled_from(list(PERCENTILES)))} for m in metrics}  # fmt: skip
    return SLO.model_validate(raw), {m: draw(VALUE_MS) for m in SLO_METRICS}


@settings(max_examples=200, deadline=None)
@given(slo_and_values())
def test_the_trial_the_search_and_the_live_check_give_one_verdict(
    case: tuple[SLO, dict[str, float | None]],
) -> None:
    slo, values = case
    # The same percentiles, as a trial reports them and as the live check reads them.
    figures = {
        figure_key(m, o.percentile): v
        for m, o in slo.bounds().items()
        if (v := values[m]) is not None
    }
    at_percentile = {m: values[m] for m in slo.bounds()}
    live_met, violating = slo_check(slo, at_percentile)
    _, trial_met = slo_margins(figures, slo)
    spec = TuningSpec.model_validate({"model": {"uri": "builtin://tiny"}, "slo": slo.to_wire()})
    evaluation = Evaluation(Candidate("builtin", "fp32", 4, 256, 16, False), "ok", figures)
    measured_all = all(values[m] is not None for m in slo.bounds())
    if live_met is None:  # nothing measured: the live check waits, a trial has failed
        assert not any(trial_met.values()) and not evaluation.feasible(spec)
        return
    # Where every bound was measured the three agree exactly; a trial missing a bound has missed it.
    assert all(trial_met.values()) == (live_met and measured_all)
    assert evaluation.feasible(spec) == (live_met and measured_all)
    assert len(violating) == sum(1 for m in trial_met if values[m] is not None and not trial_met[m])


def test_every_percentile_the_api_accepts_is_a_reported_figure() -> None:
    # A p90 bound must be judged on a p90 figure (it once read a figure no trial reported).
    for metric in SLO_METRICS:
        for p in PERCENTILES:
            assert figure_key(metric, p) in FIGURE_KEYS
            assert f"{metric}_{p}_ms" in Figures.model_fields
            assert to_camel(f"{metric}_{p}_ms") == figure_key(metric, p)


def _requests(seed: int) -> list[tuple[float, list[float]]]:
    """(TTFT, gaps) of 400 requests: about half decode fast, half at a slow mean gap."""
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        slow = rng.random() < 0.5
        gap = rng.uniform(0.055, 0.09) if slow else rng.uniform(0.01, 0.045)
        # Gaps scatter around the mean: a per-gap reading and a per-request one differ.
        gaps = [max(0.001, gap * rng.uniform(0.5, 1.5)) for _ in range(rng.randint(8, 24))]
        out.append((rng.uniform(0.05, 0.5), gaps))
    return out


def _tuner_goodput(requests: list[tuple[float, list[float]]], slo: SLO, seconds: float) -> float:
    records = []
    for i, (ttft, gaps) in enumerate(requests):
        r = RequestRecord(i, 10, len(gaps) + 1, start=0.0)
        r.ttft, r.itl = ttft, gaps
        r.end = ttft + sum(gaps)
        r.output_tokens = r.chunks = len(gaps) + 1
        records.append(r)
    result = summarize(
        records, slo=slo, mode="poisson", rate=None, concurrency=None, started=0.0,
        finished=seconds, dispatch_end=seconds, in_flight=[], prompt_length_exact=True,
    )  # fmt: skip
    assert result.goodput is not None
    return result.goodput


def _live_goodput(requests: list[tuple[float, list[float]]], slo: SLO, seconds: float) -> float:
    # Buckets on the bounds, as an SRE sets them for the SLO they alert on.
    engine = FakeEngine(buckets=(0.01, 0.02, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0))
    start = parse_exposition(engine.text())
    for ttft, gaps in requests:
        engine.request(ttft=ttft, itl=gaps, prompt=10, output=len(gaps) + 1)
    end = parse_exposition(engine.text())
    window = Window(seconds=seconds, hists={n: end[n].minus(start[n]) for n in end})
    goodput = summarise(window, slo).figures.goodput_rps
    assert goodput is not None
    return goodput


@pytest.mark.parametrize(
    "bounds",
    [
        {"itl": {"max": "50ms"}},  # the live goodput once ignored an ITL bound altogether
        {"ttft": {"max": "300ms"}},
        {"e2e": {"max": "1s"}},
    ],
)
def test_the_live_goodput_is_the_tuners_goodput_of_the_same_requests(bounds: dict) -> None:
    slo = SLO.model_validate(bounds)
    requests = _requests(seed=3)
    tuner, live = _tuner_goodput(requests, slo, 20.0), _live_goodput(requests, slo, 20.0)
    assert 0 < tuner < 20.0  # some requests miss: the test can tell the definitions apart
    assert live == pytest.approx(tuner, rel=0.02)


def test_beats_live_compares_the_tuners_goodput_with_the_same_goodput_live() -> None:
    slo = SLO.model_validate({"itl": {"max": "50ms", "percentile": "p50"}})
    requests = _requests(seed=5)
    live_figures = Figures(goodput_rps=_live_goodput(requests, slo, 20.0))
    # The retune measured exactly what the live config serves: not a gain, whatever the ITL bound.
    same_again = ServingConfig.model_validate(
        {**Candidate("builtin", "int8", 8, 512, 16, False).to_dict(), "config_hash": "new",
         "measured": {"goodputRps": _tuner_goodput(requests, slo, 20.0), "itlP50Ms": 30.0}}
    )  # fmt: skip
    live = ServingConfig.model_validate(
        {**Candidate("builtin", "fp32", 8, 512, 16, False).to_dict(), "config_hash": "live"}
    )
    ok, why = beats_live(same_again, live, live_figures, [], slo, 0.05)
    assert not ok and "gain below" in why
