"""What the profiler found, torch-free: per precision, measured step times against roofline floors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infertune.tuner.roofline import Ceilings, StepModel


@dataclass
class PhaseResult:
    """One phase (prefill or decode) of one precision."""

    phase: str
    tokens: int  # tokens processed in the step (prompt length, or the decode batch)
    measured_ms: float
    floor_ms: float
    compute_floor_ms: float
    memory_floor_ms: float
    launch_ms: float | None  # operator count x per-operator overhead
    bound: str  # compute, memory, launch, unknown
    percent_of_roofline: float | None
    kernel_ms: dict[str, float] = field(default_factory=dict)  # gemm, attention, elementwise, other
    host_gap_ms: float | None = None
    operators: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The operator's PhaseProfile shape."""
        out: dict[str, Any] = {
            "bound": self.bound,
            "measuredMs": round(self.measured_ms, 4),
            "rooflineFloorMs": round(self.floor_ms, 4),
        }
        if self.percent_of_roofline is not None:
            out["percentOfRoofline"] = round(self.percent_of_roofline, 2)
        return out


@dataclass
class PrecisionProfile:
    quantization: str
    weight_bytes: int
    kv_bytes_per_token: int
    flops_per_token: int
    prefill: PhaseResult
    decode: PhaseResult  # batch 1
    decode_batched: PhaseResult  # the largest batch profiled
    step_model: StepModel


@dataclass
class ModelProfile:
    """Measured precisions (the built-in engine's profile) and, for every precision, the
    roofline's analytic step model from the model's shape alone (model_shape.py)."""

    hardware: str
    ceilings: Ceilings
    reference: str  # the precision the phases in the summary refer to
    precisions: dict[str, PrecisionProfile] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)  # ModelShape.to_dict()
    analytic: dict[str, StepModel] = field(default_factory=dict)  # from the floors, unmeasured
    memory_fit: list[str] = field(default_factory=list)  # MemoryFit.text() per engine/precision

    def step_model(self, quantization: str) -> StepModel | None:
        """The measured step model of a precision, else its analytic one, else None."""
        measured = self.precisions.get(quantization)
        return measured.step_model if measured else self.analytic.get(quantization)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ceilings"] = self.ceilings.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelProfile:
        def phase(p: dict[str, Any]) -> PhaseResult:
            return PhaseResult(**p)

        precisions = {
            q: PrecisionProfile(
                quantization=p["quantization"],
                weight_bytes=int(p["weight_bytes"]),
                kv_bytes_per_token=int(p["kv_bytes_per_token"]),
                flops_per_token=int(p["flops_per_token"]),
                prefill=phase(p["prefill"]),
                decode=phase(p["decode"]),
                decode_batched=phase(p["decode_batched"]),
                step_model=StepModel(**p["step_model"]),
            )
            for q, p in raw.get("precisions", {}).items()
        }
        return cls(
            hardware=str(raw["hardware"]),
            ceilings=Ceilings.from_dict(raw["ceilings"]),
            reference=str(raw["reference"]),
            precisions=precisions,
            notes=list(raw.get("notes", [])),
            model=dict(raw.get("model", {})),
            analytic={q: StepModel(**m) for q, m in raw.get("analytic", {}).items()},
            memory_fit=list(raw.get("memory_fit", [])),
        )

    def to_wire(self) -> dict[str, Any]:
        """The operator's Profile shape (hardware, ceilings, prefill/decode of the reference)."""
        out: dict[str, Any] = {
            "hardware": self.hardware,
            "memoryBandwidthGbps": round(self.ceilings.memory_bandwidth_gbps, 3),
            "peakTflops": round(self.ceilings.peak_tflops, 6),
        }
        ref = self.precisions.get(self.reference)
        if ref is not None:
            out["prefill"] = ref.prefill.to_wire()
            out["decode"] = ref.decode.to_wire()
        return out
