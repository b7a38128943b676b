"""The compact summary is exactly the operator's schema, fits a termination message, and reads back."""

from __future__ import annotations

import json

from infertune.operator.api.status import Figures, Profile, ServingConfig
from infertune.tuner.api import SLO
from infertune.tuner.result import (
    SUMMARY_LIMIT,
    TrialRecord,
    TuningResult,
    binding_constraint,
    compact_summary,
    summary_json,
)

CONFIG = {
    "engine": "builtin", "quantization": "int8", "max_num_seqs": 16,
    "max_num_batched_tokens": 512, "kv_block_size": 16, "cuda_graph": False,
}  # fmt: skip
FIGURES = {
    "ttftP50Ms": 80.0, "ttftP95Ms": 210.0, "ttftP99Ms": 260.0, "itlP50Ms": 9.0, "itlP95Ms": 20.0,
    "itlP99Ms": 30.0, "e2eP50Ms": 500.0, "e2eP95Ms": 900.0, "e2eP99Ms": 1000.0,
    "goodputRps": 7.5, "requestRate": 7.9, "outputTokensPerSecond": 250.0,
    "promptTokensMean": 80.0, "outputTokensMean": 32.0,
}  # fmt: skip
PROFILE = {
    "hardware": "CPU",
    "memoryBandwidthGbps": 12.0,
    "peakTflops": 0.1,
    "prefill": {
        "bound": "compute",
        "measuredMs": 8.0,
        "rooflineFloorMs": 2.0,
        "percentOfRoofline": 25.0,
    },
    "decode": {
        "bound": "launch",
        "measuredMs": 3.0,
        "rooflineFloorMs": 0.2,
        "percentOfRoofline": 6.7,
    },
}


def record(n: int, figures: dict[str, float], feasible: bool = True) -> TrialRecord:
    return TrialRecord(
        n, CONFIG, "ok", feasible, figures.get("goodputRps"), figures,
        {"ttft": 500 - figures["ttftP95Ms"], "itl": 60 - figures["itlP95Ms"]},
        constraints=[figures["ttftP95Ms"] / 500 - 1, figures["itlP95Ms"] / 60 - 1],
    )  # fmt: skip


def result(**kw: object) -> TuningResult:
    best = record(3, FIGURES)
    base = dict(
        study="ns-name-abcdef12", status="succeeded", reason="best of 4", trials=[best],
        hardware={"kind": "gpu", "product": "NVIDIA H100 80GB HBM3"}, objective="goodput",
        slo={}, trials_total=10, best=best, profile_wire=PROFILE,
    )  # fmt: skip
    base.update(kw)
    return TuningResult(**base)  # type: ignore[arg-type]


def test_summary_keys_and_operator_models() -> None:
    s = compact_summary(result())
    assert set(s) == {
        "version", "status", "reason", "study", "trialsCompleted", "trialsTotal", "hardware",
        "gpuProduct", "gpuMemoryMib", "best", "bindingConstraint", "profile",
    }  # fmt: skip
    assert s["version"] == 1 and s["status"] == "succeeded" and s["gpuProduct"].startswith("NVIDIA")
    assert s["best"]["measured"] == FIGURES  # the contract's keys, e2eP50Ms included
    # Every key of the contract, e2eP50Ms included, validates against the operator's status models.
    best = ServingConfig.model_validate(s["best"])
    assert best.quantization == "int8" and best.max_num_seqs == 16
    assert best.measured is not None and best.measured.ttft_p95_ms == FIGURES["ttftP95Ms"]
    assert isinstance(best.measured, Figures)
    assert best.slo_margins_ms == {"ttft": 290.0, "itl": 40.0}
    assert Profile.model_validate(s["profile"]).decode.bound == "launch"  # type: ignore[union-attr]


def test_summary_fits_a_termination_message_even_with_a_huge_reason() -> None:
    text = summary_json(result(reason="x" * 20_000, status="infeasible"))
    assert len(text.encode()) <= SUMMARY_LIMIT
    assert json.loads(text)["status"] == "infeasible"


def test_cpu_result_has_no_gpu_product() -> None:
    s = compact_summary(result(hardware={"kind": "cpu", "product": "AMD EPYC"}))
    assert s["gpuProduct"] is None and s["hardware"] == "AMD EPYC"


def test_binding_constraint_names_the_metric_and_best_achieved() -> None:
    slo = SLO.model_validate({"ttft": {"max": "300ms"}, "itl": {"max": "60ms"}})
    slow = [record(i, {**FIGURES, "ttftP95Ms": 412.0 + 50 * i}) for i in range(3)]
    assert binding_constraint(slow, slo) == "ttft p95 <= 300ms: best achieved 412ms"
