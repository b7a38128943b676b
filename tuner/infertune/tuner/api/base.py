"""Shared pydantic base for every API object: camelCase on the wire, unknown fields rejected."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Engine = Literal["builtin", "vllm", "llamacpp", "sglang"]
Quantization = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
Percentile = Literal["p50", "p90", "p95", "p99"]
Objective = Literal["goodput", "throughput", "cost-per-token"]
Sampler = Literal["tpe", "nsga2", "gp", "random", "grid"]
Arrival = Literal["poisson", "constant", "gamma"]
LengthKind = Literal["fixed", "uniform", "lognormal"]

ENGINES: tuple[str, ...] = ("builtin", "vllm", "llamacpp", "sglang")
QUANTIZATIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
PERCENTILES: dict[str, float] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}

# Which precisions each engine can serve: from an ordinary (unquantized) checkpoint, except int8/int4
# on vLLM/SGLang, served only from the spec's pre-quantized checkpoint (model.variants; pruned with
# what to provide without one). Static facts about the engines, independent of the hardware; the
# hardware filter is applied later by the tuner.
ENGINE_QUANTIZATIONS: dict[str, frozenset[str]] = {
    "builtin": frozenset(QUANTIZATIONS),
    "vllm": frozenset({"fp32", "bf16", "fp16", "fp8", "int8", "int4"}),
    "llamacpp": frozenset({"fp32", "bf16", "fp16", "int8", "int4"}),
    "sglang": frozenset({"bf16", "fp16", "fp8", "int8", "int4"}),
}


def to_camel(name: str) -> str:
    """snake_case -> camelCase without pydantic's capital after a digit ("e2e" stays "e2e")."""
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


class ApiModel(BaseModel):
    """Base of the API: the YAML a user writes is exactly what these models accept."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        validate_assignment=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML / the Kubernetes API (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
