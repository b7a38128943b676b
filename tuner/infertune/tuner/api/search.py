"""The search space, its budget, and the sampler that walks it."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infertune.tuner.api.base import (
    ENGINE_QUANTIZATIONS,
    ApiModel,
    Engine,
    Quantization,
    Sampler,
)
from infertune.tuner.api.durations import Duration


class IntChoice(ApiModel):
    """An integer knob: an explicit `values` list, or a `min`..`max` range (powers of two with `log`)."""

    values: list[int] | None = Field(default=None, min_length=1, max_length=256)
    min: int | None = Field(default=None, ge=1, le=1_048_576)
    max: int | None = Field(default=None, ge=1, le=1_048_576)
    log: bool = Field(default=True, description="Step through powers of two between min and max.")

    @field_validator("values")
    @classmethod
    def _positive_values(cls, values: list[int] | None) -> list[int] | None:
        if values is not None:
            bad = [v for v in values if v < 1 or v > 1_048_576]
            if bad:
                raise ValueError(f"values must be between 1 and 1048576, got {bad}")
            return sorted(set(values))
        return values

    @model_validator(mode="after")
    def _one_form(self) -> IntChoice:
        has_range = self.min is not None or self.max is not None
        if self.values is not None and has_range:
            raise ValueError("give either values or min/max, not both")
        if self.values is None:
            if self.min is None or self.max is None:
                raise ValueError("give values, or both min and max")
            if self.min > self.max:
                raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self

    def candidates(self) -> list[int]:
        """Every value the search may try, ascending."""
        if self.values is not None:
            return list(self.values)
        assert self.min is not None and self.max is not None
        if not self.log:
            step = max(1, (self.max - self.min) // 15)
            return sorted({*range(self.min, self.max + 1, step), self.max})
        out = {self.min, self.max}
        p = 2 ** math.ceil(math.log2(self.min))
        while p <= self.max:
            out.add(p)
            p *= 2
        return sorted(out)


class Budget(ApiModel):
    max_trials: int = Field(default=20, ge=1, le=10_000)
    max_duration: Duration = Field(
        default=Duration("1h"), description="Wall-time cap for the study."
    )
    parallel_trials: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Tuning workers at once (pods of the tuning Job) sharing one study; more than "
        "one needs the operator's shared study storage (chart storage.type postgresql or "
        "external). The budget is counted across them.",
    )
    trial_timeout: Duration = Field(default=Duration("10m"), description="Cap per trial.")


class SearchSpace(ApiModel):
    engines: list[Engine] = Field(default_factory=lambda: list[Engine](["builtin"]), min_length=1)
    quantizations: list[Quantization] = Field(
        default_factory=lambda: list[Quantization](["fp32", "bf16", "fp16", "fp8", "int8", "int4"]),
        min_length=1,
    )
    max_num_seqs: IntChoice = Field(default_factory=lambda: IntChoice(values=[1, 4, 8, 16, 32, 64]))
    max_num_batched_tokens: IntChoice = Field(
        default_factory=lambda: IntChoice(values=[256, 512, 1024, 2048])
    )
    kv_block_sizes: list[int] = Field(default_factory=lambda: [16, 32], min_length=1)
    cuda_graph: list[bool] = Field(default_factory=lambda: [True, False], min_length=1)
    # The GPU servers' knobs (vLLM, SGLang). One value: pinned, not searched.
    tensor_parallel_sizes: list[int] | None = Field(
        default=None,
        min_length=1,
        description="Tensor-parallel sizes to search; default: hardware.gpusPerReplica "
        "(the GPUs the tuning pod sees), not searched.",
    )
    kv_cache_dtypes: list[Literal["auto", "fp8"]] = Field(
        default_factory=lambda: list[Literal["auto", "fp8"]](["auto"]), min_length=1
    )
    gpu_memory_fractions: list[float] = Field(
        default_factory=lambda: [0.9],
        min_length=1,
        description="--gpu-memory-utilization (vLLM) / --mem-fraction-static (SGLang).",
    )
    prefix_caching: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    chunked_prefill: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    sampler: Sampler = "tpe"
    seed: int | None = Field(default=None, ge=0)

    @field_validator("engines", "quantizations")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(values))

    @field_validator("gpu_memory_fractions")
    @classmethod
    def _fractions(cls, values: list[float]) -> list[float]:
        bad = [v for v in values if not 0.05 <= v <= 0.99]
        if bad:
            raise ValueError(f"GPU memory fractions must be between 0.05 and 0.99, got {bad}")
        return sorted(set(values))

    @field_validator("tensor_parallel_sizes")
    @classmethod
    def _tp(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and any(v < 1 or v > 64 for v in values):
            raise ValueError(f"tensor-parallel sizes must be between 1 and 64, got {values}")
        return sorted(set(values)) if values is not None else None

    @field_validator("kv_block_sizes")
    @classmethod
    def _power_of_two_blocks(cls, sizes: list[int]) -> list[int]:
        bad = [s for s in sizes if s < 1 or s > 256 or s & (s - 1)]
        if bad:
            raise ValueError(f"KV block sizes must be powers of two from 1 to 256, got {bad}")
        return sorted(set(sizes))

    @model_validator(mode="after")
    def _some_engine_can_serve(self) -> SearchSpace:
        if not self.engine_quantizations():
            pairs = ", ".join(f"{e}: {sorted(ENGINE_QUANTIZATIONS[e])}" for e in self.engines)
            raise ValueError(
                f"search space is empty: no engine in {self.engines} supports any quantization "
                f"in {self.quantizations} (supported — {pairs})"
            )
        return self

    def engine_quantizations(self) -> dict[str, list[str]]:
        """Engine -> the requested quantizations that engine can serve (engines with none dropped)."""
        out: dict[str, list[str]] = {}
        for engine in self.engines:
            quants = [str(q) for q in self.quantizations if q in ENGINE_QUANTIZATIONS[engine]]
            if quants:
                out[engine] = quants
        return out
