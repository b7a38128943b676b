"""What the profiler found, torch-free: per precision, measured step times against roofline floors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infertune.tuner.roofline import Ceilings, PhaseFloor, StepModel, classify


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


def phase_result(
    name: str,
    tokens: int,
    measured: float,
    floor: PhaseFloor,
    launch: float | None,
    *,
    kernel_ms: dict[str, float] | None = None,
    host_gap_ms: float | None = None,
    operators: int | None = None,
) -> PhaseResult:
    """One measured phase against its floor, classified (roofline.classify): the one place the
    built-in profiler (profiler.py) and an engine's API calibration (calibration.py) build it."""
    bound, percent = classify(measured, floor, launch)
    return PhaseResult(
        phase=name,
        tokens=tokens,
        measured_ms=measured,
        floor_ms=floor.floor_ms,
        compute_floor_ms=floor.compute_ms,
        memory_floor_ms=floor.memory_ms,
        launch_ms=launch,
        bound=bound,
        percent_of_roofline=percent,
        kernel_ms={} if kernel_ms is None else kernel_ms,
        host_gap_ms=host_gap_ms,
        operators=operators,
    )


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
    # engine -> precision -> measured through that engine's API (calibration.py)
    engines: dict[str, dict[str, PrecisionProfile]] = field(default_factory=dict)

    def step_model(self, quantization: str, engine: str | None = None) -> StepModel | None:
        """The step model of a precision on `engine` as measured through its API, else the
        built-in engine's measured one (for builtin, or when that engine is not calibrated),
        else the analytic one, else None."""
        on_engine = self.engines.get(engine or "", {}).get(quantization)
        if on_engine is not None:
            return on_engine.step_model
        if engine in (None, "builtin") or engine not in self.engines:
            measured = self.precisions.get(quantization)
            if measured is not None:
                return measured.step_model
        return self.analytic.get(quantization)

    def reference_profile(self) -> PrecisionProfile | None:
        """The reference precision's profile: the built-in engine's, else the first engine's
        measured through its API."""
        if self.reference in self.precisions:
            return self.precisions[self.reference]
        for by_precision in self.engines.values():
            if self.reference in by_precision:
                return by_precision[self.reference]
        return next((p for e in self.engines.values() for p in e.values()), None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ceilings"] = self.ceilings.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelProfile:
        def phase(p: dict[str, Any]) -> PhaseResult:
            return PhaseResult(**p)

        def precision(p: dict[str, Any]) -> PrecisionProfile:
            return PrecisionProfile(
                quantization=p["quantization"],
                weight_bytes=int(p["weight_bytes"]),
                kv_bytes_per_token=int(p["kv_bytes_per_token"]),
                flops_per_token=int(p["flops_per_token"]),
                prefill=phase(p["prefill"]),
                decode=phase(p["decode"]),
                decode_batched=phase(p["decode_batched"]),
                step_model=StepModel(**p["step_model"]),
            )

        precisions = {q: precision(p) for q, p in raw.get("precisions", {}).items()}
        engines = {
            e: {q: precision(p) for q, p in by.items()} for e, by in raw.get("engines", {}).items()
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
            engines=engines,
        )

    def to_wire(self) -> dict[str, Any]:
        """The operator's Profile shape (hardware, ceilings, prefill/decode of the reference)."""
        out: dict[str, Any] = {
            "hardware": self.hardware,
            "memoryBandwidthGbps": round(self.ceilings.memory_bandwidth_gbps, 3),
            "peakTflops": round(self.ceilings.peak_tflops, 6),
        }
        ref = self.reference_profile()
        if ref is not None:
            out["prefill"] = ref.prefill.to_wire()
            out["decode"] = ref.decode.to_wire()
        return out
