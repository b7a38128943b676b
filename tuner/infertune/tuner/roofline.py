"""The roofline model, torch-free: floors per phase and precision, pruning rules, seed ranking.

A phase's floor is the larger of its compute time (FLOPs / peak FLOP/s in the compute dtype) and its
memory time (bytes moved / bandwidth). Measured time far above both floors, with most of it in
per-operator overhead, is launch-bound. The same maths prunes precisions that cannot meet the SLO
even at batch 1, and ranks configurations for the study's first (enqueued) trials.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from infertune.tuner.hardware import GpuSpec
from infertune.tuner.model_shape import ModelShape

# Launch-bound when the per-operator overhead alone accounts for at least this share of the time.
LAUNCH_SHARE = 0.5


@dataclass(frozen=True)
class Ceilings:
    """The two measured ceilings of the device (and its per-operator dispatch cost)."""

    device: str
    hardware: str
    fingerprint: str
    memory_bandwidth_gbps: float  # GB/s, bytes read + written by a large copy
    peak_flops: dict[str, float]  # compute dtype -> FLOP/s of a large matmul
    launch_overhead_us: float  # one tiny operator, end to end
    measured_at: str = ""

    @property
    def peak_tflops(self) -> float:
        return max(self.peak_flops.values()) / 1e12

    def flops_for(self, dtype: str) -> float:
        return self.peak_flops.get(dtype) or max(self.peak_flops.values())

    def ridge_point(self, dtype: str) -> float:
        """FLOPs per byte above which a kernel is compute-bound."""
        return self.flops_for(dtype) / (self.memory_bandwidth_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Ceilings:
        return cls(
            device=str(raw["device"]),
            hardware=str(raw["hardware"]),
            fingerprint=str(raw["fingerprint"]),
            memory_bandwidth_gbps=float(raw["memory_bandwidth_gbps"]),
            peak_flops={str(k): float(v) for k, v in raw["peak_flops"].items()},
            launch_overhead_us=float(raw["launch_overhead_us"]),
            measured_at=str(raw.get("measured_at", "")),
        )


PLAIN = ("fp32", "bf16", "fp16")
# A CUDA kernel launch, end to end, when it was not measured (datasheet ceilings).
DATASHEET_LAUNCH_US = 5.0


def datasheet_ceilings(gpu: GpuSpec) -> Ceilings:
    """Ceilings from a GPU's published figures, for planning on a GPU the tuner has not measured."""
    return Ceilings(
        device="cuda",
        hardware=f"{gpu.product} (datasheet)",
        fingerprint=f"datasheet-{gpu.name}",
        memory_bandwidth_gbps=gpu.memory_bandwidth_gbps,
        peak_flops={
            "bf16": gpu.bf16_tflops * 1e12,
            "fp16": gpu.bf16_tflops * 1e12,
            "fp32": gpu.fp32_tflops * 1e12,
        },
        launch_overhead_us=DATASHEET_LAUNCH_US,
    )


def compute_dtype(quantization: str, device: str) -> str:
    """The activation dtype (and KV-cache dtype) of a precision.

    Mirrors the built-in engine's `quant.activation_dtype`: bf16 activations for int8/int4/fp8 on
    every device (torch's packed int8/int4 CPU kernels fall back to a scalar path with fp32
    activations, and the CUDA int4 kernel takes bf16 only).
    """
    if quantization in PLAIN:
        return quantization
    return "bf16"


def kv_dtype(quantization: str, device: str) -> str:
    return compute_dtype(quantization, device)


def ceiling_dtypes(quantizations: list[str]) -> set[str]:
    """The matmul dtypes whose peak the floors of these precisions need (see `floor_flops`)."""
    return {q for q in quantizations if q in PLAIN} | {"fp32"}


def floor_flops(ceilings: Ceilings, quantization: str) -> float:
    """The FLOP/s a floor divides by: the measured matmul peak of a plain precision's dtype.

    A weight-only quantized layer runs a packed kernel, not a plain matmul in its activation
    dtype: on CPUs without native bf16 (AVX2 only) a bf16 matmul is emulated and ~50x slower than
    fp32, while the packed int8/int4 kernels are not. A floor must never exceed what the kernel
    can reach, so these take the fastest measured peak.
    """
    if quantization in PLAIN:
        return ceilings.flops_for(quantization)
    return max(ceilings.peak_flops.values())


