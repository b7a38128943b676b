"""The quality guard, measured through the serving engine's OpenAI API (the built-in engine on the
real tiny model here; llama-server when installed), and its arithmetic."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from infertune.tuner import quality_guard
from infertune.tuner.api import QualityGuard, TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.llamacpp import tool
from infertune.tuner.hardware import discover
from infertune.tuner.models import resolve_model
from infertune.tuner.quality import heldout_text, judge, kl_topk, shortfall
from infertune.tuner.quality_guard import EngineQuality
from infertune.tuner.trial import TrialRunner


def guard_spec(model: str, engine: str, **quality: object) -> TuningSpec:
    return TuningSpec.model_validate(
        {
            "model": {"uri": model},
            "slo": {"ttft": {"max": "5s"}},
            "traffic": {"rate": 1, "numRequests": 4},
            "search": {"engines": [engine], "quantizations": ["fp32", "bf16", "int8", "int4"]},
            "quality": {
                "reference": "fp32",
                "prompts": ["Hello there", "The model"],
                "evalTokens": 6,
                **quality,
            },
        }
    )


def measure(spec: TuningSpec, engine: str, quants: list[str], workdir: Path) -> EngineQuality:
    model = resolve_model(spec.model)
    runner = TrialRunner(spec, model, workdir, discover(use_gpu=False))
    guard = EngineQuality(spec, model, runner.serve, log=lambda _: None)
    try:
        for q in quants:
            guard.get(Candidate(engine, q, 4, 512, 16, False))
    finally:
        runner.close()
    return guard


@pytest.fixture
def short_text(monkeypatch: pytest.MonkeyPatch) -> int:
    """The held-out text's first 128 tokens (the whole text is ~800 on the tiny tokenizer)."""
    monkeypatch.setattr(quality_guard, "HELDOUT_TOKENS", 128)
    return 128


def test_the_builtin_engines_api_measures_each_precision_against_fp32(
    tmp_path: Path, short_text: int
) -> None:
    spec = guard_spec("builtin://tiny", "builtin", minTop1Agreement=0.5, maxKlDivergence=0.001)
    guard = measure(spec, "builtin", ["fp32", "bf16", "int4"], tmp_path)
    assert guard.get(Candidate("builtin", "fp32", 4, 512, 16, False)) is None  # the reference
    bf16, int4 = guard.results["builtin/bf16"], guard.results["builtin/int4"]
    assert bf16.method == "echo" and bf16.tokens == 12 and bf16.reference == "fp32"
    assert 0.0 < bf16.kl_divergence < int4.kl_divergence  # int4 measurably further off
    assert bf16.passed and not int4.passed
    # The figures are in the reason, and the perplexity on the held-out text is measured.
    assert int4.reason is not None and "maxKlDivergence 0.001" in int4.reason
    assert f"KL {int4.kl_divergence:.4f}" in int4.reason and "perplexity" in int4.reason
    assert int4.perplexity_tokens == short_text - 1 and int4.reference_perplexity is not None


@pytest.mark.skipif(tool("llama-server") is None, reason="llama-server not installed")
def test_llama_server_is_scored_stepwise_with_the_forced_token(
    tmp_path: Path, short_text: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server ignores echo: each position is asked on its own, forcing the next token."""
    # One thread: on a shared, busy CPU llama.cpp's spinning thread barrier made each one-token
    # request ~20x slower with two (measured here, load average 25 on 2 cores).
    monkeypatch.setenv("LLAMA_ARG_THREADS", "1")
    spec = guard_spec("builtin://tiny", "llamacpp", minTop1Agreement=0.0)
    guard = measure(spec, "llamacpp", ["int8"], tmp_path)
    r = guard.results["llamacpp/int8"]
    assert r.method == "stepwise" and r.tokens == 12
    assert 0.0 < r.kl_divergence < 0.5 and r.passed
    assert r.perplexity is not None and r.reference_perplexity is not None


def test_kl_from_top_k_is_zero_for_equal_and_grows_with_the_gap() -> None:
    ref = {1: math.log(0.6), 2: math.log(0.3), 3: math.log(0.05)}
    assert kl_topk(ref, ref) == pytest.approx(0.0, abs=1e-12)
    near = {1: math.log(0.55), 2: math.log(0.35), 3: math.log(0.05)}
    far = {1: math.log(0.2), 2: math.log(0.7), 3: math.log(0.05)}
    assert 0.0 < kl_topk(ref, near) < kl_topk(ref, far)
    # A reference token the candidate's top-k lacks takes the candidate's k-th log-probability.
    assert kl_topk(ref, {1: math.log(0.6), 2: math.log(0.3)}) == pytest.approx(
        kl_topk(ref, {1: math.log(0.6), 2: math.log(0.3), 3: math.log(0.3)})
    )


def test_judge_names_every_bound_missed_with_the_figures() -> None:
    guard = QualityGuard(
        min_top1_agreement=0.9, max_kl_divergence=0.1, max_perplexity_increase=0.05
    )
    r = judge("int4", "bf16", 0.7, 0.2, 8, 256, guard, perplexity=21.2, reference_perplexity=16.85)
    assert not r.passed and r.reason is not None
    assert "minTop1Agreement 0.9" in r.reason and "maxKlDivergence 0.1" in r.reason
    assert "perplexity +25.8% > maxPerplexityIncrease 0.05" in r.reason
    assert "21.20 vs 16.85" in r.reason
    assert shortfall(r, guard) == pytest.approx(1.0)  # KL at twice its bound is the worst
    ok = judge(
        "int8", "bf16", 0.95, 0.01, 8, 256, guard, perplexity=17.0, reference_perplexity=16.85
    )
    assert ok.passed and ok.reason is None


def test_the_heldout_text_ships_with_the_package() -> None:
    assert len(heldout_text().split()) > 300


def test_the_guard_and_the_calibration_load_no_model_code() -> None:
    """A vLLM-only study never loads weights in the tuner: the guard and the calibration do not
    even import torch or the built-in engine's runner."""
    code = (
        "import sys, infertune.tuner.quality_guard, infertune.tuner.calibration; "
        "print(sorted(m for m in ('torch', 'infertune.engine.runner') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_engine_that_cannot_serve_is_noted_not_fatal(tmp_path: Path) -> None:
    """No reference the engine can start (CUDA graphs on a CPU): the candidate is not judged, the
    note says why, and its trial then reports what the engine does."""
    spec = guard_spec("builtin://tiny", "builtin")
    model = resolve_model(spec.model)
    runner = TrialRunner(spec, model, tmp_path, discover(use_gpu=False))
    guard = EngineQuality(spec, model, runner.serve, log=lambda _: None)
    try:
        assert guard.get(Candidate("builtin", "int4", 4, 512, 16, True)) is None
    finally:
        runner.close()
    note = guard.notes["builtin/int4"]
    assert note.startswith("not measured: no reference precision served on builtin")
    assert "fp32:" in note and "CUDA" in note
