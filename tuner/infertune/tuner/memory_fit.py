"""Does a precision fit the memory of one replica? Pruned before any trial when it cannot.

Torch-free. A configuration needs its weights (at the candidate precision) plus the KV cache of the
smallest batch -- one sequence at the spec's context -- inside the share of device memory the engine
lets itself use. The engines' shares are assumptions, stated here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infertune.tuner.api import TuningSpec
from infertune.tuner.api.traffic import LengthDistribution
from infertune.tuner.hardware import Hardware
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.roofline import kv_dtype
from infertune.tuner.space import Space

# The share of device memory each engine allocates for weights + KV cache (assumptions):
# vLLM --gpu-memory-utilization defaults to 0.9; SGLang picks --mem-fraction-static from the GPU's
# size, at most ~0.88 on large GPUs; the built-in engine's --gpu-memory-utilization defaults to 0.9
# (infertune.engine.serve_config.DEFAULT_GPU_UTILIZATION); llama.cpp takes what it needs (1.0).
MEMORY_FRACTION: dict[str, float] = {"vllm": 0.9, "sglang": 0.88, "builtin": 0.9, "llamacpp": 1.0}
DEFAULT_MEMORY_FRACTION = 0.9
GIB = 2**30


def p95(dist: LengthDistribution) -> int:
    """The 95th percentile of a token-length distribution (the spec's own p95 when lognormal)."""
    if dist.distribution == "lognormal" and dist.p95 is not None:
        return dist.p95
    if dist.distribution == "uniform" and dist.min is not None and dist.max is not None:
        return math.ceil(dist.min + 0.95 * (dist.max - dist.min))
    return math.ceil(dist.expected)


def context_tokens(spec: TuningSpec) -> int:
    """The context one sequence must hold: model.maxModelLen, else prompt p95 + output p95."""
    if spec.model.max_model_len is not None:
        return spec.model.max_model_len
    return p95(spec.traffic.prompt_tokens) + p95(spec.traffic.output_tokens)


@dataclass(frozen=True)
class MemoryBudget:
    """The memory of one replica: `devices` x `device_bytes` (GPUs), or the host's RAM."""

    device_bytes: int
    devices: int
    label: str  # "GiB of <product>" for the reason text

    @classmethod
    def of(cls, hardware: Hardware, gpus_per_replica: int | None = None) -> MemoryBudget:
        """A tuning Job's pod holds the GPUs one replica gets (gpusPerReplica), so NVML's count
        is the replica's unless the caller says otherwise."""
        if not hardware.is_gpu:
            return cls(hardware.memory_bytes, 1, f"RAM of {hardware.product}")
        return cls(hardware.memory_bytes, gpus_per_replica or hardware.count, hardware.product)


@dataclass(frozen=True)
class MemoryFit:
    engine: str
    quantization: str
    weight_bytes: int
    kv_bytes: int
    sequences: int
    context: int
    fraction: float
    budget: MemoryBudget

    @property
    def needed(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def available(self) -> float:
        return self.fraction * self.budget.devices * self.budget.device_bytes

    @property
    def fits(self) -> bool:
        return self.needed <= self.available

    def text(self) -> str:
        """E.g. 'int4 weights 35.1 GiB + KV 0.5 GiB for 1 seq x 4096 tokens > 0.9 x 22.5 GiB'."""
        devices = f"{self.budget.devices} x " if self.budget.devices > 1 else ""
        return (
            f"{self.quantization} weights {self.weight_bytes / GIB:.1f} GiB + KV "
            f"{self.kv_bytes / GIB:.1f} GiB for {self.sequences} seq x {self.context} tokens "
            f"{'<=' if self.fits else '>'} {self.fraction:g} x {devices}"
            f"{self.budget.device_bytes / GIB:.1f} GiB ({self.budget.label})"
        )


def memory_fit(
    shape: ModelShape,
    engine: str,
    quantization: str,
    context: int,
    budget: MemoryBudget,
    device: str = "cuda",
    sequences: int = 1,
) -> MemoryFit:
    kv = sequences * shape.kv_bytes(context, kv_dtype(quantization, device))
    return MemoryFit(
        engine=engine,
        quantization=quantization,
        weight_bytes=shape.weight_bytes(quantization),
        kv_bytes=kv,
        sequences=sequences,
        context=context,
        fraction=MEMORY_FRACTION.get(engine, DEFAULT_MEMORY_FRACTION),
        budget=budget,
    )


def prune_by_memory(
    space: Space, spec: TuningSpec, shape: ModelShape, hardware: Hardware, budget: MemoryBudget
) -> list[MemoryFit]:
    """Drop every (engine, precision) whose weights + one sequence's KV cannot fit; the fits."""
    context = context_tokens(spec)
    fits: list[MemoryFit] = []
    for engine, e in list(space.engines.items()):
        for q in list(e.quantizations):
            fit = memory_fit(shape, engine, q, context, budget, hardware.device)
            fits.append(fit)
            if not fit.fits:
                space.drop_quantization(engine, q, fit.text(), "memory")
    return fits