@dataclass(frozen=True)
class PhaseFloor:
    flops: float
    bytes: float
    compute_ms: float
    memory_ms: float

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


def prefill_floor(
    shape: ModelShape, ceilings: Ceilings, quantization: str, prompt_tokens: int
) -> PhaseFloor:
    """One prompt of `prompt_tokens` in one step: every weight the prompt's tokens are routed to
    read once, FLOPs for every token, the prompt's KV cache written."""
    flops = float(sum(shape.flops_per_token(i) for i in range(prompt_tokens)))
    kv = shape.kv_bytes(prompt_tokens, kv_dtype(quantization, ceilings.device))
    moved = float(shape.read_bytes(quantization, prompt_tokens) + kv)
    return _floor(flops, moved, ceilings, quantization)


def decode_floor(
    shape: ModelShape, ceilings: Ceilings, quantization: str, batch: int, context: int
) -> PhaseFloor:
    """One decode step of `batch` sequences, each attending over `context` cached tokens."""
    flops = float(batch * shape.flops_per_token(context))
    kv = shape.kv_bytes(context, kv_dtype(quantization, ceilings.device)) * batch
    moved = float(shape.read_bytes(quantization, batch) + kv)
    return _floor(flops, moved, ceilings, quantization)


def floor_step_model(
    shape: ModelShape, ceilings: Ceilings, quantization: str, context: int
) -> StepModel:
    """A step-time line from the floors alone, for a precision no engine has measured yet:
    fixed = reading the weights once, per token = its FLOPs and its context's KV reads."""
    bandwidth = ceilings.memory_bandwidth_gbps * 1e9
    weights_ms = shape.read_bytes(quantization, 1) / bandwidth * 1e3
    compute_ms = shape.flops_per_token(context) / floor_flops(ceilings, quantization) * 1e3
    kv_ms = shape.kv_bytes(context, kv_dtype(quantization, ceilings.device)) / bandwidth * 1e3
    return StepModel(fixed_ms=weights_ms, per_token_ms=max(compute_ms, kv_ms))


def _floor(flops: float, moved: float, ceilings: Ceilings, quantization: str) -> PhaseFloor:
    return PhaseFloor(
        flops=flops,
        bytes=moved,
        compute_ms=flops / floor_flops(ceilings, quantization) * 1e3,
        memory_ms=moved / (ceilings.memory_bandwidth_gbps * 1e9) * 1e3,
    )


def classify(
    measured_ms: float, floor: PhaseFloor, launch_ms: float | None
) -> tuple[str, float | None]:
    """(compute|memory|launch, percent of the roofline reached) for one measured phase."""
    if measured_ms <= 0 or not math.isfinite(measured_ms):
        return "unknown", None
    percent = min(100.0, 100.0 * floor.floor_ms / measured_ms)
    if launch_ms is not None and launch_ms >= LAUNCH_SHARE * measured_ms:
        return "launch", percent
    return floor.bound, percent


