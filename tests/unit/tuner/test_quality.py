"""The quality guard on the real tiny model: the reference agrees with itself; int4 is measurably off."""

from __future__ import annotations

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import QualityGuard
from infertune.tuner.quality import compare, judge


def test_quality_against_reference() -> None:
    guard = QualityGuard(
        reference="fp32",
        min_top1_agreement=0.999,
        prompts=["Hello there", "The model"],
        eval_tokens=6,
    )
    out = compare(ensure_model("tiny"), "fp32", ["fp32", "bf16", "int4"], guard)
    assert out["fp32"].top1_agreement == 1.0 and out["fp32"].passed
    assert out["int4"].kl_divergence > out["bf16"].kl_divergence > 0.0
    assert 0.0 <= out["int4"].top1_agreement <= 1.0
    assert out["int4"].tokens == 12


def test_judge_names_the_threshold() -> None:
    r = judge(
        "int4",
        "bf16",
        0.7,
        0.2,
        8,
        256,
        QualityGuard(min_top1_agreement=0.9, max_kl_divergence=0.1),
    )
    assert not r.passed
    assert "minTop1Agreement 0.9" in (r.reason or "") and "maxKlDivergence 0.1" in (r.reason or "")
