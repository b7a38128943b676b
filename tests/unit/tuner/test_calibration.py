"""Calibration through the engine under test's API (the built-in engine on the real tiny model):
TTFT at a few prompt lengths and the decode step at a few batch sizes become that engine's step
model and its phases against the roofline, with no weights loaded in the tuner."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune.tuner.api import TuningSpec
from infertune.tuner.calibration import ApiTimings, EngineCalibrator, measure, plan, profile_of
from infertune.tuner.candidate import Candidate
from infertune.tuner.ceilings import load_or_measure
from infertune.tuner.hardware import discover, gpu_spec
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.models import resolve_model
from infertune.tuner.roofline import datasheet_ceilings, decode_floor, prefill_floor
from infertune.tuner.trial import TrialRunner

BOUNDS = {"compute", "memory", "launch"}


def test_an_engine_is_calibrated_through_its_api(tmp_path: Path) -> None:
    spec = TuningSpec.model_validate(
        {
            "model": {"uri": "builtin://tiny"},
            "slo": {"ttft": {"max": "5s"}},
            "traffic": {"rate": 1, "numRequests": 4, "promptTokens": {"mean": 64}},
            "search": {"engines": ["builtin"], "quantizations": ["fp32"]},
        }
    )
    hardware = discover(use_gpu=False)
    model = resolve_model(spec.model)
    shape = ModelShape.from_dir(model)
    ceilings = load_or_measure(hardware, {"fp32"})
    runner = TrialRunner(spec, model, tmp_path, hardware)
    config = Candidate("builtin", "fp32", 4, 512, 16, False)
    try:
        url, name = runner.serve(config)
        lengths, batches = plan(config.max_num_seqs, 64, None)
        assert lengths == [16, 64, 128] and batches == [1, 4]
        t = measure(
            url, name, "builtin", "fp32", vocab=shape.vocab_size, prompt_lengths=[16, 128],
            batches=[1, 4],
        )  # fmt: skip
        assert set(t.ttft_ms) == {16, 128} and set(t.step_ms) == {1, 4}
        assert all(ms > 0 for ms in [*t.ttft_ms.values(), *t.step_ms.values()])
        p = profile_of(t, shape, ceilings)
        assert p.step_model.fixed_ms >= 0 and p.step_model.per_token_ms >= 0
        for phase in (p.prefill, p.decode, p.decode_batched):
            assert phase.bound in BOUNDS and 0 < (phase.percent_of_roofline or 0) <= 100
            assert phase.floor_ms > 0 and phase.launch_ms is not None
        assert p.prefill.tokens == 128 and p.decode_batched.tokens == 4

        # The calibrator files it under its engine; the planner then predicts from it.
        profile = ModelProfile(ceilings.hardware, ceilings, "fp32")
        calibrate = EngineCalibrator(spec, profile, shape, vocab=shape.vocab_size, log=print)
        calibrate(config, url, name)
        calibrate(config, url, name)  # once per (engine, precision)
        assert list(calibrate.timings) == [("builtin", "fp32")]
        measured = profile.engines["builtin"]["fp32"]
        assert profile.step_model("fp32", "builtin") == measured.step_model
        assert profile.to_wire()["decode"]["bound"] == measured.decode.bound
        assert ModelProfile.from_dict(profile.to_dict()).engines == profile.engines
    finally:
        runner.close()


CONFIGS = Path(__file__).parents[2] / "data" / "model_configs"
REAL = ["llama-3.1-8b", "qwen3-8b", "gemma-2-9b", "phi-3-mini-4k", "mixtral-8x7b"]


@pytest.mark.parametrize("name", REAL)
def test_api_timings_of_real_models_classify_each_phase(name: str) -> None:
    """From config.json alone (no weights) and what an engine's API answered: an engine whose
    decode step tracks the weight-reading floor is memory-bound; one that adds a fixed 20 ms to
    every step is launch (overhead) bound, and its share of the roofline says how far off."""
    shape = ModelShape.from_dir(CONFIGS / name)
    gpu = gpu_spec("H100-80GB")
    assert gpu is not None
    ceilings = datasheet_ceilings(gpu)

    def timings(overhead_ms: float) -> ApiTimings:
        t = ApiTimings("vllm", "bf16", context=512)
        for n in (128, 512, 2048):
            t.ttft_ms[n] = 1.3 * prefill_floor(shape, ceilings, "bf16", n).floor_ms + overhead_ms
        for b in (1, 4, 16):
            t.step_ms[b] = (
                1.3 * decode_floor(shape, ceilings, "bf16", b, 512).floor_ms + overhead_ms
            )
        return t

    lean = profile_of(timings(0.0), shape, ceilings)
    assert lean.decode.bound == "memory" and lean.decode.percent_of_roofline == pytest.approx(
        100 / 1.3, rel=0.02
    )
    assert lean.prefill.bound == "compute"  # 2048 tokens: FLOPs, not bytes
    slow = profile_of(timings(20.0), shape, ceilings)
    assert slow.decode.bound == "launch" and (slow.decode.percent_of_roofline or 100) < 40
    assert slow.step_model.fixed_ms > lean.step_model.fixed_ms + 15
