"""The quality guard on a real model (SmolLM2-135M-Instruct) through the built-in engine's API: a
spec with a tight perplexity bound makes int4 infeasible before any load test, with the measured
figures in the reason, while int8 passes the same bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import discover
from infertune.tuner.models import resolve_model
from infertune.tuner.quality_guard import EngineQuality
from infertune.tuner.trial import TrialRunner
from infertune.tuner.tune import make_evaluator

pytestmark = pytest.mark.slow


def test_a_tight_bound_rejects_int4_with_its_figures(tmp_path: Path) -> None:
    spec = TuningSpec.model_validate(
        {
            "model": {"uri": "builtin://smollm2-135m-instruct"},
            "slo": {"ttft": {"max": "10s"}},
            "traffic": {"rate": 1, "numRequests": 2},
            "search": {"engines": ["builtin"], "quantizations": ["fp32", "int8", "int4"]},
            "quality": {
                "reference": "fp32",
                "minTop1Agreement": 0.8,
                "maxPerplexityIncrease": 0.05,
                "evalTokens": 16,
            },
        }
    )
    model = resolve_model(spec.model)
    runner = TrialRunner(spec, model, tmp_path, discover(use_gpu=False))
    guard = EngineQuality(spec, model, runner.serve, log=print)
    evaluate = make_evaluator(spec, runner, guard)
    try:
        int4 = evaluate(Candidate("builtin", "int4", 4, 512, 16, False), lambda *_: False)
        int8 = guard.get(Candidate("builtin", "int8", 4, 512, 16, False))
    finally:
        runner.close()
    assert int4.outcome == "infeasible-quality" and int4.quality_shortfall > 0
    figures = guard.results["builtin/int4"]
    reason = int4.reason or ""
    assert "maxPerplexityIncrease 0.05" in reason and "int4 vs fp32 on builtin" in reason
    assert f"perplexity {figures.perplexity:.2f} vs {figures.reference_perplexity:.2f}" in reason
    assert f"top-1 agreement {figures.top1_agreement:.3f}" in reason
    # Measured here: int4 (group 64) +51% perplexity, int8 +0.8%, on the ~560-token text.
    assert (figures.perplexity_increase or 0) > 0.2
    assert int8 is not None and int8.passed, int8