@dataclass
class StepModel:
    """Measured step time as a line in the batch's token count: t(n) = fixed + per_token * n (ms).

    Fitted per precision from the profiler's prefill and decode measurements; it folds in every
    overhead the roofline floor leaves out (Python, dispatch, attention over the context).
    """

    fixed_ms: float
    per_token_ms: float

    def step_ms(self, tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * tokens


def fit_step_model(points: list[tuple[int, float]]) -> StepModel:
    """Least-squares line t = fixed + per_token * tokens through (tokens, ms) points."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0
    slope = max(slope, 0.0)
    return StepModel(fixed_ms=max(my - slope * mx, 0.0), per_token_ms=slope)


@dataclass
class Prediction:
    ttft_ms: float
    itl_ms: float
    e2e_ms: float
    goodput_rps: float
    stable: bool
    notes: list[str] = field(default_factory=list)
    # A step that carries a prefill chunk stretches the token gap of every running request: the
    # gap of such a step, and the share of decode steps that carry one.
    itl_tail_ms: float = 0.0
    prefill_share: float = 0.0

    def itl_at(self, percentile: float) -> float:
        """Inter-token latency at a percentile (95.0 for p95): when more than the tail's share of steps carry a
        prefill chunk, the percentile is one of those steps, not the mean gap. Long prompts with a
        large token budget per step miss a p95 ITL bound that their mean gap meets."""
        return self.itl_tail_ms if self.prefill_share >= 1.0 - percentile / 100 else self.itl_ms


def predict(
    step: StepModel,
    *,
    rate: float | None,
    concurrency: int | None,
    prompt_tokens: float,
    output_tokens: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> Prediction:
    """Steady-state latency and goodput of continuous batching, from the step-time line.

    A request costs ceil(P / chunk) prefill steps and O decode steps. With b sequences running,
    a decode step takes t(b) (plus, on average, the prefill tokens admitted alongside it). Little's
    law gives b = arrival rate x e2e; the fixed point is found by iteration. Crude, but it ranks the
    knobs in the right order, which is all the seeding needs.
    """
    chunk = max(1, min(max_num_batched_tokens, math.ceil(prompt_tokens)))
    prefill_steps = math.ceil(prompt_tokens / chunk)
    if rate is None:  # closed loop: the running batch is the concurrency, capped by the engine
        b = float(min(max_num_seqs, concurrency or 1))
        for _ in range(50):
            itl = step.step_ms(math.ceil(b)) + step.per_token_ms * prompt_tokens * b / max(
                output_tokens, 1
            )
            ttft = prefill_steps * step.step_ms(chunk + int(b))
            e2e = ttft + itl * max(output_tokens - 1, 0)
            waiting = max(0.0, (concurrency or 1) - max_num_seqs)
            ttft += waiting / max(b, 1) * e2e
            e2e = ttft + itl * max(output_tokens - 1, 0)
        throughput = (concurrency or 1) / (e2e / 1e3) if e2e > 0 else 0.0
        share = min(1.0, b * prefill_steps / max(output_tokens, 1))
        tail = step.step_ms(math.ceil(b) + chunk)
        return Prediction(ttft, itl, e2e, throughput, True, [], max(itl, tail), share)
    b = 1.0
    stable = True
    ttft = itl = e2e = 0.0
    for _ in range(100):
        running = min(b, float(max_num_seqs))
        # Prefill tokens per step spread over the decode steps of the running requests.
        prefill_share = rate * prompt_tokens * step.step_ms(math.ceil(running)) / 1e3
        itl = step.step_ms(math.ceil(running)) + step.per_token_ms * min(
            prefill_share, max_num_batched_tokens
        )
        ttft = prefill_steps * step.step_ms(chunk + int(running))
        e2e = ttft + itl * max(output_tokens - 1, 0)
        service_rate = max_num_seqs / (e2e / 1e3) if e2e > 0 else float("inf")
        if rate >= service_rate:  # more arrivals than the batch limit can retire: queue grows
            stable = False
            break
        new_b = rate * e2e / 1e3
        if abs(new_b - b) < 1e-3:
            break
        b = 0.5 * b + 0.5 * new_b
    running = min(b, float(max_num_seqs))
    # Chunks started per second x the gap each decode step lasts = share of steps with a chunk.
    share = min(1.0, rate * prefill_steps * itl / 1e3)
    tail = max(itl, step.step_ms(math.ceil(running) + chunk))
    if not stable:
        return Prediction(
            ttft, itl, e2e, 0.0, False, ["queue grows: batch limit too small"], tail, share
        )
    # Queueing delay at the admission limit (M/M/c-like wait folded into TTFT).
    utilisation = min(0.999, b / max_num_seqs)
    ttft += e2e * utilisation**max_num_seqs / (1 - utilisation) / max_num_seqs
    e2e = ttft + itl * max(output_tokens - 1, 0)
    return Prediction(ttft, itl, e2e, rate, True, [], tail, share)
